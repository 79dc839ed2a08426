"""Statistics of an event log: reuse-distance and block-lifetime histograms, hit rate per
tenant / model / server, the top shared prefixes and the "cache killers".

Everything is computed from event dicts (`Event.to_dict()`, the store's rows), so a live
pool, a replay and a recorded attach give the same tables. Each table is (header, rows)
and `to_csv` writes it. Token text needs the prompts' ids and a decode function; without
them the tables show ids. No Qt here. An opened trace's columnar log has the same
statistics from its columns (`engine.analysis.statistics_columnar.compute_columnar`);
this pass over dicts is the reference for it and what a live log uses.
"""

from __future__ import annotations

import csv
import io
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from engine.analysis.filter_language import EventContext

Decode = Callable[[Sequence[int]], str]
TableRows = tuple[tuple[str, ...], list[tuple[Any, ...]]]


@dataclass(slots=True, frozen=True)
class Histogram:
    """Counts in power-of-two bins: [0, 1), [1, 2), [2, 4), [4, 8), ... `num_unbounded`
    counts what has no value (a first access; a block still cached at the end)."""

    unit: str
    edges: tuple[int, ...]  # bin i is [edges[i], edges[i + 1])
    counts: tuple[int, ...]
    num_unbounded: int
    values: Sequence[float] = ()  # a tuple here; a numpy array from statistics_columnar

    @classmethod
    def of(cls, values: Sequence[float], unit: str, num_unbounded: int) -> Histogram:
        top = max(values, default=0)
        edges = [0, 1]
        while edges[-1] <= top:
            edges.append(edges[-1] * 2)
        counts = [0] * (len(edges) - 1)
        for v in values:
            i = 0 if v < 1 else int(v).bit_length()
            counts[i] += 1
        return cls(unit, tuple(edges), tuple(counts), num_unbounded, tuple(values))

    def table(self, unbounded_label: str) -> TableRows:
        rows = [(lo, hi, n) for lo, hi, n in zip(self.edges, self.edges[1:], self.counts)]
        rows.append((unbounded_label, "", self.num_unbounded))
        return (f"from ({self.unit})", f"below ({self.unit})", "count"), rows


@dataclass(slots=True, frozen=True)
class GroupRate:
    group: str
    requests: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def hit_rate(self) -> float:
        return round(self.cached_tokens / self.prompt_tokens, 6) if self.prompt_tokens else 0.0


@dataclass(slots=True, frozen=True)
class SharedPrefix:
    """A chain of cached blocks that `num_requests` requests hit, none of them further."""

    num_blocks: int
    num_tokens: int
    num_requests: int
    tokens_saved: int
    last_hash: str
    token_ids: tuple[int, ...] | None
    text: str | None


@dataclass(slots=True, frozen=True)
class Killer:
    """A token position where `num_requests` requests first diverged from the cache (miss
    reason new_content), with the text most often found there."""

    position: int
    num_requests: int
    share: float  # of all new_content misses
    text: str | None  # the most common text at the position (its token and a few after)
    examples: tuple[str, ...]  # request ids


@dataclass(slots=True)
class Statistics:
    reuse_distance: Histogram
    lifetime: Histogram
    hit_rates: dict[str, list[GroupRate]]  # by "tenant", "model", "server"
    shared_prefixes: list[SharedPrefix]
    killers: list[Killer]
    num_events: int = 0
    notes: list[str] = field(default_factory=list)

    def tables(self) -> dict[str, TableRows]:
        """Every table by name, as (header, rows): what the pane shows and exports."""
        out: dict[str, TableRows] = {
            "reuse_distance": self.reuse_distance.table("first access"),
            "block_lifetime": self.lifetime.table("still cached"),
        }
        for by, groups in self.hit_rates.items():
            out[f"hit_rate_by_{by}"] = ((by, "requests", "prompt tokens", "cached tokens", "hit rate"),
                                        [(g.group, g.requests, g.prompt_tokens, g.cached_tokens, g.hit_rate)
                                         for g in groups])
        out["shared_prefixes"] = (("blocks", "tokens", "requests", "tokens saved", "last hash", "text"),
                                  [(p.num_blocks, p.num_tokens, p.num_requests, p.tokens_saved, p.last_hash,
                                    p.text if p.text is not None else _ids(p.token_ids)) for p in self.shared_prefixes])
        out["cache_killers"] = (("token position", "requests", "share", "text", "examples"),
                                [(k.position, k.num_requests, k.share, k.text or "", " ".join(k.examples))
                                 for k in self.killers])
        return out

    def to_csv(self, name: str) -> str:
        tables = self.tables()
        if name not in tables:
            raise ValueError(f"there is no statistics table {name!r}; the tables are {', '.join(tables)}")
        header, rows = tables[name]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
        return buf.getvalue()


def _ids(ids: Sequence[int] | None) -> str:
    return "" if ids is None else " ".join(map(str, ids))


def _hash_key(h: Any) -> str:
    return h.hex() if isinstance(h, (bytes, bytearray)) else f"{h:x}" if isinstance(h, int) else str(h)


# ---- reuse distance -------------------------------------------------------------------

def reuse_distances(accesses: Sequence[str]) -> tuple[list[int], int]:
    """LRU stack distances: for each access of a hash seen before, how many distinct other
    hashes were accessed since its last access (a pool of more blocks than that would
    still hold it). Returns (distances, first accesses). O(n log n) with a Fenwick tree
    that marks the latest access of every hash."""
    n = len(accesses)
    tree = [0] * (n + 1)

    def add(i: int, v: int) -> None:
        i += 1
        while i <= n:
            tree[i] += v
            i += i & -i

    def prefix(i: int) -> int:  # marks at positions < i
        s = 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    last: dict[str, int] = {}
    out: list[int] = []
    cold = 0
    for pos, h in enumerate(accesses):
        prev = last.get(h)
        if prev is None:
            cold += 1
        else:
            out.append(prefix(pos) - prefix(prev + 1))
            add(prev, -1)
        add(pos, 1)
        last[h] = pos
    return out, cold


# ---- the whole pass -------------------------------------------------------------------

def compute(events: Iterable[Mapping[str, Any]], prompts: Mapping[str, Sequence[int]] | None = None,
            decode: Decode | None = None, block_size: int | None = None, top: int = 20,
            killer_window: int = 4) -> Statistics:
    """The statistics of an event log. `prompts` gives each request id's prompt token ids
    for the killers' text (else they are read back from the stored blocks); `decode` turns
    ids into text; `block_size` is inferred from stored blocks when not given."""
    events = list(events)
    ctx = EventContext.from_events(events)
    prompts = prompts or {}
    accesses: list[str] = []
    tokens_of: dict[str, tuple[int, ...]] = {}
    stored_at: dict[str, deque[float]] = defaultdict(deque)
    lifetimes: list[float] = []
    has_requests = any(e.get("kind") == "request_started" for e in events)
    clock = 0  # requests started so far, or the event time on a stream without requests
    groups: dict[str, dict[str, list[int]]] = {"tenant": defaultdict(lambda: [0, 0, 0]),
                                               "model": defaultdict(lambda: [0, 0, 0]),
                                               "server": defaultdict(lambda: [0, 0, 0])}
    hit_chains: list[tuple[str, tuple[str, ...]]] = []
    divergences: list[tuple[str, int]] = []
    lookup_hashes: dict[str, set[str]] = {}
    for e in events:
        kind = e.get("kind")
        now = clock if has_requests else float((e.get("remote") or {}).get("batch_time") or e.get("time") or 0.0)
        if kind == "request_started":
            clock += 1
        elif kind == "lookup":
            rid = str(e.get("request_id"))
            hashes = [_hash_key(h) for h in e.get("block_hashes") or ()]
            accesses.extend(hashes)
            lookup_hashes[rid] = set(hashes)
            num_hit = int(e.get("num_hit_blocks") or 0)
            if num_hit:
                hit_chains.append((rid, tuple(hashes[:num_hit])))
            prompt, cached = int(e.get("num_prompt_tokens") or 0), int(e.get("num_cached_tokens") or 0)
            keys = {"tenant": ctx.tenants.get(rid, e.get("salt")) or "(none)",
                    "model": ctx.models.get(rid, e.get("model")) or "(none)",
                    "server": (e.get("remote") or {}).get("source") or e.get("server") or "local"}
            for by, key in keys.items():
                g = groups[by][str(key)]
                g[0] += 1
                g[1] += prompt
                g[2] += cached
            miss = e.get("miss") or {}
            if miss.get("reason") == "new_content" and miss.get("divergence_token") is not None:
                divergences.append((rid, int(miss["divergence_token"])))
        elif kind == "block_stored":
            h = _hash_key(e.get("block_hash"))
            if e.get("token_ids"):
                tokens_of.setdefault(h, tuple(e["token_ids"]))
                block_size = block_size or len(e["token_ids"])
            rid = str(e.get("request_id"))
            if h not in lookup_hashes.get(rid, ()):  # a block filled while decoding: its first access
                accesses.append(h)
            stored_at[h].append(now)
        elif kind == "block_evicted":
            h = _hash_key(e.get("block_hash"))
            if stored_at.get(h):
                lifetimes.append(now - stored_at[h].popleft())
        elif kind == "cache_reset":
            for h, times in stored_at.items():
                lifetimes.extend(now - t for t in times)
            stored_at.clear()
    # A prompt not given is what its lookup's full blocks held (enough for a divergence,
    # which is always inside a full block that the request then stored).
    known = dict(prompts)
    for e in events:
        if e.get("kind") == "lookup" and str(e.get("request_id")) not in known:
            hashes = [_hash_key(h) for h in e.get("block_hashes") or ()]
            if hashes and all(h in tokens_of for h in hashes):
                known[str(e.get("request_id"))] = tuple(t for h in hashes for t in tokens_of[h])
    prompts = known
    distances, cold = reuse_distances(accesses)
    still = sum(len(v) for v in stored_at.values())
    unit = "requests" if has_requests else "seconds"
    rates = {by: sorted((GroupRate(k, *v) for k, v in g.items()), key=lambda r: (-r.prompt_tokens, r.group))
             for by, g in groups.items()}
    notes = []
    if not has_requests:
        notes.append("the log has no requests (a recorded attach): lifetimes are in seconds and there are no hit "
                     "rates, shared prefixes or killers")
    return Statistics(Histogram.of(distances, "blocks", cold), Histogram.of(lifetimes, unit, still), rates,
                      shared_prefixes(hit_chains, tokens_of, block_size, decode, top),
                      cache_killers(divergences, prompts, decode, top, killer_window), len(events), notes)


def shared_prefixes(hit_chains: Sequence[tuple[str, tuple[str, ...]]], tokens_of: Mapping[str, tuple[int, ...]],
                    block_size: int | None, decode: Decode | None, top: int) -> list[SharedPrefix]:
    """The chains requests hit, each as long as the requests that reach it go together: a
    chain is listed when fewer requests reach any one block after it. Ranked by tokens saved."""
    count: Counter[tuple[str, ...]] = Counter()
    children: dict[tuple[str, ...], set[tuple[str, ...]]] = defaultdict(set)
    for _, chain in hit_chains:
        for k in range(1, len(chain) + 1):
            count[chain[:k]] += 1
            if k > 1:
                children[chain[:k - 1]].add(chain[:k])
    out = []
    for node, n in count.items():
        if any(count[c] == n for c in children.get(node, ())):
            continue  # every request that reaches this node goes on to the same next block
        ids = None
        if all(h in tokens_of for h in node):
            ids = tuple(t for h in node for t in tokens_of[h])
        size = block_size or 0
        num_tokens = len(ids) if ids is not None else len(node) * size
        out.append(SharedPrefix(len(node), num_tokens, n, n * num_tokens, node[-1],
                                ids, decode(ids) if decode is not None and ids is not None else None))
    out.sort(key=lambda p: (-p.tokens_saved, -p.num_blocks, p.last_hash))
    return out[:top]


def cache_killers(divergences: Sequence[tuple[str, int]], prompts: Mapping[str, Sequence[int]],
                  decode: Decode | None, top: int, window: int) -> list[Killer]:
    """Token positions where requests most often first diverge from what is cached."""
    by_pos: dict[int, list[str]] = defaultdict(list)
    for rid, pos in divergences:
        by_pos[pos].append(rid)
    total = len(divergences)
    out = []
    for pos, rids in by_pos.items():
        texts: Counter[str] = Counter()
        for rid in rids:
            ids = prompts.get(rid)
            if ids is not None and pos < len(ids):
                piece = list(ids[pos:pos + window])
                texts[decode(piece) if decode is not None else _ids(piece)] += 1
        text = texts.most_common(1)[0][0] if texts else None
        out.append(Killer(pos, len(rids), round(len(rids) / total, 6), text, tuple(rids[:5])))
    out.sort(key=lambda k: (-k.num_requests, k.position))
    return out[:top]
