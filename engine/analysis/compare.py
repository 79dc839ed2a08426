"""Comparing two runs on one aligned request axis: `cachescope compare A B` and File > Compare...

A side is a trace (token-level or Mooncake), a conversation or session file, a stored
session (`session:ID`, replayed), a recorded run (`run:ID`: a replay, a chat, a recorded
attach, as it was recorded) or a demo (`demo:NAME`, or one part of it, `demo:NAME:PART`,
run as `cachescope demo NAME` runs it). Files and sessions are replayed through a fresh engine with
the side's `SideOptions`; requests are paired by id when both sides have the same ids,
else by position. Deltas are B minus A: "more" means B reused more tokens. Hit rates are
cached over prompt tokens of every request, a refused one counted as missed, so a pool
that serves fewer requests never looks better (as `engine.analysis.sweep` counts them).
"""

from __future__ import annotations

import collections
import re
import functools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from engine.core.blocks import cdiv
from engine.core.errors import InputError
from engine.core.events import EventBus
from engine.core.projection import EventLog, PoolProjection
from engine.core.replay import ReplayConfig, replay
from engine.core.served import ServedRequest
from engine.core.sniff import is_request_trace
from engine.core.trace import MOONCAKE_BLOCK_SIZE, TraceRequest, load_trace

_STORED = re.compile(r"(session|run):(\d+)(?:@(.+))?")
_DEMO = re.compile(r"demo:([^:]+)(?::(.+))?")
# On the Python engine, a side's event log is kept (for its block table and pool timelines)
# up to this many requests: that log holds every event as an object, about 100 MB per 1,000
# Mooncake requests. The kernel's columnar log is kept at any size.
MAX_LOGGED_REQUESTS = 5_000
KERNELS = ("auto", "numba", "python")


class DemoRuns(Protocol):
    """What runs demo:NAME[:PART] sides (`engine.analysis.compare_demo.DemoRuns`)."""

    def check(self, name: str) -> None: ...

    def side(self, name: str, part: str | None, opts: SideOptions) -> PreparedSide: ...


@dataclass(slots=True, frozen=True)
class SideOptions:
    """How one side is replayed. `capacity_blocks` wins over `capacity_tokens`; with
    neither, the pool holds every token of the side (nothing is evicted, only block
    granularity and content matter). `limit` keeps the first N requests."""

    block_size: int = 16
    capacity_blocks: int | None = None
    capacity_tokens: int | None = None
    hash: str = "sha256"
    seed: int = 0
    concurrency: int = 1
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise InputError(f"the block size must be at least 1, not {self.block_size}")
        if self.limit is not None and self.limit < 1:
            raise InputError(f"the number of requests must be at least 1, not {self.limit}")


@dataclass(slots=True)
class Run:
    """One side: what it is, the settings it ran with, its served requests in order, and
    the engine's block counters (None for a recorded run that did not keep them)."""

    label: str
    kind: str  # tokens | mooncake | conversation | session | run
    config: dict[str, Any]
    requests: list[ServedRequest]
    stored_blocks: int | None = None
    evicted_blocks: int | None = None
    token_ids: dict[str, tuple[int, ...]] = field(default_factory=dict)  # prompt ids by request id, when known
    # The engine's events (kept on request, see `PreparedSide.run`) and, per request id, the
    # seq of the event that ended it (finished or refused): the pool "after request i".
    log: EventLog | None = None
    end_seqs: dict[str, int] = field(default_factory=dict)
    no_log_reason: str | None = None
    # What a hosted API would be sent (`engine.analysis.billing` requests), when known.
    billing: Callable[[], list[Any]] | None = None

    def state_after(self, request_id: str) -> PoolProjection | None:
        """The pool just after request `request_id` ended (None without a log or that request)."""
        seq = self.end_seqs.get(request_id)
        if self.log is None or seq is None:
            return None
        return self.log.state_at(seq)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.requests)

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.requests if not r.refused)

    @property
    def hit_rate(self) -> float:
        p = self.prompt_tokens
        return round(self.cached_tokens / p, 6) if p else 0.0

    def totals(self) -> dict[str, Any]:
        served = [r for r in self.requests if not r.refused]
        return {"requests": len(self.requests), "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens,
                "computed_tokens": sum(r.computed_tokens for r in served),
                "hit_rate": self.hit_rate, "refused_requests": len(self.requests) - len(served),
                "stored_blocks": self.stored_blocks, "evicted_blocks": self.evicted_blocks,
                "cached_per_request": round(self.cached_tokens / len(self.requests), 3) if self.requests else 0.0}


# ---- loading a side ---------------------------------------------------------------------

def refine_block_ids(requests: Sequence[TraceRequest], block_size: int) -> list[TraceRequest]:
    """A Mooncake trace at a block size that divides 512: hash id h at block i stands for
    the 512 tokens 512i..512i+511, whose identity includes the whole prefix; its k-th
    sub-block of `block_size` tokens gets the id h * (512 / block_size) + k, so two
    requests share a sub-block exactly when they share the 512-token block that holds it.
    (A last, partial 512-token block is shared as far as the two prompts both reach.)"""
    if block_size == MOONCAKE_BLOCK_SIZE:
        return list(requests)
    if block_size > MOONCAKE_BLOCK_SIZE or MOONCAKE_BLOCK_SIZE % block_size:
        raise InputError(f"a Mooncake trace names {MOONCAKE_BLOCK_SIZE}-token blocks; it can be replayed at a "
                         f"block size that divides {MOONCAKE_BLOCK_SIZE} (1, 2, 4, ..., 512), not {block_size}")
    per = MOONCAKE_BLOCK_SIZE // block_size
    out = []
    for tr in requests:
        if tr.hash_ids is None:
            out.append(tr)
            continue
        num = cdiv(tr.input_length, block_size)
        ids = tuple(h * per + k for h in tr.hash_ids for k in range(per))[:num]
        out.append(replace(tr, hash_ids=ids))
    return out


def _capacity(reqs: Sequence[TraceRequest], opts: SideOptions) -> int:
    if opts.capacity_blocks is not None:
        return opts.capacity_blocks
    if opts.capacity_tokens is not None:
        return ReplayConfig.capacity_from_tokens(opts.capacity_tokens, opts.block_size)
    return max(1, sum(cdiv(r.input_length + r.output_length, opts.block_size) + 1 for r in reqs))


@dataclass(slots=True)
class PreparedSide:
    """A side read and checked, not yet replayed: its requests (refined to the block size),
    or a recorded `Run` that is shown as it was recorded."""

    label: str
    kind: str
    opts: SideOptions
    requests: list[TraceRequest] = field(default_factory=list)
    model: str | None = None
    recorded: Run | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    billing: Callable[[], list[Any]] | None = None

    def run(self, keep_log: bool = False, kernel: str = "auto") -> Run:
        """Replay the side (a recorded side as it was). `kernel` "auto" replays on the
        compiled kernel where it can run the side (as File > Open does,
        `app.runtime.replays.kernel_replay_job`) and on the Python engine, the reference,
        otherwise; "python" and "numba" force one (numba on a side it cannot run is an
        `InputError` naming why). The result is the same either way (tests/test_compare.py
        holds the two routes' JSON equal). `keep_log` keeps the engine's events for the block
        table and the pool timelines: the kernel's columnar log
        (`engine.core.columnar_log.ColumnarEventLog`) at any size, the Python engine's
        `EventLog` up to MAX_LOGGED_REQUESTS requests."""
        if self.recorded is not None:
            return self.recorded
        if kernel not in KERNELS:
            raise InputError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
        reqs, opts = self.requests, self.opts
        capacity = _capacity(reqs, opts)
        config = ReplayConfig(block_size=opts.block_size, capacity_blocks=capacity, seed=opts.seed,
                              hash=opts.hash, concurrency=opts.concurrency, model=self.model)
        got = self._kernel_run(config, keep_log) if kernel != "python" else None
        if got is None and kernel == "numba":
            raise InputError(f"{self.label}: {self._kernel_unavailable(config)}")
        if got is not None:
            result, log = got
            reason = None
        else:
            bus, log, reason = None, None, None
            if keep_log and len(reqs) > MAX_LOGGED_REQUESTS:
                reason = (f"{len(reqs):,} requests: the pool is shown for runs of up to {MAX_LOGGED_REQUESTS:,} "
                          f"on the Python engine (set 'first N requests')")
            elif keep_log:
                bus, log = EventBus(), new_log(capacity, opts.block_size)
                bus.subscribe(log.append)
            result = replay(reqs, config, bus, source=self.label)
        cfg = {**result.config, "source": self.label, "kind": self.kind, **self.extra}
        tokens = {r.id: r.tokens for r in reqs if r.tokens is not None}
        return Run(self.label, self.kind, cfg, result.requests, result.totals.stored_blocks,
                   result.totals.evicted_blocks, tokens, log, end_seqs(log) if log is not None else {}, reason,
                   self.billing)

    def _kernel_run(self, config: ReplayConfig, keep_log: bool) -> tuple[Any, Any] | None:
        """The side replayed on the kernel: its result and (with `keep_log`) its columnar log;
        None where the kernel cannot run it (numba missing, or `unsupported_reason`)."""
        try:
            from engine.kernel.replay import prepare, replay_kernel, unsupported_reason
        except ImportError:
            return None
        arrays = prepare(self.requests, config.block_size)
        if unsupported_reason(config, arrays) is not None:
            return None
        run = replay_kernel(arrays, config, record=keep_log, source=self.label)
        if not keep_log or run.log is None:
            return run.result, None
        from engine.core.columnar_log import ColumnarEventLog

        return run.result, ColumnarEventLog(run.log)

    def _kernel_unavailable(self, config: ReplayConfig) -> str:
        try:
            from engine.kernel.replay import prepare, unsupported_reason
        except ImportError as exc:
            return f"the numba kernel is not available ({exc})"
        return unsupported_reason(config, prepare(self.requests, config.block_size)) or "the kernel cannot run it"


def new_log(num_blocks: int, block_size: int) -> EventLog:
    # Few checkpoints: a copy of a large pool costs more than replaying a stretch of events.
    return EventLog(num_blocks, block_size, checkpoint_every=max(4096, num_blocks), max_checkpoints=8)


def end_seqs(log: Any) -> dict[str, int]:
    """Per request id, the seq of the event that ended it: finished, else refused (the last
    such event of an id that ran more than once). A columnar log is read from its columns."""
    out: dict[str, int] = {}
    if getattr(log, "columnar_log", False):
        import numpy as np

        from engine.core.columnar import FINISHED, REFUSED

        at = np.flatnonzero((log.kinds == FINISHED) | (log.kinds == REFUSED))
        ids = log.request_ids()[log.request_of_events()[at]]
        for rid, seq in zip(ids.tolist(), log.seqs[at].tolist()):
            out[rid] = seq
        return out
    for e in log.events:
        if e.kind in ("request_finished", "request_refused"):
            out[e.request_id] = e.seq
    return out


def prepare_requests(reqs: Sequence[TraceRequest], opts: SideOptions, label: str, kind: str,
                     model: str | None = None, billing: Callable[[], list[Any]] | None = None) -> PreparedSide:
    """`billing`, when given, makes the side's hosted-API requests; by default they are made
    from `reqs` as `cachescope billing` makes them from a trace (before any refinement)."""
    reqs = list(reqs)[:opts.limit] if opts.limit else list(reqs)
    if not reqs:
        raise InputError(f"{label}: there is no request to compare")
    if billing is None:
        billing = functools.partial(_billing_of_trace, tuple(reqs))
    if any(r.is_block_level for r in reqs):
        reqs = refine_block_ids(reqs, opts.block_size)
    ReplayConfig(block_size=opts.block_size, capacity_blocks=_capacity(reqs, opts), hash=opts.hash)  # checks now
    return PreparedSide(label, kind, opts, reqs, model, billing=billing)


def _billing_of_trace(reqs: Sequence[TraceRequest]) -> list[Any]:
    from engine.analysis.billing import requests_from_trace

    return requests_from_trace(reqs)


def _billing_of_source(source: str, db: str | None, limit: int | None) -> list[Any]:
    """The requests `cachescope billing SOURCE` prices (its --limit as the side's)."""
    from engine.analysis.billing import load_billing_requests

    reqs, _ = load_billing_requests(source, db)
    return reqs[:limit] if limit else reqs


def prepare_side(spec: str, opts: SideOptions, db: str | None = None,
                 tokenizer_loader: Callable[[], Any] | None = None, demos: DemoRuns | None = None) -> PreparedSide:
    """One side from `spec` (a file path, session:ID or run:ID in the database `db`, or
    demo:NAME[:PART] run by `demos`), read and checked; replaying it is `PreparedSide.run`,
    so a bad B fails before A replays."""
    m = _STORED.fullmatch(spec)
    if m and m.group(3) is not None:
        if m.group(1) != "run":
            raise InputError(f"{spec}: a server is named on a recorded attach, run:ID@SERVER")
        return _server_side(int(m.group(2)), m.group(3), db)
    if m:
        return _stored(m.group(1), int(m.group(2)), opts, db, tokenizer_loader)
    m = _DEMO.fullmatch(spec)
    if m:
        if demos is None:
            raise InputError(f"{spec}: demos are compared by 'cachescope compare' and the Compare window")
        return demos.side(m.group(1), m.group(2), opts)
    path = Path(spec)
    if not path.is_file():
        raise InputError(f"{spec}: no such file (give a trace, a conversation or session file, session:ID, run:ID "
                         f"or demo:NAME)")
    bills = functools.partial(_billing_of_source, spec, db, opts.limit)
    if is_request_trace(path):
        reqs = load_trace(path)  # Mooncake ids name 512-token blocks whatever block size replays them
        return prepare_requests(reqs, opts, spec, "mooncake" if reqs[0].is_block_level else "tokens", billing=bills)
    from engine.analysis.conversations import load_conversation_file

    convs = load_conversation_file(path)
    if not convs:
        raise InputError(f"{spec}: the file holds no conversation")
    if all(getattr(c, "trace", None) is not None for c in convs):  # exported trace sessions
        reqs = [tr for c in convs for tr in c.trace]
        return prepare_requests([replace(tr, index=i) for i, tr in enumerate(reqs)], opts, spec, "session")
    from engine.analysis.sweep import conversation_trace

    return prepare_requests(conversation_trace(convs, _tokenizer(tokenizer_loader)), opts, spec, "conversation",
                            billing=bills)


def load_side(spec: str, opts: SideOptions, db: str | None = None,
              tokenizer_loader: Callable[[], Any] | None = None) -> Run:
    """One side from `spec`, replayed (or as recorded, for run:ID)."""
    return prepare_side(spec, opts, db, tokenizer_loader).run()


def _tokenizer(loader: Callable[[], Any] | None) -> Any:
    if loader is not None:
        return loader()
    from engine.model.loader import load_tokenizer

    return load_tokenizer()


def _stored(what: str, ident: int, opts: SideOptions, db: str | None,
            tokenizer_loader: Callable[[], Any] | None) -> PreparedSide:
    from engine.store.database import Store
    from engine.store.sessions import session_requests

    with Store(db, read_only=True) as store:
        if what == "session":
            info = store.get_session(ident)
            tok = _tokenizer(tokenizer_loader) if info.kind == "chat" else None
            reqs, _ = session_requests(store, info, tok)
            side = prepare_requests(reqs, opts, f"session:{ident}", "session",
                                    model=info.model if info.kind == "chat" else None,
                                    billing=functools.partial(_billing_of_source, f"session:{ident}", db, opts.limit))
            side.extra["session"] = ident
            return side
        runs = {r.id: r for r in store.runs()}
        if ident not in runs:
            raise InputError(f"there is no run {ident} in the database; 'cachescope sessions list' shows the sessions")
        info = runs[ident]
        stored = store.requests(ident)[:opts.limit] if opts.limit else store.requests(ident)
        rows = [ServedRequest(r.idx, r.request_id, r.tenant, r.prompt_tokens, r.cached_tokens, r.computed_tokens,
                              len(r.output_token_ids or ()), r.miss_reason, r.first_miss_block, r.divergence_token,
                              bool(r.refused)) for r in stored]
        if store.num_frames(ident):  # a recorded attach's frames: its events as the reference pools make them
            from engine.analysis.remote_capture import recorded_events

            counts = collections.Counter(e.kind for e in recorded_events(store, ident))
        else:
            counts = dict(store.query("SELECT kind, COUNT(*) FROM events WHERE run_id = ? GROUP BY kind", [ident]))
        tokens = {r.request_id: tuple(r.prompt_token_ids) for r in stored if r.prompt_token_ids}
        label = f"run:{ident}"
        run = Run(label, "run", {**(info.config or {}), "run": ident, "run_kind": info.kind, "source": label,
                                 "kind": "run"},
                  rows, counts.get("block_stored", 0), counts.get("block_evicted", 0), tokens)
        return PreparedSide(label, "run", opts, recorded=run)


def source_name(source: str) -> str:
    """A remote event's source as a server is named: the endpoint without its scheme."""
    return source.split("://", 1)[-1]


def _server_side(ident: int, server: str, db: str | None) -> PreparedSide:
    """One server of a recorded fleet attach (`run:ID@SERVER`): the events of run ID that
    came from SERVER (its endpoint, with or without tcp://), in a log of their own. vLLM's
    KV events name no request, so the side has blocks and no requests."""
    from engine.store.database import Store

    label = f"run:{ident}@{server}"
    with Store(db, read_only=True) as store:
        runs = {r.id: r for r in store.runs()}
        if ident not in runs:
            raise InputError(f"there is no run {ident} in the database; 'cachescope sessions list' shows the sessions")
        info = runs[ident]
        from engine.analysis.remote_capture import recorded_events

        events = recorded_events(store, ident)
    sources: dict[str, None] = {}
    for e in events:
        remote = getattr(e, "remote", None)
        if remote is not None:
            sources.setdefault(source_name(remote.source))
    if not sources:
        raise InputError(f"run {ident} is not a recorded attach (its events name no server); "
                         f"run:ID@SERVER compares two servers of one")
    if source_name(server) not in sources:
        raise InputError(f"run {ident} has no server {server!r} (its servers: {', '.join(sources)})")
    mine = [e for e in events if getattr(e, "remote", None) is not None
            and source_name(e.remote.source) == source_name(server)]
    block_size = next((e.remote.block_size for e in mine if e.remote.block_size), None) \
        or (info.config or {}).get("block_size") or 16
    log = new_log(0, block_size)
    log.extend(mine)
    counts = {k: sum(1 for e in mine if e.kind == k) for k in ("block_stored", "block_evicted")}
    config = {**(info.config or {}), "run": ident, "run_kind": info.kind, "source": label, "kind": "server",
              "server": source_name(server), "block_size": block_size, "events": len(mine)}
    run = Run(label, "server", config, [], counts["block_stored"], counts["block_evicted"], log=log,
              end_seqs={})
    return PreparedSide(label, "server", SideOptions(), recorded=run)


def held_hashes(run: Run) -> set[bytes]:
    """The block hashes the side's pool holds at its end (empty without a log)."""
    if run.log is None:
        return set()
    return {h for h in run.log.live.hashes if h is not None}


# ---- the comparison ---------------------------------------------------------------------

def _delta_word(d: float) -> str:
    return "more" if d > 0 else "less" if d < 0 else "same"


def _rate(r: ServedRequest) -> float:
    return 0.0 if r.refused or not r.prompt_tokens else r.cached_tokens / r.prompt_tokens


@dataclass(slots=True, frozen=True)
class Comparison:
    a: Run
    b: Run
    aligned_by: str  # id | index
    pairs: tuple[tuple[ServedRequest | None, ServedRequest | None], ...]

    @property
    def hit_rate_drop(self) -> float:
        """How much lower B's hit rate is than A's (negative when B is higher)."""
        return round(self.a.hit_rate - self.b.hit_rate, 6)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for i, (ra, rb) in enumerate(self.pairs):
            row: dict[str, Any] = {"position": i, "id_a": ra.id if ra else None, "id_b": rb.id if rb else None}
            for side, r in (("a", ra), ("b", rb)):
                row[f"prompt_tokens_{side}"] = r.prompt_tokens if r else None
                row[f"cached_tokens_{side}"] = r.cached_tokens if r else None
                row[f"hit_rate_{side}"] = round(_rate(r), 6) if r else None
                row[f"miss_reason_{side}"] = r.miss_reason if r else None
            if ra is not None and rb is not None:
                d = rb.cached_tokens - ra.cached_tokens
                row["cached_delta"] = d
                row["computed_delta"] = rb.computed_tokens - ra.computed_tokens
                row["hit_rate_delta"] = round(_rate(rb) - _rate(ra), 6)  # normalized: sizes may differ
                row["b_reuses"] = _delta_word(d)
            else:
                row["cached_delta"] = row["computed_delta"] = row["hit_rate_delta"] = row["b_reuses"] = None
            out.append(row)
        return out

    def to_dict(self) -> dict[str, Any]:
        ta, tb = self.a.totals(), self.b.totals()
        delta = {k: round(tb[k] - ta[k], 6) if isinstance(ta[k], (int, float)) and isinstance(tb[k], (int, float))
                 else None for k in ta}
        rows = self.rows()
        paired = [r for r in rows if r["cached_delta"] is not None]
        summary = {"paired": len(paired), "only_a": sum(1 for a, b in self.pairs if b is None),
                   "only_b": sum(1 for a, b in self.pairs if a is None),
                   "b_reuses_more": sum(1 for r in paired if r["b_reuses"] == "more"),
                   "b_reuses_less": sum(1 for r in paired if r["b_reuses"] == "less"),
                   "same": sum(1 for r in paired if r["b_reuses"] == "same"),
                   "b_reuses": _delta_word(delta["cached_tokens"])}
        out = {"a": {"label": self.a.label, "config": self.a.config, "totals": ta},
               "b": {"label": self.b.label, "config": self.b.config, "totals": tb},
               "aligned_by": self.aligned_by, "delta": delta, "summary": summary, "requests": rows}
        if "server" in (self.a.kind, self.b.kind):
            # servers publish blocks, not requests: what each holds at the end, and in common
            ha, hb = held_hashes(self.a), held_hashes(self.b)
            out["blocks"] = {"held_a": len(ha), "held_b": len(hb), "held_by_both": len(ha & hb),
                             "only_a": len(ha - hb), "only_b": len(hb - ha),
                             "held_delta": len(hb) - len(ha)}
        return out


def compare_runs(a: Run, b: Run) -> Comparison:
    """Pair the requests of `a` and `b`: by id when both sides carry the same ids (each once),
    else by position; unpaired requests of the longer side pair with None."""
    ids_a = [r.id for r in a.requests]
    ids_b = [r.id for r in b.requests]
    if len(set(ids_a)) == len(ids_a) and set(ids_a) == set(ids_b):
        by_id = {r.id: r for r in b.requests}
        return Comparison(a, b, "id", tuple((r, by_id[r.id]) for r in a.requests))
    n = max(len(a.requests), len(b.requests))
    pairs = tuple((a.requests[i] if i < len(a.requests) else None, b.requests[i] if i < len(b.requests) else None)
                  for i in range(n))
    return Comparison(a, b, "index", pairs)


def compare(spec_a: str, spec_b: str, opts_a: SideOptions, opts_b: SideOptions | None = None,
            db: str | None = None, tokenizer_loader: Callable[[], Any] | None = None,
            demos: DemoRuns | None = None, keep_logs: bool = False, kernel: str = "auto") -> Comparison:
    """Load, replay and pair two sides (B takes A's options unless given its own).
    `demos` runs demo:NAME sides; `keep_logs` keeps each side's events (`Run.log`);
    `kernel` chooses the bookkeeping (`PreparedSide.run`)."""
    if kernel not in KERNELS:
        raise InputError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    for spec in (spec_a, spec_b):
        m = _DEMO.fullmatch(spec)
        if m and demos is not None:
            demos.check(m.group(1))
    a = prepare_side(spec_a, opts_a, db, tokenizer_loader, demos)
    b = prepare_side(spec_b, opts_b if opts_b is not None else opts_a, db, tokenizer_loader, demos)
    return compare_runs(a.run(keep_logs, kernel), b.run(keep_logs, kernel))


def pool_curves(run: Run) -> dict[str, list[float]] | None:
    """Per request of `run`, its pool as shares of the pool (so pools of other sizes or
    block sizes compare): the most blocks in use while it ran (from the previous request's
    end to its own), the cached free blocks it left, and the highest ref count while it
    ran. None without a log."""
    log = run.log
    if log is None or not len(log.series):
        return None
    import numpy as np

    s, n = log.series, max(1, log.live.num_blocks)
    seq = np.asarray(s.seq, np.int64)
    in_use, cached_free, max_ref = (np.asarray(x, np.int64) for x in (s.in_use, s.cached_free, s.max_ref))
    ends = sorted((seq_, rid) for rid, seq_ in run.end_seqs.items())
    his = np.searchsorted(seq, np.array([e for e, _ in ends], np.int64), side="right").tolist()
    peak: dict[str, tuple[int, int, int]] = {}
    lo = 0
    for (_, rid), hi in zip(ends, his):
        if hi > lo:
            peak[rid] = (int(in_use[lo:hi].max()), int(cached_free[hi - 1]), int(max_ref[lo:hi].max()))
        lo = hi
    out: dict[str, list[float]] = {"in_use": [], "cached_free": [], "max_ref": []}
    for r in run.requests:
        use, free, ref = peak.get(r.id, (0, 0, 0))
        out["in_use"].append(use / n)
        out["cached_free"].append(free / n)
        out["max_ref"].append(float(ref))
    return out


def hit_rate_curve(run: Run) -> list[float]:
    """The running hit rate after each request (cached over prompt tokens so far)."""
    out, cached, prompt = [], 0, 0
    for r in run.requests:
        prompt += r.prompt_tokens
        cached += 0 if r.refused else r.cached_tokens
        out.append(cached / prompt if prompt else 0.0)
    return out


# ---- cost per turn ----------------------------------------------------------------------

def bill_side(run: Run, rules: Any, breakpoints: tuple[int, ...] | None = (-1,)) -> dict[str, Any] | None:
    """`engine.analysis.billing.bill` of the side's hosted-API requests (what `cachescope
    billing` prints for its source), or None when the side has none (a recorded run)."""
    if run.billing is None:
        return None
    from engine.analysis.billing import bill

    return bill(run.billing(), rules, breakpoints)


def cost_per_turn(comparison: Comparison, rules: Any, breakpoints: tuple[int, ...] | None = (-1,)) -> dict[str, Any]:
    """What a hosted API would bill each aligned request on A and on B under `rules`, with
    B - A; requests are matched to the bills by id (a side's bill rows carry its ids)."""
    bills = {side: bill_side(run, rules, breakpoints) for side, run in (("a", comparison.a), ("b", comparison.b))}
    by_id = {side: ({str(row["id"]): row["cost_usd"] for row in b["requests"]} if b is not None else None)
             for side, b in bills.items()}
    rows = []
    for i, (ra, rb) in enumerate(comparison.pairs):
        ca = by_id["a"].get(ra.id) if by_id["a"] is not None and ra is not None else None
        cb = by_id["b"].get(rb.id) if by_id["b"] is not None and rb is not None else None
        rows.append({"position": i, "cost_usd_a": ca, "cost_usd_b": cb,
                     "cost_delta_usd": round(cb - ca, 8) if ca is not None and cb is not None else None})
    totals = {side: ({k: b["totals"][k] for k in ("cost_usd", "cost_without_cache_usd", "read_tokens", "write_tokens",
                                                  "uncached_tokens", "savings_fraction")} if b is not None else None)
              for side, b in bills.items()}
    ta, tb = totals["a"], totals["b"]
    delta = (round(tb["cost_usd"] - ta["cost_usd"], 8) if ta and tb and ta["cost_usd"] is not None
             and tb["cost_usd"] is not None else None)
    return {"provider": rules.provider, "model": rules.model, "price_per_mtok": rules.price_per_mtok,
            "a": ta, "b": tb, "cost_delta_usd": delta, "requests": rows,
            "unknown": [side.upper() for side, b in bills.items() if b is None]}
