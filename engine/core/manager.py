"""The prefix-cache manager: lookup, allocate, append, finish, reset.

It decides what vLLM v1's KV-cache manager decides for one KV-cache group: which leading
full blocks of a request are reused, which blocks are taken (and what that evicts), when
blocks become findable, and why the first missing block missed. Plain Python; emits
events on the caller's thread through an `EventBus`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Sequence

from engine.core.block_pool import Block, BlockPool
from engine.core.blocks import cdiv
from engine.core.errors import CapacityError, ResetRefusedError
from engine.core.events import (
    BlockEvicted, BlocksAllocated, BlocksFreed, BlockStored, CacheReset, EventBus,
    LookupDone, MissInfo, RefCountsChanged, RequestFinished, RequestRefused, RequestStarted,
)
from engine.core.hashing import BlockHasher
from engine.core.pool_state import BlockView, Counters, PoolSnapshot

MISS_REASONS = ("new_content", "evicted", "salt", "model", "partial_block", "last_token")
_MAX_SALTS_CHECKED = 64
_BLOCK_ID = attrgetter("block_id")
_REF_COUNT = attrgetter("ref_count")


def _ids(blocks: Sequence[Block]) -> tuple[int, ...]:
    return tuple(map(_BLOCK_ID, blocks))


def _ref_counts(blocks: Sequence[Block]) -> tuple[int, ...]:
    return tuple(map(_REF_COUNT, blocks))


@dataclass(slots=True)
class Request:
    """What the engine needs of a request: its prompt tokens (or block ids) and its salt.

    Token-level requests give `prompt_token_ids`. Block-level traces (Mooncake) give
    `num_prompt_tokens` and `external_block_ids`, one id per block whose identity already
    includes its prefix; their decode blocks are never cacheable.

    `model` keys the cache: it is folded into the root of the hash chain (and so
    namespaces block ids too), so the same tokens under two models share no block. None,
    the default, hashes exactly as a request without a model always has.
    """

    request_id: str
    prompt_token_ids: Sequence[int] | None = None
    num_prompt_tokens: int = 0
    salt: str | None = None
    external_block_ids: Sequence[int] | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if self.prompt_token_ids is not None:
            self.num_prompt_tokens = len(self.prompt_token_ids)
        elif self.external_block_ids is None:
            raise ValueError(f"request {self.request_id!r} has neither token ids nor block ids")
        if self.num_prompt_tokens < 1:
            raise ValueError(f"request {self.request_id!r} has an empty prompt; it needs at least one token")


@dataclass(slots=True, frozen=True)
class LookupResult:
    """The outcome of a lookup. `hit_block_ids` are reused, at most prompt_len - 1 tokens."""

    block_hashes: tuple[bytes, ...]
    hit_block_ids: tuple[int, ...]
    num_cached_tokens: int
    num_prompt_tokens: int
    miss: MissInfo

    @property
    def num_hit_blocks(self) -> int:
        return len(self.hit_block_ids)

    @property
    def num_computed_tokens(self) -> int:
        return self.num_prompt_tokens - self.num_cached_tokens


@dataclass(slots=True, frozen=True)
class Allocation:
    request_id: str
    block_ids: tuple[int, ...]
    num_hit_blocks: int
    num_cached_tokens: int
    num_computed_tokens: int
    miss: MissInfo
    block_hashes: tuple[bytes, ...]


@dataclass(slots=True, eq=False)
class _Running:
    request: Request
    block_table: list[Block]
    block_hashes: list[bytes]
    token_ids: list[int] | None
    num_tokens: int  # tokens whose KV is (being) computed
    stored: list[Block] = field(default_factory=list)


class PrefixCacheManager:
    """A paged prefix cache over `num_blocks` blocks of `block_size` tokens.

    Any interleaving of `allocate` / `append` / `finish` across requests is allowed, so a
    block shared by running requests carries a ref count above one. Methods emit events
    on the calling thread; a refused call raises `CapacityError` and changes nothing.
    """

    def __init__(self, num_blocks: int, block_size: int = 16, hasher: BlockHasher | None = None,
                 events: EventBus | None = None) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be at least 1, not {block_size}")
        if num_blocks < 1:
            raise ValueError(f"capacity must be at least one block, not {num_blocks}")
        self.block_size = block_size
        self.hasher = hasher if hasher is not None else BlockHasher()
        self.events = events if events is not None else EventBus()
        self.pool = BlockPool(num_blocks)
        self.counters = Counters()
        self._running: dict[str, _Running] = {}
        # hash -> seq of the eviction (or reset) event that removed it; None if unnumbered
        self._evicted_by_seq: dict[bytes, int | None] = {}
        self._salts_seen: dict[str | None, None] = {}
        self._models_seen: dict[str | None, None] = {}
        self._model_hashers: dict[str, BlockHasher] = {}
        # parent hash -> child hashes currently cached; used to find where a request diverges.
        # Token blocks only: a block-level request diverges at its first missing block, and
        # a block without tokens would match none of a token request's.
        self._children: dict[bytes | None, dict[bytes, None]] = {}

    # ------------------------------------------------------------------ queries
    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def running_request_ids(self) -> tuple[str, ...]:
        return tuple(self._running)

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return _ids(self._get(request_id).block_table)

    def num_tokens(self, request_id: str) -> int:
        """Tokens of the request whose KV exists (prompt plus decoded, minus the last sampled)."""
        return self._get(request_id).num_tokens

    def block(self, block_id: int) -> Block:
        return self.pool.blocks[block_id]

    def is_cached(self, block_hash: bytes) -> bool:
        return block_hash in self.pool.blocks_by_hash

    def _get(self, request_id: str) -> _Running:
        try:
            return self._running[request_id]
        except KeyError:
            raise ValueError(f"request {request_id!r} is not running") from None

    # ------------------------------------------------------------------ lookup
    def hasher_for(self, model: str | None) -> BlockHasher:
        """The hasher of requests of `model`: the manager's own for None, else one whose
        chain root holds the model (`BlockHasher.for_model`), made once per model."""
        if model is None:
            return self.hasher
        keyed = self._model_hashers.get(model)
        if keyed is None:
            keyed = self._model_hashers[model] = self.hasher.for_model(model)
        return keyed

    def hash_request(self, request: Request) -> list[bytes]:
        return self._chain(request, request.model, request.salt, request.num_prompt_tokens // self.block_size)

    def _chain(self, request: Request, model: str | None, salt: str | None, n_blocks: int) -> list[bytes]:
        hasher = self.hasher_for(model)
        tokens = request.prompt_token_ids
        if tokens is not None:
            if n_blocks * self.block_size < len(tokens):
                tokens = tokens[:n_blocks * self.block_size]
            return hasher.hash_chain(tokens, self.block_size, salt)
        assert request.external_block_ids is not None
        return hasher.hash_external_chain(list(request.external_block_ids[:n_blocks]), salt)

    def lookup(self, request: Request, block_hashes: Sequence[bytes] | None = None) -> LookupResult:
        """Find the reusable leading blocks of `request`. Emits nothing and moves no block; it
        only counts a digest match whose stored tokens differ (`num_hash_collisions`)."""
        bs = self.block_size
        hashes = list(block_hashes) if block_hashes is not None else self.hash_request(request)
        tokens = request.prompt_token_ids
        ext = request.external_block_ids
        hits: list[Block] = []
        cached_block = self.pool.get_cached_block
        for i, h in enumerate(hashes):
            block = cached_block(h)
            if block is None:
                break
            # A digest match alone never returns KV: the stored content must match too.
            if tokens is not None:
                if block.token_ids != tuple(tokens[i * bs:(i + 1) * bs]):
                    self.counters.num_hash_collisions += 1
                    break
            elif ext is not None and block.external_id != ext[i]:
                self.counters.num_hash_collisions += 1
                break
            hits.append(block)
        n_prompt = request.num_prompt_tokens
        n_full = len(hashes)
        max_hit_blocks = (n_prompt - 1) // bs
        capped = len(hits) > max_hit_blocks
        if capped:
            hits = hits[:max_hit_blocks]
        k = len(hits)
        if capped:
            miss = MissInfo(reason="last_token", first_miss_block=k)
        elif k < n_full:
            miss = self._classify_miss(request, hashes, k)
        else:
            remaining = n_prompt - k * bs
            miss = MissInfo(reason="last_token" if remaining == 1 else "partial_block", first_miss_block=k)
        return LookupResult(tuple(hashes), _ids(hits), k * bs, n_prompt, miss)

    def _classify_miss(self, request: Request, hashes: list[bytes], k: int) -> MissInfo:
        h = hashes[k]
        if h in self._evicted_by_seq:
            return MissInfo(reason="evicted", first_miss_block=k, evicted_by_seq=self._evicted_by_seq[h])
        if (len(self._models_seen) > 1 or request.model not in self._models_seen) \
                and self._held_by_other_model(request, k):
            return MissInfo(reason="model", first_miss_block=k)
        other = self._find_other_salt(request, k)
        if other is not None:
            return MissInfo(reason="salt", first_miss_block=k, other_salt=other[0] if other[0] is not None else "")
        return MissInfo(reason="new_content", first_miss_block=k,
                        divergence_token=self._divergence(request, hashes, k))

    def _held_by_other_model(self, request: Request, k: int) -> bool:
        """True when block k of the request is cached under another model: a model switch."""
        checked = 0
        for model in self._models_seen:
            if model == request.model:
                continue
            checked += 1
            if checked > _MAX_SALTS_CHECKED:
                break
            chain = self._chain(request, model, request.salt, k + 1)
            if chain and chain[-1] in self.pool.blocks_by_hash:
                return True
        return False

    def _find_other_salt(self, request: Request, k: int) -> tuple[str | None] | None:
        checked = 0
        for salt in self._salts_seen:
            if salt == request.salt:
                continue
            checked += 1
            if checked > _MAX_SALTS_CHECKED:
                break
            chain = self._chain(request, request.model, salt, k + 1)
            if chain and chain[-1] in self.pool.blocks_by_hash:
                return (salt,)
        return None

    def _divergence(self, request: Request, hashes: list[bytes], k: int) -> int:
        bs = self.block_size
        start = k * bs
        tokens = request.prompt_token_ids
        if tokens is None:
            return start
        parent = hashes[k - 1] if k > 0 else None
        best = 0
        mine = tokens[start:start + bs]
        for child in self._children.get(parent, ()):
            block = self.pool.get_cached_block(child)
            if block is None or (parent is None and block.salt != request.salt):
                continue
            m = 0
            for a, b in zip(mine, block.token_ids):
                if a != b:
                    break
                m += 1
            best = max(best, m)
        return start + best

    # ------------------------------------------------------------------ allocation
    def can_allocate(self, request: Request, lookup: LookupResult | None = None,
                     num_lookahead_tokens: int = 0) -> bool:
        lookup = lookup if lookup is not None else self.lookup(request)
        needed, available = self._blocks_needed_and_available(request, lookup, num_lookahead_tokens)
        return needed <= available

    def _blocks_needed_and_available(self, request: Request, lookup: LookupResult,
                                     num_lookahead_tokens: int) -> tuple[int, int]:
        """Fresh blocks the request needs, and free blocks it can take (its own hits excluded)."""
        needed = cdiv(request.num_prompt_tokens + num_lookahead_tokens, self.block_size) - lookup.num_hit_blocks
        blocks = self.pool.blocks
        hits_in_free_queue = sum(blocks[b].ref_count == 0 for b in lookup.hit_block_ids)
        return needed, self.pool.num_free_blocks - hits_in_free_queue

    def allocate(self, request: Request, lookup: LookupResult | None = None,
                 num_lookahead_tokens: int = 0) -> Allocation:
        """Take the hit blocks and fresh blocks for the whole prompt; store its full blocks.

        `num_lookahead_tokens` only widens the admission check (room for the output);
        those blocks are taken later by `append`. Raises `CapacityError` with nothing
        changed when the pool cannot serve the request.
        """
        rid = request.request_id
        if rid in self._running:
            raise ValueError(f"request {rid!r} is already running")
        lookup = lookup if lookup is not None else self.lookup(request)
        bus = self.events
        needed, available = self._blocks_needed_and_available(request, lookup, num_lookahead_tokens)
        if needed > available:
            self.counters.num_refused_requests += 1
            if bus.active:
                bus.emit(RequestRefused, request_id=rid, num_blocks_needed=needed, num_blocks_available=available)
            raise CapacityError(rid, needed, available, self.pool.num_blocks)

        self._salts_seen.setdefault(request.salt, None)
        self._models_seen.setdefault(request.model, None)
        if bus.active:
            bus.emit(RequestStarted, request_id=rid, num_prompt_tokens=request.num_prompt_tokens,
                     salt=request.salt)
            bus.emit(LookupDone, request_id=rid, block_hashes=lookup.block_hashes,
                     num_hit_blocks=lookup.num_hit_blocks, num_cached_tokens=lookup.num_cached_tokens,
                     num_prompt_tokens=request.num_prompt_tokens, miss=lookup.miss)
        pool = self.pool
        blocks = pool.blocks
        table = [blocks[block_id] for block_id in lookup.hit_block_ids]
        pool.touch_blocks(table)
        num_new = cdiv(request.num_prompt_tokens, self.block_size) - len(table)
        table.extend(self._take_blocks(num_new, rid))

        tokens = list(request.prompt_token_ids) if request.prompt_token_ids is not None else None
        running = _Running(request, table, list(lookup.block_hashes), tokens, request.num_prompt_tokens)
        self._running[rid] = running
        block_ids = _ids(table)
        if bus.active:
            bus.emit(BlocksAllocated, request_id=rid, block_ids=block_ids, num_hit_blocks=lookup.num_hit_blocks)
            bus.emit(RefCountsChanged, request_id=rid, block_ids=block_ids, ref_counts=_ref_counts(table))
        self._store_blocks(running, lookup.num_hit_blocks, len(running.block_hashes))

        c = self.counters
        c.num_requests += 1
        c.num_prompt_tokens += request.num_prompt_tokens
        c.num_cached_tokens += lookup.num_cached_tokens
        return Allocation(rid, block_ids, lookup.num_hit_blocks,
                          lookup.num_cached_tokens, lookup.num_computed_tokens, lookup.miss,
                          lookup.block_hashes)

    def _take_blocks(self, n: int, request_id: str) -> list[Block]:
        bus = self.events
        counters = self.counters
        evicted_by_seq = self._evicted_by_seq
        forget = self._forget_child

        def on_evict(block: Block, evicted: bytes, parent: bytes | None) -> None:
            forget(evicted, parent)
            counters.num_evicted_blocks += 1
            event = bus.emit(BlockEvicted, block_id=block.block_id, block_hash=evicted,
                             by_request_id=request_id) if bus.active else None
            evicted_by_seq[evicted] = event.seq if event is not None else None

        return self.pool.take_blocks(n, on_evict)

    def _forget_child(self, block_hash: bytes, parent: bytes | None) -> None:
        kids = self._children.get(parent)
        if kids is None or block_hash not in kids:
            return  # a block-level block (never a child here), or already forgotten
        if block_hash in self.pool.blocks_by_hash:  # another copy still holds it
            return
        del kids[block_hash]
        if not kids:
            del self._children[parent]

    def _store_blocks(self, running: _Running, start: int, stop: int) -> None:
        """Store blocks `start` to `stop - 1` of the request's table under its hashes, in order
        (a block that already has a hash is left as it is); each is findable from then on."""
        if start >= stop:
            return
        bs = self.block_size
        request = running.request
        table, hashes, tokens = running.block_table, running.block_hashes, running.token_ids
        ext = request.external_block_ids
        assert tokens is not None or ext is not None
        by_hash = self.pool.blocks_by_hash
        cache = self.pool.cache
        children = self._children
        evicted_by_seq = self._evicted_by_seq
        stored = running.stored
        counters = self.counters
        bus = self.events
        listened = bus.active
        for i in range(start, stop):
            block = table[i]
            if block.block_hash is not None:
                continue
            block_hash = hashes[i]
            parent = hashes[i - 1] if i > 0 else None
            if tokens is not None:
                token_ids = tuple(tokens[i * bs:(i + 1) * bs])
                external_id = None
            else:
                token_ids = ()
                external_id = int(ext[i])  # type: ignore[index]
            salt = request.salt if i == 0 else None
            first_copy = block_hash not in by_hash
            cache(block, block_hash, parent, token_ids, salt, external_id)
            if first_copy and tokens is not None:
                kids = children.get(parent)
                if kids is None:
                    kids = children[parent] = {}
                kids[block_hash] = None
            evicted_by_seq.pop(block_hash, None)
            stored.append(block)
            counters.num_stored_blocks += 1
            if listened:
                bus.emit(BlockStored, request_id=request.request_id, block_id=block.block_id,
                         block_hash=block_hash, parent_hash=parent, token_ids=token_ids,
                         salt=salt, external_id=external_id)

    def append(self, request_id: str, token_ids: Sequence[int] | None = None,
               num_tokens: int | None = None) -> tuple[int, ...]:
        """Add decoded tokens whose KV is now computed; returns the ids of new blocks.

        Pass `token_ids` for token-level requests (blocks that fill become cacheable at
        once) or `num_tokens` for block-level ones (their decode blocks never are).
        Raises `CapacityError`, changing nothing, when no block is left for them.
        """
        running = self._get(request_id)
        if token_ids is not None:
            if running.token_ids is None:
                raise ValueError(f"request {request_id!r} is block-level; append a count, not token ids")
            n = len(token_ids)
        elif num_tokens is not None:
            if running.token_ids is not None:
                raise ValueError(f"request {request_id!r} is token-level; append its token ids")
            n = num_tokens
        else:
            raise ValueError("append needs token_ids or num_tokens")
        if n < 0:
            raise ValueError("cannot append a negative number of tokens")
        total = running.num_tokens + n
        num_new = cdiv(total, self.block_size) - len(running.block_table)
        if num_new > self.pool.num_free_blocks:
            raise CapacityError(request_id, num_new, self.pool.num_free_blocks, self.pool.num_blocks)
        new_blocks = self._take_blocks(num_new, request_id) if num_new > 0 else []
        running.block_table.extend(new_blocks)
        if new_blocks and self.events.active:
            self.events.emit(BlocksAllocated, request_id=request_id,
                             block_ids=_ids(new_blocks), num_hit_blocks=0)
            self.events.emit(RefCountsChanged, request_id=request_id,
                             block_ids=_ids(new_blocks),
                             ref_counts=_ref_counts(new_blocks))
        running.num_tokens = total
        if running.token_ids is not None and token_ids is not None:
            running.token_ids.extend(token_ids)
            bs = self.block_size
            while len(running.block_hashes) < total // bs:
                i = len(running.block_hashes)
                parent = running.block_hashes[i - 1] if i > 0 else None
                running.block_hashes.append(self.hasher_for(running.request.model).hash_block(
                    parent, running.token_ids[i * bs:(i + 1) * bs], running.request.salt if i == 0 else None))
                self._store_blocks(running, i, i + 1)
        return _ids(new_blocks)

    def finish(self, request_id: str, aborted: bool = False) -> tuple[int, ...]:
        """Release the request's blocks tail first; returns the ids that became free.

        Freed blocks with a hash go to the tail of the free queue, those without to its
        head (see `BlockPool.free_blocks`).

        An aborted request's own stored blocks are dropped from the map, since their KV
        may never have been written.
        """
        running = self._get(request_id)
        del self._running[request_id]
        bus = self.events
        if aborted:
            for block in running.stored:
                if block.block_hash is not None and block.ref_count == 1:
                    old = block.block_hash
                    self._forget_child(old, self.pool.uncache(block))
                    if bus.active:
                        bus.emit(BlockEvicted, block_id=block.block_id, block_hash=old, by_request_id=request_id)
        ordered = running.block_table[::-1]  # the tail is evicted before the shared prefix
        freed = self.pool.free_blocks(ordered)
        self.counters.num_finished_requests += 1
        if bus.active:
            bus.emit(RefCountsChanged, request_id=request_id, block_ids=_ids(ordered),
                     ref_counts=_ref_counts(ordered))
            if freed:
                bus.emit(BlocksFreed, request_id=request_id, block_ids=_ids(freed))
            bus.emit(RequestFinished, request_id=request_id, num_tokens_with_kv=running.num_tokens, aborted=aborted)
        return _ids(freed)

    def reset(self) -> int:
        """Forget every cached hash; refused while any block is in use. Returns blocks cleared."""
        if self.pool.num_used_blocks > 0:
            raise ResetRefusedError(
                f"cannot reset the prefix cache while {self.pool.num_used_blocks} blocks are in use "
                f"by {len(self._running)} running requests")
        cleared = [b for b in self.pool.blocks if b.block_hash is not None]
        event = self.events.emit(CacheReset, num_blocks_cleared=len(cleared)) if self.events.active else None
        for block in cleared:
            self._evicted_by_seq[block.block_hash] = event.seq if event is not None else None  # type: ignore[index]
            self.pool.uncache(block)
        self._children.clear()
        return len(cleared)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> PoolSnapshot:
        ranks = {b.block_id: i for i, b in enumerate(self.pool.free_queue)}
        views = tuple(
            BlockView(b.block_id, b.ref_count, b.block_hash, b.parent_hash, b.token_ids, b.salt,
                      b.external_id, ranks.get(b.block_id), b.last_used)
            for b in self.pool.blocks)
        c = self.counters
        counters = Counters(c.num_requests, c.num_prompt_tokens, c.num_cached_tokens, c.num_stored_blocks,
                            c.num_evicted_blocks, c.num_refused_requests, c.num_finished_requests,
                            c.num_hash_collisions)
        return PoolSnapshot(self.block_size, views, self.pool.num_free_blocks, self.pool.num_used_blocks,
                            self.pool.num_cached_blocks,
                            {rid: _ids(s.block_table) for rid, s in self._running.items()},
                            counters)

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests)."""
        pool = self.pool
        free = list(pool.free_queue)
        assert len(free) == pool.num_free_blocks
        free_ids = {b.block_id for b in free}
        assert len(free_ids) == len(free), "a block is twice in the free queue"
        for b in pool.blocks:
            assert b.ref_count >= 0
            assert (b.ref_count == 0) == (b.block_id in free_ids), f"block {b.block_id} free state wrong"
            if b.block_hash is not None:
                assert b in pool.cached_blocks(b.block_hash)
        for h, b in pool.iter_cached():
            assert b.block_hash == h
        for found in pool.blocks_by_hash.values():
            assert type(found) is Block or (found and all(k == b.block_id for k, b in found.items()))
        refs: dict[int, int] = {}
        for running in self._running.values():
            for b in running.block_table:
                refs[b.block_id] = refs.get(b.block_id, 0) + 1
        for b in pool.blocks:
            assert b.ref_count == refs.get(b.block_id, 0), f"block {b.block_id} ref count disagrees"
        assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks
