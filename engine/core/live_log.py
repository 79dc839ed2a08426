"""The columnar event log of a live source (the local model, a demo, a streamed replay).

`LiveColumnarLog` is a `engine.core.columnar_log.ColumnarEventLog` that grows: `extend`
appends a batch of `Event`s as rows (`ColumnarLog.append_events`) and moves on from the
previous batch, never from the first event: the timelines' series by a compiled pass over
the new rows only (the counts carried between batches), the live pool by applying the new
rows to the previous live `PoolArrays`, and the checkpoints within the same 512 MiB budget
(every other one dropped and the interval doubled, as `EventLog` does). Each event's time
is kept, so the events it builds equal the ones appended. tests/test_live_log.py holds it
equal to `engine.core.projection.EventLog`, the reference, at many scrub points.

What it keeps per event is compact (`_Growing`, `_Runs`: int32 until a value outgrows it, a
column of one value as no array, times as runs), checkpoints between the first and the
newest as their differences from the next (`_DeltaState`), and a large pool's newest as its
differences from the live pool (`_LivePool`), which is moved on in place (`_LiveColumns`):
tests/test_memory_live.py holds the bytes per block to a budget.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from engine.core.columnar import (
    CHECKPOINT_BYTES, EVICTED, OTHER, REF, REFUSED, RESET, STORED, TAIL_BASE, ArithmeticRuns, ColumnarLog,
    PoolArrays, _compiled_runs_extend, bits_at, fits, set_bits,
)
from engine.core.columnar_log import (
    ArrayProjection, ColumnarEventLog, EventSeries, LazyEvents, _compiled_series_loop, _made_each_read, _series_loop,
)
from engine.core.events import Event
from engine.core.growth import regrow
from engine.core.pool_state import Counters
from engine.core.threads import made_once

# Rows between checkpoints at first; doubled whenever more than the budget allows pile up.
FIRST_CHECKPOINT_ROWS = 16_384


# A narrow column keeps this far below its type's limit before it widens (a batch of up to
# this many rows may be appended past the check without wrapping).
_NARROW_MARGIN = 1 << 24


class _Growing:
    """A numpy array appended to in batches (capacity grown by `1 / grow_by`: by half for the
    log's per-event arrays), read as a view (`view`, or `buf` up to `n`); as
    `ColumnarLog.reserve` does for the rows, another thread may make the larger array ahead
    (`reserve`), so the writer copies only what it wrote since.

    Two ways it holds less than a value a slot: `uniform` keeps no buffer while every value
    appended is the same (a remote pool's in-use, ref and token series stay 0 for its life),
    read as a zero-stride view; `narrow` (int32 for an int64 column) stores the values in the
    narrower type while they fit in it (an int32 with room to spare), and widens the whole
    column once when a value would not (numbering and row positions: 4 bytes each until
    2**31 - 2**24)."""

    __slots__ = ("buf", "n", "_spare", "_dtype", "_uniform", "_value", "_margin", "_grow_by")

    def __init__(self, dtype: Any, narrow: Any = None, uniform: bool = False, grow_by: int = 2) -> None:
        self._dtype = np.dtype(dtype)  # what the values are; the buffer may be `narrow`
        self.buf = np.zeros(0 if uniform else 1024, narrow or dtype)
        self.n = 0
        self._spare: tuple[int, np.ndarray] | None = None
        self._uniform = uniform
        self._value: Any = None  # the one value while uniform (None: none appended yet)
        # a narrow int32 keeps this far from its limits (row positions and seqs may be
        # appended a batch past the check); a narrower one (a width code in uint8) fits exactly
        self._margin = _NARROW_MARGIN if narrow is not None and np.dtype(narrow).itemsize >= 4 else 0
        self._grow_by = grow_by

    def _grown(self, need: int) -> int:
        return max(need, len(self.buf) + len(self.buf) // self._grow_by)

    def reserve(self, ahead: int) -> None:
        if self._uniform:
            return
        buf, n0 = self.buf, self.n
        need = n0 + ahead
        spare = self._spare
        if need <= len(buf) or (spare is not None and len(spare[1]) >= need and spare[1].dtype == buf.dtype):
            return
        grown = np.zeros(self._grown(need), buf.dtype)
        grown[:n0] = buf[:n0]
        self._spare = (n0, grown)

    def _fits(self, values: np.ndarray) -> bool:
        """True if `values` can be stored in the buffer's type as they are."""
        kind = self.buf.dtype
        return kind == self._dtype or fits(values, kind, self._margin)

    def extend(self, values: np.ndarray) -> np.ndarray:
        """Append `values`; the indexes they got."""
        start = self.n
        self.append(values)
        return np.arange(start, self.n, dtype=np.int64)

    def append(self, values: np.ndarray) -> None:
        """`extend` without the indexes, which most callers never read (a journal tick made
        an array of them per column, ~16 a tick)."""
        values = np.asarray(values)
        if self._uniform:
            if not len(values):
                return
            value = values[0] if self._value is None else self._value
            if bool((values == value).all()):
                self._value = value
                self.n += len(values)
                return
            # a second value: from now on a buffer, its first `n` slots that one value
            kind = self.buf.dtype if self._fits(np.array([value])) else self._dtype
            # zeros, the value written over the first `n`: the room past them stays unwritten
            # pages (np.full wrote it all: 2 B a block of a 1M-block pool's log, per column)
            self.buf = np.zeros(max(1024, self.n + len(values) + (self.n + len(values)) // 2), kind)
            if value:
                self.buf[:self.n] = value
            self._uniform = False
        if not self._fits(values):
            wide = np.zeros(max(1024, len(self.buf)), self._dtype)
            wide[:self.n] = self.buf[:self.n]
            self.buf, self._spare = wide, None
        need = self.n + len(values)
        self._fit(need)
        self.buf[self.n:need] = values
        self.n = need

    def _fit(self, need: int) -> None:
        """Room in the buffer for `need` values."""
        if need > len(self.buf):
            spare, self._spare = self._spare, None
            if spare is not None and len(spare[1]) >= need and spare[1].dtype == self.buf.dtype:
                n0, grown = spare
                grown[n0:self.n] = self.buf[n0:self.n]
                self.buf = grown
            else:  # where it lies, unless a reader holds a view of it (`regrow`): no copy beside it
                regrow(self, "buf", self._grown(need), self.n)

    def room(self, k: int) -> np.ndarray | None:
        """The next `k` values' place in the buffer, to be written there and then counted
        (`wrote`), where `append` would copy them from an array made for them; None while the
        column is kept as one value (`uniform`) or narrower than its values."""
        if self._uniform or self.buf.dtype != self._dtype:
            return None
        self._fit(self.n + k)
        return self.buf[self.n:self.n + k]

    def wrote(self, k: int) -> None:
        """The `k` values written in `room(k)` are the column's."""
        self.n += k

    def append_one(self, value: Any) -> None:
        """`append` of one value, written in place while it fits and there is room (a journal
        tick's one time: an array made and looked over for it was ~4 us of ~10 a tick)."""
        buf, n = self.buf, self.n
        if not self._uniform and n < len(buf):
            if buf.dtype == self._dtype:
                buf[n] = value
                self.n = n + 1
                return
            low, high = _BOUNDS[buf.dtype.char]  # narrow: within the margin the column keeps
            if low + self._margin <= value <= high - self._margin:
                buf[n] = value
                self.n = n + 1
                return
        self.append(np.array([value], self._dtype))

    def append_same(self, value: Any, n: int) -> None:
        """Append `value` `n` times; while the column holds that one value, without an array."""
        if self._uniform and (self._value is None or self._value == value):
            if n:
                self._value = self._dtype.type(value)
                self.n += n
            return
        self.append(np.full(n, value, self._dtype))

    @property
    def view(self) -> np.ndarray:
        if self._uniform:
            value = self._dtype.type(0 if self._value is None else self._value)
            return np.broadcast_to(np.array(value, self._dtype), (self.n,))
        return self.buf[:self.n]

    @property
    def nbytes(self) -> int:
        """The bytes it holds (its capacity, the spare included)."""
        spare = self._spare
        return self.buf.nbytes + (spare[1].nbytes if spare is not None else 0)


# a narrow buffer's least and most value, by its type's code (np.iinfo takes ~3 us a call)
_BOUNDS = {np.dtype(t).char: (int(np.iinfo(t).min), int(np.iinfo(t).max))
           for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)}


def _numbers(start: int, stop: int) -> np.ndarray:
    """start, start + 1, ... stop - 1 in int32 while they fit (as `_Growing` keeps row numbers)."""
    return np.arange(start, stop, dtype=np.int32 if stop < np.iinfo(np.int32).max - _NARROW_MARGIN else np.int64)


class _Runs:
    """A float column kept as runs of equal values (the position where each run starts and
    its value): events of one batch or tick share its time. Values are given back exactly."""

    __slots__ = ("_at", "_values", "n")

    def __init__(self) -> None:
        self._at = _Growing(np.int64, narrow=np.int32)
        self._values = _Growing(np.float64)
        self.n = 0

    def extend(self, values: np.ndarray) -> None:
        if not len(values):
            return
        values = np.asarray(values, np.float64)
        last = self._values.view[-1:] if self._values.n else values[:0]
        # a new run where the value changes; the bits compared, so -0.0 and NaN come back as given
        bits = values.view(np.int64)
        change = np.empty(len(values), bool)
        change[0] = not len(last) or bool(last.view(np.int64)[0] != bits[0])
        np.not_equal(bits[1:], bits[:-1], out=change[1:])
        at = np.flatnonzero(change)
        self._at.append(self.n + at)
        self._values.append(values[at])
        self.n += len(values)

    def extend_same(self, value: float, n: int) -> None:
        """`extend` by `n` copies of `value` (the rows of a journal tick share its time)."""
        if n <= 0:
            return
        value = np.float64(value)
        values = self._values
        if not values.n or values.buf[values.n - 1:values.n].view(np.int64)[0] != value.view(np.int64):
            self._at.append_one(self.n)
            values.append_one(value)
        self.n += n

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The values at `positions` (an int array, each below `n`)."""
        positions = np.asarray(positions, np.int64)
        run = np.searchsorted(self._at.view, positions, side="right") - 1
        return self._values.view[run]

    def frozen(self) -> _Runs:
        """A copy of the runs so far (a few a tick), read while this one is appended to."""
        out = _Runs()
        out._at.append(self._at.view)
        out._values.append(self._values.view)
        out.n = self.n
        return out

    def __getitem__(self, span: slice) -> np.ndarray:
        start, stop, _ = span.indices(self.n)
        if stop <= start:
            return np.zeros(0, np.float64)
        at = self._at.view
        first = int(np.searchsorted(at, start, side="right")) - 1
        last = int(np.searchsorted(at, stop - 1, side="right"))
        bounds = np.clip(at[first:last], start, stop) - start
        counts = np.diff(np.append(bounds, stop - start))
        return np.repeat(self._values.view[first:last], counts)

    @property
    def nbytes(self) -> int:
        return self._at.nbytes + self._values.nbytes


_ARRAYS = ("ref_counts", "hash_keys", "free_pos")
# a block kept in the newest checkpoint's differences from the live pool: its number, a
# value of each of `_ARRAYS`, its mark
_PATCH_BYTES = 4 + 4 + 4 + 8 + 1
# A pool this large keeps its newest checkpoint as differences from the live pool (a whole
# copy of 262,144 blocks is 3 MB); a smaller one keeps the copy, and its ticks skip the
# bookkeeping (~30 us a tick of the attach route's 4,400 rows, 3-4% of the commit there).
NEWEST_AS_DIFFERENCES_BLOCKS = 1 << 18


class _DeltaState:
    """A checkpoint kept as what differs from the next newer one (`PoolArrays`' reads): per
    array, the blocks whose value differs and their values here, or the whole array where
    more than a third differ. A pool that grows (a remote server's) or changes a few blocks
    between checkpoints keeps a few bytes where a copy was 16 a block; the newest checkpoint
    stays whole, and an array is read back in one copy of it and the patches on the way."""

    __slots__ = ("seq", "num_rows", "counters", "num_blocks", "newer", "parts")

    def __init__(self, state: Any, newer: Any) -> None:
        self.seq, self.num_rows, self.counters = state.seq, state.num_rows, state.counters
        self.num_blocks = len(state.ref_counts)
        self.newer = newer
        self.parts: dict[str, Any] = {}
        for name in _ARRAYS:
            mine, theirs = getattr(state, name), getattr(newer, name)
            n = len(mine)
            if n > len(theirs):
                self.parts[name] = mine
                continue
            idx = np.flatnonzero(mine != theirs[:n])
            if len(idx) * (4 + mine.itemsize) > mine.nbytes // 3:
                self.parts[name] = mine
            else:
                self.parts[name] = (idx.astype(np.int32 if n < 2**31 else np.int64), mine[idx])

    def _array(self, name: str) -> np.ndarray:
        n = self.num_blocks
        patches = []
        state: Any = self
        while isinstance(state, _DeltaState) and isinstance(state.parts[name], tuple):
            patches.append(state.parts[name])
            state = state.newer
        base = state.parts[name] if isinstance(state, _DeltaState) else getattr(state, name)
        out = base[:n].copy()
        for idx, values in reversed(patches):  # the newest first: the older patch wins
            keep = idx < n
            out[idx[keep]] = values[keep]
        return out

    @property
    def ref_counts(self) -> np.ndarray:
        return self._array("ref_counts")

    @property
    def hash_keys(self) -> np.ndarray:
        return self._array("hash_keys")

    @property
    def free_pos(self) -> np.ndarray:
        return self._array("free_pos")

    @property
    def nbytes(self) -> int:
        return sum(_held_bytes(p) if isinstance(p, np.ndarray) else p[0].nbytes + p[1].nbytes
                   for p in self.parts.values())


def _held_bytes(arr: np.ndarray) -> int:
    """The bytes an array holds: none for a zero-stride view of one value."""
    return 0 if arr.ndim and arr.strides[0] == 0 else arr.nbytes


def _whole(state: Any) -> Any:
    """A checkpoint's arrays, whole (a `_DeltaState` read back; a `PoolArrays` as it is)."""
    if not isinstance(state, _DeltaState):
        return state
    from engine.core.columnar import PoolArrays

    return PoolArrays(state.seq, state.num_rows, state.ref_counts, state.hash_keys, state.free_pos, state.counters)


class _LivePool:
    """The live pool's arrays as they are now, as the newest checkpoint reads them: it is
    kept as its differences from them (`LiveColumnarLog._keep_newest` adds each block a
    batch is about to change), not as a whole copy of the pool (12 bytes a block)."""

    __slots__ = ("log",)

    def __init__(self, log: LiveColumnarLog) -> None:
        self.log = log

    @property
    def ref_counts(self) -> np.ndarray:
        return self.log._live_arrays.ref_counts

    @property
    def hash_keys(self) -> np.ndarray:
        return self.log._live_arrays.hash_keys

    @property
    def free_pos(self) -> np.ndarray:
        return self.log._live_arrays.free_pos


def _reads_live(state: Any) -> bool:
    return isinstance(state, _DeltaState) and isinstance(state.newer, _LivePool)


def _frozen(states: list[Any]) -> list[Any]:
    """`states` as they are now, none read from the live pool (a snapshot's): the newest
    made whole, and each difference before it copied and linked to the next one here."""
    out = list(states)
    if not out or not _reads_live(out[-1]):
        return out
    out[-1] = _whole(out[-1])
    for i in range(len(out) - 2, -1, -1):
        state = out[i]
        if not isinstance(state, _DeltaState):
            break
        copied = _DeltaState.__new__(_DeltaState)
        for name in _DeltaState.__slots__:
            setattr(copied, name, getattr(state, name))
        copied.parts = dict(state.parts)
        copied.newer = out[i + 1]
        out[i] = copied
    return out


_SERIES = (("in_use", np.int32), ("cached_free", np.int32), ("empty", np.int32), ("max_ref", np.int32),
           ("evicted", np.int32), ("cached_tokens", np.int64), ("prompt_tokens", np.int64))
# The counts a log keeps only once a request has held a block: until then (an attached
# server's log, always) each follows from the rows and `cached_free` (`_CountsFromRows`).
# Kept, each was 4 B an event of a server that evicts: 8.0 B a block of a 1M-block pool's
# log after its first eviction, where a pool that only stored kept them as one value
MADE_FROM_ROWS = ("empty", "evicted")
# ... and `cached_free` too while every batch was a journal tick that stored only into
# blocks holding no hash and took hashes only from blocks holding one (the placer's rows,
# always: `LiveColumnarLog._free_from_rows`): 4 B an event, 4.0 B a block of the app's
# 1M-block remote pool held


class _CountsFromRows(EventSeries):
    """The series of a live log no request has held a block of (an attached server's): its
    `empty` and `evicted` are not kept, but made each time they are read from the log's rows
    as they were when the series was taken, as its series pass counts them: `evicted` the
    rows that evicted a block up to each event's end, `empty` the pool's blocks then (each
    born at a row) less the cached free ones (none is in use), and `cached_free` too when
    given as None (`LiveColumnarLog._free_from_rows`): the rows that stored into a block
    less those that took a block's hash (evicted or cleared)."""

    __slots__ = ("_kind", "_block", "_ends", "_born", "_n")
    cached_free = _made_each_read("cached_free")
    empty = _made_each_read("empty")
    evicted = _made_each_read("evicted")

    def __init__(self, log: LiveColumnarLog, *fields: Any) -> None:
        super().__init__(*fields)
        col = log.columnar
        rows = col.num_rows
        self._kind, self._block = col.col("kind")[:rows], col.col("block")[:rows]
        # each event's end: None while every event is one row (event i ends at row i + 1)
        self._ends = None if log._bounds is None else np.asarray(log.ends, np.int64)
        self._born = col._born_row.view(col.num_blocks)
        self._n = log._counted  # the events counted (a batch's may have rows, not counts yet)

    def evicted_between(self, at: np.ndarray) -> np.ndarray:
        """`EventSeries.evicted_between` counted from the rows of each span of events alone:
        no whole count is made (a timeline's bars read a few dozen spans each draw)."""
        at = np.asarray(at, np.int64)
        ends = None if self._ends is None else self._ends[:self._n]
        rows = [0 if i <= 0 else int(i if ends is None else ends[i - 1]) for i in at.tolist()]
        return np.array([np.count_nonzero(self._evicting(a, b)) if b > a else 0 for a, b in zip(rows[:-1], rows[1:])],
                        np.int64)

    def _evicting(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Whether each of rows [start, stop) evicted a block (as the series pass counts them)."""
        return (self._kind[start:stop] == EVICTED) & (self._block[start:stop] >= 0)

    def made(self, name: str) -> np.ndarray:
        n = self._n
        ends = np.arange(1, n + 1, dtype=np.int64) if self._ends is None else self._ends[:n]
        if name == "empty":
            return (np.asarray(self._born.searchsorted(ends), np.int64) - self.cached_free).astype(np.int32)
        rows = int(ends[-1]) if n else 0
        wide = np.int32 if rows < _I32_TOP else np.int64
        if name == "cached_free":  # +1 a row that stored into a block, -1 one that took a block's hash
            kind = self._kind[:rows]
            step = (kind == STORED).astype(np.int8)
            step -= (kind == EVICTED) | (kind == RESET)
            step *= self._block[:rows] >= 0
            counted = np.cumsum(step, dtype=wide)
        else:
            counted = np.cumsum(self._evicting(0, rows), dtype=wide)
        return counted if self._ends is None else counted[ends - 1]


_I32_TOP = np.iinfo(np.int32).max


class _LiveColumns(ColumnarLog):
    """A live log's columns, whose live pool (`moving`) is moved on in its own arrays, grown
    by a quarter when the pool outgrows them: `ColumnarLog._advance` gives every other state
    (checkpoints, scrubs) copies, as before. A copy of the whole pool a batch was 16 bytes a
    block each GUI tick (160 MB at 10M blocks), and each freed copy under the mmap threshold
    (app.runtime.allocator) stayed in the heap as a hole the next, larger one did not fit.
    A projection of the live pool is therefore good until the next batch: a state kept
    longer (a scrub, a snapshot) is a copy (`LiveColumnarLog.state_at`, `snapshot`)."""

    moving: PoolArrays | None = None  # the live pool: its arrays are views of `_bufs`
    _bufs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    _zeros: np.ndarray | None = None  # ref counts of 0, a zero-stride view (`_grown_to(refs=False)`)
    # the live pool's free-queue places as int32 offsets from TAIL_BASE (`_ShortPlaces`): None
    # till the first batch, True from it while every batch is a journal tick, False for good
    # from the first that is not (`long_places`)
    short_places: bool | None = None

    def _grown_to(self, state: PoolArrays, stop: int, refs: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`ColumnarLog._grown_to`, the live pool's arrays grown in place; `refs=False` (a pass
        that sets no ref count, whose state has none: `LiveColumnarLog._journal_tick`) gives
        the counts as a zero-stride view, so an attached server's log, all of whose ticks are
        such, keeps no array of them (4 bytes a block, set by no row)."""
        if state is not self.moving or self._bufs is None:
            return super()._grown_to(state, stop)
        ref, hk, pos = self._bufs
        have, n = len(state.hash_keys), _blocks_before(self, stop)
        if n > len(hk):
            cap = max(n, len(hk) + len(hk) // 4)
            hk, pos = (_grown_copy(old, have, cap) for old in (hk, pos))
            self._bufs = (ref, hk, pos)
        if refs and len(ref) < n:
            grown = np.zeros(len(hk), ref.dtype)  # zeroed pages: a count never set is never resident
            if state.ref_counts.strides[0]:  # a zero-stride view: every count is 0, nothing to copy
                grown[:have] = ref[:have]
            ref = grown
            self._bufs = (ref, hk, pos)
        # each new block as `ColumnarLog._grown_to` adds it: no hash, at the free queue's tail from its row
        hk[have:n] = -1
        pos[have:n] = self._born_free_pos(have, n) - (TAIL_BASE if self.short_places else 0)
        if not refs:
            zeros = self._zeros
            if zeros is None or len(zeros) < n:  # np.broadcast_to takes ~15 us: one kept, cut
                zeros = self._zeros = np.broadcast_to(np.int32(0), (max(n, 2 * len(hk)),))
            return zeros[:n], hk[:n], pos[:n]
        return ref[:n], hk[:n], pos[:n]

    def start_moving(self, state: PoolArrays) -> None:
        """Move `state` (a fresh one, shared with nothing) on in place from now on."""
        self._bufs = (state.ref_counts, state.hash_keys, state.free_pos)
        self.moving = state

    def shorten_places(self) -> None:
        """Keep the live pool's places as int32 offsets from TAIL_BASE from now on, if it has
        no block yet (every place a journal tick writes is TAIL_BASE + 2r; a pool made with
        blocks has places below TAIL_BASE); whole for good otherwise."""
        ref, hk, pos = self._bufs
        self.short_places = not len(self.moving.hash_keys)
        if self.short_places:
            self._bufs = (ref, hk, np.zeros(len(pos), np.int32))

    def long_places(self, live: Any) -> PoolArrays:
        """The live pool (`live`) with its places whole (int64) from now on, what
        `ColumnarLog._advance`'s pass writes: a batch that is not a journal tick came, or the
        rows near the offsets' end (`SHORT_PLACE_ROWS`). `live` as it is if they were whole."""
        short_places, self.short_places = self.short_places, False
        if not short_places:
            return live
        ref, hk, short = self._bufs
        pos = np.zeros(len(short), np.int64)  # zeroed pages: the room costs no resident memory
        n = len(live.hash_keys)
        pos[:n] = short[:n]
        pos[:n] += TAIL_BASE
        self._bufs = (ref, hk, pos)
        state = PoolArrays(live.seq, live.num_rows, live.ref_counts, live.hash_keys, pos[:n], live.counters)
        self.moving = state
        return state


# A journal tick writes place TAIL_BASE + 2r at row r: as an int32 offset while 2r fits, with
# room for a tick's rows (`_NARROW_MARGIN`) beyond the check
SHORT_PLACE_ROWS = (1 << 30) - _NARROW_MARGIN


class _ShortPlaces:
    """The live pool of a log whose every batch was a journal tick (an attached server's):
    `PoolArrays`' fields and reads, its free-queue places kept as int32 offsets from TAIL_BASE
    (`short`: 2r, a block's last store at row r, or 2r - 1 for the row it was born at), 4 bytes
    a block where the places were 8 (4.0 B a block of the app's 1M-block remote pool). Every
    place of such a pool is on the queue's tail (no request takes a block: none is absent, no
    free goes to the head). `free_pos` makes them whole, a new array each read."""

    __slots__ = ("seq", "num_rows", "ref_counts", "hash_keys", "short", "counters")

    def __init__(self, seq: int, num_rows: int, ref_counts: np.ndarray, hash_keys: np.ndarray, short: np.ndarray,
                 counters: Counters) -> None:
        self.seq, self.num_rows, self.ref_counts, self.hash_keys = seq, num_rows, ref_counts, hash_keys
        self.short, self.counters = short, counters

    @property
    def free_pos(self) -> np.ndarray:
        return self.short.astype(np.int64) + TAIL_BASE

    def places_at(self, blocks: np.ndarray) -> np.ndarray:
        """The places of `blocks` alone (`free_pos[blocks]`)."""
        return self.short[blocks].astype(np.int64) + TAIL_BASE

    free_order = PoolArrays.free_order
    num_in_use = PoolArrays.num_in_use
    num_cached_free = PoolArrays.num_cached_free


def _values_at(state: Any, name: str, blocks: np.ndarray) -> np.ndarray:
    """`getattr(state, name)[blocks]`, a short-placed pool's places without making them whole."""
    if name == "free_pos" and isinstance(state, _ShortPlaces):
        return state.places_at(blocks)
    return getattr(state, name)[blocks]


def _blocks_before(col: ColumnarLog, row: int) -> int:
    """`col.blocks_at(row)` for one row, without `as_key`'s np.iinfo (~10 us a call, one a
    journal tick): the pool's blocks if the newest was born before `row` (a tick's end),
    else a search of the born rows."""
    nb = col.num_blocks
    if nb == col.initial_blocks:
        return nb
    born = col._born_row
    if born.last < row:
        return nb
    return int(born.searchsorted(row))



def _grown_copy(old: np.ndarray, have: int, cap: int) -> np.ndarray:
    """A `cap`-long array of `old`'s type holding its first `have` values, the rest unset and
    untouched (np.concatenate with an empty array wrote the room too: its pages, at every growth)."""
    grown = np.empty(cap, old.dtype)
    grown[:have] = old[:have]
    return grown


@dataclasses.dataclass(slots=True, eq=False)
class PreparedRows:
    """Rows made for a run of events (`LiveColumnarLog.prepare`), not yet written: the int64
    row table (`ColumnarLog.write_rows`' layout) and each event's seq and time."""

    log: LiveColumnarLog
    row0: int  # the log's row the first of them becomes
    table: np.ndarray
    seqs: np.ndarray
    times: np.ndarray

    def __len__(self) -> int:
        """The events the rows stand for."""
        return len(self.seqs)

    def split(self, n: int) -> tuple[PreparedRows, PreparedRows]:
        """The rows of the first `n` events and those of the rest."""
        cut = int(np.searchsorted(self.table[:, 1], self.seqs[n])) if n < len(self.seqs) else len(self.table)
        return (PreparedRows(self.log, self.row0, self.table[:cut], self.seqs[:n], self.times[:n]),
                PreparedRows(self.log, self.row0 + cut, self.table[cut:], self.seqs[n:], self.times[n:]))


class PreparedBatch(list):
    """A batch of events (a list, as the bridge's `sigEvents` carries) whose first
    `sum(len(p) for p in prepared)` have their rows made already, in `prepared`."""

    __slots__ = ("prepared",)

    def __init__(self, events: Iterable[Event] = (), prepared: list[PreparedRows] | None = None) -> None:
        super().__init__(events)
        self.prepared = prepared or []


class LiveColumnarLog(ColumnarEventLog):
    """A columnar event log that live batches are appended to (see the module docstring).

    Like `EventLog`, it is written by one thread (the GUI thread, one batch per frame) and
    read by the views there; `snapshot()` gives a worker a read-only log of what is in it now.
    """

    live_log = True

    def __init__(self, num_blocks: int = 0, block_size: int = 16, checkpoint_rows: int | None = None,
                 max_checkpoints: int = 64) -> None:
        if num_blocks < 0:
            raise ValueError(f"a pool cannot have {num_blocks} blocks")
        if block_size < 1:
            raise ValueError(f"block size must be at least 1, not {block_size}")
        col = _LiveColumns(num_blocks, block_size)
        self.columnar = col
        self.time = 0.0
        self.block_size = block_size
        # each event's first row and, one on, one past its last (events' rows are contiguous):
        # none while every event has one row, from the first (an attached server's journal):
        # event i is row i then, and `_one_row_events` counts them
        self._bounds: _Growing | None = None
        self._one_row_events = 0
        # each event's seq: none of its own while every event has one row (an attached
        # server's journal, one row a block operation): the row seq column is it then
        self._seqs: _Growing | None = None
        # each event's kind: none of its own while every event has one row, as the seqs
        self._kinds, self._times = _Growing(np.uint8, uniform=True), _Runs()
        self.event_times = self._times  # (`times_at`: each event's own time)
        self._columns = {name: _Growing(dtype, narrow=np.int32 if dtype == np.int64 else None, uniform=True)
                         for name, dtype in _SERIES}
        self._refusals, self._resets = _Growing(np.int64), _Growing(np.int64)
        self._made_events = 0  # events `prepare` made rows for
        self.events = LazyEvents(self)
        self._index: dict[str, Any] = {}
        self._live: ArrayProjection | None = None
        self._live_arrays = col.initial_state()
        col.start_moving(self._live_arrays)
        # the series pass's state between batches: per block ref count and hash held,
        # blocks per ref count, and (in use, cached free, evicted, top ref, cached, prompt);
        # both per-block arrays only as long as `_series_on` needed them last (`_fit_series_state`):
        # a journal tick's pass reads a block's hash held from the live pool (`_journal_tick`)
        self._ref = np.zeros(max(1, num_blocks), np.int32)  # a ref count, as PoolArrays keeps it
        self._any_ref = False  # a ref row appended yet (an attached server's log has none)
        # `cached_free` made from the rows, not kept (`MADE_FROM_ROWS`), till a batch is not a
        # journal tick whose rows follow the placer's rules (`_keep_cached_free`)
        self._free_from_rows = True
        self._counted = 0  # the events the series count (`rows_appended` moved them on over)
        self._held = np.zeros(max(1, num_blocks), np.uint8)
        self._held_stale = False  # a journal tick moved the hashes on since `_held` was written
        self._zero_refs = np.broadcast_to(np.int32(0), (1024,))  # `_no_refs`
        self._hist = np.zeros(2, np.int64)
        self._acc = np.zeros(6, np.int64)
        # the newest checkpoint as its differences from the live pool: per block of it, a
        # bit (block b: bit b & 7 of byte b >> 3) set where they are kept (`_keep_newest`);
        # those blocks and, per array, their values
        self._marks: np.ndarray | None = None
        self._patch: tuple[_Growing, dict[str, _Growing]] | None = None
        col.checkpoint_rows = checkpoint_rows or max(FIRST_CHECKPOINT_ROWS, num_blocks)
        self.max_checkpoints = max(2, max_checkpoints)
        self.columns_answer_filters = True  # until a row the filter's columns do not describe
        col._cp_rows = [0]
        col._cp_states = [col.initial_state()]  # not the live pool's: that one moves

    # ------------------------------------------------------------------ what the base class reads
    @property
    def starts(self) -> np.ndarray:  # type: ignore[override]
        if self._bounds is not None:
            return self._bounds.view[:-1]
        return _numbers(0, self._one_row_events)

    @property
    def ends(self) -> np.ndarray:  # type: ignore[override]
        if self._bounds is not None:
            return self._bounds.view[1:]
        return _numbers(1, self._one_row_events + 1)

    @property
    def last_seq(self) -> int | None:  # type: ignore[override]
        runs = self.columnar._cols.get("seq")
        if self._seqs is None and isinstance(runs, ArithmeticRuns) and runs.n and runs.n == self._num_events():
            return runs.last  # a journal's newest event's (a row each), no view of the runs made for it
        return super().last_seq

    @property
    def seqs(self) -> np.ndarray:  # type: ignore[override]
        if self._seqs is not None:
            return self._seqs.view
        return self.columnar.seq_runs(self._num_events())  # a journal's runs: not made whole a call

    def _num_events(self) -> int:
        return self._one_row_events if self._bounds is None else max(0, self._bounds.n - 1)

    def event_of_rows(self, rows: np.ndarray) -> np.ndarray:
        if self._bounds is not None:
            return super().event_of_rows(rows)
        return np.clip(np.asarray(rows, np.int64), -1, self._one_row_events - 1)  # event i is row i

    @property
    def kinds(self) -> np.ndarray:  # type: ignore[override]
        if self._bounds is None:  # an event a row: the rows' own kinds
            return self.columnar.col("kind")[:self._one_row_events]
        return self._kinds.view

    @property
    def series(self) -> EventSeries:  # type: ignore[override]
        c = self._columns
        if self._any_ref:
            return EventSeries(self.seqs, *(c[name].view for name, _ in _SERIES), self._refusals.view,
                               self._resets.view)
        made = (*MADE_FROM_ROWS, "cached_free") if self._free_from_rows else MADE_FROM_ROWS
        return _CountsFromRows(self, self.seqs, *(None if name in made else c[name].view for name, _ in _SERIES),
                               self._refusals.view, self._resets.view)

    @property
    def live(self) -> ArrayProjection:  # type: ignore[override]
        if self._live is None:
            live = ArrayProjection(self, self._live_arrays, len(self.seqs))
            if not self._any_ref and len(live.log.seqs):
                # no request ever held a block (a remote pool's): every block holding a hash is
                # cached free, which the series counts, so no whole-pool pass is made per tick
                # (a 10M-block pool's three were ~10 ms of each redraw's summary)
                cached = int(self._acc[1])  # the series pass's, after the last event
                live._cache["counts"] = (0, cached, cached)
            self._live = live
        return self._live

    def build(self, start: int, stop: int) -> Iterator[Event]:
        """The events at positions [start, stop), each with the time it arrived with."""
        if stop <= start:
            return
        times = self._times[start:stop].tolist()
        bounds = self._bounds
        first, last = (start, stop) if bounds is None else (int(bounds.buf[start]), int(bounds.buf[stop]))
        events = self.columnar.events(0.0, first, last)
        for e, t in zip(events, times):
            yield e if e.time == t else dataclasses.replace(e, time=t)

    def kind_names(self) -> np.ndarray:
        names = super().kind_names()
        other = np.flatnonzero(self.kinds == OTHER)
        if len(other):
            names = names.astype(object)
            others = self.columnar._others
            for i in other.tolist():
                names[i] = others[int(self.seqs[i])].kind
            names = names.astype(str)
        return names

    def warm(self) -> None:  # a live log is built as it goes
        pass

    def blocks_of_rows(self, start: int, array: bool = False) -> list[int] | np.ndarray:
        """The slot of every stored and removed row from row `start` on (-1: none), in row
        order: one per `BlockStored` and `BlockEvicted` (what `RemoteOverlay` follows); a
        numpy array with `array`."""
        col = self.columnar
        kind = col.col("kind")[start:]
        blocks = col.col("block")[start:][(kind == STORED) | (kind == EVICTED)]
        return blocks if array else blocks.tolist()

    # ------------------------------------------------------------------ appending
    def append(self, event: Event) -> None:  # type: ignore[override]
        self.extend((event,))

    def extend(self, events: Iterable[Event]) -> None:  # type: ignore[override]
        """Append a batch in seq order: rows, series, live pool and checkpoints move on.

        A batch whose rows were made for this log off this thread (a `PreparedBatch`, as
        the bridge hands them over) is written with `extend_prepared`; its events that
        were not are appended here."""
        prepared = getattr(events, "prepared", None)
        if prepared and all(p.log is self for p in prepared):
            self.extend_prepared(prepared)
            covered = sum(len(p) for p in prepared)
            if covered < len(events):  # type: ignore[arg-type]
                self.extend(list(events[covered:]))  # type: ignore[index]
            return
        events = events if isinstance(events, list) else list(events)
        if not events:
            return
        seqs = np.fromiter((e.seq for e in events), np.int64, len(events))
        last = self.last_seq
        bad = np.flatnonzero(np.diff(seqs) <= 0)
        if len(bad) or (last is not None and seqs[0] <= last):
            at, before = (int(seqs[bad[0] + 1]), int(seqs[bad[0]])) if len(bad) else (int(seqs[0]), last)
            raise ValueError(f"event seq {at} arrived after seq {before}; events must be in order")
        times = np.fromiter((e.time for e in events), np.float64, len(events))
        r0 = self.columnar.num_rows
        self.columnar.append_events(events)
        self.rows_appended(r0, seqs, times)

    # ------------------------------------------------------------------ rows made off this thread
    @property
    def can_prepare(self) -> bool:
        """True while `prepare` may make rows on another thread (a local engine's pool of a
        known size; not an attached server's, whose slots are placed as rows are written)."""
        col = self.columnar
        return col.preparable and col._slots is None and not col.journal_fed and col.num_blocks > 0

    def prepare(self, events: list[Event]) -> PreparedRows:
        """The rows of `events`, made on the calling thread (an engine thread) and written by
        `extend_prepared` on the thread that writes this log, one array copy per column.
        Events must come in seq order, each batch after the one before; the rows cover the
        first `len(result)` of them, all unless an event needs the writing thread (see
        `ColumnarLog.prepare_events`): that one and every later one go to `extend`."""
        col = self.columnar
        table, done, row0 = col.prepare_events(events)
        seqs = np.fromiter((e.seq for e in events[:done]), np.int64, done)
        times = np.fromiter((e.time for e in events[:done]), np.float64, done)
        # room ahead for what waits to be written and as much again, made here, not there
        col.reserve(max(4 * len(table), len(col._cols["kind"]) // 8))
        self._made_events += done
        ahead = 4 * done + self._made_events - len(self.seqs)
        for arr in self._per_event_arrays():
            arr.reserve(max(ahead, len(arr.buf) // 8))
        return PreparedRows(self, row0, table, seqs, times)

    def _per_event_arrays(self) -> list[_Growing]:
        return [g for g in (self._bounds, self._seqs, self._kinds, *self._columns.values()) if g is not None]

    def extend_prepared(self, prepared: Iterable[PreparedRows]) -> None:
        """Write rows `prepare` made, in the order they were made: the columns, then the
        series, live pool and checkpoints move on once for all of them."""
        parts = [p for p in prepared if len(p)]
        if not parts:
            return
        col = self.columnar
        at = col.num_rows
        for p in parts:
            if p.log is not self or p.row0 != at:
                raise ValueError("prepared rows must be written to the log that made them, in the order made")
            at += len(p.table)
        r0 = col.num_rows
        for p in parts:
            col.write_prepared(p.table, p.row0, int(p.seqs[-1]))
        seqs = parts[0].seqs if len(parts) == 1 else np.concatenate([p.seqs for p in parts])
        times = parts[0].times if len(parts) == 1 else np.concatenate([p.times for p in parts])
        self.rows_appended(r0, seqs, times)

    def rows_appended(self, r0: int, seqs: np.ndarray, times: np.ndarray | float) -> None:
        """Rows from `r0` on were written to the columns (one event per seq of `seqs`):
        the events' index, the series, the live pool and the checkpoints move on. `times`:
        each event's time, or one time for all of them."""
        col = self.columnar
        r1 = col.num_rows
        if r1 - r0 == len(seqs):  # an event a row (a journal's): no run of the seqs to find
            ends = np.arange(r0 + 1, r1 + 1, dtype=np.int64)
            kinds = col.col("kind")[r0:r1]
        else:
            row_seq = col.values_at("seq", slice(r0, r1))
            starts = r0 + np.flatnonzero(np.concatenate(([True], row_seq[1:] != row_seq[:-1])))
            ends = np.append(starts[1:], r1)
            kinds = col.col("kind")[starts]
        bounds = self._bounds
        last = self._one_row_events if bounds is None else int(bounds.view[-1]) if bounds.n else None
        if last and last != r0:
            raise ValueError(f"rows {r0} on follow row {last}: every row belongs to an event")
        if bounds is None and (r1 - r0 != len(seqs) or r0 != self._one_row_events):
            # an event of several rows (or rows not from the first): bounds of their own
            bounds = self._bounds = _Growing(np.int64, narrow=np.int32)
            if self._one_row_events:
                bounds.extend(np.arange(self._one_row_events + 1, dtype=np.int64))
                self._kinds.append(col.col("kind")[:self._one_row_events])  # the events before, a row each
        if bounds is None:
            self._one_row_events = r1
        else:
            bounds.append(ends if bounds.n else np.append(r0, ends))
        if self._seqs is None and r1 - r0 != len(seqs):  # an event of several rows: seqs of their own
            self._seqs = _Growing(np.int64, narrow=np.int32)
            self._seqs.extend(col.values_at("seq", slice(0, r0)))  # the events before, one row each
        if self._seqs is not None:
            self._seqs.append(seqs)
        if bounds is not None:  # (an event a row: its kind is its row's, `kinds`)
            self._kinds.append(kinds)
        if np.ndim(times):
            self._times.extend(times)
        else:
            self._times.extend_same(times, len(seqs))
        self._refusals.append(seqs[kinds == REFUSED])
        self._resets.append(seqs[kinds == RESET])
        if self.columns_answer_filters and (col.has_remote_rows or int(kinds.max()) >= RESET):
            # the kind and block columns alone no longer answer a filter: a remote pool's
            # tiers, ranks and servers are read through its rows' RemoteInfos, a reset's
            # fields by its kind (app.runtime.selection), and another engine's events
            # (OTHER rows) only from the events themselves
            self.columns_answer_filters = False
        fused = bounds is None and self._seqs is None and col.journal_fed
        if not (fused and self._journal_tick(r0, r1, int(seqs[-1]))):
            self._live_arrays = col.long_places(self._live_arrays)  # `_advance`'s pass writes places whole
            self._series_on(r0, ends)
            self._keep_newest(r0, r1)
            self._live_arrays = col._advance(self._live_arrays, r0, r1)  # in place (_LiveColumns)
        self._counted = self._num_events()
        live = self._live_arrays
        if not self._any_ref:  # no request ever held a block (a remote pool's): no array of zeros kept
            live.ref_counts = self._no_refs(len(live.ref_counts))
        col.moving = live
        col._head_marks[r1] = col._head_count(r1)
        if r0 and r0 not in col._cp_rows:
            col._head_marks.pop(r0, None)
        self._checkpoint_on()
        self._live = None
        self._index.clear()

    def _journal_tick(self, r0: int, r1: int, last_seq: int) -> bool:
        """The series and the live pool moved on over rows [r0, r1) (`last_seq` the seq of row
        r1 - 1) in one compiled pass (`_journal_loop`), where `_series_on` and
        `ColumnarLog._advance` each made one: a tick of an attached server's journal, one row
        an event, no request ever holding a block, rows that only store, evict or clear.
        False, nothing moved, for any other rows (a ref row, a lookup): the two passes then.
        The same counts, hashes, places and counters."""
        loop = _compiled_journal_loop()
        if loop is None or self._any_ref or r1 <= r0:
            return False
        col = self.columnar
        if col.short_places is None:  # the first batch, a journal tick: its places short from now on
            col.shorten_places()
        if col.short_places and r1 > SHORT_PLACE_ROWS:
            self._live_arrays = col.long_places(self._live_arrays)
        self._keep_newest(r0, r1)
        state = self._live_arrays
        ref, hk, pos = col._grown_to(state, r1, refs=False)  # in place (_LiveColumns); every ref count 0
        n = r1 - r0
        acc, columns = self._acc, self._columns
        # the pass counts cached free blocks after each event; the log keeps them (written
        # where its column keeps them, unless that keeps one value so far) only once its rows
        # no longer tell them (`_free_from_rows`); empty and evicted it never keeps (no
        # request holds a block here: `MADE_FROM_ROWS`)
        cached_free = columns["cached_free"]
        room = None if self._free_from_rows else cached_free.room(n)
        out = np.empty(n, np.int32) if room is None else room
        got = np.zeros(5, np.int64)
        hashes = col.rows_window("hash", r0, r1)  # these rows only, where kept as runs (`ArithmeticRuns`)
        base = 0 if col.short_places else TAIL_BASE  # a place is base + 2r
        if not loop(col.col("kind"), col.col("block"), hashes, col.col("flag"), r0, r1, acc, hk, pos, base, out,
                    got):
            return False
        self._held_stale = True
        stores, evictions = int(got[0]), int(got[1])
        # in use, top ref, cached and prompt tokens: no ref row, no lookup, so as they were
        for name, value in (("in_use", acc[0]), ("max_ref", acc[3]), ("cached_tokens", acc[4]),
                            ("prompt_tokens", acc[5])):
            columns[name].append_same(value, n)
        if self._free_from_rows and got[4]:  # a row the placer would not write: counts kept from here
            self._keep_cached_free()
        if room is not None:
            cached_free.wrote(n)
        elif not self._free_from_rows:
            if got[3]:
                cached_free.append_same(out[0], n)
            else:
                cached_free.append(out)
        c = state.counters
        counters = Counters(c.num_requests, c.num_prompt_tokens, c.num_cached_tokens, c.num_stored_blocks + stores,
                            c.num_evicted_blocks + evictions, c.num_refused_requests, c.num_finished_requests,
                            c.num_hash_collisions)
        col._heads_after = (r1, col._head_count(r0))  # no row prepends to the free queue's head
        self._live_arrays = (_ShortPlaces if col.short_places else PoolArrays)(last_seq, r1, ref, hk, pos, counters)
        return True

    def _no_refs(self, n: int) -> np.ndarray:
        """`n` ref counts of 0 as a zero-stride view, cut from one kept (np.broadcast_to took
        ~15 us a tick)."""
        zeros = self._zero_refs
        if len(zeros) < n:
            zeros = self._zero_refs = np.broadcast_to(np.int32(0), (max(n, 2 * len(zeros)),))
        return zeros[:n]

    def _fit_series_state(self) -> None:
        """The series pass's per-block state as long as the pool, and each block's hash held
        as the live pool holds it after journal ticks (they keep no `_held`: a block holds a
        hash exactly where its hash key is not -1, as both passes write them)."""
        width = self.columnar.num_blocks
        if width > len(self._ref):
            # grown by half into zeroed pages: the room not used yet costs no resident memory;
            # ref counts no row has set are left untouched (zeroed pages read, never resident)
            cap = max(width, len(self._ref) + len(self._ref) // 2)
            for name in ("_ref", "_held") if self._any_ref else ("_held",):
                old = getattr(self, name)
                grown = np.zeros(cap, old.dtype)
                grown[:len(old)] = old
                setattr(self, name, grown)
            if not self._any_ref:
                self._ref = np.zeros(cap, np.int32)
        if self._held_stale:
            hk = self._live_arrays.hash_keys
            np.greater_equal(hk, 0, out=self._held[:len(hk)].view(bool))
            self._held[len(hk):] = 0
            self._held_stale = False

    def _keep_made(self, names: tuple[str, ...]) -> None:
        """Keep the series `names`, made from the rows so far, in their columns from now on:
        their values so far written there."""
        made = self.series
        for name in names:
            self._columns[name].append(getattr(made, name))

    def _keep_cached_free(self) -> None:
        """Keep `cached_free` in its column from now on (`_keep_made`)."""
        if self._free_from_rows:
            self._keep_made(("cached_free",))
            self._free_from_rows = False

    def _series_on(self, r0: int, ends: np.ndarray) -> None:
        """The series after each new event, from the counts after the previous batch."""
        col = self.columnar
        self._keep_cached_free()  # the pass's rows may be any: its counts are kept
        self._fit_series_state()
        r1 = col.num_rows
        kind, a = col.col("kind"), col.rows_window("a", r0, r1)  # `a`: these rows only, where kept as runs
        new = kind[r0:] == REF
        any_new = bool(new.any())
        if any_new and not self._any_ref:  # the counts made from the rows so far are kept from now on
            self._keep_made(MADE_FROM_ROWS)
        self._any_ref = self._any_ref or any_new
        top = int(a[r0:][new].max()) if any_new else 0
        if top + 2 > len(self._hist):
            self._hist = np.concatenate([self._hist, np.zeros(top + 2 - len(self._hist), np.int64)])
        # the pool's size after each event, counted in the pass from the blocks' born rows
        nb0 = col.blocks_at(r0)
        born = col._born_row.span(nb0, col.num_blocks)  # the blocks born in these rows
        loop = _compiled_series_loop() or _series_loop
        request = col.rows_window("request", r0, r1)
        out = loop(kind, col.col("block"), a, request, col.requests.prompt_sizes(), ends, r0, born,
                   nb0, self._ref, self._held, self._hist, self._acc, self.block_size)
        for (name, _), values, same in zip(_SERIES, out[:7], out[7].tolist()):
            if not self._any_ref and name in MADE_FROM_ROWS:
                continue
            if same and len(values):  # a count that did not move (a remote pool's in use, top ref, tokens)
                self._columns[name].append_same(values[0], len(values))
            else:
                self._columns[name].append(values)

    def _checkpoint_on(self) -> None:
        """A snapshot about every `checkpoint_rows` rows, on an event's first row (as a
        finished log's, `ColumnarLog.build_checkpoints`); past the budget, every other one goes."""
        col = self.columnar
        rows, states = col._cp_rows, col._cp_states
        made = False
        while rows[-1] + col.checkpoint_rows <= col.num_rows:
            made = True
            due = rows[-1] + col.checkpoint_rows
            if due + col.checkpoint_rows > col.num_rows and self._live_arrays.num_rows == col.num_rows:
                # the last one due: after the newest row (an event ends there), the live pool
                # copied; the one before moved on over the rows since passed over them again
                pos = col.num_rows
                state = _copied(self._live_arrays)
            else:
                pos = _event_first_row(col, due, rows[-1])
                state = col._advance(states[-1], rows[-1], pos)
            if not state.ref_counts.any():  # a remote pool's: no request holds a block
                state.ref_counts = np.broadcast_to(np.int32(0), state.ref_counts.shape)
            states.append(state)
            if len(states) > 2:  # the one before keeps its differences from this one (not the first)
                states[-2] = _DeltaState(states[-2], states[-1])
                if isinstance(states[-3], _DeltaState):  # the same arrays: the whole copy can go
                    states[-3].newer = states[-2]
            col._head_marks[pos] = col._head_count(pos)
            rows.append(pos)
            most = max(2, min(self.max_checkpoints, CHECKPOINT_BYTES // (16 * max(1, col.num_blocks))))
            if len(rows) > most:
                col._cp_rows, col._cp_states = rows[::2], _thinned(states)
                rows, states = col._cp_rows, col._cp_states
                col.checkpoint_rows *= 2
                keep = set(rows) | {col.num_rows}
                col._head_marks = {r: v for r, v in col._head_marks.items() if r in keep or r == 0}
        if made and len(states) > 1 and col.num_blocks >= NEWEST_AS_DIFFERENCES_BLOCKS:
            self._newest_from_live()

    def _newest_from_live(self) -> None:
        """The newest checkpoint (whole) kept as the blocks where it differs from the live pool
        and its values there, one pass over the pool; whole still if they pass a third of it."""
        states = self.columnar._cp_states
        whole = _whole(states[-1])
        n = len(whole.hash_keys)
        live = self._live_arrays
        differ = np.zeros(n, bool)
        for name in _ARRAYS:
            differ |= getattr(whole, name) != getattr(live, name)[:n]
        idx = np.flatnonzero(differ)
        self._marks = self._patch = None
        if len(idx) * _PATCH_BYTES > 16 * n // 3:
            return
        marks = np.zeros((n + 7) >> 3, np.uint8)  # a bit a block (`_keep_newest`)
        set_bits(marks, idx)
        blocks = _Growing(np.int64, narrow=np.int32)
        blocks.extend(idx)
        values = {name: _Growing(getattr(whole, name).dtype) for name in _ARRAYS}
        for name, grow in values.items():
            grow.extend(getattr(whole, name)[idx])
        cp = _DeltaState.__new__(_DeltaState)
        cp.seq, cp.num_rows, cp.counters, cp.num_blocks = whole.seq, whole.num_rows, whole.counters, n
        cp.newer = _LivePool(self)
        cp.parts = {name: (blocks.view, grow.view) for name, grow in values.items()}
        states[-1] = cp
        if isinstance(states[-2], _DeltaState):
            states[-2].newer = cp
        self._marks, self._patch = marks, (blocks, values)

    def _keep_newest(self, r0: int, r1: int) -> None:
        """Before rows [r0, r1) move the live pool on: the newest checkpoint, kept as its
        differences from it, keeps the present value of each block they name that it does
        not hold yet (a block no row names is the same in both). Past a third of the
        pool's bytes, the checkpoint is made whole again, as `_DeltaState` keeps an array."""
        cp = self.columnar._cp_states[-1]
        if not _reads_live(cp) or self._marks is None or self._patch is None:
            return
        marks = self._marks
        blocks = self.columnar.col("block")[r0:r1]
        blocks = blocks[blocks.view(f"u{blocks.itemsize}") < cp.num_blocks]  # -1 (no block) read as the largest
        fresh = blocks[bits_at(marks, blocks) == 0]
        if not len(fresh):
            return
        fresh = np.sort(fresh)  # each block once (np.unique took 10 times as long on a tick's rows)
        once = np.empty(len(fresh), bool)
        once[0] = True
        np.not_equal(fresh[1:], fresh[:-1], out=once[1:])
        fresh = fresh[once]
        set_bits(marks, fresh)
        idx, values = self._patch
        idx.append(fresh)
        live = self._live_arrays
        for name, grow in values.items():
            grow.append(_values_at(live, name, fresh))
        cp.parts = {name: (idx.view, grow.view) for name, grow in values.items()}
        if idx.n * _PATCH_BYTES > 16 * cp.num_blocks // 3:
            states = self.columnar._cp_states
            whole = states[-1] = _whole(cp)
            if not whole.ref_counts.any():
                whole.ref_counts = np.broadcast_to(np.int32(0), whole.ref_counts.shape)
            if isinstance(states[-2], _DeltaState):
                states[-2].newer = whole
            self._marks = self._patch = None

    # ------------------------------------------------------------------ what it holds
    def nbytes_by_part(self) -> dict[str, int]:
        """Bytes this log holds beside its rows (`ColumnarLog`'s columns), by part: the
        per-event arrays (rows of each event, seq, kind, time, the series), the series pass's
        per-block state, the live pool and its checkpoints (each array once, however many
        states share it), a remote pool's copies of each hash on the event route (the
        digests themselves apart: the key table keeps them). What tests/test_memory_live.py
        holds to a budget per block."""
        events = sum(g.nbytes for g in (*self._per_event_arrays(), self._times, self._refusals, self._resets))
        seen: set[int] = set()

        def arrays(state: Any) -> int:
            if isinstance(state, _DeltaState):
                return state.nbytes
            out = 0
            places = state.short if isinstance(state, _ShortPlaces) else state.free_pos
            for arr in (state.ref_counts, state.hash_keys, places):
                base = arr.base if arr.base is not None and arr.strides[0] else arr
                if id(base) not in seen:
                    seen.add(id(base))
                    out += _held_bytes(base)
            return out

        live = arrays(self._live_arrays)
        checkpoints = sum(arrays(state) for state in self.columnar._cp_states)
        if self._patch is not None and self._marks is not None:  # the marks, and the room past the kept values
            grown = (self._patch[0], *self._patch[1].values())
            checkpoints += self._marks.nbytes + sum(g.nbytes - g.view.nbytes for g in grown)
        slots = self.columnar._slots  # a remote pool's copies by hash, on the event route
        holders = 0 if slots is None else sys.getsizeof(slots.holders) + sum(
            sys.getsizeof(v) for v in dict.values(slots.holders)) + slots.ranks.itemsize * len(slots.ranks) + \
            slots.places.itemsize * len(slots.places) + sys.getsizeof(slots.tenants)
        return {"events": events, "series_state": self._ref.nbytes + self._held.nbytes + self._hist.nbytes,
                "live": live, "checkpoints": checkpoints, "holders": holders}

    # ------------------------------------------------------------------ a frozen copy for a worker
    def snapshot(self) -> ColumnarEventLog:
        """A read-only log of the events in this one now (the columns shared, not copied):
        what a worker reads while batches keep arriving here."""
        col = self.columnar
        frozen = ColumnarLog.__new__(ColumnarLog)
        frozen.__dict__.update(col.__dict__)
        frozen.__dict__.pop("moving", None)
        frozen.__dict__.pop("_bufs", None)
        frozen._cols = col.frozen_columns()
        frozen._born_row = col._born_row.view(col.num_blocks)  # (blocks added here are not its)
        frozen._cp_rows, frozen._cp_states = list(col._cp_rows), _frozen(col._cp_states)
        frozen._head_marks = dict(col._head_marks)
        frozen._req_index = None
        frozen.final_counters = self._live_arrays.counters
        out = ColumnarEventLog(frozen, self.time)
        out.event_times = self._times.frozen()  # each event's own time, as `build` gives it
        out._series = self.series
        out._live = ArrayProjection(out, _copied(self._live_arrays), len(self.seqs))
        return out

    def state_at(self, seq: int | None, base: Any = None) -> ArrayProjection:  # type: ignore[override]
        """`ColumnarEventLog.state_at`; the pool at the last event, asked for by its seq (a
        scrub there), is a copy of the live one, which the next batch moves on in place."""
        got = super().state_at(seq, base)
        if seq is None or got is not self.live:
            return got
        return ArrayProjection(self, _copied(self._live_arrays), got.num_events)


def _copied(state: PoolArrays | _ShortPlaces) -> PoolArrays:
    """`state` with arrays of its own (a zero-stride view stays one: nothing writes it), its
    places whole."""
    ref = state.ref_counts if not state.ref_counts.strides[0] else state.ref_counts.copy()
    pos = state.free_pos if isinstance(state, _ShortPlaces) else state.free_pos.copy()
    return PoolArrays(state.seq, state.num_rows, ref, state.hash_keys.copy(), pos,
                      dataclasses.replace(state.counters))


def _event_first_row(col: Any, row: int, after: int) -> int:
    """The first row of the event holding `row`, or of the next event if that one starts at
    or before `after` (an event longer than the spacing). A pass from a row inside an event
    numbers a multi-block free to the free queue's head among that event's rows in that pass
    only: a scrub from a checkpoint there put the freed blocks in the wrong order (Mooncake's
    first 600 requests at 300 blocks, checkpoints every 997 rows: seq 15,068)."""
    start = col._event_start(row)
    return start if start > after else col._event_end(row)


def _thinned(states: list[Any]) -> list[Any]:
    """Every other checkpoint of `states` (the first and the newest kept), each kept one's
    differences taken again from the next one kept: read back from the newest down, each
    from the one after it, so the whole pool is copied once a checkpoint, not once a link."""
    kept = list(range(0, len(states), 2))
    out: dict[int, Any] = {kept[-1]: _whole(states[kept[-1]])}  # the newest kept is whole
    newer = _whole(states[kept[-1]])
    whole = {name: getattr(newer, name) for name in _ARRAYS}
    for i in range(kept[-1] - 1, 0, -1):
        state = states[i]
        if isinstance(state, _DeltaState):
            for name in _ARRAYS:  # this one's arrays from the next one's, patched
                part = state.parts[name]
                if isinstance(part, tuple):
                    arr = whole[name][:state.num_blocks].copy()
                    arr[part[0]] = part[1]
                else:
                    arr = part
                whole[name] = arr
        else:
            whole = {name: getattr(state, name) for name in _ARRAYS}
        if i in out or i % 2:
            continue
        from engine.core.columnar import PoolArrays

        here = PoolArrays(state.seq, state.num_rows, whole["ref_counts"], whole["hash_keys"], whole["free_pos"],
                          state.counters)
        out[i] = _DeltaState(here, out[min(k for k in out if k > i)])
    out[0] = states[0]
    return [out[i] for i in kept]


def _journal_loop(kind, block, key, flag, r0, r1, acc, hk, pos, base, free_out, got):  # pragma: no cover - compiled
    """`_series_loop` and `ColumnarLog._advance`'s loop as one pass over rows [r0, r1), each
    row an event, for rows that only store (STORED), evict (EVICTED) or clear (RESET) while
    no block has a ref count: per block its hash (`hk`, -1: none held) and free-queue place
    (`pos`, less `base`: int32 offsets from TAIL_BASE, `_ShortPlaces`, or int64 places), the
    live pool's; `acc` the series' counts (cached free, evicted move). `free_out`: the cached
    free blocks after each event; `got`: stores, evictions, clears' rows, 1 where the cached
    free did not move, and the rows a placer does not write (a store into a block holding a
    hash, a hash taken from one holding none: `LiveColumnarLog._free_from_rows`). False,
    nothing written, if a row is of another kind. (`empty` and `evicted` after each event follow from the rows: they are
    `_CountsFromRows`', never this pass's.)"""
    for i in range(r0, r1):
        k = kind[i]
        if k != STORED and k != EVICTED and k != RESET:
            return False
    cached_free = acc[1]
    evicted = acc[2]
    for i in range(r0, r1):
        k = kind[i]
        b = block[i]
        if k == STORED:
            got[0] += 1
            if b >= 0:
                if hk[b] < 0:
                    cached_free += 1
                else:
                    got[4] += 1
                hk[b] = key[i]
                if flag[i] == 1:
                    pos[b] = base + 2 * i  # the free queue's tail from this row
        elif b >= 0:  # evicted, or a clear's: the hash goes, an eviction counted for the former
            if hk[b] >= 0:
                cached_free -= 1
            else:
                got[4] += 1
            hk[b] = -1
            if k == EVICTED:
                evicted += 1
                got[1] += 1
        if k == RESET:
            got[2] += 1
        free_out[i - r0] = cached_free
    acc[1] = cached_free
    acc[2] = evicted
    got[3] = _all_first(free_out)
    return True


def _all_first(values):  # pragma: no cover - compiled
    """1 if every value of `values` is its first, else 0."""
    for e in range(1, len(values)):
        if values[e] != values[0]:
            return 0
    return 1


_JOURNAL_LOOP: list[Any] = []


def _compiled_journal_loop() -> Any:
    """`_journal_loop` compiled (cached on disk), or None without numba; loaded (or compiled)
    with a tick of one store, one eviction and one clear, as its callers call it (a journal
    log asks for it when made: `engine.core.live_journal.journal_log`), and with it the pass
    that appends to the columns a journal log keeps as runs (`ArithmeticRuns`)."""
    _compiled_runs_extend()
    return made_once(_JOURNAL_LOOP, _make_journal_loop)[0]


def _make_journal_loop() -> list[Any]:
    try:
        from numba import njit
    except ImportError:
        return [None]
    global _all_first
    _all_first = njit(cache=True, nogil=True)(_all_first)  # called by the loop
    loop = njit(cache=True, nogil=True)(_journal_loop)
    i32 = np.zeros(3, np.int32)
    for pos, base in ((np.zeros(1, np.int32), 0), (np.zeros(1, np.int64), TAIL_BASE)):  # short, long places
        loop(np.array([STORED, EVICTED, RESET], np.uint8), i32, i32, np.ones(3, np.uint8), 0, 3,
             np.zeros(6, np.int64), np.full(1, -1, np.int32), pos, base, np.empty(3, np.int32), np.zeros(5, np.int64))
    return [loop]


def warm_up() -> None:
    """Run one tiny request through a `LiveColumnarLog`, so the compiled passes it uses are
    loaded from numba's disk cache (compiled, the first time on a machine) here and not
    on the thread that appends the first real batch: a window's GUI thread would freeze for
    one to three seconds at its first chat message. Call it on a worker thread."""
    from engine.core.events import EventBus
    from engine.core.hashing import BlockHasher
    from engine.core.manager import PrefixCacheManager, Request

    bus = EventBus()
    events: list[Event] = []
    bus.subscribe(events.append)
    manager = PrefixCacheManager(4, 4, BlockHasher(seed=0), bus)
    manager.allocate(Request("warm-up", list(range(9))))
    manager.finish("warm-up")
    log = LiveColumnarLog(4, 4)
    log.extend(events)
    _ = log.series, log.state_at(events[0].seq)
    _compiled_journal_loop()  # a journal log's ticks' pass (an attached server's)
