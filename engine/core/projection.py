"""The pool as the event stream tells it: a projection rebuilt purely from engine events.

`PoolProjection` follows one engine's events (or a remote vLLM pool's stored/removed/
cleared events, where block ids may be unknown and each stored copy of a hash takes a
slot of its own); `EventLog` keeps every event with checkpoints so the pool at any past
seq is rebuilt fast. No Qt, no torch.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from engine.core.events import (
    BlockEvicted, BlocksAllocated, BlocksFreed, BlockStored, CacheReset, Event, LookupDone,
    MissInfo, RefCountsChanged, RemoteInfo, RequestFinished, RequestRefused, RequestStarted,
)
from engine.core.pool_state import BlockView, Counters, PoolSnapshot

# Block categories of the grid; the counts of each are kept up to date per event.
EMPTY, CACHED_FREE, IN_USE = 0, 1, 2


class FreeOrder:
    """The free queue as block ids, head (taken next) first, with O(1) removal anywhere.

    Two ordered sets: blocks put at the head (hashless blocks a request freed, newest
    first) and blocks put at the tail (cached blocks, LRU order), as the manager's queue.
    """

    __slots__ = ("_front", "_back")

    def __init__(self) -> None:
        self._front: dict[int, None] = {}  # reversed: its last key is the head
        self._back: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self._front) + len(self._back)

    def __iter__(self) -> Iterator[int]:
        yield from reversed(self._front)
        yield from self._back

    def __reversed__(self) -> Iterator[int]:
        yield from reversed(self._back)
        yield from self._front

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._back or block_id in self._front

    def append(self, block_id: int) -> None:
        """To the tail (moved there if it was queued already)."""
        self.discard(block_id)
        self._back[block_id] = None

    def prepend_n(self, block_ids: list[int]) -> None:
        """To the head, in order: `block_ids[0]` becomes the head."""
        for b in reversed(block_ids):
            self.discard(b)
            self._front[b] = None

    def discard(self, block_id: int) -> None:
        if block_id in self._back:
            del self._back[block_id]
        else:
            self._front.pop(block_id, None)

    def copy(self) -> FreeOrder:
        new = FreeOrder.__new__(FreeOrder)
        new._front = self._front.copy()
        new._back = self._back.copy()
        return new


@dataclass(slots=True, frozen=True)
class RequestRecord:
    """One request as its events describe it: the lookup outcome and, later, its end."""

    request_id: str
    salt: str | None
    num_prompt_tokens: int
    started_seq: int
    num_cached_tokens: int = 0
    num_hit_blocks: int = 0
    block_hashes: tuple[bytes, ...] = ()
    miss: MissInfo | None = None
    finished_seq: int | None = None
    num_tokens_with_kv: int | None = None
    aborted: bool = False

    @property
    def num_computed_tokens(self) -> int:
        return self.num_prompt_tokens - self.num_cached_tokens


@dataclass(slots=True, frozen=True)
class BlockInfo(BlockView):
    """Everything the projection knows of one physical block (for tooltips and tests): the
    snapshot's view of it plus who used it and when, from the event stream."""

    tenant: str | None
    last_use_seq: int | None
    evicted_seq: int | None
    owners: tuple[str, ...]


_STREAMS: dict[tuple[str, int], int] = {}
_STREAMS_LOCK = threading.Lock()


def stream_code(source: str, rank: int) -> int:
    """A number for the stream (server `source`, data-parallel `rank`) a remote event came
    from, the same for the whole process: a stream's removal frees its own copy and its
    clear (or restart) its own blocks, whichever other servers and ranks hold. A new one is
    numbered under a lock: an attach's placing thread, its GUI tick and the bridge's engine
    thread may meet a stream first at once, and two numbers for one stream left a slot that
    its removals and clears no longer named."""
    key = (source, int(rank))
    got = _STREAMS.get(key)
    if got is None:
        with _STREAMS_LOCK:
            got = _STREAMS.get(key)
            if got is None:
                got = _STREAMS[key] = len(_STREAMS)
    return got


def copy_to_free(holders: Sequence[int], info: RemoteInfo, codes: Sequence[int], ranks: Sequence[int],
                 names: Sequence[tuple[str, int]]) -> int | None:
    """Of `holders` (the slots holding copies of one hash, oldest first), the one a removal
    named by `info` frees: the oldest in its stream (server and rank), tier and KV cache
    group (a removal naming no group takes any group's, group 0 first). `codes[b]` is 0 (a
    copy with no place) or 1 + an index into `names` ((medium, group)); `ranks[b]` is the
    copy's `stream_code` (-1: any)."""
    medium, group, rank = info.medium, info.group_idx, stream_code(info.source, info.rank)
    fallback = None
    for b in holders:
        code = codes[b]
        if ranks[b] != rank and ranks[b] >= 0:
            continue
        if code == 0:
            return b
        m, g = names[code - 1]
        if m != medium:
            continue
        if g == (group or 0):
            return b
        if group is None and fallback is None:
            fallback = b
    return fallback


def chain_by_parents(block_id: int, parents: Any, block_of_hash: Any) -> list[int]:
    """`block_id` and its cached ancestors, root first: each block's parent digest
    (`parents[b]`) to the block holding it (`block_of_hash`), stopping where a parent is not
    held (evicted) or a chain would loop."""
    chain = [block_id]
    seen = {block_id}
    parent = parents[block_id]
    while parent is not None:
        holder = block_of_hash(parent)
        if holder is None or holder in seen:
            break
        chain.append(holder)
        seen.add(holder)
        parent = parents[holder]
    chain.reverse()
    return chain


class PoolProjection:
    """Per-block state, the free queue, running requests and counters, from events only.

    Block state lives in parallel lists (one entry per block) so that a copy for a
    checkpoint is a handful of list copies, not thousands of objects.
    """

    __slots__ = (
        "block_size", "num_blocks", "ref_counts", "hashes", "parents", "token_ids", "salts",
        "tenants", "external_ids", "last_used", "last_seq", "evicted_seq", "hashed", "free", "by_hash",
        "running", "requests", "order", "counters", "use_clock", "seq", "num_events",
        "num_in_use", "num_cached_free", "num_hashed", "ref_hist", "last_request_id",
        "num_resets", "last_eviction_seq", "vacant", "slot_ranks", "slot_places", "places", "remote_slots",
    )

    def __init__(self, num_blocks: int = 0, block_size: int = 16) -> None:
        if num_blocks < 0:
            raise ValueError(f"a pool cannot have {num_blocks} blocks")
        if block_size < 1:
            raise ValueError(f"block size must be at least 1, not {block_size}")
        self.block_size = block_size
        self.num_blocks = 0
        self.ref_counts: list[int] = []
        self.hashes: list[bytes | None] = []
        self.parents: list[bytes | None] = []
        self.token_ids: list[tuple[int, ...]] = []
        self.salts: list[str | None] = []
        self.tenants: list[str | None] = []
        self.external_ids: list[int | None] = []
        self.last_used: list[int] = []
        self.last_seq: list[int] = []
        self.evicted_seq: list[int] = []
        self.hashed = bytearray()  # 1 where a block holds a hash: lets views vectorise without a loop
        # The free queue: the first block is taken (its hash evicted) next.
        self.free = FreeOrder()
        # hash -> ids of the physical blocks holding it (usually one)
        self.by_hash: dict[bytes, tuple[int, ...]] = {}
        self.running: dict[str, tuple[int, ...]] = {}
        self.requests: dict[str, RequestRecord] = {}
        self.order: list[str] = []  # request ids in start order (repeats allowed)
        self.counters = Counters()
        self.use_clock = 0
        self.seq = -1
        self.num_events = 0
        self.num_in_use = 0
        self.num_cached_free = 0
        self.num_hashed = 0
        self.ref_hist: dict[int, int] = {}
        self.last_request_id: str | None = None
        self.num_resets = 0
        self.last_eviction_seq = -1
        # Slots a remote store may take (no hash, no ref), newest last; None until the first
        # remote store, so a local engine's pool pays nothing for it. Entries are checked
        # when taken, so a stale one is skipped, never trusted.
        self.vacant: list[int] | None = None
        # The stream (`stream_code`: server and data-parallel rank) that stored each slot, once
        # a remote event names one; a stream's AllBlocksCleared (or restart) clears only its
        # own blocks from the combined pool, and its removal frees its own copy.
        self.slot_ranks: list[int] | None = None
        # Where each remote slot's copy lives: 1 + its index in `places`, a (tier, KV cache
        # group) pair; 0 when unknown (matches any). A removal frees a copy of its own place.
        self.slot_places: bytearray | None = None
        self.places: list[tuple[str, int]] = []
        # While a list (a caller such as the app's remote overlay arms it around one batch),
        # every BlockStored and BlockEvicted appends the slot it filled or freed (-1: none).
        self.remote_slots: list[int] | None = None
        self._grow(num_blocks)

    # ------------------------------------------------------------------ queries
    @property
    def num_empty(self) -> int:
        return self.num_blocks - self.num_in_use - self.num_cached_free

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def max_ref_count(self) -> int:
        return max(self.ref_hist) if self.ref_hist else 0

    def category(self, block_id: int) -> int:
        if self.ref_counts[block_id] > 0:
            return IN_USE
        return CACHED_FREE if self.hashes[block_id] is not None else EMPTY

    def free_ranks(self) -> dict[int, int]:
        """block id -> position in the free queue (0 = next to be taken)."""
        return {b: i for i, b in enumerate(self.free)}

    def block_of_hash(self, block_hash: bytes | None) -> int | None:
        holders = self.by_hash.get(block_hash) if block_hash is not None else None
        return holders[0] if holders else None

    def owners(self, block_id: int) -> tuple[str, ...]:
        return tuple(rid for rid, table in self.running.items() if block_id in table)

    # many blocks at once, as `engine.core.columnar_log.ArrayProjection` reads them from arrays
    def digests_of(self, blocks: Iterable[int]) -> list[bytes | None]:
        return [self.hashes[b] for b in blocks]

    def parents_of(self, blocks: Iterable[int]) -> list[bytes | None]:
        return [self.parents[b] for b in blocks]

    def tokens_of(self, blocks: Iterable[int]) -> list[tuple[int, ...]]:
        return [self.token_ids[b] for b in blocks]

    def salts_of(self, blocks: Iterable[int]) -> list[str | None]:
        return [self.salts[b] for b in blocks]

    first_holder_shown = True  # block_of_hash(h) is by_hash[h][0]

    def tenants_of(self, blocks: Iterable[int]) -> list[str | None]:
        return [self.tenants[b] for b in blocks]

    def chain_of(self, block_id: int) -> list[int]:
        """The block and its cached ancestors, root first (stops where a parent was evicted)."""
        return chain_by_parents(block_id, self.parents, self.block_of_hash)

    def block_info(self, block_id: int) -> BlockInfo:
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block {block_id} is not in this pool of {self.num_blocks} blocks")
        rank = None
        if block_id in self.free:
            rank = next(i for i, b in enumerate(self.free) if b == block_id)
        return BlockInfo(
            block_id, self.ref_counts[block_id], self.hashes[block_id], self.parents[block_id],
            self.token_ids[block_id], self.salts[block_id], self.external_ids[block_id], rank,
            self.last_used[block_id], tenant=self.tenants[block_id],
            last_use_seq=self.last_seq[block_id] if self.last_seq[block_id] >= 0 else None,
            evicted_seq=self.evicted_seq[block_id] if self.evicted_seq[block_id] >= 0 else None,
            owners=self.owners(block_id))

    def request_records(self) -> list[RequestRecord]:
        """Every started request in start order (the latest record for a reused id)."""
        return [self.requests[rid] for rid in dict.fromkeys(self.order)]

    def snapshot(self) -> PoolSnapshot:
        """The projection in the shape of `PrefixCacheManager.snapshot()`, for comparison."""
        ranks = self.free_ranks()
        views = tuple(
            BlockView(i, self.ref_counts[i], self.hashes[i], self.parents[i], self.token_ids[i],
                      self.salts[i], self.external_ids[i], ranks.get(i), self.last_used[i])
            for i in range(self.num_blocks))
        return PoolSnapshot(self.block_size, views, len(self.free), self.num_blocks - len(self.free),
                            self.num_hashed, dict(self.running), dataclasses.replace(self.counters))

    # ------------------------------------------------------------------ copying
    def copy(self) -> PoolProjection:
        new = PoolProjection.__new__(PoolProjection)
        for name in PoolProjection.__slots__:
            value = getattr(self, name)
            if isinstance(value, (list, dict, bytearray, FreeOrder)):  # vacant too (a list or None)
                value = value.copy()  # elements are immutable (tuples, bytes, records)
            elif isinstance(value, Counters):
                value = dataclasses.replace(value)
            setattr(new, name, value)
        new.remote_slots = None  # belongs to the batch being applied to this projection
        return new

    # ------------------------------------------------------------------ applying events
    def apply(self, event: Event) -> None:
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
        self.seq = event.seq
        self.num_events += 1

    def apply_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.apply(event)

    def _grow(self, num_blocks: int) -> None:
        # A remote pool announces no size; blocks appear as events name them.
        start = self.num_blocks
        if num_blocks <= start:
            return
        n = num_blocks - start
        if n == 1:  # a remote pool grows one block at a time: appends, no temporary lists
            self.ref_counts.append(0)
            self.hashes.append(None)
            self.parents.append(None)
            self.salts.append(None)
            self.tenants.append(None)
            self.external_ids.append(None)
            self.token_ids.append(())
            self.last_used.append(0)
            self.last_seq.append(-1)
            self.evicted_seq.append(-1)
            self.hashed.append(0)
            self.free.append(start)
            self.num_blocks = num_blocks
            if self.vacant is not None:
                self.vacant.append(start)
            if self.slot_ranks is not None:
                self.slot_ranks.append(-1)
            if self.slot_places is not None:
                self.slot_places.append(0)
            return
        self.ref_counts.extend([0] * n)
        for lst in (self.hashes, self.parents, self.salts, self.tenants, self.external_ids):
            lst.extend([None] * n)
        self.token_ids.extend([()] * n)
        self.last_used.extend([0] * n)
        self.last_seq.extend([-1] * n)
        self.evicted_seq.extend([-1] * n)
        self.hashed.extend(bytes(n))
        for b in range(start, num_blocks):
            self.free.append(b)
        self.num_blocks = num_blocks
        if self.slot_ranks is not None:
            self.slot_ranks.extend([-1] * n)
        if self.slot_places is not None:
            self.slot_places.extend(bytes(n))
        if self.vacant is not None:
            self.vacant.extend(range(num_blocks - 1, start - 1, -1))

    def _set_ref(self, b: int, ref: int) -> None:
        old = self.ref_counts[b]
        if old == ref:
            return
        hist = self.ref_hist
        if old > 0:
            left = hist[old] - 1
            if left:
                hist[old] = left
            else:
                del hist[old]
        else:
            self.num_in_use += 1
            if self.hashes[b] is not None:
                self.num_cached_free -= 1
            self.free.discard(b)  # a hit or an allocation takes it off the queue
        if ref > 0:
            hist[ref] = hist.get(ref, 0) + 1
        else:
            self.num_in_use -= 1
            if self.hashes[b] is not None:
                self.num_cached_free += 1
        self.ref_counts[b] = ref

    def _uncache(self, b: int) -> None:
        h = self.hashes[b]
        if h is None:
            return
        holders = tuple(x for x in self.by_hash.get(h, ()) if x != b)
        if holders:
            self.by_hash[h] = holders
        else:
            self.by_hash.pop(h, None)
        self.hashes[b] = self.parents[b] = self.salts[b] = self.tenants[b] = self.external_ids[b] = None
        self.token_ids[b] = ()
        self.hashed[b] = 0
        self.num_hashed -= 1
        if self.ref_counts[b] == 0:
            self.num_cached_free -= 1
            if self.vacant is not None:
                self.vacant.append(b)

    def _slot_for_remote(self) -> int:
        # vLLM's events carry hashes, not block ids, and vLLM keeps one physical block per
        # copy of a hash (RemotePool counts them): every store takes a slot of its own, the
        # first empty free slot, else grows the pool by one.
        # A scan of the free queue for an empty slot made a pool of N blocks cost N^2:
        # the vacant stack (built by one scan on the first remote store) makes it O(1).
        if self.vacant is None:
            self.vacant = [b for b in reversed(self.free) if self.hashes[b] is None]
        vacant = self.vacant
        while vacant:
            b = vacant.pop()
            if self.hashes[b] is None and self.ref_counts[b] == 0:
                return b
        self._grow(self.num_blocks + 1)
        self.vacant.pop()  # the slot just grown is the one returned
        return self.num_blocks - 1

    def _on_started(self, e: RequestStarted) -> None:
        self.requests[e.request_id] = RequestRecord(e.request_id, e.salt, e.num_prompt_tokens, e.seq)
        self.order.append(e.request_id)
        self.running[e.request_id] = ()
        self.last_request_id = e.request_id

    def _on_lookup(self, e: LookupDone) -> None:
        rec = self.requests.get(e.request_id)
        if rec is None:  # a stream that starts mid-request
            rec = RequestRecord(e.request_id, None, e.num_prompt_tokens, e.seq)
            self.order.append(e.request_id)
        self.requests[e.request_id] = dataclasses.replace(
            rec, num_prompt_tokens=e.num_prompt_tokens, num_cached_tokens=e.num_cached_tokens,
            num_hit_blocks=e.num_hit_blocks, block_hashes=e.block_hashes, miss=e.miss)
        c = self.counters
        c.num_requests += 1
        c.num_prompt_tokens += e.num_prompt_tokens
        c.num_cached_tokens += e.num_cached_tokens
        self.last_request_id = e.request_id

    def _on_allocated(self, e: BlocksAllocated) -> None:
        top = max(e.block_ids, default=-1)
        if top >= self.num_blocks:
            self._grow(top + 1)
        self.running[e.request_id] = self.running.get(e.request_id, ()) + tuple(e.block_ids)

    def _on_ref_counts(self, e: RefCountsChanged) -> None:
        top = max(e.block_ids, default=-1)
        if top >= self.num_blocks:
            self._grow(top + 1)
        # The manager ticks its use clock once per block touched or released, in this order.
        for b, ref in zip(e.block_ids, e.ref_counts):
            self._set_ref(b, ref)
            self.use_clock += 1
            self.last_used[b] = self.use_clock
            self.last_seq[b] = e.seq

    def _place_of(self, medium: str, group: int | None) -> int:
        key = (medium, group or 0)
        places = self.places
        try:
            return places.index(key) + 1  # a handful of (tier, group) pairs at most
        except ValueError:
            if len(places) >= 255:
                return 0
            places.append(key)
            return len(places)

    def _slot_of_copy(self, e: BlockEvicted) -> int | None:
        """The slot a removal frees: the oldest copy of its hash in its rank, tier and KV
        cache group (a removal naming no group takes any group's, group 0 first)."""
        holders = self.by_hash.get(e.block_hash)
        if not holders:
            return None
        info = e.remote
        places, ranks = self.slot_places, self.slot_ranks
        if info is None or places is None or ranks is None:
            return holders[0]
        return copy_to_free(holders, info, places, ranks, self.places)

    def _on_stored(self, e: BlockStored) -> None:
        b = e.block_id
        if b is None or b < 0:
            b = self._slot_for_remote()
        elif b >= self.num_blocks:
            self._grow(b + 1)
        if self.hashes[b] is not None:
            self._uncache(b)
        self.hashes[b] = e.block_hash
        self.parents[b] = e.parent_hash
        self.token_ids[b] = tuple(e.token_ids)
        self.salts[b] = e.salt
        parent_holder = self.block_of_hash(e.parent_hash)
        self.tenants[b] = e.salt if e.parent_hash is None or parent_holder is None else self.tenants[parent_holder]
        self.external_ids[b] = e.external_id
        self.by_hash[e.block_hash] = self.by_hash.get(e.block_hash, ()) + (b,)
        if e.remote is not None:
            if self.slot_ranks is None:
                self.slot_ranks = [-1] * self.num_blocks
            if self.slot_places is None:
                self.slot_places = bytearray(self.num_blocks)
            self.slot_ranks[b] = stream_code(e.remote.source, e.remote.rank)
            self.slot_places[b] = self._place_of(e.remote.medium, e.remote.group_idx)
        self.hashed[b] = 1
        self.num_hashed += 1
        if self.ref_counts[b] == 0:
            self.num_cached_free += 1
            # Only a remote pool stores into an unreferenced block: count it as just used.
            self.free.append(b)
        self.counters.num_stored_blocks += 1
        if self.remote_slots is not None:
            self.remote_slots.append(b)

    def _on_freed(self, e: BlocksFreed) -> None:
        # As the manager's free_blocks: hashless blocks to the head, cached ones to the tail.
        hashless: list[int] = []
        for b in e.block_ids:
            if 0 <= b < self.num_blocks and self.ref_counts[b] == 0:
                if self.hashes[b] is None:
                    hashless.append(b)
                else:
                    self.free.append(b)
        self.free.prepend_n(hashless)

    def _on_evicted(self, e: BlockEvicted) -> None:
        b = e.block_id
        if b is None or not 0 <= b < self.num_blocks or self.hashes[b] != e.block_hash:
            b = self._slot_of_copy(e)
        if self.remote_slots is not None:
            self.remote_slots.append(-1 if b is None else b)
        if b is None:
            return
        # Taking a free block for new data is an eviction; an aborted request dropping
        # its own in-use blocks is not counted as one, as in the manager.
        if self.ref_counts[b] == 0:
            self.counters.num_evicted_blocks += 1
        self._uncache(b)
        self.evicted_seq[b] = e.seq
        self.last_eviction_seq = e.seq

    def _on_refused(self, e: RequestRefused) -> None:
        self.counters.num_refused_requests += 1

    def _on_finished(self, e: RequestFinished) -> None:
        self.running.pop(e.request_id, None)
        rec = self.requests.get(e.request_id)
        if rec is not None:
            self.requests[e.request_id] = dataclasses.replace(
                rec, finished_seq=e.seq, num_tokens_with_kv=e.num_tokens_with_kv, aborted=e.aborted)
        self.counters.num_finished_requests += 1

    def _on_reset(self, e: CacheReset) -> None:
        ranks = self.slot_ranks
        rank = stream_code(e.remote.source, e.remote.rank) if e.remote is not None else -1
        if e.remote is not None and ranks is not None and any(r != rank for r in ranks if r >= 0):
            # One stream (a server, or one rank of it) cleared or restarted: the others keep theirs.
            for b in range(self.num_blocks):
                if self.hashes[b] is not None and ranks[b] == rank:
                    self._uncache(b)
                    self.evicted_seq[b] = e.seq
            self.num_resets += 1
            return
        for b in range(self.num_blocks):
            if self.hashes[b] is not None:
                self._uncache(b)
                self.evicted_seq[b] = e.seq
        self.by_hash.clear()
        self.num_resets += 1


_HANDLERS: dict[type, Callable[[PoolProjection, Event], None]] = {
    RequestStarted: PoolProjection._on_started,
    LookupDone: PoolProjection._on_lookup,
    BlocksAllocated: PoolProjection._on_allocated,
    RefCountsChanged: PoolProjection._on_ref_counts,
    BlockStored: PoolProjection._on_stored,
    BlocksFreed: PoolProjection._on_freed,
    BlockEvicted: PoolProjection._on_evicted,
    RequestRefused: PoolProjection._on_refused,
    RequestFinished: PoolProjection._on_finished,
    CacheReset: PoolProjection._on_reset,
}


class PoolSeries:
    """One sample per event (x = seq) of what the timelines plot; compact typed arrays."""

    __slots__ = ("seq", "in_use", "cached_free", "empty", "max_ref", "evicted", "cached_tokens",
                 "prompt_tokens", "refusal_seqs", "reset_seqs")

    def __init__(self) -> None:
        self.seq = array("q")
        self.in_use = array("l")
        self.cached_free = array("l")
        self.empty = array("l")
        self.max_ref = array("l")
        self.evicted = array("q")  # cumulative evictions
        self.cached_tokens = array("q")  # cumulative, for the hit rate over time
        self.prompt_tokens = array("q")
        self.refusal_seqs = array("q")
        self.reset_seqs = array("q")

    def evicted_between(self, at: Sequence[int]) -> list[int]:
        """The evictions of the events from each of the ascending sample positions `at` (0 to
        len) to the next: the differences of the cumulative count there (read at those
        positions alone, the typed array not copied)."""
        counted = self.evicted
        cum = [counted[i - 1] if i > 0 else 0 for i in map(int, at)]
        return [b - a for a, b in zip(cum, cum[1:])]

    def __len__(self) -> int:
        return len(self.seq)


class EventLog:
    """Every event of one engine, the live projection, and checkpoints for scrubbing.

    A checkpoint (a projection copy) is taken every `checkpoint_every` events; when more
    than `max_checkpoints` pile up, every other one is dropped and the interval doubles,
    so memory stays bounded and `state_at` replays at most one interval.
    """

    def __init__(self, num_blocks: int = 0, block_size: int = 16, checkpoint_every: int | None = None,
                 max_checkpoints: int = 32) -> None:
        self.live = PoolProjection(num_blocks, block_size)
        self.events: list[Event] = []
        self.seqs: list[int] = []
        self.series = PoolSeries()
        # Copying costs about as much as replaying a few events per block; scale with size.
        self.checkpoint_every = checkpoint_every or max(1024, num_blocks // 4)
        if self.checkpoint_every < 1:
            raise ValueError("checkpoints must be at least one event apart")
        self.max_checkpoints = max(2, max_checkpoints)
        self._checkpoint_pos: list[int] = [0]
        self._checkpoints: list[PoolProjection] = [self.live.copy()]

    def __len__(self) -> int:
        return len(self.events)

    @property
    def first_seq(self) -> int | None:
        return self.seqs[0] if self.seqs else None

    @property
    def last_seq(self) -> int | None:
        return self.seqs[-1] if self.seqs else None

    @property
    def num_checkpoints(self) -> int:
        return len(self._checkpoints)

    def append(self, event: Event) -> None:
        self.extend((event,))

    def extend(self, events: Iterable[Event]) -> None:
        """Apply and sample events in seq order; the hot loop of ingestion, so names are local."""
        live = self.live
        handlers = _HANDLERS
        s = self.series
        log_events, seqs = self.events, self.seqs
        add_event, add_seq = log_events.append, seqs.append
        s_seq, s_use, s_free, s_empty = s.seq.append, s.in_use.append, s.cached_free.append, s.empty.append
        s_ref, s_ev, s_cached, s_prompt = s.max_ref.append, s.evicted.append, s.cached_tokens.append, s.prompt_tokens.append
        counters = live.counters
        last = seqs[-1] if seqs else None
        for event in events:
            seq = event.seq
            if last is not None and seq <= last:
                raise ValueError(f"event seq {seq} arrived after seq {last}; events must be in order")
            last = seq
            add_event(event)
            add_seq(seq)
            cls = type(event)
            handler = handlers.get(cls)
            if handler is not None:
                handler(live, event)
            live.seq = seq
            live.num_events += 1
            s_seq(seq)
            s_use(live.num_in_use)
            s_free(live.num_cached_free)
            s_empty(live.num_blocks - live.num_in_use - live.num_cached_free)
            hist = live.ref_hist
            s_ref(max(hist) if hist else 0)
            s_ev(counters.num_evicted_blocks)
            s_cached(counters.num_cached_tokens)
            s_prompt(counters.num_prompt_tokens)
            if cls is RequestRefused:
                s.refusal_seqs.append(seq)
            elif cls is CacheReset:
                s.reset_seqs.append(seq)
            if len(log_events) - self._checkpoint_pos[-1] >= self.checkpoint_every:
                self._checkpoint()

    def _checkpoint(self) -> None:
        self._checkpoint_pos.append(len(self.events))
        self._checkpoints.append(self.live.copy())
        if len(self._checkpoints) > self.max_checkpoints:
            self._checkpoint_pos = self._checkpoint_pos[::2]
            self._checkpoints = self._checkpoints[::2]
            self.checkpoint_every *= 2

    def count_upto(self, seq: int | None) -> int:
        """How many events have `event.seq <= seq` (all of them for None)."""
        if seq is None:
            return len(self.seqs)
        return bisect.bisect_right(self.seqs, seq)

    def event_at_seq(self, seq: int) -> Event | None:
        i = bisect.bisect_left(self.seqs, seq)
        return self.events[i] if i < len(self.seqs) and self.seqs[i] == seq else None

    def state_at(self, seq: int | None, base: PoolProjection | None = None) -> PoolProjection:
        """A new projection after every event with seq <= `seq` (the live one copied for None).

        `base`, a projection this log produced earlier and the caller owns, is advanced in
        place when it lies before the target and closer than the nearest checkpoint
        (a slider dragged forward replays only the events it passes).
        """
        n = self.count_upto(seq)
        if n == len(self.events):
            return self.live.copy()
        i = bisect.bisect_right(self._checkpoint_pos, n) - 1
        start = self._checkpoint_pos[i]
        if base is not None and start <= base.num_events <= n:
            proj = base
        else:
            proj = self._checkpoints[i].copy()
        for event in self.events[proj.num_events:n]:
            proj.apply(event)
        return proj
