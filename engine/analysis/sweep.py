"""What-if sweeps: the hit rate of a trace against block size and against pool capacity.

Each point is a fresh no-model replay (`engine.core.replay`). A request the pool is too small
to hold is refused; a sweep counts its prompt tokens as missed (a refused request reuses
nothing), so a smaller pool never looks better by serving fewer requests. Before any point runs, the
memory of every point is estimated from the blocks it could store (`point_memory`), so a
sweep that cannot fit is refused in one sentence instead of running out of memory.
`sweep_file` is the whole sweep of a file, as `cachescope sweep FILE` and the app's Sweep
panel run it. Also here: turning conversation files into token-level requests (one per
user turn) so a chat can be swept like a trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from engine.core import validation
from engine.core.errors import InputError
from engine.core.blocks import cdiv
from engine.core.replay import ReplayConfig, replay
from engine.core.sniff import WEKA_FORMAT, is_weka_trace, trace_format
from engine.core.trace import MOONCAKE_BLOCK_SIZE, TraceRequest, read_trace
from engine.analysis.conversations import load_conversation_file, messages_of
from engine.model.chat import render_chat

DEFAULT_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CAPACITIES = (64, 128, 256, 512, 1024, 2048, 4096)

# What one point of a sweep costs on its Python engine, fitted from the peak RSS (VmHWM) of
# `_point` on generated token traces of 0.3M-4M tokens at block sizes 1 and 16 (CPython
# 3.11), rounded up past the worst point seen (a dict just past a resize). Each block of the
# pool is a `Block` with its free-queue links: 153 B. Each block a request stores adds its
# digest, its token tuple, the hash map's and the children map's entries and a last-used
# clock: 690-770 B, plus 8 B a token of the block. A hash evicted from the pool stays in the
# evicted map: 120-140 B. While it runs, the largest request holds its hashes, its lookup and its
# block table: 50 B a block on a miss, up to 260 B when it hits. (Before: the pool's check
# counted 128 B a block and nothing stored, a sixth of what a stored block costs.)
POOL_BYTES_PER_BLOCK = validation.BYTES_PER_BOOKKEEPING_BLOCK  # the pool's own check: 160
STORED_BYTES_PER_BLOCK = 800
STORED_BYTES_PER_TOKEN = 8
EVICTED_BYTES_PER_BLOCK = 200
REQUEST_BYTES_PER_BLOCK = 350


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


def load_sweep_requests(path: str | Path, tokenizer_loader: Callable[[], Any] | None = None,
                        limit: int | None = None, on_request: Callable[[TraceRequest], None] | None = None,
                        kind: str | None = None) -> tuple[list[TraceRequest], str]:
    """The requests of a trace or conversation file and its kind: tokens, mooncake, weka (a
    kv-cache-tester file or a folder of them: concurrent users in time order, the cache keyed
    by model) or conversation. `kind`, when the caller has sniffed the file already, saves
    parsing its first line again (one line can be 50 MB). A JSONL trace is read one line at
    a time and no further than `limit` requests; `on_request` sees each request as it is
    read (a `MemoryGuard` there refuses a sweep that cannot fit before the rest is parsed)."""
    if kind is None:
        kind = (WEKA_FORMAT if Path(path).is_dir() or is_weka_trace(path)
                else trace_format(path) or "conversation")
    if kind == WEKA_FORMAT:
        from engine.store.weka import load_weka_requests

        return _taken(load_weka_requests(path), limit, on_request), WEKA_FORMAT
    if kind in ("tokens", "mooncake"):
        reqs = _taken(read_trace(path), limit, on_request)
        if not reqs:
            raise InputError(f"{validation.show_path(str(path))}: the trace holds no requests")
        return reqs, ("mooncake" if reqs[0].is_block_level else "tokens")
    convs = load_conversation_file(path)
    if tokenizer_loader is None:
        from engine.model.loader import load_tokenizer as tokenizer_loader  # type: ignore[assignment]
    return _taken(conversation_trace(convs, tokenizer_loader()), limit, on_request), "conversation"


def _taken(requests: Iterable[TraceRequest], limit: int | None,
           on_request: Callable[[TraceRequest], None] | None) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    for r in requests:
        if limit is not None and len(out) >= limit:
            break
        if on_request is not None:
            on_request(r)
        out.append(r)
    return out


# ---- memory --------------------------------------------------------------------------------

def _shared_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading items two tuples share; compared a slice at a time, so a common
    prefix of millions of tokens costs C-speed comparisons, not a Python step per token."""
    n, i, step = min(len(a), len(b)), 0, 1 << 14
    while i < n:
        j = min(n, i + step)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return n


def stored_block_bounds(requests: Sequence[TraceRequest], block_sizes: Iterable[int]) -> dict[int, int]:
    """For each block size, at most how many blocks the requests store in an unbounded pool.

    The distinct full blocks of the prompts are the nodes of their trie: with the prompts
    sorted, sum(blocks of each) - sum(blocks each shares with the one before it). Requests of
    another model or tenant share nothing (their chains start apart), and every output
    block is counted as new. A block-aligned prompt that hits in full recomputes its last
    block, which is stored a second time (vLLM keeps both copies), so each such prompt may
    add one. A block-level request's units are its hash ids, one block each."""
    def key(i: int) -> tuple:
        r = requests[i]
        return (r.model is not None, r.model or "", r.tenant is not None, r.tenant or "",
                r.tokens if r.tokens is not None else r.hash_ids or ())

    shared: list[tuple[int, bool]] = []  # (units shared with the prompt before it, block-level)
    prev = None
    for i in sorted(range(len(requests)), key=key):
        r = requests[i]
        content = r.tokens if r.tokens is not None else (r.hash_ids or ())
        group = (r.model, r.tenant, r.tokens is None)
        n = _shared_prefix(prev[1], content) if prev is not None and prev[0] == group else 0
        shared.append((n, r.tokens is None))
        prev = (group, content)
    out = {}
    for bs in block_sizes:
        total = sum((r.input_length + r.output_length) // bs for r in requests)
        common = sum(n if block_level else n // bs for n, block_level in shared)
        copies = sum(1 for r in requests if r.input_length and r.input_length % bs == 0)
        out[bs] = max(0, total - common) + copies
    return out


def point_memory(block_size: int, capacity_blocks: int, distinct_blocks: int, largest_request_blocks: int) -> int:
    """Bytes one sweep point may need at its peak (see the constants above)."""
    stored = min(capacity_blocks, distinct_blocks)
    return (capacity_blocks * POOL_BYTES_PER_BLOCK
            + stored * (STORED_BYTES_PER_BLOCK + STORED_BYTES_PER_TOKEN * block_size)
            + max(0, distinct_blocks - capacity_blocks) * EVICTED_BYTES_PER_BLOCK
            + largest_request_blocks * REQUEST_BYTES_PER_BLOCK)


def check_sweep_memory(requests: Sequence[TraceRequest], plan: Sequence[tuple[str, int, int]]) -> None:
    """Refuse, before any point runs, a sweep whose largest point would not fit in the memory
    this process has left (the machine's, and the address-space limit's)."""
    bounds = stored_block_bounds(requests, {bs for _, bs, _ in plan})
    longest = max(r.input_length + r.output_length for r in requests)
    need, worst = 0, None
    for series, bs, cap in plan:
        n = point_memory(bs, cap, bounds[bs], cdiv(longest, bs))
        if n > need:
            need, worst = n, (series, bs, cap)
    if need <= 64 * 2**20:
        return
    available = validation.available_memory()
    if need > available:
        series, bs, cap = worst  # type: ignore[misc]
        stored = min(cap, bounds[bs])
        raise InputError(_too_large(series, bs, cap, stored, need, available, ""))


def _too_large(series: str, bs: int, cap: int, stored: int, need: int, available: int, at_least: str) -> str:
    hint = ("a larger smallest block size (--block-sizes) or a smaller --capacity-tokens" if series == "block_size"
            else "smaller --capacities")
    return (f"the sweep's point at block size {bs} (a pool of {cap:,} blocks, {at_least or 'up to '}{stored:,} of them "
            f"stored) needs {at_least}{validation.human_bytes(need)} of memory but this process has "
            f"{validation.human_bytes(available)} available; choose {hint}")


@dataclass(slots=True)
class MemoryGuard:
    """Refuses a block-size sweep while its trace is still being read, once what is read
    already needs more memory than the process has: a 33M-token trace at block size 1 is
    refused after its first long line, not after minutes of parsing.

    A lower bound on the final point's need: the pool grows with every token read (the
    series holds the whole trace by default) and a request's own blocks are all distinct,
    so each one stores at least its longest prompt's blocks (`point_memory` is increasing
    in each argument). `check_sweep_memory` gives the full estimate once everything is read."""

    block_size: int  # the smallest block size of the block-size series
    capacity_tokens: int | None
    available: int = 0
    num_tokens: int = 0
    max_prompt_tokens: int = 0
    max_request_tokens: int = 0

    @classmethod
    def for_sweep(cls, block_sizes: Sequence[int], capacity_tokens: int | None) -> MemoryGuard | None:
        """The guard of a sweep, or None when it has no block-size series to guard."""
        if not block_sizes:
            return None
        # memory only shrinks while the trace is read, so what is free now bounds every check
        return cls(min(block_sizes), capacity_tokens, validation.available_memory())

    def add(self, r: TraceRequest) -> None:
        if r.is_block_level:
            return  # a block-level trace fixes its block size: only the capacity series runs
        self.num_tokens += r.input_length + r.output_length
        self.max_prompt_tokens = max(self.max_prompt_tokens, r.input_length)
        self.max_request_tokens = max(self.max_request_tokens, r.input_length + r.output_length)
        bs = self.block_size
        budget = self.capacity_tokens if self.capacity_tokens is not None else self.num_tokens
        cap = max(1, cdiv(budget, bs))
        stored = self.max_prompt_tokens // bs
        need = point_memory(bs, cap, stored, cdiv(self.max_request_tokens, bs))
        if need > self.available and need > 64 * 2**20:
            raise InputError(_too_large("block_size", bs, cap, min(cap, stored), need, self.available, "at least "))


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
    check_sweep_memory(reqs, plan)
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


def sweep_file(path: str | Path, block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES,
               capacities: Sequence[int] = DEFAULT_CAPACITIES, block_size: int = 16,
               capacity_tokens: int | None = None, limit: int | None = None, seed: int = 0,
               keyed_by_model: bool = True, tokenizer_loader: Callable[[], Any] | None = None,
               progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """The sweep JSON of a trace or conversation file, or a folder of kv-cache-tester traces:
    what `cachescope sweep FILE --json` prints, and what the app's Sweep panel draws.

    The file is sniffed once (each sniff parses its first line, which may be 50 MB). A
    kv-cache-tester file or folder is swept at its own block size, its users' requests
    merged in time order, the cache keyed by model unless `keyed_by_model` is False (the
    what-if of one cache for every model). A kvcache-simulator line's declared block size
    fixes a block-level trace's, every line checked against it. A token trace is read
    under a `MemoryGuard`, so a sweep that cannot fit is refused while it is read. Only the
    first `limit` requests are used. A conversation file is tokenised by
    `tokenizer_loader()` (default: the bundled model's tokenizer). `progress(done, total)`
    is called after each point, on the caller's thread; an exception it raises stops the
    sweep there (a panel's cancel)."""
    if not Path(path).exists():
        raise InputError(f"{path}: no such file")
    trace_block_size = MOONCAKE_BLOCK_SIZE
    if Path(path).is_dir() or is_weka_trace(path):
        from engine.store.weka import load_weka, merged_requests, to_trace_requests

        traces = load_weka(path)
        trace_block_size, kind = traces[0].block_size, WEKA_FORMAT
        reqs = to_trace_requests(merged_requests(traces), {t.id: t.hash_id_scope for t in traces},
                                 keyed_by_model=keyed_by_model)
    else:
        from engine.store.block_traces import check_block_sizes, declared_block_size

        fmt = trace_format(path)
        declared = declared_block_size(path) if fmt == "mooncake" else None
        if declared is not None:  # kvcache-simulator lines carry their block size
            check_block_sizes(path, declared)
            trace_block_size = declared
        guard = MemoryGuard.for_sweep(block_sizes, capacity_tokens)
        reqs, kind = load_sweep_requests(path, tokenizer_loader, limit, guard.add if guard is not None else None,
                                         kind=fmt or "conversation")
    if limit is not None:
        reqs = reqs[:limit]
    result = sweep(reqs, block_sizes, capacities, block_size=block_size, capacity_tokens=capacity_tokens,
                   seed=seed, trace=str(path), progress=progress, trace_block_size=trace_block_size)
    result["keyed_by_model"] = keyed_by_model
    result["kind"] = kind
    return result
