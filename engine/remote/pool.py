"""The remote pool: what one vLLM server (one data-parallel rank) holds, rebuilt from its events.

`RemotePool.apply(batch)` updates a compact per-tier model (GPU, CPU, STORAGE, REMOTE: every
producer's medium normalized by `engine.remote.tiers`, the raw names kept) and, when
anyone listens on its bus, emits Cachescope's own `BlockStored`, `BlockEvicted` and
`CacheReset` carrying a `RemoteInfo`, so the same views, store and projections show a
server's pool. A hash can be held by several physical copies (vLLM does not dedupe
identical blocks); the pool counts them. `CombinedPool` answers for all ranks at once.
No sockets, no Qt here.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator

from engine.core.events import BlockEvicted, BlockStored, CacheReset, Event, EventBus, RemoteInfo
from engine.remote.tiers import GPU, tier_of_medium, tier_order
from engine.remote.wire import MEDIUM_DEFAULT, VllmBatch, VllmEvent

_U32 = "I" if array("I").itemsize == 4 else "L"


class RemoteBlock:
    """One hash cached on a remote tier, however many physical copies hold it (their count
    is in `RemotePool.copies`, kept only for the rare hash that is not exactly one copy in
    KV cache group 0). Kept small (about 260 bytes with 16 token ids): a server holds up to
    millions of them. The fields describe the first copy stored. `parent` is the parent's
    RemoteBlock when it was tracked at store time (its hash object is shared, not copied),
    else the parent's hash bytes; a removed parent stays reachable only through its cached
    children."""

    __slots__ = ("block_hash", "parent", "tokens", "stored_seq", "stored_time", "tenant", "num_announced",
                 "num_removed")

    def __init__(self, block_hash: bytes, parent: RemoteBlock | bytes | None, tokens: bytes,
                 stored_seq: int, stored_time: float, tenant: str | None) -> None:
        self.block_hash = block_hash
        self.parent = parent
        self.tokens = tokens
        self.stored_seq = stored_seq
        self.stored_time = stored_time
        self.tenant = tenant
        self.num_announced = 1  # stores that named this hash on this tier (copies and reports)
        self.num_removed = 0  # removals that named it while another copy stayed

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
    """How long a tier held a hash: seconds from its first copy stored to its last copy
    removed (server batch clocks), one entry per hash that left a tier, summed for the
    metrics view."""

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


@dataclass(slots=True, frozen=True)
class GroupSpec:
    """A KV cache group as its events describe it: vLLM's `kv_cache_spec_kind`
    (full_attention, sliding_window, ...), the sliding window, and its block size (a
    sliding-window group may use a partial block, e.g. 8 of 16 tokens)."""

    group_idx: int
    kind: str | None = None
    sliding_window: int | None = None
    block_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"group_idx": self.group_idx, "kind": self.kind, "sliding_window": self.sliding_window,
                "block_size": self.block_size}


@dataclass(slots=True)
class RemotePool:
    """One rank of one server: cached blocks per tier, counters, and recent removals.

    A copy is one physical block of the server holding a hash; copies are counted per
    (tier, KV cache group, hash), the group being vLLM's `group_idx` (None is group 0).
    vLLM keeps one block per request that computed it (two concurrent requests with one
    prompt, a regenerated block-aligned prompt) and sends one BlockStored and one
    BlockRemoved per copy; the offloading connector announces a shared prefix once per
    chunk and asks consumers to count the announcements. So a BlockStored of a hash the
    tier/group holds adds a copy, a BlockRemoved takes one away, and the hash leaves the
    tier with its last copy. The exception is vLLM's reuse report (`_is_reuse_report`).

    Tiers are normalized (`tiers.tier_of_medium`: `cpu` and `CPU_PINNED` are CPU, `cuda:0`
    the GPU); `media[tier][raw name]` counts the blocks announced under each raw name. A
    placeholder (an offloading connector's store with no token ids) is held like any block
    and counted by `num_without_tokens`. `hits_by_session` counts the blocks reuse reports
    re-announced, per session (None: no session id): vLLM's only hit signal on the wire.
    Each block counts the stores and removals that named its hash on its tier
    (`num_announced`, `num_removed`); when a hash leaves a tier its counts move to
    `departed` (the last `max_removed` hashes), so `details_of` says how often a hash was
    announced and removed whether it is still held or not.

    `tiers[tier][hash]` is the hash's RemoteBlock; `copies[(medium, hash)]` lists copies
    per group index, only for hashes that are not exactly one copy in group 0, so the
    common block costs nothing more. Not thread-safe: the `Attachment` applies batches under
    its lock, and readers (views, probes) take the same lock. `removed_at` remembers, for
    the last `max_removed` hashes that left a tier, hash -> (event seq or None when nobody
    listened, vLLM batch seq).
    """

    source: str
    rank: int = 0
    events: EventBus = field(default_factory=EventBus)
    max_removed: int = 200_000
    server: str = ""  # the fleet's name for the server this rank belongs to ("" if alone)
    tiers: dict[str, dict[bytes, RemoteBlock]] = field(default_factory=dict)
    removed_at: OrderedDict[bytes, tuple[int | None, int]] = field(default_factory=OrderedDict)
    tenants: set[str] = field(default_factory=set)
    block_size: int | None = None
    num_batches: int = 0
    num_stored: int = 0  # copies stored (each block of a BlockStored, reuse reports aside)
    num_removed: int = 0  # blocks a BlockRemoved named (known to the pool or not)
    num_cleared: int = 0
    # removals of a copy the tier/group did not hold: stored before we joined (or missed)
    num_unknown_removed: int = 0
    num_restored: int = 0  # stores of a hash the tier/group already held: copies beyond the first
    num_reported: int = 0  # blocks re-announced by a reuse report (held already; no copy added)
    last_batch_seq: int | None = None
    last_batch_time: float | None = None
    lifetimes: LifetimeStats = field(default_factory=LifetimeStats)
    copies: dict[tuple[str, bytes], list[int]] = field(default_factory=dict)
    num_extra_copies: dict[str, int] = field(default_factory=dict)  # per tier: copies beyond one per hash
    media: dict[str, dict[str, int]] = field(default_factory=dict)  # tier -> raw medium name -> blocks announced
    hits_by_session: dict[str | None, int] = field(default_factory=dict)
    num_unknown_events: dict[str, int] = field(default_factory=dict)  # event type -> count (changes nothing)
    # hash -> [stores, removals] that named it on tiers it has left (or removals of a hash
    # never held), for the last `max_removed` hashes
    departed: OrderedDict[bytes, list[int]] = field(default_factory=OrderedDict)
    groups: dict[int, GroupSpec] = field(default_factory=dict)
    # (tier, hash) -> what a store said beyond the common fields (its raw medium when not
    # the tier's name, ownership, locality, lookahead tokens), only when it said any of it
    details: dict[tuple[str, bytes], dict[str, Any]] = field(default_factory=dict)

    # ---- reading ---------------------------------------------------------------------

    @property
    def num_cached(self) -> int:
        """Physical blocks held on every tier: each copy of a hash counts."""
        return sum(len(t) for t in self.tiers.values()) + sum(self.num_extra_copies.values())

    def num_cached_in(self, medium: str) -> int:
        """Physical blocks held on one tier (each copy counts; `len(tiers[tier])` is hashes);
        `medium` may be any name of the tier (`cpu`, `CPU_PINNED`)."""
        medium = tier_of_medium(medium)
        return len(self.tiers.get(medium, ())) + self.num_extra_copies.get(medium, 0)

    def num_without_tokens(self, medium: str) -> int:
        """Hashes a tier holds from placeholder stores (no token ids, block size 0)."""
        return sum(1 for b in self.tiers.get(tier_of_medium(medium), {}).values() if not b.tokens)

    def num_cached_by_group(self, medium: str) -> dict[int, int]:
        """Physical blocks one tier holds per KV cache group (group 0 first)."""
        medium = tier_of_medium(medium)
        tier = self.tiers.get(medium, {})
        out: dict[int, int] = {}
        num_special = 0
        for (m, _h), counts in self.copies.items():
            if m != medium:
                continue
            num_special += 1
            for g, n in enumerate(counts):
                if n:
                    out[g] = out.get(g, 0) + n
        if len(tier) > num_special:
            out[0] = out.get(0, 0) + len(tier) - num_special
        return dict(sorted(out.items()))

    def mediums(self) -> list[str]:
        """The tiers held, GPU first."""
        return sorted(self.tiers, key=tier_order)

    def num_copies(self, block_hash: bytes, medium: str = MEDIUM_DEFAULT, group: int | None = None) -> int:
        """Copies of `block_hash` held on `medium`, in KV cache `group` (every group for None)."""
        medium = tier_of_medium(medium)
        tier = self.tiers.get(medium)
        if not tier or block_hash not in tier:
            return 0
        counts = self.copies.get((medium, block_hash))
        if counts is None:
            return 1 if not group else 0
        if group is None:
            return sum(counts)
        return counts[group] if group < len(counts) else 0

    def cached_hashes(self) -> set[bytes]:
        """Every hash held on some tier (once, however many copies)."""
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

    def tiers_holding(self, block_hash: bytes) -> list[str]:
        """Every tier holding `block_hash` (or, for a 32-byte digest, its 8-byte tail), GPU first."""
        keys = (block_hash, block_hash[-8:]) if len(block_hash) > 8 else (block_hash,)
        return [m for m in self.mediums() if any(k in self.tiers[m] for k in keys)]

    def held_key(self, block_hash: bytes, medium: str) -> bytes:
        """The key `medium` holds `block_hash` under: itself, or a digest's 8-byte tail."""
        tier = self.tiers.get(medium, {})
        if block_hash not in tier and len(block_hash) > 8 and block_hash[-8:] in tier:
            return block_hash[-8:]
        return block_hash

    def held(self) -> Iterator[tuple[str, bytes, int]]:
        """(tier, hash, physical copies) for every hash held on a tier."""
        for medium in self.mediums():
            for h in self.tiers[medium]:
                yield medium, h, self.num_copies(h, medium)

    def details_of(self, block_hash: bytes) -> dict[str, Any]:
        """What the pool knows of one hash: where it is held (copies per tier), how often it
        was announced and removed, and what its store said beyond the common fields."""
        key = block_hash
        tiers: dict[str, dict[str, Any]] = {}
        for m in self.tiers_holding(block_hash):
            key = self.held_key(block_hash, m)
            tiers[m] = {"copies": self.num_copies(key, m), **self.details.get((m, key), {})}
            if not self.tiers[m][key].tokens:
                tiers[m]["no_token_ids"] = True
        gone = self.departed.get(key, (0, 0))
        held = [self.tiers[m][self.held_key(block_hash, m)] for m in tiers]
        return {"hash": key.hex(), "tiers": tiers, "announced": gone[0] + sum(b.num_announced for b in held),
                "removed": gone[1] + sum(b.num_removed for b in held)}

    def _departed(self, h: bytes, num_announced: int, num_removed: int) -> None:
        counts = self.departed.get(h)
        if counts is None:
            self.departed[h] = [num_announced, num_removed]
            if len(self.departed) > self.max_removed:
                self.departed.popitem(last=False)
        else:
            counts[0] += num_announced
            counts[1] += num_removed

    def removal_of(self, block_hash: bytes) -> tuple[int | None, int] | None:
        for key in (block_hash, block_hash[-8:]) if len(block_hash) > 8 else (block_hash,):
            hit = self.removed_at.get(key)
            if hit is not None:
                return hit
        return None

    def blocks(self) -> Iterator[tuple[str, RemoteBlock]]:
        """(tier, block) per hash held on a tier; copies are counted by `num_copies`."""
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
        for i, e in enumerate(batch.events):
            info = self._info(batch, e) if emit else None
            if e.kind == "BlockStored":
                self._stored(e, batch, i, info, out)
            elif e.kind == "BlockRemoved":
                self._removed(e, batch, info, out)
            elif e.kind == "AllBlocksCleared":
                self._clear(e.medium, info, out)
            else:  # a type a newer server added: counted, never fatal
                self.num_unknown_events[e.kind] = self.num_unknown_events.get(e.kind, 0) + 1
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
                          medium=tier_of_medium(e.medium), group_idx=e.group_idx,
                          kv_cache_spec_kind=e.kv_cache_spec_kind, lora_id=e.lora_id, lora_name=e.lora_name,
                          extra_keys=e.extra_keys, locality=e.locality, session_id=e.session_id,
                          block_size=e.block_size or None)

    def _stored(self, e: VllmEvent, batch: VllmBatch, index: int, info: RemoteInfo | None,
                out: list[Event]) -> None:
        hashes = e.block_hashes
        if not hashes:
            return
        raw_medium = e.medium or MEDIUM_DEFAULT
        medium = tier_of_medium(raw_medium)
        tier = self.tiers.get(medium)
        if tier is None:
            tier = self.tiers[medium] = {}
        group = e.group_idx or 0
        parent_hash = e.parent_block_hash
        # Only the engine's own GPU pool sends reuse reports; a connector's device tier
        # (LMCache's `cuda:0`) storing a held hash is another physical copy.
        if parent_hash is None and raw_medium == MEDIUM_DEFAULT and hashes[0] in tier \
                and all(self.num_copies(h, medium, group) for h in hashes) \
                and self._is_reuse_report(batch, index, hashes[-1], group):
            self.num_reported += len(hashes)
            self.hits_by_session[e.session_id] = self.hits_by_session.get(e.session_id, 0) + len(hashes)
            for h in hashes:
                tier[h].num_announced += 1
            return
        names = self.media.get(medium)
        if names is None:
            names = self.media[medium] = {}
        names[raw_medium] = names.get(raw_medium, 0) + len(hashes)
        raw = e.token_bytes
        if not raw and e.token_ids:  # built in code rather than decoded from the wire
            raw = array(_U32, e.token_ids).tobytes()
        bs = e.block_size or (len(raw) // 4 // len(hashes))
        if bs and not group:  # a sliding-window group may use partial blocks: group 0 sets the size
            self.block_size = bs
        if e.group_idx is not None or e.kv_cache_spec_kind is not None:
            spec = GroupSpec(group, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window, bs or None)
            if self.groups.get(group) != spec:
                self.groups[group] = spec
        if e.ownership is not None or e.locality is not None or e.lookahead_token_ids is not None \
                or raw_medium != medium:
            said = {k: v for k, v in (("medium", raw_medium if raw_medium != medium else None),
                                      ("ownership", e.ownership), ("locality", e.locality),
                                      ("lookahead_token_ids", e.lookahead_token_ids)) if v is not None}
            for h in hashes:
                self.details.setdefault((medium, h), {}).update(said)
        step = 4 * bs
        parent: RemoteBlock | bytes | None = parent_hash
        tenant = e.cache_salt  # SGLang names the tenant on every store; vLLM on block 0's extra keys
        if tenant is not None:
            self.tenants.add(tenant)
        if parent_hash is not None:
            found = tier.get(parent_hash)
            if found is None and len(self.tiers) > 1:  # e.g. offloaded to CPU under a GPU parent
                found = next((t[parent_hash] for t in self.tiers.values() if parent_hash in t), None)
            if found is not None:
                parent = found
                if tenant is None:
                    tenant = found.tenant
        extra = e.extra_keys
        removed_at = self.removed_at
        if info is None and extra is None and not group:
            # The fast path (nobody listening, no salt, group 0): what `bench attach` measures.
            seq, ts, pop, keep = batch.seq, batch.ts, removed_at.pop, tier.setdefault
            for i, h in enumerate(hashes):
                new = RemoteBlock(h, parent, raw[i * step:(i + 1) * step], seq, ts, tenant)
                block = keep(h, new)
                if block is not new:  # held already: one more copy
                    self._add_copy(medium, h, 0)
                    block.num_announced += 1
                pop(h, None)
                parent = block
            self.num_stored += len(hashes)
            return
        rid = f"{self.source}#{batch.seq}"
        for i, h in enumerate(hashes):
            if extra is not None and i < len(extra) and extra[i] is not None:
                salt = salt_of(extra[i], e.lora_name)
                if salt is not None:
                    tenant = salt
                    self.tenants.add(salt)
            new = RemoteBlock(h, parent, raw[i * step:(i + 1) * step], batch.seq, batch.ts, tenant)
            block = tier.setdefault(h, new)
            if block is not new:
                self._add_copy(medium, h, group)
                block.num_announced += 1
            elif group:
                self.copies[(medium, h)] = [0] * group + [1]
            if removed_at:
                removed_at.pop(h, None)
            self.num_stored += 1
            if info is not None:
                ev = self.events.emit(BlockStored, request_id=rid, block_id=-1, block_hash=h,
                                      parent_hash=new.parent_hash, token_ids=new.token_ids, salt=tenant,
                                      remote=info)
                if ev is not None:
                    out.append(ev)
            parent = block

    def _is_reuse_report(self, batch: VllmBatch, index: int, last: bytes, group: int) -> bool:
        """Whether a GPU BlockStored without a parent, every block of which the group holds
        already, is vLLM's reuse report rather than new copies.

        With `kv_cache_report_mode="full"` vLLM re-announces the blocks a request hit, from
        block 0 without a parent, in the same BlockStored that new copies arrive in: nothing
        on the wire tells them apart. After its hit a request stores the blocks that follow,
        in the same step, so a report is a store whose next GPU store of that group in the
        batch has its `last` block for parent; once the server has sent one, every store of
        its shape is read as a report. Copies of that shape are rare (a prompt of exactly
        one block computed again, a request that skipped the prefix-cache lookup, such as
        one asking for prompt logprobs): on a server that has sent reports they are missed,
        and their removal counts as unknown. A report before the server's first continued
        one (every full block of the prompt hit) is read as copies and stays counted.
        """
        if self.num_reported:
            return True
        for later in batch.events[index + 1:]:
            if later.kind == "BlockStored" and (later.medium or MEDIUM_DEFAULT) == MEDIUM_DEFAULT \
                    and (later.group_idx or 0) == group:
                return later.parent_block_hash == last
        return False

    def _add_copy(self, medium: str, h: bytes, group: int) -> None:
        """One more copy of a hash the tier holds, in KV cache `group`."""
        key = (medium, h)
        counts = self.copies.get(key)
        if counts is None:
            counts = self.copies[key] = [1]  # the one copy so far, in group 0
        if group >= len(counts):
            counts.extend([0] * (group + 1 - len(counts)))
        if counts[group]:
            self.num_restored += 1
        counts[group] += 1
        self.num_extra_copies[medium] = self.num_extra_copies.get(medium, 0) + 1

    def _remove_copy(self, tier: dict[bytes, RemoteBlock], medium: str, h: bytes,
                     group: int | None) -> tuple[bool, RemoteBlock | None]:
        """Take one copy of `h` in `group` (None: any group, group 0 first) off the tier:
        (whether the tier/group held one, the block when that was the hash's last copy)."""
        block = tier.get(h)
        if block is None:
            return False, None
        key = (medium, h)
        counts = self.copies.get(key)
        if counts is None:  # one copy, in group 0
            if group:
                return False, None
            del tier[h]
            return True, block
        if group is None:
            group = next(g for g, n in enumerate(counts) if n)
        if group >= len(counts) or not counts[group]:
            return False, None
        counts[group] -= 1
        left = sum(counts)
        if not left:
            del self.copies[key]
            del tier[h]
            return True, block
        self.num_extra_copies[medium] -= 1
        if left == 1 and counts[0]:
            del self.copies[key]  # back to the common case: one copy in group 0
        return True, None

    def _removed(self, e: VllmEvent, batch: VllmBatch, info: RemoteInfo | None, out: list[Event]) -> None:
        medium = tier_of_medium(e.medium)
        tier = self.tiers.get(medium)
        group = e.group_idx
        if info is None and not group:
            # The fast path: one shared (event, batch) pair, the lifetime sums inline.
            removed_at, key, ts, life = self.removed_at, (None, batch.seq), batch.ts, self.lifetimes
            pop = tier.pop if tier is not None else {}.pop
            copies = self.copies
            for h in e.block_hashes:
                if copies and (medium, h) in copies:  # several copies, or one outside group 0
                    held, block = self._remove_copy(tier, medium, h, group)
                    if not held:
                        self.num_unknown_removed += 1
                        self._departed(h, 0, 1)
                        continue
                    if block is None:  # another copy still holds it
                        tier[h].num_removed += 1
                        continue
                else:
                    block = pop(h, None)
                    if block is None:
                        self.num_unknown_removed += 1
                        removed_at[h] = key
                        self._departed(h, 0, 1)
                        continue
                self._departed(h, block.num_announced, block.num_removed + 1)
                seconds = ts - block.stored_time
                if seconds > 0:  # LifetimeStats.add, inlined: this loop runs per removed block
                    life.total_s += seconds
                    if seconds > life.max_s:
                        life.max_s = seconds
                life.num += 1
                removed_at[h] = key
                if self.details:
                    self.details.pop((medium, h), None)
            self.num_removed += len(e.block_hashes)
            while len(removed_at) > self.max_removed:
                removed_at.popitem(last=False)
            return
        rid = f"{self.source}#{batch.seq}"
        copies = self.copies
        for h in e.block_hashes:
            if tier is None:
                held, block = False, None
            elif group or (copies and (medium, h) in copies):
                held, block = self._remove_copy(tier, medium, h, group)
            else:  # one copy in group 0, the common case
                block = tier.pop(h, None)
                held = block is not None
            if not held:
                self.num_unknown_removed += 1
                self._departed(h, 0, 1)
            elif block is not None:
                self.lifetimes.add(batch.ts - block.stored_time)
                self._departed(h, block.num_announced, block.num_removed + 1)
            else:  # another copy still holds it
                tier[h].num_removed += 1
            self.num_removed += 1
            seq = None
            if info is not None:
                ev = self.events.emit(BlockEvicted, block_id=-1, block_hash=h, by_request_id=rid, remote=info)
                if ev is not None:
                    out.append(ev)
                    seq = ev.seq
            if tier is None or h not in tier:  # the hash left the tier (or was never known there)
                self._remember_removal(h, seq, batch.seq)
                self.details.pop((medium, h), None)

    def _remember_removal(self, h: bytes, event_seq: int | None, batch_seq: int) -> None:
        removed_at = self.removed_at
        removed_at[h] = (event_seq, batch_seq)
        if len(removed_at) > self.max_removed:
            removed_at.popitem(last=False)

    def _clear(self, medium: str | None, info: RemoteInfo | None, out: list[Event]) -> None:
        if medium is not None:
            medium = tier_of_medium(medium)
        tiers = [medium] if medium is not None else list(self.tiers)
        num = 0
        seq = None
        if info is not None:
            num = sum(self.num_cached_in(m) for m in tiers)
            ev = self.events.emit(CacheReset, num_blocks_cleared=num, remote=info)
            if ev is not None:
                out.append(ev)
                seq = ev.seq
        batch_seq = info.batch_seq if info is not None else (self.last_batch_seq or -1)
        for m in tiers:
            tier = self.tiers.pop(m, None)
            self.num_extra_copies.pop(m, None)
            if tier:
                for h, block in tier.items():
                    self._remember_removal(h, seq, batch_seq)
                    self._departed(h, block.num_announced, block.num_removed)
        if self.details:
            for key in [k for k in self.details if k[0] in tiers]:
                del self.details[key]
        if medium is None:
            self.copies.clear()
        elif self.copies:
            for key in [k for k in self.copies if k[0] == medium]:
                del self.copies[key]
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

