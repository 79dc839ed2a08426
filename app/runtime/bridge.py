"""The one object that turns engine events into Qt signals.

Engine listeners run on whatever thread drives the engine (the model worker); they only
append to a lock-protected list. A GUI-thread timer flushes it once per frame as one
`sigEvents(list)` batch, so a burst of thousands of events costs one repaint.

The GUI thread does nothing per event here: it takes the engine threads' whole list in
one swap, cuts batches from it with list slices (sorting only when an engine thread saw
a seq lower than the one before it), and while it applies a batch the engine threads
wait at their next event (at most `GATE_WAIT_S`) instead of taking the GIL from it.
Without that gate a busy producer took the GIL back at every Qt call of the batch, each
time for Python's switch interval (5 ms): a batch of 7 ms of work took 100 ms.

With a log to prepare for (`prepare_for`: the pool state's live columnar log), the engine
threads also make the log's rows (`LiveColumnarLog.prepare`) in chunks of `PREPARE_CHUNK`
events, in arrival order, and the GUI thread only writes them (`extend_prepared`: one copy
per column); it makes rows itself only for a few events left over for two frames (the end
of a burst, a trickle), or for all of them when told to deliver everything.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from operator import attrgetter, gt
from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer, Signal

from engine.core.events import Event, EventBus
from engine.core.live_log import PreparedBatch

FRAME_MS = 16
# One flush hands at most this many events to the views, so that a burst of a million
# events is spread over several frames instead of stalling one.
MAX_BATCH = 50_000
# Time the views may spend on one batch; the batch size adapts to what they cost per event.
BATCH_BUDGET_S = 0.018
FIRST_BATCH = 1_000
MIN_BATCH = 500
# The longest an engine thread waits at an event while the GUI thread applies a batch (a
# bound, not a lock: an engine thread holding something the views wait for goes on).
GATE_WAIT_S = 0.05
# Events an engine thread makes rows for at once (a few milliseconds of its time); and the
# most one call makes, so that a backlog (a stored session pushed whole) is cut up.
PREPARE_CHUNK = 1024
PREPARE_MOST = 16_384
# An engine thread makes rows this many events at a time and, between two runs, waits
# while the GUI thread applies a batch, as it does at an event (the gate).
PREPARE_SLICE = 256
_SEQ = attrgetter("seq")


def engine_info(*, block_size: int, num_blocks: int, model: str | None = None, num_layers: int = 0,
                num_kv_heads: int = 0, head_dim: int = 0, dtype: str | None = None,
                per_layer_bytes: list[int] | None = None) -> dict[str, Any]:
    """The `sigEngineChanged` dict; bytes are per block (K and V of every layer)."""
    per_layer = [int(b) for b in (per_layer_bytes or [])]
    per_block = [b // num_blocks for b in per_layer] if num_blocks else []
    return {"block_size": int(block_size), "num_blocks": int(num_blocks), "model": model,
            "num_layers": int(num_layers), "num_kv_heads": int(num_kv_heads), "head_dim": int(head_dim),
            "dtype": dtype, "bytes_per_block": int(sum(per_block)), "per_layer_bytes": per_layer}


class EngineBridge(QObject):
    """Buffers events from any thread and re-emits them in the GUI thread, per frame.

    `sigEvents(list)` carries Event objects in seq order (a `PreparedBatch`, a list that
    carries the rows made for its events, while a log is prepared for: an `object` signal,
    so the list reaches the slots as it is); `sigEngineChanged(dict)` tells views that a new
    engine/runner (block size, pool size, model shape) replaced the last.
    """

    sigEvents = Signal(object)
    sigEngineChanged = Signal(dict)

    def __init__(self, parent: QObject | None = None, frame_ms: int = FRAME_MS,
                 batch_budget_s: float = BATCH_BUDGET_S) -> None:
        super().__init__(parent)
        self.batch_budget_s = batch_budget_s
        self._lock = threading.Lock()
        self._buffer: list[Event] = []  # engine threads append here, under the lock
        self._last_seq = -1  # the seq appended last, and whether any came after a higher one
        self._out_of_order = False
        # GUI thread only: lists taken from the buffer, in seq order, and how far into the first
        self._ready: deque[list[Event]] = deque()
        self._ready_at = 0
        self._num_ready = 0
        self.gate_wait_s = GATE_WAIT_S
        self._open = threading.Event()  # cleared while the GUI thread applies a batch
        self._open.set()
        self._gui_thread = threading.get_ident()
        # Rows made off the GUI thread: the log they are made for, batches made (engine
        # threads append, under `_lock`), and one maker at a time, in buffer order.
        self._preparer: weakref.ref | None = None  # a weak reference: a log the state let go of goes
        self._made: list[list[Event]] = []
        self._prep_lock = threading.Lock()
        self._buffer_since = 0.0  # when the oldest event in `_buffer` arrived (a preparer set)
        self._unsubscribe: Callable[[], None] | None = None
        self._bus: EventBus | None = None
        self.engine_info: dict[str, Any] = {}
        self.num_flushes = 0
        self.num_events = 0
        self.longest_batch_cpu_s = 0.0  # the GUI thread's CPU time for the costliest batch so far
        self.last_tick = time.perf_counter()
        self.batch_limit = FIRST_BATCH
        self._timer = QTimer(self)
        self._frame_ms = frame_ms
        self._timer.setInterval(frame_ms)
        self._timer.timeout.connect(self.flush)
        self._timer.start()

    # ------------------------------------------------------------------ engine side
    def attach(self, bus: EventBus) -> None:
        """Listen to `bus` (and stop listening to the previous one)."""
        self.detach()
        self._bus = bus
        self._unsubscribe = bus.subscribe(self._on_event)

    def detach(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._unsubscribe = None
        self._bus = None

    @property
    def bus(self) -> EventBus | None:
        return self._bus

    def _on_event(self, event: Event) -> None:
        # Runs on the engine thread: one append under the lock, after the batch being applied.
        if not self._open.is_set() and threading.get_ident() != self._gui_thread:
            self._open.wait(self.gate_wait_s)
        with self._lock:
            if event.seq < self._last_seq:
                self._out_of_order = True
            self._last_seq = event.seq
            buf = self._buffer
            buf.append(event)
            if self._preparer is None:
                return
            n = len(buf)
            if n == 1:
                self._buffer_since = time.perf_counter()
                return
            due = n >= PREPARE_CHUNK or (n % 64 == 0 and time.perf_counter() - self._buffer_since > self._frame_ms / 1e3)
        if due:
            self._prepare(blocking=False)

    # ------------------------------------------------------------------ rows made off the GUI thread
    def follow(self, state: Any) -> None:
        """Make rows for the live log of `state` (a `PoolState`), and for each log it starts
        (`sigReset`) from then on."""
        state.sigReset.connect(lambda: self.prepare_for(state.log))
        self.prepare_for(state.log)

    def prepare_for(self, log: Any) -> None:
        """Make rows for `log` (a `LiveColumnarLog` that `can_prepare`) on the engine threads
        from now on; None (or a log that cannot) stops it. The pool state calls it with each
        log it starts; events buffered before go to it too, in order."""
        with self._prep_lock:
            self._preparer = weakref.ref(log) if getattr(log, "can_prepare", False) else None

    def _prepare(self, blocking: bool, everything: bool = False) -> bool:
        """Make rows for the buffered events, in arrival order (any thread); False if another
        thread is making rows now and `blocking` is off."""
        if not self._prep_lock.acquire(blocking):
            return False
        try:
            while True:
                with self._lock:
                    chunk, self._buffer = self._buffer[:PREPARE_MOST], self._buffer[PREPARE_MOST:]
                    unordered, self._out_of_order = self._out_of_order, False
                    self._buffer_since = time.perf_counter()
                if not chunk:
                    return True
                if unordered:
                    chunk.sort(key=_SEQ)
                log = self._preparer() if self._preparer is not None else None
                engine_thread = threading.get_ident() != self._gui_thread
                for at in range(0, len(chunk), PREPARE_SLICE):
                    part = chunk[at:at + PREPARE_SLICE]
                    if engine_thread and not self._open.is_set():
                        self._open.wait(self.gate_wait_s)
                    made: list[Event] = part
                    if log is not None and log.can_prepare:
                        made = PreparedBatch(part, [log.prepare(part)])
                    if log is None or not log.can_prepare:
                        self._preparer = None  # it stopped (see ColumnarLog.prepare_events): the plain way on
                        log = None
                    with self._lock:
                        self._made.append(made)
                if not everything:
                    return True
        finally:
            self._prep_lock.release()

    def push(self, events: list[Event]) -> None:
        """Queue already-built events (e.g. a stored session's log) as if they were emitted."""
        if not events:
            return
        seqs = list(map(_SEQ, events))
        unordered = any(map(gt, seqs, seqs[1:]))
        with self._lock:
            if unordered or seqs[0] < self._last_seq:
                self._out_of_order = True
            self._last_seq = seqs[-1]
            self._buffer.extend(events)

    @property
    def num_pending(self) -> int:
        with self._lock:
            return len(self._buffer) + sum(map(len, self._made)) + self._num_ready

    def _take(self, limit: int, everything: bool = False) -> list[Event]:
        """Up to `limit` events, in seq order (GUI thread): the engine threads' list is
        taken whole in one swap, and batches are list slices of what was taken. While a
        log is prepared for, the batches made so far are taken instead, and the buffer
        only when its oldest event waited two frames (or with `everything`): a batch of
        rows made is never merged with others, and holds no event without its rows."""
        if self._preparer is not None:
            with self._lock:
                stale = bool(self._buffer) and (
                    everything or time.perf_counter() - self._buffer_since > 2 * self._frame_ms / 1e3)
            if stale:
                self._prepare(blocking=everything, everything=everything)
        with self._lock:
            made, self._made = self._made, []
            fresh: list[Event] = []
            unordered = False
            if self._preparer is None:
                fresh, self._buffer = self._buffer, []
                unordered, self._out_of_order = self._out_of_order, False
        for part in made:
            self._ready.append(part)
            self._num_ready += len(part)
        if fresh:
            if unordered:
                fresh.sort(key=_SEQ)
            if self._ready and fresh[0].seq < self._ready[-1][-1].seq and \
                    not any(isinstance(part, PreparedBatch) for part in self._ready):  # interleaved with what waits
                merged = [e for part in self._ready for e in part][self._ready_at:] + fresh
                merged.sort(key=_SEQ)
                self._ready.clear()
                self._ready_at = 0
                fresh = merged
            self._ready.append(fresh)
            self._num_ready = sum(len(part) for part in self._ready) - self._ready_at
        batch: list[Event] = []
        while self._ready and len(batch) < limit:
            part = self._ready[0]
            if batch and not _joins(batch, part):
                break
            a = self._ready_at
            b = min(len(part), a + limit - len(batch))
            if a == 0 and b == len(part) and not batch:
                batch = part
            elif isinstance(part, PreparedBatch):
                piece = _slice(part, a, b)
                batch = piece if not batch else PreparedBatch([*batch, *piece], [*batch.prepared, *piece.prepared])
            else:
                batch += part[a:b]
            if b == len(part):
                self._ready.popleft()
                self._ready_at = 0
            else:
                self._ready_at = b
        self._num_ready -= len(batch)
        return batch

    def _emit(self, batch: list[Event]) -> None:
        self.num_flushes += 1
        self.num_events += len(batch)
        self._open.clear()
        cpu = time.thread_time()
        try:
            self.sigEvents.emit(batch)
        finally:
            self._open.set()
            self.longest_batch_cpu_s = max(self.longest_batch_cpu_s, time.thread_time() - cpu)

    # ------------------------------------------------------------------ GUI side
    def set_engine(self, info: dict[str, Any]) -> None:
        """Announce a new engine; any events still buffered from the old one are delivered first."""
        self.flush(everything=True)
        self.engine_info = dict(info)
        self.sigEngineChanged.emit(dict(info))

    def flush_bulk(self, max_events: int) -> int:
        """Emit up to `max_events` buffered events in batches of `MAX_BATCH`, one after the
        other. For a backlog whose producer is done (a trace the kernel replayed in one go):
        there a repaint between small batches costs more than the events themselves."""
        total = 0
        while total < max_events:
            batch = self._take(min(MAX_BATCH, max_events - total), everything=True)
            if not batch:
                break
            total += len(batch)
            self._emit(batch)
        return total

    def flush(self, everything: bool = False) -> int:
        """Emit buffered events as one batch (all of them, in batches, with `everything`).

        A batch is as large as the views can apply in about `batch_budget_s`, learnt from the
        previous batches, so a burst never freezes the window; while a backlog remains the
        next batch follows a millisecond later instead of a frame later.
        """
        self.last_tick = time.perf_counter()
        total = 0
        while True:
            batch = self._take(MAX_BATCH if everything else self.batch_limit, everything)
            if not batch:
                break
            total += len(batch)
            t = time.perf_counter()
            self._emit(batch)
            per_event = (time.perf_counter() - t) / len(batch)
            if len(batch) >= MIN_BATCH:
                fit = int(self.batch_budget_s / per_event) if per_event > 0 else MAX_BATCH
                # Shrink at once (a stall is visible), grow gradually (a burst may be uneven).
                grown = fit if fit < self.batch_limit else (self.batch_limit + fit) // 2
                self.batch_limit = max(MIN_BATCH, min(MAX_BATCH, grown))
            if not everything:
                # With a backlog the frame timer ticks every millisecond. It stays one
                # repeating timer, which fires at most once per event-loop pass, so
                # paints and other timers still run between batches.
                self._timer.setInterval(1 if self.num_pending else self._frame_ms)
                break
        return total

    def stop(self) -> None:
        self._timer.stop()
        self.detach()


def _slice(part: PreparedBatch, a: int, b: int) -> PreparedBatch:
    """Events [a, b) of a batch from `EngineBridge._prepare`, with the rows made for them
    (its one `PreparedRows` covers a prefix of its events)."""
    rows = part.prepared[0] if part.prepared else None
    if rows is None or a >= len(rows):
        return PreparedBatch(part[a:b])
    kept = rows.split(a)[1].split(min(b, len(rows)) - a)[0] if a or b < len(rows) else rows
    return PreparedBatch(part[a:b], [kept])


def _joins(batch: list[Event], part: list[Event]) -> bool:
    """Whether `part` may follow `batch` in one batch: rows made for one log only, every
    event with rows before every event without."""
    if not isinstance(batch, PreparedBatch) or not isinstance(part, PreparedBatch):
        return not isinstance(batch, PreparedBatch) and not isinstance(part, PreparedBatch)
    covered = sum(len(p) for p in batch.prepared)
    if covered < len(batch) or not part.prepared:
        return False
    return not batch.prepared or batch.prepared[-1].log is part.prepared[0].log
