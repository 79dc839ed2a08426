"""What-if sweeps: the hit rate of a trace against block size and against pool capacity.

Each point is a fresh no-model replay (`engine.core.replay`). A request the pool is too small
to hold is refused; a sweep counts its prompt tokens as missed (a refused request reuses
nothing), so a smaller pool never looks better by serving fewer requests. Also here: turning
conversation files into token-level requests (one per user turn) so a chat can be swept
like a trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from engine.core.errors import InputError
from engine.core.blocks import cdiv
from engine.core.replay import ReplayConfig, replay
from engine.core.sniff import WEKA_FORMAT, file_kind, is_request_trace
from engine.core.trace import MOONCAKE_BLOCK_SIZE, TraceRequest, load_trace
from engine.analysis.conversations import load_conversation_file, messages_of
from engine.model.chat import render_chat

DEFAULT_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CAPACITIES = (64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(slots=True, frozen=True)
class SweepPoint:
    """One replay of a sweep.

    `hit_rate` is cached tokens over the prompt tokens of every request, refused ones
    included (they count as misses); `served_hit_rate` is over served requests only.
    """

    series: str  # "block_size" (capacity held in tokens) or "capacity" (block size held)
    block_size: int
    capacity_blocks: int
    hit_rate: float
    cached_tokens: int
    prompt_tokens: int  # every request's, refused ones included
    evicted_blocks: int
    refused_requests: int
    refused_tokens: int  # prompt tokens of the refused requests, all counted as missed
    served_hit_rate: float

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


# ---- inputs -------------------------------------------------------------------------------

def conversation_trace(conversations: Iterable[Any], tokenizer: Any) -> list[TraceRequest]:
    """One token-level request per user turn; the recorded assistant reply is its output."""
    out: list[TraceRequest] = []
    for ci, conv in enumerate(conversations):
        msgs = messages_of(conv)
        for k, m in enumerate(msgs):
            if m["role"] != "user":
                continue
            prompt = render_chat(tokenizer, msgs[:k + 1])
            output: list[int] = []
            if k + 1 < len(msgs) and msgs[k + 1]["role"] == "assistant":
                full = render_chat(tokenizer, msgs[:k + 2], add_generation_prompt=False)
                if full[:len(prompt)] == prompt:
                    output = full[len(prompt):]
                else:
                    output = tokenizer(msgs[k + 1]["content"], add_special_tokens=False)["input_ids"]
            out.append(TraceRequest(len(out), 0, f"{ci}/{k}", None, tuple(prompt), tuple(output), None,
                                    len(prompt), len(output)))
    if not out:
        raise InputError("the conversations hold no user message, so there is no request to replay")
    return out


def load_sweep_requests(path: str | Path, tokenizer_loader: Callable[[], Any] | None = None) -> tuple[list[TraceRequest], str]:
    """The requests of a trace or conversation file and its kind: tokens, mooncake, weka (a
    kv-cache-tester file or a folder of them: concurrent users in time order, the cache keyed
    by model) or conversation."""
    if Path(path).is_dir() or file_kind(path) == WEKA_FORMAT:
        from engine.store.weka import load_weka_requests

        return load_weka_requests(path), WEKA_FORMAT
    if is_request_trace(path):
        reqs = load_trace(path)
        return reqs, ("mooncake" if reqs[0].is_block_level else "tokens")
    convs = load_conversation_file(path)
    if tokenizer_loader is None:
        from engine.model.loader import load_tokenizer as tokenizer_loader  # type: ignore[assignment]
    return conversation_trace(convs, tokenizer_loader()), "conversation"


# ---- the sweep ----------------------------------------------------------------------------

def _point(reqs: list[TraceRequest], series: str, block_size: int, capacity: int, seed: int) -> SweepPoint:
    result = replay(reqs, ReplayConfig(block_size=block_size, capacity_blocks=capacity, seed=seed))
    t = result.totals
    # replay's totals cover served requests only; a refused one still asked for its prompt
    refused = sum(r.prompt_tokens for r in result.requests if r.refused)
    prompt = t.prompt_tokens + refused
    rate = round(t.cached_tokens / prompt, 6) if prompt else 0.0
    return SweepPoint(series, block_size, capacity, rate, t.cached_tokens, prompt,
                      t.evicted_blocks, t.refused_requests, refused, t.hit_rate)


def sweep(requests: Sequence[TraceRequest], block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES,
          capacities: Sequence[int] = DEFAULT_CAPACITIES, block_size: int = 16,
          capacity_tokens: int | None = None, seed: int = 0, trace: str = "",
          progress: Callable[[int, int], None] | None = None,
          trace_block_size: int = MOONCAKE_BLOCK_SIZE) -> dict[str, Any]:
    """Replay `requests` once per point; the sweep JSON.

    The block-size series holds the pool at `capacity_tokens` tokens (default: every token
    of the trace, so nothing is evicted and only granularity matters); the capacity series
    holds the block size at `block_size`. A block-level trace fixes the block size at its
    own, `trace_block_size` (512 for Mooncake, 64 for kv-cache-tester).
    """
    reqs = list(requests)
    if not reqs:
        raise InputError("the trace holds no requests")
    if any(b < 1 for b in block_sizes) or any(c < 1 for c in capacities):
        raise InputError("block sizes and capacities must be whole numbers of at least 1")
    notes: list[str] = []
    block_level = any(r.is_block_level for r in reqs)
    if block_level:
        size = trace_block_size
        if any(b != size for b in block_sizes) or block_size != size:
            notes.append(f"a block-level trace fixes the block size at {size} tokens (its hash ids name "
                         f"{size}-token blocks), so only the capacity varies")
        block_sizes, block_size = (), size
    total_tokens = sum(r.input_length + r.output_length for r in reqs)
    budget = capacity_tokens if capacity_tokens is not None else total_tokens
    plan = [("block_size", b, max(1, cdiv(budget, b))) for b in sorted(set(block_sizes))]
    plan += [("capacity", block_size, c) for c in sorted(set(capacities))]
    points = []
    for i, (series, bs, cap) in enumerate(plan):
        points.append(_point(reqs, series, bs, cap, seed).to_dict())
        if progress is not None:
            progress(i + 1, len(plan))
    models = sorted({r.model for r in reqs if r.model is not None})
    return {"trace": trace, "kind": "mooncake" if block_level else "tokens", "requests": len(reqs),
            **({"models": models} if models else {}),
            "total_tokens": total_tokens, "block_size": block_size, "capacity_tokens": budget,
            "notes": notes, "points": points}
