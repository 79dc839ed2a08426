"""Where a remote vLLM pool's blocks go in a live columnar log: one slot per stored copy.

vLLM's events name hashes, never block ids, and keep one physical block per copy of a
hash; `engine.core.projection.PoolProjection` gives each stored copy a slot of its own
(`_slot_for_remote`, `_slot_of_copy`, a rank's `CacheReset`). `RemoteSlots` makes the same
choices for `engine.core.columnar.ColumnarLog.append_events`, so the rows it writes name
the slots the reference names; tests/test_live_log.py holds both equal.
"""

from __future__ import annotations

from array import array
from typing import Any

from engine.core.events import BlockEvicted, RemoteInfo
from engine.core.projection import copy_to_free, stream_code


class _Holders(dict):
    """digest -> the slots holding a copy of it, oldest first, read as a tuple: a hash with
    one copy (nearly all) keeps its slot as an int, not a 1-tuple (48 bytes a block)."""

    __slots__ = ()

    def get(self, digest: Any, default: Any = None) -> Any:
        got = dict.get(self, digest)
        if got is None:
            return default
        return (got,) if type(got) is int else got

    def __getitem__(self, digest: Any) -> tuple[int, ...]:
        got = dict.__getitem__(self, digest)
        return (got,) if type(got) is int else got

    def add(self, digest: bytes, b: int) -> None:
        got = dict.get(self, digest)
        self[digest] = b if got is None else (got, b) if type(got) is int else got + (b,)

    def discard(self, digest: bytes, b: int) -> None:
        got = dict.get(self, digest)
        if got is None:
            return
        left = () if got == b else got if type(got) is int else tuple(x for x in got if x != b)
        if not left:
            del self[digest]
        else:
            self[digest] = left[0] if type(left) is tuple and len(left) == 1 else left


class RemoteSlots:
    """The slot bookkeeping of a remote pool: vacant slots, the copies of each hash, the
    rank and (tier, KV cache group) place of each slot, and the events' `RemoteInfo`s
    (each distinct one kept once; rows name it by number)."""

    __slots__ = ("vacant", "holders", "ranks", "places", "tenants", "place_names", "infos", "_info_ids", "_last",
                 "_field_ids", "_top_batch")

    def __init__(self, vacant: list[int]) -> None:
        self.vacant = vacant  # slots a store may take, newest last (checked when taken)
        self.holders = _Holders()  # digest -> its slots, in store order
        self.ranks = array("i")  # per slot its stream (`stream_code`), -1 until a remote store names it
        self.places = array("B")  # per slot, 1 + index in place_names (at most 255); 0: unknown
        self.tenants: list[str | None] = []  # per slot, as its store set it
        self.place_names: list[tuple[str, int]] = []
        # a journal's infos stay (source, rank, batch seq, batch time, medium) until read (`info`)
        self.infos: list[RemoteInfo | tuple] = []
        self._info_ids: dict[RemoteInfo, int] = {}
        self._field_ids: dict[tuple, int] = {}  # a journal's infos by their fields
        self._top_batch: dict[tuple[str, int], int] = {}  # (source, rank) -> the newest batch seq given an info
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

    def info_ids(self, source: str, rank: int, batch_seqs: list[int], batch_times: list[float],
                 media: list[str]) -> list[int]:
        """`info_id` of one stream's RemoteInfos given as their fields (a journal's batches
        and tiers: thousands a second), each kept as a tuple, not an object, until read."""
        ids, infos = self._field_ids, self.infos
        if not batch_seqs:
            return []
        keys = list(zip([source] * len(batch_seqs), [rank] * len(batch_seqs), batch_seqs, batch_times, media))
        top = self._top_batch.get((source, rank))
        self._top_batch[source, rank] = max(batch_seqs) if top is None else max(top, max(batch_seqs))
        if (top is None or batch_seqs[0] > top) and all(a <= b for a, b in zip(batch_seqs, batch_seqs[1:])):
            # every batch past the stream's newest so far: all new, none looked up, unless two of
            # them are one info (a batch's tiers, GPU and CPU, are two; a tier vLLM does not name
            # and "GPU" are one): a tick's batches came in two tiers, and each was looked up
            first, had = len(infos) + 1, len(ids)
            ids.update(zip(keys, range(first, first + len(keys))))
            if len(ids) == had + len(keys):
                infos.extend(keys)
                return list(range(first, first + len(keys)))
            for key in keys:  # two were one: none of them was there before (past the newest), so out again
                ids.pop(key, None)
        out = []
        for key in keys:
            got = ids.get(key)
            if got is None:
                infos.append(key)
                got = ids[key] = len(infos)
            out.append(got)
        return out

    def batch_times(self) -> list[float]:
        """The batch time of every RemoteInfo, by number - 1."""
        return [x[3] if type(x) is tuple else x.batch_time for x in self.infos]

    def info_columns(self, numbers: Any = None) -> dict[str, list[Any]]:
        """`info_columns` of the RemoteInfos numbered `numbers` (each 1 + its index; None:
        every one)."""
        return info_columns(self.infos if numbers is None else [self.infos[n - 1] for n in numbers])

    def info(self, number: int) -> RemoteInfo:
        """The RemoteInfo numbered `number` (1 + its index in `infos`)."""
        got = self.infos[number - 1]
        if type(got) is tuple:
            source, rank, batch_seq, batch_time, medium = got
            got = self.infos[number - 1] = RemoteInfo(source=source, rank=rank, batch_seq=batch_seq,
                                                      batch_time=batch_time, medium=medium)
        return got

    def grow(self, num_blocks: int) -> None:
        more = num_blocks - len(self.ranks)
        if more > 0:
            self.ranks.extend([-1] * more)
            self.places.frombytes(bytes(more))
            self.tenants.extend([None] * more)

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
        self.holders.add(digest, b)
        self.tenants[b] = tenant
        self.ranks[b] = stream_code(info.source, info.rank)
        self.places[b] = self.place_of(info.medium, info.group_idx)

    def uncached(self, b: int, digest: bytes) -> None:
        self.holders.discard(digest, b)
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


def info_columns(infos: list[Any]) -> dict[str, list[Any]]:
    """The source, rank, medium, LoRA name and session id of each of `infos` (RemoteInfos, or
    a journal's kept as their fields), read without making their objects."""
    out: dict[str, list[Any]] = {"source": [], "rank": [], "medium": [], "lora_name": [], "session_id": []}
    for x in infos:
        if type(x) is tuple:
            source, rank, _seq, _time, medium = x
            lora = session = None
        else:
            source, rank, medium, lora, session = x.source, x.rank, x.medium, x.lora_name, x.session_id
        out["source"].append(source)
        out["rank"].append(rank)
        out["medium"].append(medium)
        out["lora_name"].append(lora)
        out["session_id"].append(session)
    return out
