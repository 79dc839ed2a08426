"""The kv-cache-tester hit rates, by their published definition and by the engine.

`published_rates` computes the two columns of kv-cache-tester's `cache_hit_rates.txt`
straight from a trace: per model (a cache is keyed to its model), the first request of
each model and every sub-agent request left out, the sum of hit blocks over the sum of
prompt blocks; `Same-Model%` counts a request's blocks that match the previous request of
its model from block 0, `Cumulative%` those that any earlier request of its model held.
`replay_weka` runs the same requests through the engine: unbounded, the blocks it holds
equal `Cumulative%` exactly; bounded, it shows what capacity costs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from engine.core.blocks import cdiv
from engine.core.replay import ReplayConfig, replay
from engine.core.served import ServedRequest
from engine.store.weka import WekaRequest, WekaTrace, merged_requests, to_trace_requests

HIT_RATE_NOTE = ("the engine's hit rate counts tokens: a prompt's partial last block is never a hit, and a prompt "
                 "that fills its blocks exactly has its last block recomputed (a hit stops one token short of the "
                 "prompt, as in vLLM, so the model has logits to sample from), so it is a little lower than the "
                 "blocks held")


@dataclass(slots=True, frozen=True)
class PublishedRates:
    """One row of kv-cache-tester's table for one conversation."""

    trace: str
    requests: int  # top-level requests (the table's count)
    counted_requests: int  # those after the first of their model
    prompt_blocks: int
    same_model_blocks: int
    cumulative_blocks: int

    @property
    def same_model_pct(self) -> float:
        return round(100 * self.same_model_blocks / self.prompt_blocks, 1) if self.prompt_blocks else 0.0

    @property
    def cumulative_pct(self) -> float:
        return round(100 * self.cumulative_blocks / self.prompt_blocks, 1) if self.prompt_blocks else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["same_model_pct"] = self.same_model_pct
        out["cumulative_pct"] = self.cumulative_pct
        return out


def _leading(ids: Sequence[int], held: Any) -> int:
    n = 0
    for x in ids:
        if x not in held:
            break
        n += 1
    return n


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def counted_ids(trace: WekaTrace) -> set[str]:
    """The ids of the requests the table counts: top level, after the first of their model."""
    seen: set[str] = set()
    out: set[str] = set()
    for r in trace.top_level:
        if r.model in seen:
            out.add(r.id)
        seen.add(r.model)
    return out


def published_rates(trace: WekaTrace) -> PublishedRates:
    """`Same-Model%` and `Cumulative%` of one conversation, by the table's definition."""
    previous: dict[str, tuple[int, ...]] = {}
    held: dict[str, set[int]] = {}
    prompt = same = cumulative = counted = 0
    top = trace.top_level
    for r in top:
        if r.model in previous:
            counted += 1
            prompt += len(r.hash_ids)
            same += _common(r.hash_ids, previous[r.model])
            cumulative += _leading(r.hash_ids, held[r.model])
        previous[r.model] = r.hash_ids
        held.setdefault(r.model, set()).update(r.hash_ids)
    return PublishedRates(trace.id, len(top), counted, prompt, same, cumulative)


# ---------------------------------------------------------------------------- the engine's view
@dataclass(slots=True)
class WekaRow:
    """One request as the engine served it, with the blocks it found held."""

    id: str
    stream: str
    subagent: bool
    model: str
    time: float
    prompt_tokens: int
    prompt_blocks: int
    held_blocks: int  # leading blocks the cache held (the hit before vLLM's last-token cap)
    cached_tokens: int
    miss_reason: str | None
    counted: bool  # one of the table's requests
    refused: bool = False


@dataclass(slots=True)
class WekaReplay:
    """A replay of conversations: its settings, per-request rows and per-trace totals."""

    capacity_blocks: int
    bounded: bool
    include_subagents: bool
    keyed_by_model: bool
    block_size: int
    rows: list[WekaRow] = field(default_factory=list)
    hit_rate: float = 0.0  # the engine's: cached over prompt tokens, every request served

    def held_pct(self, only: set[str] | None = None) -> float:
        """Blocks held over prompt blocks of the table's requests (of `only`, if given)."""
        rows = [r for r in self.rows if r.counted and (only is None or r.id in only)]
        blocks = sum(r.prompt_blocks for r in rows)
        return round(100 * sum(r.held_blocks for r in rows) / blocks, 1) if blocks else 0.0

    def counted_hit_rate(self) -> float:
        rows = [r for r in self.rows if r.counted and not r.refused]
        tokens = sum(r.prompt_tokens for r in rows)
        return round(100 * sum(r.cached_tokens for r in rows) / tokens, 1) if tokens else 0.0

    def num_recomputed_last_blocks(self) -> int:
        return sum(1 for r in self.rows if r.counted and r.held_blocks * self.block_size == r.prompt_tokens
                   and r.held_blocks > 0)


def unbounded_capacity(requests: Sequence[WekaRequest], block_size: int, concurrency: int = 1,
                       keyed_by_model: bool = True) -> int:
    """A pool that never evicts: one block per distinct chain of ids (per model), plus room
    for the `concurrency` largest requests' uncached blocks."""
    keys: dict[tuple[Any, int], int] = {}
    for r in requests:
        # Keyed by conversation too: an upper bound whatever the scope.
        parent: Any = ("root", r.model if keyed_by_model else None, r.conversation)
        for x in r.hash_ids:
            parent = keys.setdefault((parent, x), len(keys))
    largest = sorted((cdiv(r.input_length + r.output_length, block_size) for r in requests), reverse=True)
    return max(1, len(keys) + sum(largest[:concurrency]))


def replay_weka(traces: Sequence[WekaTrace], capacity_blocks: int | None = None, include_subagents: bool = True,
                keyed_by_model: bool = True, concurrency: int = 1, seed: int | None = 0,
                hash: str = "sha256", events: Any = None) -> WekaReplay:
    """Replay conversations (several: concurrent users in time order) on one engine."""
    block_size = traces[0].block_size
    requests = merged_requests(traces, include_subagents)
    bounded = capacity_blocks is not None
    capacity = capacity_blocks if bounded else unbounded_capacity(requests, block_size, concurrency, keyed_by_model)
    scopes = {t.id: t.hash_id_scope for t in traces}
    config = ReplayConfig(block_size=block_size, capacity_blocks=capacity, seed=seed, hash=hash,
                          concurrency=concurrency)
    result = replay(to_trace_requests(requests, scopes, keyed_by_model), config, events,
                    source=traces[0].path if len(traces) == 1 else "the folder")
    counted: set[str] = set()
    for t in traces:
        counted |= counted_ids(t)
    out = WekaReplay(capacity, bounded, include_subagents, keyed_by_model, block_size,
                     hit_rate=round(100 * result.totals.hit_rate, 1))
    for r, served in zip(requests, result.requests):
        out.rows.append(WekaRow(r.id, r.stream, r.is_subagent, r.model, r.time, r.input_length,
                                len(r.hash_ids), held_blocks(served, len(r.hash_ids), block_size),
                                served.cached_tokens, served.miss_reason, r.id in counted, served.refused))
    return out


def held_blocks(served: ServedRequest, num_ids: int, block_size: int) -> int:
    """Leading blocks the cache held for a request. The engine's hit stops a token short of
    the prompt; when that cap dropped a held block (a block-aligned prompt), it is counted."""
    if served.refused:
        return 0
    hit = served.cached_tokens // block_size
    if served.miss_reason == "last_token" and hit < min(num_ids, served.prompt_tokens // block_size):
        return hit + 1
    return hit


# ---------------------------------------------------------------------------- the summary
def weka_summary(traces: Sequence[WekaTrace], capacity_blocks: int | None = None, concurrency: int = 1,
                 shared_across_models: bool = False, seed: int | None = 0, hash: str = "sha256",
                 events: Any = None) -> dict[str, Any]:
    """The summary `replay` prints for kv-cache-tester traces: per conversation the table's
    two columns, the blocks an unbounded cache holds and the engine's hit rate; with a
    bounded pool, the same with sub-agents replayed and not; per-request rows."""
    keyed = not shared_across_models
    unbounded = replay_weka(traces, None, True, keyed, concurrency, seed, hash,
                            events if capacity_blocks is None else None)
    bounded_with = bounded_without = None
    if capacity_blocks is not None:
        bounded_with = replay_weka(traces, capacity_blocks, True, keyed, concurrency, seed, hash, events)
        bounded_without = replay_weka(traces, capacity_blocks, False, keyed, concurrency, seed, hash)
    per_trace = []
    for t in traces:
        ids = counted_ids(t)
        rates = published_rates(t)
        row: dict[str, Any] = {
            "trace": t.id, "requests": rates.requests, "subagent_requests": sum(1 for r in t.requests if r.agent),
            "models": sorted({r.model for r in t.requests}),
            "same_model_pct": rates.same_model_pct, "cumulative_pct": rates.cumulative_pct,
            "unbounded_held_pct": unbounded.held_pct(ids),
            "engine_hit_rate_pct": _hit_rate(unbounded, ids),
            "recomputed_last_blocks": sum(1 for r in unbounded.rows if r.id in ids and r.held_blocks > 0
                                          and r.held_blocks * t.block_size == r.prompt_tokens),
            "counted_requests": rates.counted_requests,
        }
        if bounded_with is not None and bounded_without is not None:
            row["bounded_held_pct_with_subagents"] = bounded_with.held_pct(ids)
            row["bounded_held_pct_without_subagents"] = bounded_without.held_pct(ids)
        per_trace.append(row)
    shown = bounded_with if bounded_with is not None else unbounded
    return {
        "format": "weka",
        "config": {"block_size": unbounded.block_size, "capacity_blocks": capacity_blocks,
                   "unbounded_capacity_blocks": unbounded.capacity_blocks, "concurrency": concurrency,
                   "keyed_by_model": keyed, "seed": seed, "hash": hash,
                   "traces": [t.path for t in traces]},
        "traces": per_trace,
        "totals": {
            "requests": len(shown.rows), "subagent_requests": sum(1 for r in shown.rows if r.subagent),
            "prompt_tokens": sum(r.prompt_tokens for r in shown.rows if not r.refused),
            "cached_tokens": sum(r.cached_tokens for r in shown.rows),
            "hit_rate": shown.hit_rate, "refused_requests": sum(1 for r in shown.rows if r.refused),
            "unbounded_held_pct": unbounded.held_pct(),
        },
        "note": HIT_RATE_NOTE,
        "requests": [asdict(r) for r in shown.rows],
    }


def _hit_rate(rep: WekaReplay, ids: set[str]) -> float:
    rows = [r for r in rep.rows if r.id in ids and not r.refused]
    tokens = sum(r.prompt_tokens for r in rows)
    return round(100 * sum(r.cached_tokens for r in rows) / tokens, 1) if tokens else 0.0


def models_of(requests: Iterable[WekaRequest]) -> list[str]:
    return sorted({r.model for r in requests})
