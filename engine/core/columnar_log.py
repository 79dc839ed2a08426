"""The views' event log over a `ColumnarLog`: the part of `EventLog`'s interface they read,
answered from the columns, never from one Python object per event.

`ColumnarEventLog` wraps a finished `engine.core.columnar.ColumnarLog` (a trace replayed by
the kernel) read-only: `events` is a lazy sequence that builds an `Event` only for the
positions asked for, `seqs` an integer array (int32 while the seqs fit; a replay's 0, 1, 2,
... a `engine.core.columnar.Consecutive` read as one), `series` the
timelines' per-event counts computed with vectorised code from the columns (each in the
narrowest integer type that holds it), and `state_at(seq)` / `live` an
`ArrayProjection`: the pool as `engine.core.columnar.PoolArrays` with what
`engine.core.projection.PoolProjection` offers (hashes, parents, tokens, tenants, request
records, chains) computed per block or per request when asked for. tests/test_app_columnar.py
holds both equal to the Python `EventLog` on real traces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.core.columnar import (
    ALLOCATED, EVICTED, FINISHED, FREE_ABSENT, FREED, KIND_NAMES, LOOKUP, MISS_REASONS, REF, REFUSED, RESET, STARTED,
    STORED, ColumnarLog, Consecutive, EventBounds, EventRows, KeyTable, PoolArrays, as_key, fits,
)
from engine.core.events import Event, MissInfo
from engine.core.pool_state import BlockView, Counters, PoolSnapshot
from engine.core.projection import CACHED_FREE, EMPTY, IN_USE, BlockInfo, RequestRecord, chain_by_parents

# A view asks for the same few hundred events again and again while it paints.
_EVENT_CACHE = 4096
_CHUNK_EVENTS = 16_384  # events built at once when a caller iterates the whole log
# Miss reasons "next miss" jumps to (app.runtime.state.MISS_REASONS), as codes.
_WHOLE_BLOCK_MISSES = tuple(MISS_REASONS.index(r) for r in ("new_content", "evicted", "salt", "model"))
# Past this max ref count the timeline's series counts blocks per ref level in a loop.
_MAX_REF_LEVELS = 64
_I32_MAX = int(np.iinfo(np.int32).max)


@dataclass(slots=True)
class EventSeries:
    """`engine.core.projection.PoolSeries` as numpy arrays: one sample per event."""

    seq: np.ndarray
    in_use: np.ndarray
    cached_free: np.ndarray
    empty: np.ndarray
    max_ref: np.ndarray
    evicted: np.ndarray
    cached_tokens: np.ndarray
    prompt_tokens: np.ndarray
    refusal_seqs: np.ndarray
    reset_seqs: np.ndarray

    def __len__(self) -> int:
        return len(self.seq)

    def evicted_between(self, at: np.ndarray) -> np.ndarray:
        """The evictions of the events from each of the ascending sample positions `at` (0 to
        len) to the next (`engine.core.projection.PoolSeries.evicted_between`)."""
        at = np.asarray(at, np.int64)
        counted = self.evicted
        return np.diff(np.where(at > 0, counted[np.maximum(at - 1, 0)] if len(counted) else 0, 0))


def _made_when_read(name: str) -> property:
    """A field of `LogSeries` left None until read, then made by its log."""
    field = getattr(EventSeries, name)  # the slot's descriptor

    def get(self: LogSeries) -> np.ndarray:
        if field.__get__(self, LogSeries) is None:
            self.cached_tokens, self.prompt_tokens = self._log._token_series()
        return field.__get__(self, LogSeries)

    return property(get, field.__set__)


def _made_each_read(name: str) -> property:
    """A field of a series made each time it is read while it is None (by its `made(name)`),
    never kept: `LogSeries`' and a live server log's (`engine.core.live_log`)."""
    field = getattr(EventSeries, name)  # the slot's descriptor

    def get(self: Any) -> np.ndarray:
        got = field.__get__(self, type(self))
        return self.made(name) if got is None else got

    return property(get, field.__set__)


class Changes:
    """A per-event count that most events leave as it was, kept as the positions where it
    changes (the first included) and its value from each: the Mooncake trace's blocks in use
    change at 32,349 of its 481,145 events, its top ref count at 24,062 (0.19 MB and 0.12 MB
    so, 0.96 MB and 0.48 MB whole)."""

    __slots__ = ("at", "values", "n")

    def __init__(self, at: np.ndarray, values: np.ndarray, n: int) -> None:
        self.at, self.values, self.n = at, values, n

    @staticmethod
    def of(series: np.ndarray) -> Changes | np.ndarray:
        """`series` as its changes where that takes less than half its bytes, else as it is."""
        n = len(series)
        if not n:
            return series
        moved = np.flatnonzero(series[1:] != series[:-1])
        if (len(moved) + 1) * (4 + series.itemsize) * 2 > series.nbytes or n > np.iinfo(np.int32).max:
            return series
        at = np.empty(len(moved) + 1, np.int32)
        at[0] = 0
        np.add(moved, 1, out=at[1:])
        return Changes(at, series[at], n)

    def whole(self) -> np.ndarray:
        """The series, one value an event (made each time)."""
        return np.repeat(self.values, np.diff(self.at, append=self.n))

    def copy(self) -> Changes:
        return Changes(self.at.copy(), self.values.copy(), self.n)

    @property
    def nbytes(self) -> int:
        return self.at.nbytes + self.values.nbytes


class Steps:
    """A per-event count that moves by little from one event to the next, kept as its first
    value and each step in one byte, the few larger steps apart: the Mooncake trace's cached
    free blocks change at 43% of its events, by more than 127 at 0.06% (0.48 MB so, 0.96 MB
    whole as int16)."""

    __slots__ = ("first", "steps", "big_at", "big", "dtype")

    def __init__(self, first: int, steps: np.ndarray, big_at: np.ndarray, big: np.ndarray, dtype: np.dtype) -> None:
        self.first, self.steps, self.big_at, self.big, self.dtype = first, steps, big_at, big, dtype

    @staticmethod
    def of(series: np.ndarray) -> Steps | None:
        """`series` as its steps where that takes at most 0.6 of its bytes, else None."""
        n = len(series)
        if n < 2 or series.itemsize < 2 or n > np.iinfo(np.int32).max:
            return None
        d = np.diff(series.astype(np.int64))
        big_at = np.flatnonzero((d < -127) | (d > 127))
        if n - 1 + 12 * len(big_at) > 0.6 * series.nbytes:
            return None
        big = d[big_at]
        d[big_at] = 0
        return Steps(int(series[0]), d.astype(np.int8), big_at.astype(np.int32), big, series.dtype)

    def whole(self) -> np.ndarray:
        """The series, one value an event (made each time)."""
        # an int16 series sums in int32 (every partial sum is one of its values): half the bytes
        out = np.empty(len(self.steps) + 1, np.int32 if self.dtype.itemsize <= 2 else np.int64)
        out[0] = self.first
        d = out[1:]
        d[:] = self.steps
        d[self.big_at] = self.big
        np.cumsum(out, out=out)
        return out.astype(self.dtype)

    def copy(self) -> Steps:
        return Steps(self.first, self.steps.copy(), self.big_at.copy(), self.big.copy(), self.dtype)

    @property
    def nbytes(self) -> int:
        return self.steps.nbytes + self.big_at.nbytes + self.big.nbytes


def kept_form(series: np.ndarray) -> Changes | Steps | np.ndarray:
    """`series` as a finished log keeps it: its `Changes` or its `Steps`, whichever is smaller
    when either is (they are made whole when read), else as it is."""
    changes = Changes.of(series)
    steps = Steps.of(series)
    if steps is not None and steps.nbytes < changes.nbytes:
        return steps
    return changes


def _kept_as_changes(name: str) -> property:
    """A field of `LogSeries` that may be kept as its `Changes` or `Steps`: read whole each time."""
    field = getattr(EventSeries, name)  # the slot's descriptor

    def get(self: LogSeries) -> np.ndarray:
        got = field.__get__(self, LogSeries)
        return got.whole() if isinstance(got, (Changes, Steps)) else got

    return property(get, field.__set__)


class LogSeries(EventSeries):
    """The series of a finished log. Its running token sums (`cached_tokens`, `prompt_tokens`:
    3.85 MB over the Mooncake trace, read by no view) are made when first read, not kept;
    `empty` (the pool's blocks less those in use and cached free: 0.96 MB, read by no view but
    the export) and `evicted` (the evictions' rows counted at each event's end: 1.9 MB, read
    by the timeline once a draw) each time they are read. `in_use`, `cached_free` and
    `max_ref` are kept as their `Changes` or `Steps` where those are smaller, and made whole
    each time they are read (0.3 to 1 ms each over the Mooncake trace; the timeline reads
    them once a draw and once a zoom)."""

    __slots__ = ("_log",)
    cached_tokens = _made_when_read("cached_tokens")
    prompt_tokens = _made_when_read("prompt_tokens")
    empty = _made_each_read("empty")
    evicted = _made_each_read("evicted")
    in_use = _kept_as_changes("in_use")
    cached_free = _kept_as_changes("cached_free")
    max_ref = _kept_as_changes("max_ref")

    def __init__(self, log: ColumnarEventLog, *fields: Any) -> None:
        super().__init__(*fields)
        self._log = log

    def made(self, name: str) -> np.ndarray:
        """`empty` or `evicted`, made from the log (`_made_each_read`)."""
        if name == "empty":
            return self._log._empty_series(self.in_use, self.cached_free)
        return self._log._evicted_series()


class LazyEvents(Sequence[Event]):
    """The log's events by position, each built from its rows when asked for (a few cached)."""

    def __init__(self, log: ColumnarEventLog) -> None:
        self._log = log
        self._cache: dict[int, Event] = {}

    def __len__(self) -> int:
        return len(self._log)  # the events (a live log of one-row events keeps no starts)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [self[j] for j in range(start, stop, step)]
            return EventRange(self._log, start, max(start, stop))
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"event position {i} is not in a log of {n} events")
        e = self._cache.get(i)
        if e is None:
            if len(self._cache) >= _EVENT_CACHE:
                self._cache.clear()
            e = self._cache[i] = next(self._log.build(i, i + 1))
        return e

    def __iter__(self) -> Iterator[Event]:
        n = len(self)
        for start in range(0, n, _CHUNK_EVENTS):
            yield from self._log.build(start, min(n, start + _CHUNK_EVENTS))

    def __reversed__(self) -> Iterator[Event]:
        for start in range(len(self), 0, -_CHUNK_EVENTS):
            yield from reversed(list(self._log.build(max(0, start - _CHUNK_EVENTS), start)))


class EventRange(Sequence[Event]):
    """A slice of the log's events, built as it is read (on whichever thread reads it: a
    worker matching a filter builds them there, not on the GUI thread)."""

    def __init__(self, log: ColumnarEventLog, start: int, stop: int) -> None:
        self._log, self._start, self._stop = log, start, stop

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [self[j] for j in range(start, stop, step)]
            return EventRange(self._log, self._start + start, self._start + max(start, stop))
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"event position {i} is not in a range of {n} events")
        return self._log.events[self._start + i]

    def __iter__(self) -> Iterator[Event]:
        for start in range(self._start, self._stop, _CHUNK_EVENTS):
            yield from self._log.build(start, min(self._stop, start + _CHUNK_EVENTS))


class ColumnarEventLog:
    """A read-only event log over a `ColumnarLog` (see the module docstring)."""

    columnar_log = True  # views test for this to take their array paths
    columns_answer_filters = True  # app.runtime.selection may match a filter on the columns

    def __init__(self, log: ColumnarLog, time: float = 0.0) -> None:
        self.columnar = log
        self.time = time
        self.event_times: Any = None  # runs of per-event times with `at(positions)`, if kept
        self.block_size = log.block_size
        self._share_events()
        self.events = LazyEvents(self)
        self._series: EventSeries | None = None
        self._live: ArrayProjection | None = None
        self._index: dict[str, Any] = {}

    def _share_events(self) -> None:
        """`starts`, `ends` (each event's first row, and one on its last row's end: two views
        of one array, int32 while the rows fit), `seqs` and `kinds`: a finished log's own
        per-event arrays where it keeps them (`ColumnarLog.event_bounds`), made from its rows
        otherwise."""
        log = self.columnar
        if log.event_bounds is not None and "seq" in log._per_event:
            bounds, seqs = log.event_bounds, log._per_event["seq"]
            kinds = log._per_event.get("kind")
            self.kinds = kinds if kinds is not None else log.col("kind")[bounds[:-1]]  # kind code per event
        else:
            seq = log.col("seq")
            if len(seq):
                starts = np.flatnonzero(np.concatenate(([True], seq[1:] != seq[:-1])))
            else:
                starts = np.zeros(0, np.int64)
            bounds = np.append(starts, log.num_rows)
            seqs = seq[starts]
            self.kinds = log.col("kind")[starts]
        if isinstance(bounds, EventBounds):  # two views of the packed bounds, nothing of their own
            self.starts, self.ends = bounds.starts(), bounds.ends()
        else:
            bounds = narrowest(bounds, np.int32)
            self.starts, self.ends = bounds[:-1], bounds[1:]
        self.seqs = seqs if isinstance(seqs, Consecutive) else narrowest(seqs, np.int32)

    # ------------------------------------------------------------------ EventLog's reads
    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def first_seq(self) -> int | None:
        return int(self.seqs[0]) if len(self.seqs) else None

    @property
    def last_seq(self) -> int | None:
        return int(self.seqs[-1]) if len(self.seqs) else None

    @property
    def num_checkpoints(self) -> int:
        return len(self.columnar._cp_rows)

    def count_upto(self, seq: int | None) -> int:
        """How many events have `event.seq <= seq` (all of them for None)."""
        if seq is None:
            return len(self.seqs)
        return int(np.searchsorted(self.seqs, as_key(seq, self.seqs), side="right"))

    def position_of(self, seq: int) -> int | None:
        i = int(np.searchsorted(self.seqs, as_key(seq, self.seqs)))
        return i if i < len(self.seqs) and int(self.seqs[i]) == seq else None

    def event_at_seq(self, seq: int) -> Event | None:
        i = self.position_of(int(seq))
        return None if i is None else self.events[i]

    def extend(self, events: Any) -> None:
        raise TypeError("a trace's columnar log is read-only; live events go to an EventLog")

    append = extend

    def build(self, start: int, stop: int) -> Iterator[Event]:
        """The events at positions [start, stop), built from their rows."""
        if stop <= start:
            return iter(())
        return self.columnar.events(self.time, int(self.starts[start]), int(self.ends[stop - 1]))

    # ------------------------------------------------------------------ per-event masks
    def kind_names(self) -> np.ndarray:
        """The kind name of every event (a numpy string array)."""
        names = np.array([""] + [KIND_NAMES.get(k, "") for k in range(1, max(KIND_NAMES) + 1)])
        return names[self.kinds]

    def miss_mask(self) -> np.ndarray:
        """Per event: a lookup that missed a whole block it could have hit (`is_miss`). Made
        each time it is asked for (a jump to the next miss: ~1 ms over the Mooncake trace's
        481,145 events), not kept (a byte an event)."""
        look = np.flatnonzero(self.kinds == LOOKUP)  # a lookup an occurrence: the flags read are few
        got = np.zeros(len(self.kinds), bool)
        got[look[np.isin(self.columnar.values_at("flag", self.starts[look]), _WHOLE_BLOCK_MISSES)]] = True
        return got

    def eviction_mask(self) -> np.ndarray:
        """Per event: an eviction or a cache reset. Made each time, as `miss_mask`."""
        return (self.kinds == EVICTED) | (self.kinds == RESET)

    def find(self, mask: np.ndarray, forward: bool, here: int | None) -> int | None:
        """The seq of the nearest event after (or before) seq `here` where `mask` holds."""
        if not len(self.seqs):
            return None
        if here is None:
            here = int(self.seqs[0]) - 1
        if forward:
            i = int(np.searchsorted(self.seqs, as_key(here, self.seqs), side="right"))
            hits = np.flatnonzero(mask[i:])
            return int(self.seqs[i + hits[0]]) if len(hits) else None
        i = int(np.searchsorted(self.seqs, as_key(here, self.seqs), side="left"))
        hits = np.flatnonzero(mask[:i])
        return int(self.seqs[hits[-1]]) if len(hits) else None

    def event_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The event position of each row."""
        return np.searchsorted(self.starts, rows, side="right") - 1

    def request_ids(self) -> np.ndarray:
        """Every request occurrence's id as a numpy string array (by occurrence index)."""
        ids = self._index.get("ids")
        if ids is None:
            ids = self._index["ids"] = np.array(list(self.columnar.requests.ids), dtype=str)
        return ids

    def request_of_events(self) -> np.ndarray:
        """The request occurrence of each event (every event names one)."""
        return self.columnar.values_at("request", np.asarray(self.starts))

    def touched_blocks(self, positions: np.ndarray, upto: int) -> np.ndarray:
        """Block ids the events at `positions` (those before position `upto`) name, sorted."""
        pos = positions[positions < upto]
        if not len(pos):
            return np.zeros(0, np.int64)
        keep = np.zeros(len(self.seqs), bool)
        keep[pos] = True
        row_event = self.row_events()
        block = self.columnar.col("block")
        kind = self.columnar.col("kind")
        m = keep[row_event] & (block >= 0) & np.isin(kind, (ALLOCATED, STORED, REF, FREED, EVICTED))
        return np.unique(block[m]).astype(np.int64)

    def times_at(self, positions: np.ndarray) -> np.ndarray:
        """The time of the events at `positions`: their own where the log keeps them
        (`event_times`: a live log's snapshot), else the log's `time`, which a finished
        log's events share."""
        if self.event_times is not None:
            return self.event_times.at(positions)
        return np.full(len(positions), float(self.time))

    def row_events(self) -> np.ndarray:
        """Per row of the columns, the position of the event it belongs to (int32 while the
        positions fit: 4 bytes a row, kept once the statistics or a filter asked for it)."""
        r = self._index.get("row_events")
        if r is None:
            n = len(self.starts)
            r = np.repeat(np.arange(n, dtype=np.int32 if n <= np.iinfo(np.int32).max else np.int64),
                          self._event_counts())
            self._index["row_events"] = r
        return r

    def _event_counts(self) -> np.ndarray:
        """Each event's row count (read from the packed bounds' bytes where the log keeps them)."""
        starts = self.starts
        return self.ends - starts if isinstance(starts, np.ndarray) else starts.counts()

    # ------------------------------------------------------------------ series
    @property
    def series(self) -> EventSeries:
        if self._series is None:
            loop = _compiled_series_loop()
            s = self._compute_series() if loop is None else self._compiled_series(loop)
            # each count in the narrowest type that holds it (a pool of 16K blocks in int16, a
            # top ref count of a few in int8), about half the bytes of the int32 and int64 the
            # pass returns; `empty` made when read
            in_use, cached_free, evicted = (narrowest(a, np.int16, np.int32) for a in (
                s.in_use, s.cached_free, s.evicted))
            max_ref = narrowest(s.max_ref, np.int8, np.int16, np.int32)
            # the pass counts an eviction row whose block was free (every one a trace's
            # manager writes): when it counted them all, the count after each event is read
            # from the rows (kept for the live state's last eviction anyway), not kept
            if (int(evicted[-1]) if len(evicted) else 0) == len(self.eviction_rows()):
                evicted = None
            in_use, cached_free, max_ref = (kept_form(a) for a in (in_use, cached_free, max_ref))
            self._series = LogSeries(self, s.seq, in_use, cached_free, None, max_ref, evicted, None, None,
                                     s.refusal_seqs, s.reset_seqs)
        return self._series

    def _empty_series(self, in_use: np.ndarray, cached_free: np.ndarray) -> np.ndarray:
        """`EventSeries.empty` from the series' other counts, as the series pass sums it (the
        log's pool size throughout), in int16 whenever it fits (never summed with another: a
        pool of 16,384 blocks)."""
        empty = self.columnar.num_blocks - in_use.astype(np.int64) - cached_free
        return empty.astype(np.int16) if fits(empty, np.int16) else narrowest(empty, np.int32)

    def _evicted_series(self) -> np.ndarray:
        """`EventSeries.evicted` from the eviction rows (each event counts those before its
        end), in the type the series pass's count narrows to."""
        rows = self.eviction_rows()
        # the type `narrowest` gives a count that ends at len(rows)
        top = len(rows)
        dtype = next((t for t in (np.int16, np.int32) if top <= np.iinfo(t).max // 2), np.int64)
        if isinstance(rows, EventRows):  # each the row of its event: the events summed up
            return np.cumsum(rows.events(), dtype=dtype)
        # the event of each row (fewer searches than an event's count each: ~2.6 events a
        # row), summed up
        at = np.searchsorted(self.ends, rows, side="right")
        return np.cumsum(np.bincount(at, minlength=len(self.ends))[:len(self.ends)], dtype=dtype)

    def eviction_rows(self) -> np.ndarray:
        """The rows of the evictions (a cache reset's rows are not), in row order; the same
        array as the live state's evicted rows while the log has no reset."""
        ev = self._index.get("eviction_rows")
        if ev is None:
            if not np.any(self.kinds == RESET):
                ev = self._evicted_rows()
            else:
                col = self.columnar
                ev = self._as_events(_row_numbers((col.col("kind") == EVICTED) & (col.col("block") >= 0)), EVICTED)
            self._index["eviction_rows"] = ev
        return ev

    def _evicted_rows(self) -> np.ndarray:
        """The rows that take a block's hash away (evictions and cache resets), in row order."""
        ev = self._index.get("evicted_rows")
        if ev is None:
            kind, block = self.columnar.col("kind"), self.columnar.col("block")
            ev = self._as_events(_row_numbers(((kind == EVICTED) | (kind == RESET)) & (block >= 0)), EVICTED, RESET)
            self._index["evicted_rows"] = ev
        return ev

    def _as_events(self, rows: np.ndarray, *kinds: int) -> np.ndarray | EventRows:
        """`rows` kept as the events they begin (`EventRows`: the Mooncake trace's 181,986
        evictions, one row each, 0.73 MB as int32) when they are the first rows of the
        events of `kinds` and the log keeps its event bounds (a finished log), else as they are."""
        log = self.columnar
        if log.event_bounds is None or "kind" not in log._per_event:
            return rows
        return EventRows.of(rows, log.event_bounds, np.isin(log._per_event["kind"], kinds))

    def _token_series(self) -> tuple[np.ndarray, np.ndarray]:
        """The cached and prompt tokens summed over the lookups up to each event, in the
        narrowest type that holds them (`EventSeries.cached_tokens`, `prompt_tokens`)."""
        log = self.columnar
        look = np.flatnonzero(log.col("kind") == LOOKUP)
        at_look = np.searchsorted(look, np.asarray(self.ends) - 1, side="right") - 1

        def after_lookups(values: np.ndarray) -> np.ndarray:
            total = np.cumsum(values, dtype=np.int64)
            return np.where(at_look >= 0, total[np.maximum(at_look, 0)], 0) if len(total) else \
                np.zeros(len(self.ends), np.int64)

        cached = after_lookups(log.values_at("a", look) * self.block_size)
        prompt = after_lookups(log.requests.prompt_sizes()[log.values_at("request", look)])
        return narrowest(cached, np.int16, np.int32), narrowest(prompt, np.int16, np.int32)

    def _compiled_series(self, loop: Any) -> EventSeries:
        """The series from one compiled pass over the rows (`_series_loop`), where numba is
        installed (the kernel that filled the log needs it too)."""
        log = self.columnar
        kind, block, a = log.col("kind"), log.col("block"), log.col("a")
        is_ref = kind == REF
        top = int(a[is_ref].max()) if is_ref.any() else 0
        width = max(log.num_blocks, int(block.max()) + 1 if log.num_rows else 0)
        # the pool's size throughout: no block born past it
        out = loop(kind, block, a, log.col("request"), log.requests.prompt_sizes(), np.asarray(self.ends), 0,
                   np.zeros(0, np.int32), log.num_blocks, np.zeros(width, np.int32), np.zeros(width, np.uint8),
                   np.zeros(top + 2, np.int64), np.zeros(6, np.int64), self.block_size)
        in_use, cached_free, empty, max_ref, evicted, cached, prompt = out[:7]
        return EventSeries(self.seqs, in_use, cached_free, empty, max_ref, evicted, cached, prompt,
                           self.seqs[self.kinds == REFUSED], self.seqs[self.kinds == RESET])

    def _compute_series(self) -> EventSeries:
        """Each count as `PoolProjection` keeps it, after every event: the changes are worked
        out on the rows that make them (ref, stored, evicted) from each block's own earlier
        rows, summed in row order and read at each event's last row."""
        log = self.columnar
        kind, block, a = log.col("kind"), log.col("block"), log.col("a")
        last = np.asarray(self.ends) - 1
        rows = np.flatnonzero(((kind == REF) | (kind == STORED) | (kind == EVICTED)) & (block >= 0))
        k = kind[rows]
        # per row: the block's ref count and whether it held a hash just before the row
        ref_before, held = self._block_state_before(rows, k, block[rows], a[rows])
        is_ref, is_st, is_ev = k == REF, k == STORED, k == EVICTED
        new_ref = np.where(is_ref, a[rows], ref_before)
        use = (new_ref > 0).astype(np.int8) - (ref_before > 0).astype(np.int8)
        free_before = ref_before == 0
        cf = np.where(is_ref, -use * held, 0).astype(np.int8)
        cf[is_st] = (free_before[is_st] & (held[is_st] == 0))
        cf[is_ev] = -(free_before[is_ev] & (held[is_ev] == 1)).astype(np.int8)
        evicted_now = (is_ev & free_before).astype(np.int8)
        at = np.searchsorted(rows, last, side="right") - 1  # the last such row of each event

        def after_each_event(delta: np.ndarray) -> np.ndarray:
            total = np.cumsum(delta, dtype=np.int64)
            return np.where(at >= 0, total[np.maximum(at, 0)], 0) if len(total) else np.zeros(len(last), np.int64)

        in_use = after_each_event(use)
        cached_free = after_each_event(cf)
        evicted = after_each_event(evicted_now)
        cached, prompt = self._token_series()
        ref_rows = rows[is_ref]
        max_ref = self._max_ref_series(ref_rows, ref_before[is_ref], new_ref[is_ref], last)
        narrow = np.int32
        return EventSeries(self.seqs, in_use.astype(narrow), cached_free.astype(narrow),
                           (log.num_blocks - in_use - cached_free).astype(narrow), max_ref.astype(narrow),
                           evicted.astype(narrow), cached, prompt, self.seqs[self.kinds == REFUSED],
                           self.seqs[self.kinds == RESET])

    @staticmethod
    def _block_state_before(rows: np.ndarray, kind: np.ndarray, block: np.ndarray,
                            a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each of `rows` (ref, stored and evicted rows, in row order): the ref count
        its block had and whether it held a hash, just before the row."""
        m = len(rows)
        if not m:
            return np.zeros(0, np.int64), np.zeros(0, np.int8)
        order = np.argsort(block, kind="stable")  # grouped by block, row order kept within
        b, k = block[order], kind[order]
        pos = np.arange(m, dtype=np.int64)
        new_group = np.empty(m, bool)
        new_group[0] = True
        np.not_equal(b[1:], b[:-1], out=new_group[1:])
        group_start = np.maximum.accumulate(np.where(new_group, pos, 0))

        def previous(is_source: np.ndarray) -> np.ndarray:
            """Index (in the grouped order) of the block's latest source row before each, -1 if none."""
            src = np.maximum.accumulate(np.where(is_source, pos, -1))
            prev = np.empty(m, np.int64)
            prev[0] = -1
            prev[1:] = src[:-1]
            prev[prev < group_start] = -1
            return prev

        pr = previous(k == REF)
        ref_sorted = np.where(pr >= 0, a[order][np.maximum(pr, 0)], 0)
        ph = previous(k != REF)  # stored or evicted: the last of them says whether it holds one
        held_sorted = np.where(ph >= 0, k[np.maximum(ph, 0)] == STORED, False).astype(np.int8)
        ref_before = np.empty(m, np.int64)
        held = np.empty(m, np.int8)
        ref_before[order] = ref_sorted
        held[order] = held_sorted
        return ref_before, held

    def _max_ref_series(self, ref_rows: np.ndarray, old: np.ndarray, new: np.ndarray, last: np.ndarray) -> np.ndarray:
        """The largest ref count of any block after each event."""
        n_ev = len(last)
        top = int(new.max()) if len(new) else 0
        if top == 0:
            return np.zeros(n_ev, np.int64)
        # the REF rows up to each event's last row
        upto = np.searchsorted(ref_rows, last, side="right")
        if top <= _MAX_REF_LEVELS:
            out = np.zeros(n_ev, np.int64)
            for level in range(1, top + 1):
                count = np.cumsum((new >= level).astype(np.int64) - (old >= level).astype(np.int64))
                at = np.where(upto > 0, count[np.maximum(upto - 1, 0)], 0)
                out += at > 0
            return out
        hist = np.zeros(top + 1, np.int64)
        per_row = np.zeros(len(ref_rows), np.int64)
        best = 0
        for i, (o, v) in enumerate(zip(old.tolist(), new.tolist())):
            if o > 0:
                hist[o] -= 1
            if v > 0:
                hist[v] += 1
                best = max(best, v)
            while best > 0 and hist[best] == 0:
                best -= 1
            per_row[i] = best
        return np.where(upto > 0, per_row[np.maximum(upto - 1, 0)], 0)

    # ------------------------------------------------------------------ projections
    @property
    def live(self) -> ArrayProjection:
        if self._live is None:
            self._live = ArrayProjection(self, self.columnar.state_at(None), len(self.seqs))
        return self._live

    def state_at(self, seq: int | None, base: Any = None) -> ArrayProjection:
        """The pool after every event with seq <= `seq` (the live one for None); `base` is
        accepted for `EventLog`'s signature (checkpoints make every target as quick)."""
        n = self.count_upto(seq)
        if n == len(self.seqs):
            return self.live
        arrays = self.columnar.state_at(int(self.seqs[n - 1]) if n else -1)
        if n == 0:
            arrays.seq = -1
        return ArrayProjection(self, arrays, n)

    def warm(self) -> None:
        """Build what the views read first (the series, the live state, the request and
        eviction indexes) now: on the worker that made the log, so the GUI thread and the
        first scrub find them ready."""
        self.series  # noqa: B018
        live = self.live
        self.start_order()
        self.id_codes()
        self.columnar._request_spans()
        live.looked_up()
        live.last_eviction_seq  # noqa: B018
        # not the cached blocks' digests (`chain_index`): only the hash chain view reads
        # them, and its panel is not drawn by an open; they are made when it is first shown,
        # and each digest, kept by the key table once made, is 65 bytes of Python bytes

    def settle(self) -> None:
        """`ColumnarLog.settle` for what `warm` built too (series, per-event arrays, indexes):
        each array made again now that the passes' temporaries are freed, so the heap's
        freed pages below them can go back to the system."""
        self.columnar.settle()
        if self.columnar.event_bounds is not None and "seq" in self.columnar._per_event:
            self._share_events()  # the log's arrays, made again by its settle
        else:
            bounds = np.append(self.starts, self.ends[-1:]) if len(self.starts) else np.zeros(1, self.starts.dtype)
            self.starts, self.ends = bounds[:-1], bounds[1:]
            self.seqs, self.kinds = self.seqs.copy(), self.kinds.copy()
        s = self._series
        if s is not None:
            s.seq = self.seqs  # one array, as `series` made it
            for field in dataclasses.fields(s)[1:]:
                value = getattr(EventSeries, field.name).__get__(s)  # a token sum not yet made stays so
                if value is not None:
                    setattr(s, field.name, value.copy())
        copies: dict[int, Any] = {}  # an array two indexes share stays one (evictions' rows)
        for key, value in list(self._index.items()):
            if isinstance(value, (np.ndarray, EventRows)):
                got = copies.get(id(value))
                if got is None:  # rows kept as events read the settled bounds
                    got = copies[id(value)] = value.fresh(self.columnar.event_bounds) \
                        if isinstance(value, EventRows) else value.copy()
                self._index[key] = got

    # ------------------------------------------------------------------ indexes, built once
    def request_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per request occurrence: its started, lookup and finished rows (num_rows when none)."""
        idx = self._index.get("requests")
        if idx is None:
            log = self.columnar
            kind, req = log.col("kind"), log.col("request")
            n_req, nrows = len(log.requests), log.num_rows
            dtype = _row_type(nrows)  # a row number, or num_rows for none
            rows = np.arange(nrows, dtype=dtype)
            out = []
            for code in (STARTED, LOOKUP, FINISHED):
                at = np.full(n_req, nrows, dtype)
                m = kind == code
                at[req[m]] = rows[m]
                out.append(at)
            idx = self._index["requests"] = tuple(out)
        return idx

    def occurrences_of(self, rid: str) -> np.ndarray:
        """The started occurrences of request id `rid`, in start order (one search of the ids,
        no dict of a million ids built for it)."""
        started = self.request_index()[0]
        occ = np.flatnonzero(self.request_ids() == rid)
        occ = occ[started[occ] < self.columnar.num_rows]
        return occ[np.argsort(started[occ], kind="stable")]

    def start_order(self) -> tuple[np.ndarray, np.ndarray]:
        """The started occurrences in start order, and their started rows (sorted)."""
        got = self._index.get("start_order")
        if got is None:
            started = self.request_index()[0]
            order = np.argsort(started, kind="stable")
            order = order[started[order] < self.columnar.num_rows].astype(_row_type(len(started)))
            got = self._index["start_order"] = (order, started[order])
        return got

    def id_codes(self) -> tuple[np.ndarray, int]:
        """A dense code per request id (occurrences of one id share it) and how many ids."""
        codes = self._index.get("id_codes")
        if codes is None:
            ids = self.columnar.requests.ids
            if len(set(ids)) == len(ids):  # the usual trace: every id once
                codes = (np.arange(len(ids), dtype=_row_type(len(ids))), len(ids))
            else:
                _, inverse = np.unique(self.request_ids(), return_inverse=True)
                codes = (inverse.astype(_row_type(len(ids))).reshape(-1), int(inverse.max()) + 1 if len(ids) else 0)
            self._index["id_codes"] = codes
        return codes

    def ref_rows_by_block(self) -> tuple[np.ndarray, np.ndarray]:
        """The REF rows grouped by block (row numbers, and each block's group start)."""
        got = self._index.get("ref_by_block")
        if got is None:
            log = self.columnar
            kind, block = log.col("kind"), log.col("block")
            rows = np.flatnonzero(kind == REF)
            rows = rows[np.argsort(block[rows], kind="stable")]
            bounds = np.searchsorted(block[rows], np.arange(log.num_blocks + 1))
            got = self._index["ref_by_block"] = (rows, bounds)
        return got

    def use_clock(self) -> np.ndarray:
        """Per row: how many REF rows came before it (the manager's use clock ticks once each)."""
        got = self._index.get("use_clock")
        if got is None:
            got = self._index["use_clock"] = np.cumsum(self.columnar.col("kind") == REF, dtype=np.int64)
        return got

    def request_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """All occurrences' full-block chain ids in one array, and each occurrence's start in it."""
        got = self._index.get("request_keys")
        if got is None:
            reqs = self.columnar.requests
            flat, starts = reqs.fixed_keys()
            live = [np.asarray(reqs.hash_keys(r), np.int64) for r in range(reqs.num_fixed, len(reqs))]
            if live:
                flat = np.concatenate([flat, *live])
                starts = np.concatenate([starts, starts[-1] + np.cumsum([len(x) for x in live])])
            got = self._index["request_keys"] = (flat, starts)
        return got


class _FreeQueue:
    """The free queue of a state as `PoolProjection.free` reads: ordered, sized, membership."""

    def __init__(self, proj: ArrayProjection) -> None:
        self._proj = proj

    @property
    def order(self) -> np.ndarray:
        return self._proj.free_order()

    def __len__(self) -> int:
        return int(np.count_nonzero(self._proj.arrays.free_pos != FREE_ABSENT))

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[int]:
        return iter(self.order.tolist())

    def __reversed__(self) -> Iterator[int]:
        return iter(self.order[::-1].tolist())

    def __contains__(self, block_id: object) -> bool:
        pos = self._proj.arrays.free_pos
        return isinstance(block_id, (int, np.integer)) and 0 <= block_id < len(pos) and \
            pos[int(block_id)] != FREE_ABSENT


class _BlockColumn(Sequence[Any]):
    """One per-block attribute (hashes, parents, ...) computed for the blocks asked for."""

    def __init__(self, proj: ArrayProjection, which: int) -> None:
        self._proj = proj
        self._which = which

    def __len__(self) -> int:
        return self._proj.num_blocks

    def __getitem__(self, b: Any) -> Any:
        if isinstance(b, slice):
            return [self[i] for i in range(*b.indices(len(self)))]
        return self._proj._attribute(int(b), self._which)


_HASH, _PARENT, _TOKENS, _SALT, _EXTERNAL, _TENANT = range(6)


class _Requests(Mapping[str, RequestRecord]):
    """request id -> its latest `RequestRecord` at the state, built on demand."""

    def __init__(self, proj: ArrayProjection) -> None:
        self._proj = proj

    def _occurrence(self, rid: str) -> int | None:
        if not isinstance(rid, str):
            return None
        occ = self._proj.log.occurrences_of(rid)
        if not len(occ):
            return None
        started = self._proj.log.request_index()[0]
        i = int(np.searchsorted(started[occ], self._proj.arrays.num_rows)) - 1
        return int(occ[i]) if i >= 0 else None

    def __getitem__(self, rid: str) -> RequestRecord:
        made = self._proj._cache.setdefault("records", {})
        got = made.get(rid)
        if got is None:
            r = self._occurrence(rid)
            if r is None:
                raise KeyError(rid)
            got = made[rid] = self._proj.record(r)  # the same object each time, as a dict's value
        return got

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, str) and self._occurrence(rid) is not None

    def __iter__(self) -> Iterator[str]:
        ids = self._proj.log.columnar.requests.ids
        return iter(dict.fromkeys(ids[r] for r in self._proj.started_occurrences().tolist()))

    def __len__(self) -> int:
        codes, _ = self._proj.log.id_codes()
        return len(np.unique(codes[self._proj.started_occurrences()]))


class ArrayProjection:
    """The pool after some event, from `PoolArrays`, read as `PoolProjection` is; read-only.

    Whole-pool arrays (`ref_counts`, `hashed`, `evicted_seq`, the free order) are numpy;
    digests, parents, tokens and tenants are computed for the blocks asked for, request
    records for the requests asked for.
    """

    remote_slots = None
    vacant = None
    slot_ranks = None

    def __init__(self, log: ColumnarEventLog, arrays: PoolArrays, num_events: int) -> None:
        self.log = log
        self.arrays = arrays
        self.block_size = log.block_size
        self.num_blocks = len(arrays.ref_counts)  # a live pool may have grown since
        self.num_events = num_events
        self.seq = int(log.seqs[num_events - 1]) if num_events else -1
        self.counters = arrays.counters
        self.ref_counts = arrays.ref_counts
        self.hash_keys = arrays.hash_keys
        self.free = _FreeQueue(self)
        self.hashes = _BlockColumn(self, _HASH)
        self.parents = _BlockColumn(self, _PARENT)
        self.token_ids = _BlockColumn(self, _TOKENS)
        self.salts = _BlockColumn(self, _SALT)
        self.external_ids = _BlockColumn(self, _EXTERNAL)
        self.tenants = _BlockColumn(self, _TENANT)
        self.requests = _Requests(self)
        self._cache: dict[str, Any] = {}

    # The whole-pool passes below are made when first read, not for every projection built:
    # a 10M-block remote pool gets a new live projection per tick, and a view reads few.
    @property
    def hashed(self) -> np.ndarray:
        """Per block, 1 where it holds a hash (uint8)."""
        got = self._cache.get("hashed")
        if got is None:
            got = self._cache["hashed"] = (self.hash_keys >= 0).view(np.uint8)
        return got

    def _counts(self) -> tuple[int, int, int]:
        got = self._cache.get("counts")
        if got is None:
            in_use = self.ref_counts > 0
            hashed = self.hashed.view(bool)
            got = self._cache["counts"] = (int(np.count_nonzero(in_use)), int(np.count_nonzero(hashed)),
                                           int(np.count_nonzero(hashed & ~in_use)))
        return got

    @property
    def num_in_use(self) -> int:
        return self._counts()[0]

    @property
    def num_hashed(self) -> int:
        return self._counts()[1]

    @property
    def num_cached_free(self) -> int:
        return self._counts()[2]

    def copy(self) -> ArrayProjection:
        return self  # never changed after it is built

    # ------------------------------------------------------------------ counts
    @property
    def num_empty(self) -> int:
        return self.num_blocks - self.num_in_use - self.num_cached_free

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def max_ref_count(self) -> int:
        return int(self.ref_counts.max()) if self.num_blocks else 0

    @property
    def ref_hist(self) -> dict[int, int]:
        values, counts = np.unique(self.ref_counts[self.ref_counts > 0], return_counts=True)
        return dict(zip(values.tolist(), counts.tolist()))

    def category(self, block_id: int) -> int:
        if self.ref_counts[block_id] > 0:
            return IN_USE
        return CACHED_FREE if self.hash_keys[block_id] >= 0 else EMPTY

    # ------------------------------------------------------------------ the free queue
    def free_order(self) -> np.ndarray:
        got = self._cache.get("free_order")
        if got is None:
            got = self.arrays.free_order()
            # block ids: int32 for a pool that fits (kept with the state shown: 4 B a block less)
            got = self._cache["free_order"] = got.astype(np.int32) if self.num_blocks <= _I32_MAX else got
        return got

    def free_ranks(self) -> dict[int, int]:
        return {b: i for i, b in enumerate(self.free_order().tolist())}

    def free_rank(self, block_id: int) -> int | None:
        if self.arrays.free_pos[block_id] == FREE_ABSENT:
            return None
        order = self.free_order()
        return int(np.flatnonzero(order == block_id)[0])

    @property
    def num_resets(self) -> int:
        """Cache resets up to this state."""
        return int(np.count_nonzero(self.log.kinds[:self.num_events] == RESET))

    # ------------------------------------------------------------------ per-block history
    @property
    def evicted_seq(self) -> np.ndarray:
        """Per block: the seq of its last eviction up to this state, -1 if none."""
        got = self._cache.get("evicted_seq")
        if got is None:
            col = self.log.columnar
            ev = self._evicted_rows()
            if isinstance(ev, EventRows):  # the events up to this state's, and their first rows
                events = np.flatnonzero(ev.events()[:self.num_events])
                ev, seqs = ev.bounds[events], self.log.seqs[events]
            else:
                ev = ev[:int(np.searchsorted(ev, self.arrays.num_rows))]
                seqs = col.values_at("seq", ev)
            # int32 while the seqs fit, as the log keeps them (kept with the state shown)
            last = self.log.last_seq
            wide = np.int32 if last is None or int(last) <= _I32_MAX else np.int64
            got = np.full(self.num_blocks, -1, wide)
            got[col.values_at("block", ev)] = seqs  # rows in seq order: a block's last wins
            self._cache["evicted_seq"] = got
        return got

    def _evicted_rows(self) -> np.ndarray:
        return self.log._evicted_rows()

    @property
    def last_eviction_seq(self) -> int:
        got = self._cache.get("last_eviction")
        if got is None:
            ev = self.log.eviction_rows()  # evictions only: a reset is not one
            i = int(np.searchsorted(ev, self.arrays.num_rows)) - 1
            got = self._cache["last_eviction"] = int(self.log.columnar.values_at("seq", ev[i])) if i >= 0 else -1
        return got

    def _last_ref_row(self, b: int) -> int | None:
        rows, bounds = self.log.ref_rows_by_block()
        group = rows[bounds[b]:bounds[b + 1]]
        i = int(np.searchsorted(group, self.arrays.num_rows)) - 1
        return int(group[i]) if i >= 0 else None

    @property
    def last_seq(self) -> _PerBlock:
        return _PerBlock(self, "seq")

    @property
    def last_used(self) -> _PerBlock:
        return _PerBlock(self, "clock")

    # ------------------------------------------------------------------ per-block attributes
    def _attribute(self, b: int, which: int) -> Any:
        if not 0 <= b < self.num_blocks:
            raise IndexError(f"block {b} is not in this pool of {self.num_blocks} blocks")
        key = int(self.hash_keys[b])
        if key < 0:
            return () if which == _TOKENS else None
        keys = self.log.columnar.keys
        if which == _HASH:
            return keys.digest(key)
        stores = self.log.columnar.store_attributes
        if stores is not None:  # a remote pool: what the slot's own store said
            row = self._store_row(b)
            return stores[int(self.log.columnar.values_at("a", row))][(0, 0, 1, 2, 3, 4)[which]]
        if which == _TENANT:
            return self._tenant(key)
        parent, tokens, salt, ext = keys.attributes(key)
        return (None, parent, tokens, salt, ext)[which]

    def _tenant(self, key: int) -> str | None:
        """As `PoolProjection`: the salt of the chain's root, inherited while each parent is held."""
        keys = self.log.columnar.keys
        holder = self.key_holders()
        k = key
        while True:
            parent = keys.parent_of(k)
            if parent < 0:
                return keys.attributes(k)[2]
            if holder[parent] < 0:
                return None
            k = parent

    def _stored_by_block(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Every store row grouped by block (rows ascending within a block), each group's
        bounds, and per row `block * (rows + 1) + row` (ascending: one searchsorted finds
        many blocks' stores), and that `rows + 1`."""
        got = self.log._index.get("stored_by_block")
        if got is None:
            col = self.log.columnar
            rows = np.flatnonzero(col.col("kind")[:col.num_rows] == STORED)
            rows = rows[np.argsort(col.col("block")[rows], kind="stable")]
            blocks = col.col("block")[rows].astype(np.int64)
            bounds = np.searchsorted(blocks, np.arange(col.num_blocks + 1))
            width = col.num_rows + 1
            got = self.log._index["stored_by_block"] = (rows, bounds, blocks * width + rows, width)
        return got

    def _store_row(self, b: int) -> int:
        """The row of the store block `b` holds at this state."""
        rows, bounds, _, _ = self._stored_by_block()
        group = rows[bounds[b]:bounds[b + 1]]
        return int(group[int(np.searchsorted(group, self.arrays.num_rows)) - 1])

    def store_rows(self, blocks: np.ndarray) -> np.ndarray:
        """`_store_row` of many held blocks at once (one searchsorted)."""
        rows, _, code, width = self._stored_by_block()
        blocks = np.asarray(blocks, np.int64)
        if not len(blocks):
            return np.zeros(0, np.int64)
        return rows[np.searchsorted(code, blocks * width + self.arrays.num_rows) - 1]

    # ------------------------------------------------------------------ many blocks at once
    def held_blocks(self) -> np.ndarray:
        """The blocks holding a hash, in the order their hashes were stored (`by_hash`'s)."""
        got = self._cache.get("held_in_store_order")
        if got is None:
            col = self.log.columnar
            held = np.flatnonzero(self.hash_keys >= 0)
            if self.log.columnar.store_attributes is not None and len(held):  # each slot's own store
                stored_at = self.store_rows(held)
            else:
                stored = np.flatnonzero(col.col("kind")[:self.arrays.num_rows] == STORED)
                at = np.full(self.num_blocks, -1, np.int64)
                at[col.values_at("block", stored)] = stored  # the last store of each block wins
                stored_at = at[held]
            got = self._cache["held_in_store_order"] = held[np.argsort(stored_at, kind="stable")]
        return got

    def digests_of(self, blocks: np.ndarray) -> list[bytes | None]:
        """The hash each of `blocks` holds, as `hashes[b]` reads it: None for a block that
        holds none (a hash chain tree laid out from an earlier state asks for its blocks; a
        key of -1 once read the last key's digest, by Python's negative index)."""
        keys = self.log.columnar.keys
        ids = self.hash_keys[np.asarray(blocks, np.int64)]
        many = getattr(keys, "digests", None)
        held = np.flatnonzero(ids >= 0)
        got = ids[held] if len(held) < len(ids) else ids
        digests = many(got) if many is not None else [keys.digest(k) for k in got.tolist()]
        if len(held) == len(ids):
            return list(digests)
        out: list[bytes | None] = [None] * len(ids)
        for i, d in zip(held.tolist(), digests):
            out[i] = d
        return out

    def _stored_of(self, blocks: np.ndarray, which: int, many: str, field: int) -> list[Any]:
        """Attribute `which` of many held blocks at once: a remote pool's from the store each
        holds (its store table's `many` method when it has one, else field `field` of each
        store's tuple), another log's block by block."""
        stores = self.log.columnar.store_attributes
        if stores is None:
            return [self._attribute(b, which) for b in np.asarray(blocks, np.int64).tolist()]
        a = self.log.columnar.values_at("a", self.store_rows(blocks))
        read = getattr(stores, many, None)
        return read(a) if read is not None else [stores[i][field] for i in a.tolist()]

    def parents_of(self, blocks: np.ndarray) -> list[bytes | None]:
        """The parent hash each of `blocks` (held blocks) was stored under, as `parents[b]`."""
        return self._stored_of(blocks, _PARENT, "parents", 0)

    def tokens_of(self, blocks: np.ndarray) -> list[tuple[int, ...]]:
        """The token ids each of `blocks` (held blocks) holds, as `token_ids[b]` reads them."""
        return self._stored_of(blocks, _TOKENS, "tokens", 1)

    def chain_index(self) -> tuple[list[bytes], np.ndarray, np.ndarray, np.ndarray] | None:
        """The cached hashes as arrays, for a journal-fed log (None for another): each hash
        once in `by_hash` order, the block of its first holder, the index (in that order)
        of its first holder's parent (-1: none, or not cached), and whether it has a parent
        hash at all. Equal to reading `by_hash` and `parents` block by block. For a replay's
        log, from its chain ids (`_chain_index_of_ids`)."""
        keys = self.log.columnar.keys
        stores = self.log.columnar.store_attributes
        if stores is None and isinstance(keys, KeyTable) and not keys._live:
            return self._chain_index_of_ids(keys)
        if not hasattr(keys, "identities") or not hasattr(stores, "parent_identities"):
            return None
        held = self.held_blocks()
        ident = keys.identities(self.hash_keys[held])
        uniq, first_at = np.unique(ident, return_index=True)
        order = np.argsort(first_at, kind="stable")  # by_hash order: as first held
        first = held[first_at[order]]
        a = self.log.columnar.values_at("a", self.store_rows(first))
        parent = stores.parent_identities(a)
        has = parent["wide"] != 2
        at = np.searchsorted(uniq, parent).clip(0, max(0, len(uniq) - 1))
        found = has & (len(uniq) > 0) & (uniq[at] == parent) if len(uniq) else np.zeros(len(parent), bool)
        rank = np.empty(len(order), np.int64)  # sorted position -> by_hash position
        rank[order] = np.arange(len(order))
        par = np.where(found, rank[at] if len(uniq) else -1, -1)
        return self.digests_of(first), first, par, has

    def _chain_index_of_ids(self, keys: KeyTable) -> tuple[list[bytes], np.ndarray, np.ndarray, np.ndarray] | None:
        """`chain_index` of a replay's log: a held block's hash is its chain id's digest and
        its parent hash the digest of the id's parent id, so the ids answer what `by_hash`
        (a dict, a tuple and an int per cached hash: 1.9 MB over the Mooncake trace's 16,384
        cached blocks) and `parents` would. None (read `by_hash`) if two ids share a digest."""
        held = self.held_blocks()
        ids = self.hash_keys[held].astype(np.int64)
        if len(ids) and int(ids.max()) >= len(keys.parent):
            return None
        uniq, first_at = np.unique(ids, return_index=True)
        order = np.argsort(first_at, kind="stable")  # by_hash order: as first held
        first = held[first_at[order]]
        parent = keys.parent[uniq[order]].astype(np.int64)  # -1: a root
        has = parent >= 0
        at = np.searchsorted(uniq, parent).clip(0, max(0, len(uniq) - 1))
        found = has & (uniq[at] == parent) if len(uniq) else np.zeros(0, bool)
        rank = np.empty(len(order), np.int64)  # sorted position -> by_hash position
        rank[order] = np.arange(len(order))
        digests = self.digests_of(first)
        if len(set(digests)) != len(digests):
            return None
        return digests, first, np.where(found, rank[at], -1) if len(uniq) else np.zeros(0, np.int64), has

    def salts_of(self, blocks: np.ndarray) -> list[str | None]:
        """The salt each of `blocks` (held blocks) was stored with, as `salts[b]` reads it."""
        return self._stored_of(blocks, _SALT, "salts", 2)

    @property
    def first_holder_shown(self) -> bool:
        """True when `block_of_hash(h)` is `by_hash[h][0]` (a remote pool's copies)."""
        return self.log.columnar.store_attributes is not None

    def tenants_of(self, blocks: np.ndarray) -> list[str | None]:
        """The tenant of each of `blocks` (held blocks), as `tenants[b]` reads it."""
        return self._stored_of(blocks, _TENANT, "tenant_names", 4)

    def key_holders(self) -> np.ndarray:
        """Per chain id: the block holding it in this state (the lowest id), -1 if none."""
        got = self._cache.get("holders")
        if got is None:
            got = np.full(len(self.log.columnar.keys), -1, np.int64)
            held = np.flatnonzero(self.hash_keys >= 0)
            got[self.hash_keys[held[::-1]]] = held[::-1]  # the lowest block id wins
            self._cache["holders"] = got
        return got

    def _key_of_digest(self, digest: bytes) -> int | None:
        """The chain id of a digest some block of this state holds."""
        by = self._cache.get("by_digest")
        if by is None:
            keys = self.log.columnar.keys
            by = {keys.digest(k): k for k in np.unique(self.hash_keys[self.hash_keys >= 0]).tolist()}
            self._cache["by_digest"] = by
        return by.get(digest)

    def block_of_hash(self, block_hash: bytes | None) -> int | None:
        if block_hash is None:
            return None
        if self.log.columnar.store_attributes is not None:  # copies: the oldest store, as PoolProjection
            holders = self.by_hash.get(block_hash)
            return holders[0] if holders else None
        k = self._key_of_digest(block_hash)
        if k is None:
            return None
        b = int(self.key_holders()[k])
        return b if b >= 0 else None

    @property
    def by_hash(self) -> dict[bytes, tuple[int, ...]]:
        """digest -> the blocks holding it, in the order the digests were stored (as
        `PoolProjection.by_hash`, whose order the hash chains' layout follows)."""
        got = self._cache.get("by_hash_map")
        if got is None:
            held = self.held_blocks()
            got = {}
            for d, b in zip(self.digests_of(held), held.tolist()):
                had = got.get(d)
                got[d] = (b,) if had is None else had + (b,)
            self._cache["by_hash_map"] = got
        return got

    def chain_of(self, block_id: int) -> list[int]:
        """The block and its cached ancestors, root first (stops where a parent was evicted)."""
        if self.log.columnar.store_attributes is not None:  # copies: each slot's own parent
            return chain_by_parents(block_id, self.parents, self.block_of_hash)
        keys = self.log.columnar.keys
        holder = self.key_holders()
        chain = [block_id]
        seen = {block_id}
        k = int(self.hash_keys[block_id])
        while k >= 0:
            parent = keys.parent_of(k)
            if parent < 0:
                break
            h = int(holder[parent])
            if h < 0 or h in seen:
                break
            chain.append(h)
            seen.add(h)
            k = parent
        chain.reverse()
        return chain

    # ------------------------------------------------------------------ requests
    @property
    def running(self) -> dict[str, tuple[int, ...]]:
        got = self._cache.get("running")
        if got is None:
            got = self._cache["running"] = self._running()
        return got

    def _running(self) -> dict[str, tuple[int, ...]]:
        n = self.arrays.num_rows
        started, _, finished = self.log.request_index()
        live = np.flatnonzero((started < n) & (finished >= n))
        live = live[np.argsort(started[live], kind="stable")].tolist()
        ids = self.log.columnar.requests.ids
        return {ids[r]: table for r, table in zip(live, self.log.columnar.block_tables(live, n))}

    def owners(self, block_id: int) -> tuple[str, ...]:
        return tuple(rid for rid, table in self.running.items() if block_id in table)

    def started_occurrences(self) -> np.ndarray:
        """Occurrences started in this state, in start order (a prefix of the log's order)."""
        order, starts = self.log.start_order()
        return order[:int(np.searchsorted(starts, self.arrays.num_rows))]

    @property
    def order(self) -> list[str]:
        ids = self.log.columnar.requests.ids
        return [ids[r] for r in self.started_occurrences().tolist()]

    def recent_request_ids(self, limit: int) -> list[str]:
        """Up to `limit` distinct request ids, the latest started first."""
        ids = self.log.columnar.requests.ids
        out: dict[str, None] = {}
        occ = self.started_occurrences()
        for start in range(len(occ), 0, -1024):
            for r in occ[max(0, start - 1024):start][::-1].tolist():
                out.setdefault(ids[r], None)
                if len(out) >= limit:
                    return list(out)
        return list(out)

    @property
    def last_request_id(self) -> str | None:
        n = self.arrays.num_rows
        col = self.log.columnar
        kind = col.col("kind")
        rows = self.log._index.get("start_lookup_rows")
        if rows is None:
            rows = self.log._index["start_lookup_rows"] = np.flatnonzero((kind == STARTED) | (kind == LOOKUP))
        i = int(np.searchsorted(rows, n)) - 1
        return col.requests.ids[int(col.values_at("request", rows[i]))] if i >= 0 else None

    def record(self, r: int) -> RequestRecord:
        """Occurrence `r`'s record as `PoolProjection` keeps it at this state."""
        col = self.log.columnar
        reqs, keys, n = col.requests, col.keys, self.arrays.num_rows
        started, looked, finished = self.log.request_index()
        rec = RequestRecord(reqs.ids[r], reqs.salt(r), reqs.num_prompt_tokens(r),
                            int(col.values_at("seq", started[r])))
        fields: dict[str, Any] = {}
        if looked[r] < n:
            i = int(looked[r])
            hits = int(col.values_at("a", i))
            fields.update(num_cached_tokens=hits * self.block_size, num_hit_blocks=hits,
                          block_hashes=tuple(keys.digest(k) for k in reqs.hash_keys(r)),
                          miss=_miss_of_row(col, i))
        if finished[r] < n:
            i = int(finished[r])
            fields.update(finished_seq=int(col.values_at("seq", i)), num_tokens_with_kv=int(col.values_at("a", i)),
                          aborted=bool(col.values_at("flag", i)))
        return dataclasses.replace(rec, **fields) if fields else rec

    def looked_up(self) -> np.ndarray:
        """The occurrences `request_records()` gives with a miss: per request id, its latest
        occurrence, ordered by the id's first start, kept when that occurrence's lookup is done."""
        got = self._cache.get("looked_up")
        if got is None:
            n = self.arrays.num_rows
            started, looked, _ = self.log.request_index()
            occ = self.started_occurrences()
            codes, num_ids = self.log.id_codes()
            if num_ids == len(codes):  # every id once: each occurrence is its id's latest
                got = self._cache["looked_up"] = occ[looked[occ] < n]
                return got
            c = codes[occ]
            latest = np.full(num_ids, -1, np.int64)
            latest[c] = occ  # occ is in start order: the latest occurrence of each id wins
            first = np.full(num_ids, np.iinfo(np.int64).max, np.int64)
            np.minimum.at(first, c, started[occ])
            ids_present = np.flatnonzero(latest >= 0)
            ids_present = ids_present[np.argsort(first[ids_present], kind="stable")]
            chosen = latest[ids_present]
            got = self._cache["looked_up"] = chosen[looked[chosen] < n]
        return got

    def request_columns(self) -> tuple[Sequence[str], np.ndarray, np.ndarray]:
        """(request ids, cached tokens, computed tokens) of the requests with a lookup, in
        the order `request_records()` gives them: what the metrics plots draw."""
        occ = self.looked_up()
        col = self.log.columnar
        _, looked, _ = self.log.request_index()
        cached = col.values_at("a", looked[occ]).astype(float) * self.block_size
        prompt = col.requests.prompt_sizes()[occ].astype(float)
        return _Names(col.requests.ids, occ), cached, prompt - cached

    def request_records(self) -> list[RequestRecord]:
        """Every started request in start order (the latest record for a reused id)."""
        return [self.requests[rid] for rid in self.requests]

    def requests_using(self, block_hash: bytes, limit: int) -> tuple[tuple[str, ...], int]:
        """Up to `limit` request ids whose prompt hashed to `block_hash` (latest first), and how many."""
        k = self._key_of_digest(block_hash)
        if k is None:
            return (), 0
        flat, starts = self.log.request_keys()
        hit_occ = np.unique(np.searchsorted(starts, np.flatnonzero(flat == k), side="right") - 1)
        _, looked, _ = self.log.request_index()
        occ = self.looked_up()
        use = occ[np.isin(occ, hit_occ)]
        ids = self.log.columnar.requests.ids
        latest_first = [ids[r] for r in use[::-1][:limit].tolist()]
        return tuple(latest_first), len(use)

    # ------------------------------------------------------------------ one block, whole pool
    def block_info(self, block_id: int) -> BlockInfo:
        if not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block {block_id} is not in this pool of {self.num_blocks} blocks")
        b = block_id
        row = self._last_ref_row(b)
        clock = int(self.log.use_clock()[row]) if row is not None else 0
        last_seq = int(self.log.columnar.values_at("seq", row)) if row is not None else None
        ev = int(self.evicted_seq[b])
        return BlockInfo(b, int(self.ref_counts[b]), self.hashes[b], self.parents[b], self.token_ids[b],
                         self.salts[b], self.external_ids[b], self.free_rank(b), clock, tenant=self.tenants[b],
                         last_use_seq=last_seq, evicted_seq=ev if ev >= 0 else None, owners=self.owners(b))

    def snapshot(self) -> PoolSnapshot:
        ranks = self.free_ranks()
        views = tuple(BlockView(i, int(self.ref_counts[i]), self.hashes[i], self.parents[i], self.token_ids[i],
                                self.salts[i], self.external_ids[i], ranks.get(i), self.last_used[i])
                      for i in range(self.num_blocks))
        c = self.counters
        return PoolSnapshot(self.block_size, views, len(ranks), self.num_blocks - len(ranks), self.num_hashed,
                            dict(self.running), Counters(c.num_requests, c.num_prompt_tokens, c.num_cached_tokens,
                                                         c.num_stored_blocks, c.num_evicted_blocks,
                                                         c.num_refused_requests, c.num_finished_requests,
                                                         c.num_hash_collisions))


class _PerBlock(Sequence[int]):
    """Last use of each block (its seq, or the use clock), computed for the blocks asked for."""

    def __init__(self, proj: ArrayProjection, what: str) -> None:
        self._proj = proj
        self._what = what

    def __len__(self) -> int:
        return self._proj.num_blocks

    def __getitem__(self, b: Any) -> Any:
        if isinstance(b, slice):
            return [self[i] for i in range(*b.indices(len(self)))]
        row = self._proj._last_ref_row(int(b))
        if self._what == "seq":
            return int(self._proj.log.columnar.values_at("seq", row)) if row is not None else -1
        return int(self._proj.log.use_clock()[row]) if row is not None else 0


class _Names(Sequence[str]):
    """Request ids of chosen occurrences, read one at a time (a plot's tick labels)."""

    def __init__(self, ids: list[str], occ: np.ndarray) -> None:
        self._ids = ids
        self._occ = occ

    def __len__(self) -> int:
        return len(self._occ)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._ids[r] for r in self._occ[i].tolist()]
        return self._ids[int(self._occ[i])]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Names):
            return other._ids is self._ids and np.array_equal(other._occ, self._occ)
        return isinstance(other, Sequence) and len(other) == len(self) and list(other) == list(self)

    __hash__ = None  # type: ignore[assignment]


def _row_numbers(mask: np.ndarray) -> np.ndarray:
    """The rows where `mask` holds, int32 while row numbers fit (an index kept with the log)."""
    rows = np.flatnonzero(mask)
    return rows.astype(np.int32) if len(mask) <= np.iinfo(np.int32).max else rows


def _row_type(top: int) -> type:
    """The integer type of an index kept with the log whose values go up to `top` (a row
    number or a count): int32 while it fits (half the bytes of numpy's int64), else int64."""
    return np.int32 if top <= np.iinfo(np.int32).max else np.int64


def narrowest(values: np.ndarray, *types: Any) -> np.ndarray:
    """`values` (integers) in the first of `types` narrower than theirs in which every value
    fits in half the range (so a sum of two still fits), else as they are."""
    for narrow in types:
        info = np.iinfo(narrow)
        if values.dtype.itemsize <= info.bits // 8:
            return values
        if not len(values) or (info.min // 2 <= int(values.min()) and int(values.max()) <= info.max // 2):
            return values.astype(narrow)
    return values


def _series_loop(kind: np.ndarray, block: np.ndarray, a: np.ndarray, request: np.ndarray, sizes: np.ndarray,
                 ends: np.ndarray, start_row: int, born: np.ndarray, num_blocks: int, ref: np.ndarray,
                 held: np.ndarray, hist: np.ndarray, acc: np.ndarray, block_size: int) -> tuple:
    """Every count of `EventSeries` after each event, in one pass over rows `start_row` up
    to `ends[-1]`: each row applied as `PoolProjection` applies its event (compiled by
    numba; the numpy `ColumnarEventLog._compute_series` is the same, held equal by tests).
    It resumes: `ref`, `held` (per block), `hist` (blocks per ref count) and `acc` (in use,
    cached free, evicted, top ref, cached tokens, prompt tokens) carry the state after the
    rows before `start_row`, and hold it after the last row when it returns. The pool's
    size after each event: `num_blocks` at the first row, and each block of `born` (the
    rows the blocks from `num_blocks` on were born at, ascending; `ColumnarLog.blocks_at`)
    counts once an event ends past its row (numpy's searchsorted and bincount over a tick's
    ends were a third of this pass's time). Returns the seven counts after each event and,
    per count, 1 where every value is the first (a column kept as one value appends it so)."""
    n_ev = len(ends)
    in_use_out = np.zeros(n_ev, np.int32)
    free_out = np.zeros(n_ev, np.int32)
    empty_out = np.zeros(n_ev, np.int32)
    ref_out = np.zeros(n_ev, np.int32)
    ev_out = np.zeros(n_ev, np.int32)
    cached_out = np.zeros(n_ev, np.int64)
    prompt_out = np.zeros(n_ev, np.int64)
    in_use, cached_free, evicted, best, cached, prompt = acc[0], acc[1], acc[2], acc[3], acc[4], acc[5]
    i = start_row
    nb = num_blocks
    top = num_blocks + len(born)
    for e in range(n_ev):
        while nb < top and born[nb - num_blocks] < ends[e]:
            nb += 1
        while i < ends[e]:
            k = kind[i]
            b = block[i]
            if k == 5 and b >= 0:  # REF
                old = ref[b]
                new = a[i]
                if old > 0:
                    hist[old] -= 1
                if new > 0:
                    hist[new] += 1
                    if new > best:
                        best = new
                if old == 0 and new > 0:
                    in_use += 1
                    if held[b]:
                        cached_free -= 1
                elif old > 0 and new == 0:
                    in_use -= 1
                    if held[b]:
                        cached_free += 1
                ref[b] = new
            elif k == 4 and b >= 0:  # STORED
                if not held[b] and ref[b] == 0:
                    cached_free += 1
                held[b] = 1
            elif k == 7 and b >= 0:  # EVICTED
                if ref[b] == 0:
                    evicted += 1
                    if held[b]:
                        cached_free -= 1
                held[b] = 0
            elif k == 10 and b >= 0:  # RESET: the hash goes, no eviction counted
                if held[b] and ref[b] == 0:
                    cached_free -= 1
                held[b] = 0
            elif k == 2:  # LOOKUP
                cached += a[i] * block_size
                prompt += sizes[request[i]]
            i += 1
        while best > 0 and hist[best] == 0:
            best -= 1
        in_use_out[e] = in_use
        free_out[e] = cached_free
        empty_out[e] = nb - in_use - cached_free
        ref_out[e] = best
        ev_out[e] = evicted
        cached_out[e] = cached
        prompt_out[e] = prompt
    acc[0], acc[1], acc[2], acc[3], acc[4], acc[5] = in_use, cached_free, evicted, best, cached, prompt
    # which series did not move over these events (appended as one value: `_Growing.append_same`)
    same = np.ones(7, np.int8)
    for j in range(1, n_ev):
        if in_use_out[j] != in_use_out[0]:
            same[0] = 0
        if free_out[j] != free_out[0]:
            same[1] = 0
        if empty_out[j] != empty_out[0]:
            same[2] = 0
        if ref_out[j] != ref_out[0]:
            same[3] = 0
        if ev_out[j] != ev_out[0]:
            same[4] = 0
        if cached_out[j] != cached_out[0]:
            same[5] = 0
        if prompt_out[j] != prompt_out[0]:
            same[6] = 0
    return in_use_out, free_out, empty_out, ref_out, ev_out, cached_out, prompt_out, same


_COMPILED: list[Any] = []


def _compiled_series_loop() -> Any:
    """`_series_loop` compiled (cached on disk after the first run), or None without numba."""
    if not _COMPILED:
        try:
            from numba import njit
        except ImportError:
            _COMPILED.append(None)
        else:
            _COMPILED.append(njit(cache=True, nogil=True)(_series_loop))
    return _COMPILED[0]


def _miss_of_row(col: ColumnarLog, i: int) -> MissInfo:
    """The `MissInfo` a lookup row stands for (as `ColumnarLog.events` builds it)."""
    reason = MISS_REASONS[int(col.values_at("flag", i))]
    extra = int(col.values_at("b", i))
    salts = col.keys.salts
    return MissInfo(reason=reason, first_miss_block=int(col.values_at("block", i)),
                    divergence_token=extra if reason == "new_content" else None,
                    evicted_by_seq=(None if extra < 0 else extra) if reason == "evicted" else None,
                    other_salt=(("" if extra < 0 else salts[extra] or "") if reason == "salt" else None))
