"""The "current filter" every view that shows events shares: a filter of
`engine.analysis.filter_language` and a range of event seqs picked on a timeline.

`shared_filter(ctx)` gives the one `EventFilter` of an app context (made on first use).
The filter bars of the event log and the block table set its filter, a timeline's range
selection sets its range, and every view listens to `sigChanged` and asks it which events
match: `match_mask()` over positions of `ctx.state.log`, `matching_seqs()`, `in_range`.

Tenants and models of events that do not carry them (an eviction, an allocation) come
from their request, learnt from the log's own request_started and block_stored events, as
`engine.analysis.statistics` does. The mask is kept per log position and extended as the
log grows, so a live log is matched once per event, not once per redraw. A trace's
columnar log (`engine.core.columnar_log.ColumnarEventLog`) is matched on its columns at
once (`columnar_mask`), with no Event built, unless the filter reads hashes. No widgets here.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from PySide6.QtCore import QObject, Signal

from engine.analysis.filter_language import BoolOp, Comparison, EventContext, Filter, Not, parse
from engine.core import columnar as C

if TYPE_CHECKING:
    from app.runtime.context import AppContext
    from app.runtime.state import PoolState

_CHUNK = 20_000  # events read at once while matching
# A new filter on a log longer than this is matched on the worker (about 1 s per 100K
# events on the shared machine): the window stays responsive while you type.
ASYNC_EVENTS = 50_000


class EventFields(Mapping[str, Any]):
    """An event (or a dataclass inside it: a miss, a remote tier) read as the mapping
    `Event.to_dict()` would give, field by field on demand: the filter reads two or three
    fields of an event, and building the whole dict (digests to hex, tuples to lists) cost
    three times the matching on a 176K-event log. Digests stay bytes (the filter reads
    bytes and hex alike)."""

    __slots__ = ("_obj",)

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getitem__(self, key: str) -> Any:
        if key == "kind" and hasattr(self._obj, "kind"):  # an event's class name; a miss has none
            return self._obj.kind
        if key not in self._obj.__dataclass_fields__:
            raise KeyError(key)
        v = getattr(self._obj, key)
        return EventFields(v) if hasattr(v, "__dataclass_fields__") else v

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __iter__(self) -> Iterator[str]:
        return iter(self._obj.__dataclass_fields__)

    def __len__(self) -> int:
        return len(self._obj.__dataclass_fields__)


class EventFilter(QObject):
    """The shared filter and range. `sigChanged` fires when either changes (not when the
    log grows: views that follow the log catch up on `state.sigChanged` themselves)."""

    sigChanged = Signal()

    def __init__(self, state: PoolState, parent: QObject | None = None, worker: Any = None,
                 async_events: int = ASYNC_EVENTS) -> None:
        super().__init__(parent)
        self.state = state
        self.worker = worker  # app.runtime.worker.ModelWorker, or None: always match here
        self.async_events = async_events
        self.pending = False  # a match is running on the worker; views say "matching"
        self._job = 0
        self.filter: Filter = parse("")
        self.range: tuple[int, int] | None = None  # first and last event seq, both included
        self._mask = np.zeros(0, dtype=bool)
        self._scanned = 0
        self._log: Any = None
        self._context = EventContext({}, {})
        state.sigReset.connect(self._on_reset)

    # ------------------------------------------------------------------ setting
    def set_filter(self, flt: Filter | str) -> None:
        flt = parse(flt) if isinstance(flt, str) else flt
        if flt.text == self.filter.text:
            return
        self.filter = flt
        self._start()
        self.sigChanged.emit()

    def _start(self) -> None:
        """Match the log afresh: here as views ask, or on the worker for a long log."""
        self._restart()
        flt, events = self.filter, self.state.log.events
        if columnar_mask(self.state.log, flt, probe=True) is not None:
            return  # matched on the columns when a view asks: no worker, no Event per row
        if self.worker is not None and flt.root is not None and len(events) > self.async_events:
            self._job += 1
            self.pending = True
            self._log = self.state.log
            # references: the worker reads the frozen events (a columnar log's are built
            # there, chunk by chunk, as it reads them: it is read-only)
            snapshot = events if getattr(self.state.log, "columnar_log", False) else list(events)
            job = self._job
            self.worker.submit(match_events, snapshot, flt, on_done=lambda r: self._matched(job, r),
                               on_error=lambda exc: self._match_failed(job, exc))

    def _matched(self, job: int, result: tuple[np.ndarray, EventContext]) -> None:
        if job != self._job or self._log is not self.state.log:
            return  # another filter was typed since, or another log came in
        self._mask, self._context = result
        self._scanned = len(self._mask)
        self.pending = False
        self.sigChanged.emit()

    def _match_failed(self, job: int, exc: BaseException) -> None:
        if job == self._job:
            self.pending = False  # match here instead, as a small log would be
            self.sigChanged.emit()

    def set_range(self, first_seq: int | None, last_seq: int | None = None) -> None:
        """Keep only events with seq in [first_seq, last_seq]; None clears the range."""
        if first_seq is None or last_seq is None:
            new = None
        else:
            lo, hi = sorted((int(first_seq), int(last_seq)))
            new = (lo, hi)
        if new == self.range:
            return
        self.range = new
        self.sigChanged.emit()

    def clear(self) -> None:
        changed = self.filter.root is not None or self.range is not None
        self.filter, self.range = parse(""), None
        self._restart()
        if changed:
            self.sigChanged.emit()

    @property
    def active(self) -> bool:
        return self.filter.root is not None or self.range is not None

    def _on_reset(self) -> None:
        # A new engine: the range belonged to the old log; the typed filter still applies.
        self.range = None
        self._start()
        self.sigChanged.emit()

    def _restart(self) -> None:
        self._job += 1  # a match still running on the worker is for an older filter
        self.pending = False
        self._mask = np.zeros(0, dtype=bool)
        self._scanned = 0
        self._log = None
        self._context = EventContext({}, {})

    # ------------------------------------------------------------------ matching
    def _catch_up(self) -> None:
        log = self.state.log
        events = log.events
        if log is not self._log or self._scanned > len(events):  # another log
            self._restart()
            self._log = log
        n = len(events)
        if self._scanned == n:
            return
        if self.filter.root is None:
            new = np.ones(n - self._scanned, dtype=bool)
        elif (got := columnar_mask(log, self.filter, start=self._scanned)) is not None:
            new = got  # the new events only (a live attach's ticks: not the whole log again)
        else:
            new = _match(events[self._scanned:n], self.filter, self._context)
        self._mask = np.concatenate([self._mask, new])
        self._scanned = n

    def filter_mask(self) -> np.ndarray:
        """Per position of the log: does its event pass the typed filter (range ignored).
        While the worker matches a long log, nothing passes yet (`pending`)."""
        if self.pending:
            return np.zeros(len(self.state.log.events), dtype=bool)
        self._catch_up()
        return self._mask

    def range_mask(self) -> np.ndarray:
        """Per position of the log: is its event inside the range (all True without one)."""
        n = len(self.state.log.events)
        out = np.ones(n, dtype=bool)
        if self.range is not None:
            lo = self.state.log.count_upto(self.range[0] - 1)
            hi = self.state.log.count_upto(self.range[1])
            out[:lo] = False
            out[hi:] = False
        return out

    def match_mask(self) -> np.ndarray:
        """Per position of the log: does its event pass the filter and lie in the range."""
        mask = self.filter_mask()
        return mask & self.range_mask() if self.range is not None else mask

    def matching_positions(self) -> np.ndarray:
        return np.flatnonzero(self.match_mask())

    def matching_seqs(self, in_range: bool = False) -> np.ndarray:
        """Seqs of the events the filter keeps (only those in the range with `in_range`)."""
        mask = self.match_mask() if in_range else self.filter_mask()
        seqs = np.asarray(self.state.log.seqs, dtype=np.int64)
        return seqs[mask[:len(seqs)]]

    def in_range(self, seq: int) -> bool:
        return self.range is None or self.range[0] <= seq <= self.range[1]

    def describe(self) -> str:
        """'kind:evicted · events 120-480', what views print beside their counts."""
        parts = []
        if self.filter.root is not None:
            parts.append(self.filter.text.strip())
        if self.range is not None:
            parts.append(f"events {self.range[0]:,}\u2013{self.range[1]:,}")
        return " · ".join(parts)


def _match(events: Any, flt: Filter, ctx: EventContext) -> np.ndarray:
    """`flt` over `events` in order, learning their requests' tenants and models into `ctx`
    (each chunk's own requests first, as `EventContext.from_events` sees the whole log)."""
    n = len(events)
    out = np.zeros(n, dtype=bool)
    for start in range(0, n, _CHUNK):
        fields = [EventFields(e) for e in events[start:start + _CHUNK]]
        for d in fields:
            rid = d.get("request_id")
            if rid is None:
                continue
            if d.get("salt") is not None:
                ctx.tenants.setdefault(str(rid), str(d["salt"]))
            if d.get("model") is not None:
                ctx.models.setdefault(str(rid), str(d["model"]))
        out[start:start + len(fields)] = [flt.matches(d, ctx) for d in fields]
    return out


_BLOCK_KIND_CODES = (C.ALLOCATED, C.STORED, C.REF, C.FREED, C.EVICTED)
_COLUMN_FIELDS = frozenset({"kind", "tier", "server", "rank", "tenant", "model", "request", "session", "reason",
                            "block"})


def columnar_mask(log: Any, flt: Filter, probe: bool = False, start: int = 0) -> np.ndarray | None:
    """Per event of a columnar log from position `start` on: does it pass `flt`, from the
    columns (as `Filter.matches` over each event, held equal by tests/test_app_columnar.py
    and, for an attached server's log, tests/test_filter_remote_columns.py); None when `log`
    is not columnar, the filter reads a field the columns do not hold (hashes) or the log
    holds events kept as objects (another engine's). With `probe`, only whether it can: an
    empty array or None."""
    if not getattr(log, "columnar_log", False) or flt.root is None or not flt.fields <= _COLUMN_FIELDS:
        return None
    col = log.columnar
    starts = np.asarray(log.starts)[start:]  # `reduceat` reads every event's first row
    r0 = int(starts[0]) if len(starts) else col.num_rows
    kind_all = col.col("kind")
    kind = kind_all[r0:]  # the rows asked for only (a live log's tick: its new rows)
    if not getattr(log, "columns_answer_filters", True) and bool((kind == C.OTHER).any()):
        return None
    if probe:
        return np.zeros(0, bool)
    starts = starts - r0
    req = col.values_at("request", slice(r0, col.num_rows))
    n_kinds = max(C.KIND_NAMES) + 1
    remote = _RemoteRows(log, kind_all, r0, req) if col.has_remote_rows or bool((kind == C.RESET).any()) else None

    def table_hit(leaf: Comparison, values: list[Any], number: bool) -> np.ndarray:
        """The leaf (as a ':' match, or its own op) over a small table of values."""
        column = np.array(values, dtype=np.int64) if number else np.array(values, dtype=str)
        return Filter("", leaf).mask({"kind": column, leaf.field: column})

    def rows_hit(leaf: Comparison) -> np.ndarray:
        f = leaf.field
        if f == "kind":
            return table_hit(leaf, [C.KIND_NAMES.get(k, "") for k in range(n_kinds)], False)[kind]
        if f == "reason":
            hit = table_hit(leaf, [*C.MISS_REASONS, ""], False)
            code = np.where(kind == C.LOOKUP, col.values_at("flag", slice(r0, col.num_rows)), len(C.MISS_REASONS))
            return hit[code]
        if remote is not None and f in _REMOTE_FIELDS:
            values, codes = remote.field(f)
            return table_hit(leaf, values, f == "rank")[codes]
        if f == "block":  # the block ids of the kinds that carry them; a server's rows carry none
            block = np.where(np.isin(kind, _BLOCK_KIND_CODES) & (remote is None or remote.info == 0),
                             col.values_at("block", slice(r0, col.num_rows)), -1)
            return Filter("", leaf).mask({"kind": block, "block": block})
        if f == "tier":
            return table_hit(leaf, ["gpu" if k in _BLOCK_KIND_CODES else "" for k in range(n_kinds)], False)[kind]
        if f in ("server", "model", "session"):
            return np.repeat(table_hit(leaf, [""], False), len(kind))
        if f == "rank":
            return np.repeat(table_hit(leaf, [-1], True), len(kind))
        if f == "request":
            return table_hit(leaf, [x.lower() for x in col.requests.ids], False)[req]
        table, codes = _request_tenant_codes(col, req)  # tenant
        return table_hit(leaf, table, False)[codes]

    def event_mask(node: Any) -> np.ndarray:
        if isinstance(node, Not):
            return ~event_mask(node.operand)
        if isinstance(node, BoolOp):
            masks = [event_mask(o) for o in node.operands]
            out = masks[0].copy()
            for m in masks[1:]:
                out = out & m if node.op == "and" else out | m
            return out
        negate = node.op == "!="
        leaf = dataclasses.replace(node, op=":") if negate else node
        rows = rows_hit(leaf)
        # an event matches when one of its values (rows) does; "!=" when none does
        hit = np.logical_or.reduceat(rows, starts) if len(starts) else np.zeros(0, bool)
        return ~hit if negate else hit

    return event_mask(flt.root)


_REMOTE_FIELDS = frozenset({"tier", "server", "rank", "model", "session", "request", "tenant"})


class _RemoteRows:
    """What the filter's fields read of a log with rows of attached servers (and cache
    resets), per row from `r0` on as codes into small tables of values ('' or -1: none), as
    `engine.analysis.filter_language.field_values` reads their events: a stored, removed or
    reset row of a server names its tier, server, rank, LoRA (model) and session by its
    RemoteInfo (`b`), no block, and its batch's request (a reset: none); a stored row's
    tenant is its own salt, else its request's, learnt as `EventContext` learns it from the
    whole log (the request id's first salt: a request_started's or a stored block's)."""

    def __init__(self, log: Any, kind_all: np.ndarray, r0: int, req: np.ndarray) -> None:
        self.log, self.kind_all, self.r0 = log, kind_all, r0
        self.kind, self.req = kind_all[r0:], np.asarray(req, np.int64)
        self.info = log.columnar.info_numbers(slice(r0, log.columnar.num_rows))
        self.is_reset = self.kind == C.RESET
        self._named: tuple[dict[str, list[Any]], np.ndarray] | None = None

    def _infos(self) -> tuple[dict[str, list[Any]], np.ndarray]:
        """The fields of the RemoteInfos these rows name (`info_columns`), and per row 1 +
        the index of its own among them (0: none): a tick's few hundred, not every batch's."""
        if self._named is None:
            info = self.info
            used = np.flatnonzero(np.bincount(info)) if len(info) else np.zeros(0, np.int64)
            used = used[used > 0]
            number = np.zeros(int(info.max()) + 1 if len(info) else 1, np.int64)
            number[used] = np.arange(1, len(used) + 1)
            self._named = (self.log.columnar.remote_info_columns(used), number[info])
        return self._named

    def field(self, name: str) -> tuple[list[Any], np.ndarray]:
        col = self.log.columnar
        if name in ("tier", "server", "rank", "model", "session"):
            fields, info = self._infos()
        if name == "tier":  # a local block event (a reset too) is on the GPU
            local = np.isin(self.kind, _BLOCK_KIND_CODES + (C.RESET,))
            return (["", "gpu", *(str(m).lower() for m in fields["medium"])],
                    np.where(info > 0, info + 1, local.astype(np.int64)))
        if name == "server":
            return ["", *(str(s).lower() for s in fields["source"])], info
        if name == "rank":
            return [-1, *(0 if r is None else int(r) for r in fields["rank"])], info
        if name == "model":
            return ["", *("" if m is None else str(m).lower() for m in fields["lora_name"])], info
        if name == "session":
            return ["", *("" if v is None else str(v).lower() for v in fields["session_id"])], info
        if name == "request":  # a reset names none; the table: the requests these rows name
            named, codes = np.unique(np.where(self.is_reset, -1, self.req), return_inverse=True)
            ids = col.requests.ids
            return [ids[r].lower() if r >= 0 else "" for r in named.tolist()], codes.reshape(-1)
        return self._tenants()

    def _tenants(self) -> tuple[list[str], np.ndarray]:
        col = self.log.columnar
        table, out = _request_tenant_codes(col, np.where(self.is_reset, -1, self.req))  # a reset names none
        stored = np.flatnonzero((self.kind == C.STORED) & (self.info > 0))  # a stored row's own salt first
        if len(stored):
            salts, names = col.store_salt_codes(np.asarray(col.values_at("a", stored + self.r0), np.int64))
            own = salts > 0
            out[stored[own]] = len(table) + salts[own] - 1
            table += [str(n).lower() for n in names]
        return table, out


class _Tenants:
    """The tenant of each request id as learnt from a log so far, lower-cased: its first
    occurrence's salt (a request_started's), else its first salted stored row's (a server's
    block, `engine.analysis.filter_language.EventContext`'s two sources, in that order). One
    per log (`_learnt`), moved on by the occurrences and rows added since it last read, so
    a live log's tick reads its own, not the whole log's (a tenant filter cost 58 ms a tick
    on 931K attached events)."""

    def __init__(self) -> None:  # (the log is not kept: `_LEARNT` holds its key weakly)
        self.occurrences = 0  # request occurrences read
        self.rows = 0  # rows read for their stores' salts
        self.by_request: dict[str, str] = {}
        self.by_store: dict[str, str] = {}

    def learn(self, col: Any) -> None:
        requests, ids = col.requests, col.requests.ids
        for r in range(self.occurrences, len(requests)):
            salt = requests.salt(r)
            if salt is not None:
                self.by_request.setdefault(ids[r], str(salt).lower())
        self.occurrences = len(requests)
        lo, hi = self.rows, col.num_rows
        if hi > lo and col.has_remote_rows:
            kind = col.col("kind")[lo:hi]
            rows = np.flatnonzero((kind == C.STORED) & (col.info_numbers(slice(lo, hi)) > 0)) + lo
            salts, names = col.store_salt_codes(np.asarray(col.values_at("a", rows), np.int64))
            salted = salts > 0
            reqs = np.asarray(col.values_at("request", rows[salted]), np.int64).tolist()
            for r, code in zip(reqs, salts[salted].tolist()):
                self.by_store.setdefault(ids[r], str(names[code - 1]).lower())
        self.rows = hi

    def tenants(self, col: Any, occurrences: list[int]) -> list[str]:
        """The tenant of each request occurrence's id ('' for none, and for -1: no request), from
        what `col` holds now."""
        self.learn(col)
        ids = col.requests.ids
        out = []
        for r in occurrences:
            rid = ids[r] if r >= 0 else None
            out.append("" if rid is None else self.by_request.get(rid) or self.by_store.get(rid, ""))
        return out


def _request_tenant_codes(col: Any, req: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Per row of request occurrence `req` (-1: none), a code into a table of tenants ('' at 0):
    its request's, learnt for the id from the log (`_Tenants`), for the requests the rows name
    (a tick's: a few hundred neighbours), numbered without a sort of the rows."""
    req = np.asarray(req, np.int64)
    if not len(req):
        return [""], np.zeros(0, np.int64)
    lo = int(req.min())
    used = np.zeros(int(req.max()) - lo + 1, bool)
    used[req - lo] = True
    code = np.cumsum(used)  # the k-th request named: code k (1-based)
    return ["", *_learnt(col).tenants(col, (np.flatnonzero(used) + lo).tolist())], code[req - lo]


_LEARNT: weakref.WeakKeyDictionary[Any, _Tenants] = weakref.WeakKeyDictionary()


def _learnt(col: Any) -> _Tenants:
    """The `_Tenants` of columnar log `col` (a new one if its rows or requests were cut)."""
    got = _LEARNT.get(col)
    if got is None or got.rows > col.num_rows or got.occurrences > len(col.requests):
        got = _LEARNT[col] = _Tenants()
    return got


def match_events(events: Any, flt: Filter) -> tuple[np.ndarray, EventContext]:
    """The worker's job: the mask of `flt` over `events` and the context it learnt."""
    ctx = EventContext({}, {})
    return _match(events, flt, ctx), ctx


def shared_filter(ctx: AppContext) -> EventFilter:
    """The app context's one `EventFilter`, made (and kept on the context) on first use."""
    flt = getattr(ctx, "event_filter", None)
    if flt is None:
        flt = EventFilter(ctx.state, ctx, getattr(ctx, "worker", None))
        ctx.event_filter = flt  # type: ignore[attr-defined]
    return flt
