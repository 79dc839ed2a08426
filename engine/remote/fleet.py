"""A fleet: many servers' pools at once, where a prefix lives, and the router's view of a probe.

A `Fleet` maps each server (a name: the pod of an llm-d topic `kv@<pod>@<model>`, or the
name given on the command line) to its pools, one `RemotePool` per data-parallel rank; each
pool holds its tiers and KV cache groups. It answers what an operator of a fleet asks:

    fleet = Fleet()
    fleet.add("pod-a", pool_a0); fleet.add("pod-a", pool_a1); fleet.add("pod-b", pool_b)
    fleet.locate(keys)          # per block of a prefix: every (server, rank, tier) holding it
    fleet.shared_blocks()       # hashes held by more than one server (memory spent twice)
    fleet.pool_rows()           # blocks per (server, rank, tier, KV cache group)
    fleet.summaries()           # per server: ranks, blocks per tier, tenants, block size
    view = fleet.route(keys, block_size=16)             # what a KV-aware router sees
    view.best_server, [s.to_dict() for s in view.servers]

`keys` are a prompt's block hashes as the servers' events name them (`probe.prompt_keys`
computes them with the server's hash scheme; a 32-byte vLLM digest also matches its
8-byte tail). `server_of_topic` reads the pod out of an llm-d topic. The router's view follows llm-d's
longest-prefix scorer (consecutive blocks from block 0 that a server holds, each weighted
by the best tier holding it: GPU 1.0, CPU 0.8 by default, `TierWeights`) and NVIDIA
Dynamo's overlap (matched consecutive blocks per (worker, rank), any tier). Plain values
out, no Qt, no sockets; the pools are read as they are, so call it under the
`Attachment`'s lock when they are live.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from engine.remote.pool import RemotePool
from engine.remote.tiers import CPU, GPU, tier_of_medium, tier_order

DEFAULT_WEIGHTS: tuple[tuple[str, float], ...] = ((GPU, 1.0), (CPU, 0.8))
DEFAULT_OTHER_WEIGHT = 0.5


@dataclass(slots=True, frozen=True)
class TierWeights:
    """How much a block counts in llm-d's score by the best tier holding it. llm-d's
    defaults are GPU 1.0 and CPU 0.8; a tier not listed (storage, a remote pool) weighs
    `other`, so a block found only there still continues the prefix."""

    weights: tuple[tuple[str, float], ...] = DEFAULT_WEIGHTS
    other: float = DEFAULT_OTHER_WEIGHT

    def __post_init__(self) -> None:
        for tier, w in (*self.weights, ("other", self.other)):
            if not isinstance(w, (int, float)) or isinstance(w, bool) or not 0.0 <= w <= 1e6:
                raise ValueError(f"the weight of {tier} must be a number from 0 up, not {w!r}")

    def of(self, tier: str) -> float:
        for name, w in self.weights:
            if name == tier:
                return float(w)
        return float(self.other)

    @classmethod
    def parse(cls, text: str) -> TierWeights:
        """`GPU=1,CPU=0.8,other=0.5` (tiers as any medium names them: `cpu_pinned=0.7` is CPU)."""
        weights: dict[str, float] = dict(DEFAULT_WEIGHTS)
        other = DEFAULT_OTHER_WEIGHT
        for part in filter(None, (p.strip() for p in str(text).split(","))):
            name, sep, value = part.partition("=")
            try:
                w = float(value)
            except ValueError:
                w = float("nan")
            if not sep or not name.strip() or not w == w or w in (float("inf"), float("-inf")) or w < 0:
                raise ValueError(f"{part!r} is not TIER=WEIGHT with a weight of 0 or more, as in GPU=1,CPU=0.8")
            if name.strip().lower() == "other":
                other = w
            else:
                weights[tier_of_medium(name)] = w
        return cls(tuple(weights.items()), other)

    def to_dict(self) -> dict[str, float]:
        return {**{t: float(w) for t, w in self.weights}, "other": float(self.other)}


@dataclass(slots=True, frozen=True)
class Holding:
    """One place a block lives: a server's rank and tier, with its physical copies there."""

    server: str
    rank: int
    tier: str
    num_copies: int

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "rank": self.rank, "tier": self.tier, "copies": self.num_copies}


@dataclass(slots=True, frozen=True)
class BlockLocation:
    """Where block `index` of a prefix lives (empty `holdings`: nowhere in the fleet)."""

    index: int
    key: bytes
    holdings: tuple[Holding, ...]

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h.server for h in self.holdings))

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "hash": self.key.hex(), "held": [h.to_dict() for h in self.holdings]}


@dataclass(slots=True, frozen=True)
class SharedBlock:
    """A hash more than one server holds: the memory a fleet spends on it more than once."""

    key: bytes
    holdings: tuple[Holding, ...]

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h.server for h in self.holdings))

    @property
    def num_copies(self) -> int:
        return sum(h.num_copies for h in self.holdings)

    def to_dict(self) -> dict[str, Any]:
        return {"hash": self.key.hex(), "servers": list(self.servers), "copies": self.num_copies,
                "held": [h.to_dict() for h in self.holdings]}


@dataclass(slots=True, frozen=True)
class ServerScore:
    """One server in the router's view of a probe.

    `matched_blocks`: consecutive blocks from block 0 that any of its ranks holds on any
    tier; `cached_tokens` = matched_blocks * block size; `score`: llm-d's longest-prefix
    score (each matched block weighted by the best tier holding it); `tiers`: that best
    tier per matched block; `overlap_blocks`: Dynamo's overlap, the most consecutive
    blocks a single rank holds; `overlap_by_rank`: (rank, blocks) per rank."""

    server: str
    matched_blocks: int
    cached_tokens: int
    score: float
    overlap_blocks: int
    tiers: tuple[str, ...] = ()
    overlap_by_rank: tuple[tuple[int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "matched_blocks": self.matched_blocks, "cached_tokens": self.cached_tokens,
                "score": round(self.score, 6), "overlap_blocks": self.overlap_blocks}


@dataclass(slots=True, frozen=True)
class RouterView:
    """What a KV-aware router makes of one probe: a score per server (in the fleet's order)
    and the server it picks. `best_server` has the highest score, ties going to the most
    overlap blocks, then to the server listed first (llm-d and Dynamo then break ties by
    load, which the events do not carry); None when no server holds block 0."""

    num_blocks: int
    block_size: int
    servers: tuple[ServerScore, ...]
    best_server: str | None
    weights: TierWeights = field(default_factory=TierWeights)

    def score_of(self, server: str) -> ServerScore:
        for s in self.servers:
            if s.server == server:
                return s
        raise KeyError(server)

    def to_dict(self) -> dict[str, Any]:
        return {"servers": [s.to_dict() for s in self.servers], "best_server": self.best_server}


@dataclass(slots=True, frozen=True)
class ServerSummary:
    """Counts of one server: ranks, physical blocks per tier (all ranks), tenants seen."""

    server: str
    ranks: tuple[int, ...]
    num_cached: int
    tiers: tuple[tuple[str, int], ...]
    tenants: tuple[str, ...]
    block_size: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "ranks": list(self.ranks), "cached": self.num_cached,
                "tiers": dict(self.tiers), "tenants": list(self.tenants), "block_size": self.block_size}


@dataclass(slots=True, frozen=True)
class PoolRow:
    """One pool of the fleet: a server's rank, tier and KV cache group, with its physical
    blocks (each copy counts)."""

    server: str
    rank: int
    tier: str
    group: int
    num_blocks: int

    def to_dict(self) -> dict[str, Any]:
        return {"server": self.server, "rank": self.rank, "tier": self.tier, "group": self.group,
                "blocks": self.num_blocks}


@dataclass(slots=True)
class Fleet:
    """Servers -> pools (one per data-parallel rank), in the order servers were added.

    Not thread-safe: the `Attachment` that feeds the pools holds its lock while it applies
    a batch; read a live fleet under that lock."""

    servers: dict[str, list[RemotePool]] = field(default_factory=dict)

    def add(self, server: str, pool: RemotePool) -> None:
        """Add one rank's pool to `server` (created on first use)."""
        if not isinstance(server, str) or not server:
            raise ValueError("a server needs a name")
        self.servers.setdefault(server, []).append(pool)

    def remove(self, server: str) -> None:
        self.servers.pop(server, None)

    @property
    def server_names(self) -> list[str]:
        return list(self.servers)

    def pools(self, server: str | None = None) -> list[RemotePool]:
        """One server's pools, or every pool of the fleet."""
        if server is not None:
            return list(self.servers.get(server, ()))
        return [p for pools in self.servers.values() for p in pools]

    def server_of(self, pool: RemotePool) -> str | None:
        for name, pools in self.servers.items():
            if any(p is pool for p in pools):
                return name
        return None

    def __len__(self) -> int:
        return len(self.servers)

    # ---- where blocks live ------------------------------------------------------------

    def holdings(self, key: bytes) -> tuple[Holding, ...]:
        """Every (server, rank, tier) holding `key`, GPU first within a rank."""
        out = []
        for name, pools in self.servers.items():
            for pool in pools:
                for tier in pool.tiers_holding(key):
                    out.append(Holding(name, pool.rank, tier, pool.num_copies(pool.held_key(key, tier), tier)))
        return tuple(out)

    def locate(self, keys: Sequence[bytes]) -> list[BlockLocation]:
        """Where each block of a prefix lives, block by block (a block held nowhere has no
        holdings; later blocks are still located, as a router's index holds them too)."""
        return [BlockLocation(i, k, self.holdings(k)) for i, k in enumerate(keys)]

    def shared_blocks(self) -> list[SharedBlock]:
        """Hashes held by more than one server, most copies first (then by hash)."""
        by_key: dict[bytes, list[Holding]] = {}
        for name, pools in self.servers.items():
            for pool in pools:
                for tier, key, copies in pool.held():
                    by_key.setdefault(key, []).append(Holding(name, pool.rank, tier, copies))
        out = [SharedBlock(k, tuple(hs)) for k, hs in by_key.items() if len({h.server for h in hs}) > 1]
        out.sort(key=lambda s: (-s.num_copies, s.key))
        return out

    def pool_rows(self) -> list[PoolRow]:
        """Blocks per (server, rank, tier, group), servers in the fleet's order, GPU first."""
        out = []
        for name, pools in self.servers.items():
            for pool in pools:
                for tier in pool.mediums():
                    for group, n in pool.num_cached_by_group(tier).items():
                        out.append(PoolRow(name, pool.rank, tier, group, n))
        return out

    def summaries(self) -> list[ServerSummary]:
        out = []
        for name, pools in self.servers.items():
            tiers: dict[str, int] = {}
            tenants: set[str] = set()
            for pool in pools:
                for tier in pool.tiers:
                    tiers[tier] = tiers.get(tier, 0) + pool.num_cached_in(tier)
                tenants |= pool.tenants
            ordered = tuple(sorted(((t, n) for t, n in tiers.items() if n), key=lambda tn: tier_order(tn[0])))
            block_size = next((p.block_size for p in pools if p.block_size), None)
            out.append(ServerSummary(name, tuple(p.rank for p in pools), sum(p.num_cached for p in pools), ordered,
                                     tuple(sorted(tenants)), block_size))
        return out

    # ---- the router's view ------------------------------------------------------------

    def route(self, keys: Sequence[bytes], block_size: int, weights: TierWeights | None = None) -> RouterView:
        """Score every server for a prompt whose blocks the servers' events call `keys`."""
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"the block size must be a whole number of at least 1, not {block_size!r}")
        weights = weights or TierWeights()
        scores = [self._score(name, pools, keys, block_size, weights) for name, pools in self.servers.items()]
        best: ServerScore | None = None
        for s in scores:  # first listed wins a tie: strictly greater replaces
            if s.matched_blocks and (best is None or (s.score, s.overlap_blocks) > (best.score, best.overlap_blocks)):
                best = s
        return RouterView(len(keys), block_size, tuple(scores), best.server if best else None, weights)

    @staticmethod
    def _score(name: str, pools: Sequence[RemotePool], keys: Sequence[bytes], block_size: int,
               weights: TierWeights) -> ServerScore:
        tiers: list[str] = []
        score = 0.0
        for key in keys:
            held = {t for pool in pools for t in pool.tiers_holding(key)}
            if not held:
                break
            best = max(held, key=lambda t: (weights.of(t), -tier_order(t)))
            tiers.append(best)
            score += weights.of(best)
        by_rank = []
        for pool in pools:
            n = 0
            for key in keys:
                if not pool.tiers_holding(key):
                    break
                n += 1
            by_rank.append((pool.rank, n))
        overlap = max((n for _, n in by_rank), default=0)
        return ServerScore(name, len(tiers), len(tiers) * block_size, score, overlap, tuple(tiers), tuple(by_rank))


def server_of_topic(topic: str | bytes) -> str | None:
    """The pod in llm-d's topic `kv@<pod-ip:port>@<model>`; None for any other topic."""
    if isinstance(topic, bytes):
        topic = topic.decode("utf-8", "replace")
    parts = topic.split("@", 2)
    if len(parts) == 3 and parts[0] == "kv" and parts[1]:
        return parts[1]
    return None


def fleet_of(pools: Mapping[str, Sequence[RemotePool]] | Sequence[RemotePool]) -> Fleet:
    """A Fleet from {server: pools}, or from a list of pools named by their `server`
    (falling back to their `source`)."""
    fleet = Fleet()
    if isinstance(pools, Mapping):
        for name, ps in pools.items():
            for p in ps:
                fleet.add(name, p)
        return fleet
    for p in pools:
        fleet.add(p.server or p.source, p)
    return fleet

