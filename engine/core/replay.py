"""Replaying a trace through a fresh engine without a model (`cachescope replay --no-model`).

Requests run in file order; with `concurrency` K, up to K are in flight and decode
round-robin, one token per request per step, so shared prefixes carry ref counts up to K.
The result is a `ReplayResult`; its `to_dict()` is the JSON contract of the replay command.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Iterable

from engine.core.errors import CapacityError, InputError, TraceError
from engine.core.events import EventBus
from engine.core.hashing import BlockHasher
from engine.core.blocks import cdiv
from engine.core.manager import PrefixCacheManager, Request
from engine.core.served import ReplayResult, ReplayTotals, ServedRequest
from engine.core.trace import TraceRequest


@dataclass(slots=True, frozen=True)
class ReplayConfig:
    block_size: int = 16
    capacity_blocks: int = 1024
    seed: int | None = 0
    hash: str = "sha256"
    concurrency: int = 1
    model: str | None = None
    hash_seed: str | None = None  # vllm-* hashes: the server's PYTHONHASHSEED

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise InputError(f"--block-size must be at least 1, not {self.block_size}")
        if self.capacity_blocks < 1:
            raise InputError(f"the capacity must be at least one block, not {self.capacity_blocks}")
        if self.concurrency < 1:
            raise InputError(f"--concurrency must be at least 1, not {self.concurrency}")

    @staticmethod
    def capacity_from_tokens(num_tokens: int, block_size: int) -> int:
        if num_tokens < block_size:
            raise InputError(f"a capacity of {num_tokens} tokens holds no block of {block_size} tokens")
        return num_tokens // block_size


def make_manager(config: ReplayConfig, events: EventBus | None = None) -> PrefixCacheManager:
    try:
        hasher = BlockHasher(config.hash, config.seed, config.model or "", config.hash_seed)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return PrefixCacheManager(config.capacity_blocks, config.block_size, hasher, events)


def to_request(tr: TraceRequest) -> Request:
    if tr.tokens is not None:
        return Request(tr.id, tr.tokens, salt=tr.tenant, model=tr.model)
    return Request(tr.id, None, tr.input_length, tr.tenant, tr.hash_ids, model=tr.model)


@dataclass(slots=True)
class _Running:
    """A request between allocate and finish: how much of its output has KV so far."""

    tr: TraceRequest
    num_kv_output: int  # output tokens that get KV: all but the last sampled
    num_appended: int = 0


def replay(requests: Iterable[TraceRequest], config: ReplayConfig, events: EventBus | None = None,
           manager: PrefixCacheManager | None = None, source: str = "the trace") -> ReplayResult:
    """Run `requests` through a fresh manager (or `manager`, warm from earlier requests).

    `source` names the trace file in errors."""
    mgr = manager if manager is not None else make_manager(config, events)
    bs = config.block_size
    pending = deque(requests)
    rows: list[ServedRequest] = []
    running: list[_Running] = []

    def outstanding(live: _Running) -> int:
        total = live.tr.input_length + live.num_kv_output
        return cdiv(total, bs) - len(mgr.block_table(live.tr.id))

    while pending or running:
        while pending and len(running) < config.concurrency:
            tr = pending[0]
            req = to_request(tr)
            kv_out = max(tr.output_length - 1, 0)
            reserve = sum(map(outstanding, running)) if running else 0
            lookup = mgr.lookup(req)
            row = ServedRequest(tr.index, tr.id, tr.tenant, tr.input_length, output_tokens=tr.output_length,
                                miss_reason=lookup.miss.reason, first_miss_block=lookup.miss.first_miss_block,
                                divergence_token=lookup.miss.divergence_token)
            if tr.id in mgr.running_request_ids:
                raise TraceError(source, tr.line, "id", f"request id {tr.id!r} is already running")
            try:
                alloc = mgr.allocate(req, lookup, num_lookahead_tokens=kv_out + reserve * bs)
            except CapacityError:
                if running:
                    break  # wait for running requests to free their blocks
                row.refused = True
                rows.append(row)
                pending.popleft()
                continue
            pending.popleft()
            row.cached_tokens = alloc.num_cached_tokens
            row.computed_tokens = alloc.num_computed_tokens
            rows.append(row)
            running.append(_Running(tr, kv_out))
        if not running:
            continue
        if len(running) == 1 and (config.concurrency == 1 or not pending):
            # One request decoding alone, no admission tried between its steps (each retry
            # of a refused request is an event): its quiet steps and the step that fills its
            # block (or ends it) are one append, with the same events in the same order as
            # the round-robin below gives (at most one new block, taken first).
            live = running[0]
            _append(mgr, live, min(live.num_kv_output - live.num_appended,
                                   bs - (live.tr.input_length + live.num_appended) % bs))
            if live.num_appended >= live.num_kv_output:
                mgr.finish(live.tr.id)
                running = []
            continue
        # Round-robin, one token per request per step. Steps where no request fills a
        # block or finishes change nothing anyone can see, so they are taken in one go:
        # the events come out in the same order, and a long output costs per block,
        # not per token.
        quiet = min(min(live.num_kv_output - live.num_appended,
                        bs - (live.tr.input_length + live.num_appended) % bs) for live in running) - 1
        for live in running:
            if quiet > 0:
                _append(mgr, live, quiet)
        for live in running:
            if live.num_appended < live.num_kv_output:
                _append(mgr, live, 1)
        still: list[_Running] = []
        for live in running:
            if live.num_appended >= live.num_kv_output:
                mgr.finish(live.tr.id)
            else:
                still.append(live)
        running = still

    rows.sort(key=lambda r: r.index)
    return ReplayResult(asdict(config), ReplayTotals.of(rows, mgr.counters), rows)


def _append(mgr: PrefixCacheManager, live: _Running, n: int) -> None:
    if n <= 0:
        return
    tr = live.tr
    if tr.output_tokens is not None:
        start = live.num_appended
        mgr.append(tr.id, token_ids=tr.output_tokens[start:start + n])
    else:
        mgr.append(tr.id, num_tokens=n)
    live.num_appended += n


