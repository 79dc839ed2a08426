"""What the app's fleet views show, as plain values: servers side by side, every block of the
fleet in one table, the blocks held twice, where a prefix lives, and the router's view.

`engine.remote.fleet.Fleet` is the model (servers -> pools, scores); this module reads it
once, under the attachment's lock, into a `FleetSnapshot` the GUI thread can draw without
touching live pools. It also reads a servers list (`parse_servers`: one `name endpoint
[replay]` per line), names an attachment's pools by server (`fleet_of_attachment`), and
rebuilds a recorded capture's pools from its converted events (`fleet_from_events`), so a
fleet opens offline. No Qt, no sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from engine.core.errors import InputError
from engine.remote.fleet import Fleet, RouterView, SharedBlock, TierWeights, server_of_topic
from engine.remote.pool import RemoteBlock, RemotePool
from engine.remote.subscriber import StreamHealth, check_endpoint, total_health
from engine.remote.tiers import tier_order
from engine.remote.wire import VllmBatch, VllmEvent

MAX_SERVERS_LINES = 4096
DEFAULT_MAX_ROWS = 200_000  # the combined table's rows; a fleet past this is cut (and says so)


# ---- a servers list ---------------------------------------------------------------------

@dataclass(slots=True, frozen=True)
class ServerEntry:
    """One line of a servers list: a name (may be ""), its event endpoint, its replay endpoint."""

    name: str
    endpoint: str
    replay_endpoint: str | None = None


def _is_endpoint(word: str) -> bool:
    return word.startswith(("tcp://", "ipc://", "inproc://"))


def parse_servers(text: str, source: str = "the servers list") -> list[ServerEntry]:
    """Servers from `text`, one per line: `name endpoint [replay]` or `endpoint [replay]`
    (blank lines and `#` comments skipped). InputError names the line of a bad entry, a
    repeated name or endpoint."""
    out: list[ServerEntry] = []
    names: set[str] = set()
    endpoints: set[str] = set()
    lines = str(text).splitlines()
    if len(lines) > MAX_SERVERS_LINES:
        raise InputError(f"{source} has {len(lines):,} lines; at most {MAX_SERVERS_LINES:,} servers are read")
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        name = ""
        if not _is_endpoint(words[0]):
            name, words = words[0], words[1:]
        if not words or len(words) > 2 or not all(_is_endpoint(w) for w in words):
            raise InputError(f"line {number} of {source} is not 'name endpoint [replay]', "
                             "as in pod-a tcp://10.0.0.11:5557 tcp://10.0.0.11:5558")
        try:
            endpoint = check_endpoint(words[0])
            replay = check_endpoint(words[1]) if len(words) == 2 else None
        except InputError as exc:
            raise InputError(f"line {number} of {source}: {exc}") from None
        if name and name in names:
            raise InputError(f"line {number} of {source} names the server {name!r} a second time")
        if endpoint in endpoints:
            raise InputError(f"line {number} of {source} lists {endpoint} a second time")
        names.add(name)
        endpoints.add(endpoint)
        out.append(ServerEntry(name, endpoint, replay))
    return out


def format_servers(entries: Iterable[ServerEntry]) -> str:
    """The inverse of `parse_servers` (what the attach dialog shows)."""
    return "\n".join(" ".join(w for w in (e.name, e.endpoint, e.replay_endpoint or "") if w) for e in entries)


# ---- naming an attachment's pools -------------------------------------------------------

def server_name(pool: RemotePool, names: Mapping[str, str] | None = None) -> str:
    """The fleet's name for `pool`: the engine's (`pool.server`, an llm-d pod), else the name
    the servers list gave its stream (`names[pool.source]`), else the pod of a topic-like
    source, else its source (the endpoint)."""
    if pool.server:
        return pool.server
    if names:
        name = names.get(pool.source)
        if name:
            return name
    return server_of_topic(pool.source) or pool.source


def fleet_of_attachment(attachment: Any, names: Mapping[str, str] | None = None) -> Fleet:
    """The attachment's pools as a Fleet (call under `attachment.lock`): the engine's own
    `Attachment.fleet()` (servers named by the options or by llm-d topics), else its pools
    named by `server_name`."""
    own = getattr(attachment, "fleet", None)
    if callable(own) and not names:
        return own()
    fleet = Fleet()
    for pool in attachment.pools:
        fleet.add(server_name(pool, names), pool)
    return fleet


# ---- the snapshot the views draw --------------------------------------------------------

@dataclass(slots=True, frozen=True)
class TierCount:
    """A tier of one server: physical blocks, hashes, placeholders, the raw media names seen."""

    tier: str
    num_blocks: int
    num_hashes: int
    num_without_tokens: int
    media: tuple[tuple[str, int], ...]  # raw medium name -> blocks announced under it

    @property
    def raw_names(self) -> str:
        return ", ".join(name for name, _n in self.media) or self.tier


@dataclass(slots=True, frozen=True)
class ServerRow:
    """One server side by side with the others."""

    server: str
    index: int  # its place in the fleet: the colour the views give it
    ranks: tuple[int, ...]
    num_blocks: int  # physical blocks on every tier
    num_hashes: int  # distinct hashes
    tiers: tuple[TierCount, ...]
    tenants: tuple[str, ...]
    block_size: int | None
    health: StreamHealth  # its streams summed (`total_health`; a recorded fleet: the pools' batches)
    last_seen: float | None = None  # its last batch's server time, seconds since the epoch
    num_shared: int = 0  # hashes another server holds too

    def blocks_in(self, tier: str) -> int:
        return next((t.num_blocks for t in self.tiers if t.tier == tier), 0)


@dataclass(slots=True, frozen=True)
class FleetBlock:
    """One hash on one server's rank and tier, for the combined block table."""

    server: str
    index: int  # the server's colour
    rank: int
    tier: str
    key: bytes
    parent: bytes | None
    num_copies: int
    tenant: str | None
    num_tokens: int
    stored_seq: int
    stored_time: float
    num_servers: int  # servers holding this hash (more than 1: memory spent twice)


@dataclass(slots=True, frozen=True)
class FleetSnapshot:
    """Everything the fleet views draw, read at one moment."""

    servers: tuple[ServerRow, ...] = ()
    blocks: tuple[FleetBlock, ...] = ()
    num_blocks: int = 0  # rows the fleet has (more than `blocks` when cut)
    shared: tuple[SharedBlock, ...] = ()
    version: int = 0

    @property
    def server_names(self) -> list[str]:
        return [s.server for s in self.servers]

    def server(self, name: str) -> ServerRow:
        for s in self.servers:
            if s.server == name:
                return s
        raise KeyError(name)

    @property
    def num_duplicate_copies(self) -> int:
        """Physical copies of shared hashes beyond one per hash: the memory spent twice."""
        return sum(s.num_copies - 1 for s in self.shared)

    @property
    def is_cut(self) -> bool:
        return self.num_blocks > len(self.blocks)


def _health_of(name: str, pools: Sequence[RemotePool], health: Mapping[str, StreamHealth]) -> StreamHealth:
    """The server's streams as one (`total_health`); without streams (a recorded fleet), the
    batches its pools took."""
    streams = [health[p.source] for p in pools if p.source in health]
    total = total_health(streams, name)
    if not streams:
        total.batches = sum(p.num_batches for p in pools)
    return total


def _parent_key(block: RemoteBlock) -> bytes | None:
    return block.parent_hash


def _copies(pool: RemotePool, tier: str, key: bytes) -> int:
    """`pool.num_copies(key, tier)` for a held key and a normalized tier, without the
    medium lookup: the snapshot asks it once per block of the fleet."""
    counts = pool.copies.get((tier, key))
    return 1 if counts is None else sum(counts)


def snapshot(fleet: Fleet, health: Iterable[StreamHealth] = (), max_rows: int = DEFAULT_MAX_ROWS,
             version: int = 0) -> FleetSnapshot:
    """Read `fleet` into plain values (under the attachment's lock when live). `health`:
    every stream's, matched to pools by source; a recorded fleet has none, so batches are
    the pools' own counts."""
    by_source = {h.source: h for h in health}
    shared = fleet.shared_blocks()
    servers_of: dict[bytes, int] = {s.key: len(s.servers) for s in shared}
    rows: list[ServerRow] = []
    blocks: list[FleetBlock] = []
    num_blocks = 0
    for index, (name, pools) in enumerate(fleet.servers.items()):
        tiers: dict[str, list[int]] = {}
        media: dict[str, dict[str, int]] = {}
        hashes: set[bytes] = set()
        tenants: set[str] = set()
        for pool in pools:
            tenants |= pool.tenants
            for tier, held in pool.tiers.items():
                counts = tiers.setdefault(tier, [0, 0, 0])
                counts[0] += pool.num_cached_in(tier)
                counts[1] += len(held)
                counts[2] += pool.num_without_tokens(tier)
                hashes.update(held)
                for raw, n in pool.media.get(tier, {}).items():
                    media.setdefault(tier, {})[raw] = media.get(tier, {}).get(raw, 0) + n
                for key, block in held.items():
                    num_blocks += 1
                    if len(blocks) < max_rows:
                        blocks.append(FleetBlock(name, index, pool.rank, tier, key, _parent_key(block),
                                                 _copies(pool, tier, key), block.tenant, len(block.tokens) // 4,
                                                 block.stored_seq, block.stored_time, servers_of.get(key, 1)))
        counts_ = tuple(TierCount(t, c[0], c[1], c[2], tuple(sorted(media.get(t, {}).items())))
                        for t, c in sorted(tiers.items(), key=lambda tc: tier_order(tc[0])) if c[1])
        seen = [p.last_batch_time for p in pools if p.last_batch_time is not None]
        rows.append(ServerRow(name, index, tuple(p.rank for p in pools), sum(t.num_blocks for t in counts_),
                              len(hashes), counts_, tuple(sorted(tenants)),
                              next((p.block_size for p in pools if p.block_size), None),
                              _health_of(name, pools, by_source), max(seen) if seen else None, len(hashes & servers_of.keys())))
    return FleetSnapshot(tuple(rows), tuple(blocks), num_blocks, tuple(shared), version)


# ---- where a prefix lives ---------------------------------------------------------------

def prefix_of(fleet: Fleet, server: str, key: bytes, max_blocks: int = 4096) -> list[bytes]:
    """The chain of hashes from block 0 to `key` as `server`'s pools know it (parents
    followed while a pool tracks them), root first. A removed parent ends the chain there."""
    chain = [key]
    pools = fleet.pools(server) or fleet.pools()
    seen = {key}
    while len(chain) < max_blocks:
        parent = None
        for pool in pools:
            hit = pool.find(chain[-1])
            if hit is not None:
                parent = hit[1].parent_hash
                break
        if parent is None or parent in seen:
            break
        seen.add(parent)
        chain.append(parent)
    return chain[::-1]


@dataclass(slots=True, frozen=True)
class PrefixPlace:
    """One block of a prefix across the fleet: the tiers each server holds it on."""

    index: int
    key: bytes
    tiers: tuple[tuple[str, ...], ...]  # per server (in the fleet's order): the tiers holding it

    @property
    def num_servers(self) -> int:
        return sum(1 for t in self.tiers if t)


def locate(fleet: Fleet, keys: Sequence[bytes]) -> list[PrefixPlace]:
    """Per block of a prefix, per server, the tiers holding it (GPU first). A block's `key`
    is the one the servers hold it under (a vLLM digest's 8-byte tail when their events
    carry integer hashes), so it reads as the block table writes it."""
    names = fleet.server_names
    pools = fleet.pools()
    out = []
    for loc in fleet.locate(keys):
        held = {p.held_key(loc.key, t) for p in pools for t in p.tiers_holding(loc.key)}
        key = next(iter(held)) if len(held) == 1 else loc.key
        per: dict[str, list[str]] = {n: [] for n in names}
        for h in loc.holdings:
            if h.tier not in per[h.server]:
                per[h.server].append(h.tier)
        out.append(PrefixPlace(loc.index, key,
                               tuple(tuple(sorted(per[n], key=tier_order)) for n in names)))
    return out


def route(fleet: Fleet, keys: Sequence[bytes], block_size: int, weights: TierWeights | None = None) -> RouterView:
    """The router's view (`Fleet.route`) with the fleet's block size when none is given."""
    if not block_size:
        block_size = next((p.block_size for p in fleet.pools() if p.block_size), None) or 16
    return fleet.route(list(keys), block_size, weights)


# ---- a recorded capture -----------------------------------------------------------------

@dataclass(slots=True)
class _Stream:
    pool: RemotePool
    seq: int | None = None
    ts: float = 0.0
    events: list[VllmEvent] = field(default_factory=list)


def fleet_from_events(events: Iterable[Any], names: Mapping[str, str] | None = None) -> Fleet:
    """The pools a recorded attach ended with, rebuilt from its converted events (each
    carries its `RemoteInfo`: source, rank, batch, tier): one pool per (source, rank),
    named by `server_name`. A run of stores of one request chained by parent is one
    BlockStored again, as the server sent it, its tenant the event's salt; removals follow
    in order. A CacheReset clears every tier of its pool (the converted event does not say
    whether the server cleared one medium or all); the raw media names are the tiers'."""
    streams: dict[tuple[str, int], _Stream] = {}
    order: list[_Stream] = []

    def flush(s: _Stream) -> None:
        if s.events:
            s.pool.apply(VllmBatch(s.seq if s.seq is not None else -1, s.ts, tuple(s.events)))
            s.events = []

    last_request: dict[int, tuple[str, bytes]] = {}
    for e in events:
        info = getattr(e, "remote", None)
        if info is None:
            continue
        key = (info.source, info.rank)
        s = streams.get(key)
        if s is None:
            # A server of several ranks names its streams "<server> rank <r>" (AttachOptions.streams).
            suffix = f" rank {info.rank}"
            server = info.source[:-len(suffix)] if info.source.endswith(suffix) else ""
            s = streams[key] = _Stream(RemotePool(info.source, info.rank, server=server))
            order.append(s)
        if s.seq != info.batch_seq:
            flush(s)
            s.seq, s.ts = info.batch_seq, info.batch_time
            last_request.pop(id(s), None)
        medium = info.medium
        if e.kind == "block_stored":
            prev = last_request.get(id(s))
            ev = s.events[-1] if s.events else None
            if ev is not None and prev == (e.request_id, e.parent_hash) and ev.kind == "BlockStored" \
                    and ev.medium == medium and ev.group_idx == info.group_idx:
                s.events[-1] = VllmEvent("BlockStored", (*ev.block_hashes, e.block_hash), ev.parent_block_hash,
                                         (*ev.token_ids, *e.token_ids), ev.block_size, ev.lora_id, medium,
                                         ev.lora_name, None, ev.group_idx, ev.kv_cache_spec_kind, ev.locality,
                                         ev.session_id, cache_salt=ev.cache_salt if ev.cache_salt == e.salt else e.salt)
            else:
                s.events.append(VllmEvent("BlockStored", (e.block_hash,), e.parent_hash, tuple(e.token_ids),
                                          info.block_size or len(e.token_ids), info.lora_id, medium,
                                          info.lora_name, None, info.group_idx, info.kv_cache_spec_kind,
                                          info.locality, info.session_id, cache_salt=e.salt))
            last_request[id(s)] = (e.request_id, e.block_hash)
        elif e.kind == "block_evicted":
            s.events.append(VllmEvent("BlockRemoved", (e.block_hash,), medium=medium, group_idx=info.group_idx))
            last_request.pop(id(s), None)
        elif e.kind == "cache_reset":
            flush(s)
            s.pool.reset(info.batch_seq, info.batch_time)
            last_request.pop(id(s), None)
    for s in order:
        flush(s)
    fleet = Fleet()
    for s in order:
        fleet.add(server_name(s.pool, names), s.pool)
    return fleet

