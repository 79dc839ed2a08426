"""The remote pool: what one vLLM server (one data-parallel rank) holds, rebuilt from its events.

`RemotePool.apply(batch)` updates a compact per-tier model (GPU, CPU, STORAGE) and, when
anyone listens on its bus, emits Cachescope's own `BlockStored`, `BlockEvicted` and
`CacheReset` carrying a `RemoteInfo`, so the same views, store and projections show a
server's pool. `CombinedPool` answers for all ranks at once. No sockets, no Qt here.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator

from engine.core.events import BlockEvicted, BlockStored, CacheReset, Event, EventBus, RemoteInfo
from engine.remote.wire import MEDIUM_DEFAULT, VllmBatch, VllmEvent

_U32 = "I" if array("I").itemsize == 4 else "L"


class RemoteBlock:
    """One cached block of a remote tier. Kept small (about 260 bytes with 16 token ids):
    a server holds up to millions of them. `parent` is the parent's RemoteBlock when it was
    tracked at store time (its hash object is shared, not copied), else the parent's hash
    bytes; a removed parent stays reachable only through its cached children."""

    __slots__ = ("block_hash", "parent", "tokens", "stored_seq", "stored_time", "tenant")

    def __init__(self, block_hash: bytes, parent: RemoteBlock | bytes | None, tokens: bytes,
                 stored_seq: int, stored_time: float, tenant: str | None) -> None:
        self.block_hash = block_hash
        self.parent = parent
        self.tokens = tokens
        self.stored_seq = stored_seq
        self.stored_time = stored_time
        self.tenant = tenant

    @property
    def parent_hash(self) -> bytes | None:
        p = self.parent
        return p.block_hash if isinstance(p, RemoteBlock) else p

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(array(_U32, self.tokens))


def salt_of(extra_keys: Any, lora_name: str | None) -> str | None:
    """The cache salt (tenant) in one block's extra keys as vLLM publishes them.

    A tagged pair `("cache_salt", s)` is taken as is; vLLM 0.33 publishes the keys untagged
    (LoRA name, multimodal hashes, then the salt), so the last string that is not the LoRA
    name is the salt. Only block 0 of a request carries it.
    """
    if not isinstance(extra_keys, tuple):
        return None
    salt = None
    for key in extra_keys:
        if isinstance(key, tuple) and len(key) == 2 and key[0] == "cache_salt" and isinstance(key[1], str):
            return key[1]
        if isinstance(key, str) and key != lora_name:
            salt = key
    return salt


@dataclass(slots=True)
class LifetimeStats:
    """Seconds from stored to removed (server batch clocks), summed for the metrics view."""

    num: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def add(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.num += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)

    @property
    def mean_s(self) -> float:
        return self.total_s / self.num if self.num else 0.0


@dataclass(slots=True)
class RemotePool:
    """One rank of one server: cached blocks per tier, counters, and recent removals.

    Not thread-safe: the `Attachment` applies batches under its lock, and readers (views,
    probes) take the same lock. `removed_at` remembers, for the last `max_removed`
    removals, hash -> (event seq or None when nobody listened, vLLM batch seq).
    """

    source: str
    rank: int = 0
    events: EventBus = field(default_factory=EventBus)
    max_removed: int = 200_000
    tiers: dict[str, dict[bytes, RemoteBlock]] = field(default_factory=dict)
    removed_at: OrderedDict[bytes, tuple[int | None, int]] = field(default_factory=OrderedDict)
    tenants: set[str] = field(default_factory=set)
    block_size: int | None = None
    num_batches: int = 0
    num_stored: int = 0
    num_removed: int = 0
    num_cleared: int = 0
    num_unknown_removed: int = 0  # removals of blocks stored before we joined (or missed)
    num_restored: int = 0  # BlockStored of a hash the tier already held (a re-store, e.g. after offload)
    last_batch_seq: int | None = None
    last_batch_time: float | None = None
    lifetimes: LifetimeStats = field(default_factory=LifetimeStats)

    # ---- reading ---------------------------------------------------------------------

    @property
    def num_cached(self) -> int:
        """Blocks held, counting a hash once per tier that holds it."""
        return sum(len(t) for t in self.tiers.values())

    def num_cached_in(self, medium: str) -> int:
        return len(self.tiers.get(medium, ()))

    def cached_hashes(self) -> set[bytes]:
        out: set[bytes] = set()
        for tier in self.tiers.values():
            out.update(tier)
        return out

    def find(self, block_hash: bytes) -> tuple[str, RemoteBlock] | None:
        """The tier and block holding `block_hash`; a 32-byte digest also matches its 8-byte
        tail, which is how a server with integer event hashes names the same block."""
        for key in (block_hash, block_hash[-8:]) if len(block_hash) > 8 else (block_hash,):
            for medium, tier in self.tiers.items():
                block = tier.get(key)
                if block is not None:
                    return medium, block
        return None

    def removal_of(self, block_hash: bytes) -> tuple[int | None, int] | None:
        for key in (block_hash, block_hash[-8:]) if len(block_hash) > 8 else (block_hash,):
            hit = self.removed_at.get(key)
            if hit is not None:
                return hit
        return None

    def blocks(self) -> Iterator[tuple[str, RemoteBlock]]:
        for medium, tier in self.tiers.items():
            for block in tier.values():
                yield medium, block

    # ---- applying --------------------------------------------------------------------

    def apply(self, batch: VllmBatch) -> list[Event]:
        """Apply one batch in sequence order; returns the Cachescope events emitted (empty
        when nobody listens on `events`, which is the fast path the bench measures)."""
        self.num_batches += 1
        self.last_batch_seq = batch.seq
        self.last_batch_time = batch.ts
        out: list[Event] = []
        emit = self.events.active
        for e in batch.events:
            info = self._info(batch, e) if emit else None
            if e.kind == "BlockStored":
                self._stored(e, batch, info, out)
            elif e.kind == "BlockRemoved":
                self._removed(e, batch, info, out)
            else:
                self._clear(e.medium, info, out)
        return out

    def reset(self, batch_seq: int = -1, batch_time: float = 0.0) -> list[Event]:
        """Forget every block (the server restarted); one CacheReset when anyone listens."""
        out: list[Event] = []
        info = RemoteInfo(source=self.source, rank=self.rank, batch_seq=batch_seq, batch_time=batch_time) \
            if self.events.active else None
        self._clear(None, info, out)
        return out

    def _info(self, batch: VllmBatch, e: VllmEvent) -> RemoteInfo:
        return RemoteInfo(source=self.source, rank=self.rank if batch.data_parallel_rank is None
                          else batch.data_parallel_rank, batch_seq=batch.seq, batch_time=batch.ts,
                          medium=e.medium or MEDIUM_DEFAULT, group_idx=e.group_idx,
                          kv_cache_spec_kind=e.kv_cache_spec_kind, lora_id=e.lora_id, lora_name=e.lora_name,
                          extra_keys=e.extra_keys, locality=e.locality, session_id=e.session_id,
                          block_size=e.block_size or None)

    def _stored(self, e: VllmEvent, batch: VllmBatch, info: RemoteInfo | None, out: list[Event]) -> None:
        hashes = e.block_hashes
        if not hashes:
            return
        medium = e.medium or MEDIUM_DEFAULT
        tier = self.tiers.get(medium)
        if tier is None:
            tier = self.tiers[medium] = {}
        bs = e.block_size or (len(e.token_ids) // len(hashes))
        if bs:
            self.block_size = bs
        raw = e.token_bytes
        if not raw and e.token_ids:  # built in code rather than decoded from the wire
            raw = array(_U32, e.token_ids).tobytes()
        step = 4 * bs
        parent_hash = e.parent_block_hash
        parent: RemoteBlock | bytes | None = parent_hash
        tenant = None
        if parent_hash is not None:
            found = tier.get(parent_hash)
            if found is None and len(self.tiers) > 1:  # e.g. offloaded to CPU under a GPU parent
                found = next((t[parent_hash] for t in self.tiers.values() if parent_hash in t), None)
            if found is not None:
                parent, tenant = found, found.tenant
        extra = e.extra_keys
        removed_at = self.removed_at
        if info is None and extra is None:
            # The fast path (nobody listening, no salt): what `bench attach` measures.
            seq, ts, pop, before = batch.seq, batch.ts, removed_at.pop, len(tier)
            for i, h in enumerate(hashes):
                block = RemoteBlock(h, parent, raw[i * step:(i + 1) * step], seq, ts, tenant)
                tier[h] = block
                pop(h, None)
                parent = block
            self.num_restored += len(hashes) - (len(tier) - before)
            self.num_stored += len(hashes)
            return
        rid = f"{self.source}#{batch.seq}"
        for i, h in enumerate(hashes):
            if extra is not None and i < len(extra) and extra[i] is not None:
                salt = salt_of(extra[i], e.lora_name)
                if salt is not None:
                    tenant = salt
                    self.tenants.add(salt)
            if h in tier:
                self.num_restored += 1
            block = RemoteBlock(h, parent, raw[i * step:(i + 1) * step], batch.seq, batch.ts, tenant)
            tier[h] = block
            if removed_at:
                removed_at.pop(h, None)
            self.num_stored += 1
            if info is not None:
                ev = self.events.emit(BlockStored, request_id=rid, block_id=-1, block_hash=h,
                                      parent_hash=block.parent_hash, token_ids=block.token_ids, salt=tenant,
                                      remote=info)
                if ev is not None:
                    out.append(ev)
            parent = block

    def _removed(self, e: VllmEvent, batch: VllmBatch, info: RemoteInfo | None, out: list[Event]) -> None:
        tier = self.tiers.get(e.medium or MEDIUM_DEFAULT)
        if info is None:
            # The fast path: one shared (event, batch) pair, the lifetime sums inline.
            removed_at, key, ts, life = self.removed_at, (None, batch.seq), batch.ts, self.lifetimes
            pop = tier.pop if tier is not None else {}.pop
            for h in e.block_hashes:
                block = pop(h, None)
                if block is None:
                    self.num_unknown_removed += 1
                else:
                    seconds = ts - block.stored_time
                    if seconds > 0:  # LifetimeStats.add, inlined: this loop runs per removed block
                        life.total_s += seconds
                        if seconds > life.max_s:
                            life.max_s = seconds
                    life.num += 1
                removed_at[h] = key
            self.num_removed += len(e.block_hashes)
            while len(removed_at) > self.max_removed:
                removed_at.popitem(last=False)
            return
        rid = f"{self.source}#{batch.seq}"
        for h in e.block_hashes:
            block = tier.pop(h, None) if tier is not None else None
            if block is None:
                self.num_unknown_removed += 1
            else:
                self.lifetimes.add(batch.ts - block.stored_time)
            self.num_removed += 1
            seq = None
            if info is not None:
                ev = self.events.emit(BlockEvicted, block_id=-1, block_hash=h, by_request_id=rid, remote=info)
                if ev is not None:
                    out.append(ev)
                    seq = ev.seq
            self._remember_removal(h, seq, batch.seq)

    def _remember_removal(self, h: bytes, event_seq: int | None, batch_seq: int) -> None:
        removed_at = self.removed_at
        removed_at[h] = (event_seq, batch_seq)
        if len(removed_at) > self.max_removed:
            removed_at.popitem(last=False)

    def _clear(self, medium: str | None, info: RemoteInfo | None, out: list[Event]) -> None:
        tiers = [medium] if medium is not None else list(self.tiers)
        num = 0
        seq = None
        if info is not None:
            num = sum(len(self.tiers.get(m, ())) for m in tiers)
            ev = self.events.emit(CacheReset, num_blocks_cleared=num, remote=info)
            if ev is not None:
                out.append(ev)
                seq = ev.seq
        batch_seq = info.batch_seq if info is not None else (self.last_batch_seq or -1)
        for m in tiers:
            tier = self.tiers.pop(m, None)
            if tier:
                for h in tier:
                    self._remember_removal(h, seq, batch_seq)
        self.num_cleared += 1


@dataclass(slots=True)
class CombinedPool:
    """Every rank's pool seen as one: what the whole data-parallel deployment holds."""

    pools: list[RemotePool]

    @property
    def num_cached(self) -> int:
        return sum(p.num_cached for p in self.pools)

    def num_cached_in(self, medium: str) -> int:
        return sum(p.num_cached_in(medium) for p in self.pools)

    def mediums(self) -> list[str]:
        seen: dict[str, None] = {}
        for p in self.pools:
            seen.update(dict.fromkeys(p.tiers))
        return list(seen)

    def find(self, block_hash: bytes) -> list[tuple[RemotePool, str]]:
        """Every (pool, tier) that holds `block_hash`."""
        out = []
        for p in self.pools:
            hit = p.find(block_hash)
            if hit is not None:
                out.append((p, hit[0]))
        return out

    def cached_hashes(self) -> set[bytes]:
        out: set[bytes] = set()
        for p in self.pools:
            out |= p.cached_hashes()
        return out

