"""Where a remote vLLM pool's blocks go in a live columnar log: one slot per stored copy.

vLLM's events name hashes, never block ids, and keep one physical block per copy of a
hash; `engine.core.projection.PoolProjection` gives each stored copy a slot of its own
(`_slot_for_remote`, `_slot_of_copy`, a rank's `CacheReset`). `RemoteSlots` makes the same
choices for `engine.core.columnar.ColumnarLog.append_events`, so the rows it writes name
the slots the reference names; tests/test_live_log.py holds both equal.
"""

from __future__ import annotations

from typing import Any

from engine.core.events import BlockEvicted, RemoteInfo
from engine.core.projection import copy_to_free, stream_code


class RemoteSlots:
    """The slot bookkeeping of a remote pool: vacant slots, the copies of each hash, the
    rank and (tier, KV cache group) place of each slot, and the events' `RemoteInfo`s
    (each distinct one kept once; rows name it by number)."""

    __slots__ = ("vacant", "holders", "ranks", "places", "tenants", "place_names", "infos", "_info_ids", "_last")

    def __init__(self, vacant: list[int]) -> None:
        self.vacant = vacant  # slots a store may take, newest last (checked when taken)
        self.holders: dict[bytes, tuple[int, ...]] = {}  # digest -> its slots, in store order
        self.ranks: list[int] = []  # per slot its stream (`stream_code`), -1 until a remote store names it
        self.places: list[int] = []  # per slot, 1 + index in place_names; 0: unknown
        self.tenants: list[str | None] = []  # per slot, as its store set it
        self.place_names: list[tuple[str, int]] = []
        self.infos: list[RemoteInfo] = []
        self._info_ids: dict[RemoteInfo, int] = {}
        # the last info and place asked for: a batch's events share one RemoteInfo object
        self._last: list[Any] = [None, 0, None, 0]

    def info_id(self, info: RemoteInfo) -> int:
        """1 + the number of `info` (0 stands for no info: a local event)."""
        last = self._last
        if info is last[0]:
            return last[1]
        got = self._info_ids.get(info)
        if got is None:
            self.infos.append(info)
            got = self._info_ids[info] = len(self.infos)
        last[0], last[1] = info, got
        return got

    def grow(self, num_blocks: int) -> None:
        while len(self.ranks) < num_blocks:
            self.ranks.append(-1)
            self.places.append(0)
            self.tenants.append(None)

    def take(self, held: Any, num_blocks: int) -> int:
        """The slot a store takes: the newest vacant one still empty, else a new one
        (`num_blocks`, which the caller then grows the pool to)."""
        vacant = self.vacant
        while vacant:
            b = vacant.pop()
            if b < num_blocks and held[b] < 0:
                return b
        return num_blocks

    def place_of(self, medium: str, group: int | None) -> int:
        key = (medium, group or 0)
        last = self._last
        if key == last[2]:
            return last[3]
        names = self.place_names
        try:
            code = names.index(key) + 1  # a handful of (tier, group) pairs at most
        except ValueError:
            if len(names) >= 255:
                return 0
            names.append(key)
            code = len(names)
        last[2], last[3] = key, code
        return code

    def stored(self, b: int, digest: bytes, info: RemoteInfo, tenant: str | None) -> None:
        self.holders[digest] = self.holders.get(digest, ()) + (b,)
        self.tenants[b] = tenant
        self.ranks[b] = stream_code(info.source, info.rank)
        self.places[b] = self.place_of(info.medium, info.group_idx)

    def uncached(self, b: int, digest: bytes) -> None:
        left = tuple(x for x in self.holders.get(digest, ()) if x != b)
        if left:
            self.holders[digest] = left
        else:
            self.holders.pop(digest, None)
        self.vacant.append(b)

    def copy_of(self, e: BlockEvicted) -> int | None:
        """The slot a removal frees: the oldest copy of its hash in its stream, tier and KV
        cache group (one naming no group takes any group's, group 0 first)."""
        holders = self.holders.get(e.block_hash)
        if not holders:
            return None
        info = e.remote
        if info is None:
            return holders[0]
        return copy_to_free(holders, info, self.places, self.ranks, self.place_names)

    def cleared_by(self, info: RemoteInfo | None, held_slots: list[int]) -> tuple[list[int], bool]:
        """The held slots a reset clears (one stream's, when others hold blocks too) and
        whether it cleared them all."""
        ranks = self.ranks
        who = stream_code(info.source, info.rank) if info is not None else -1
        if info is not None and any(r != who for r in ranks if r >= 0):
            return [b for b in held_slots if ranks[b] == who], False
        return held_slots, True
