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
"""

from __future__ import annotations

import threading
import time
from collections import deque
from operator import attrgetter, gt
from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer, Signal

from engine.core.events import Event, EventBus

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

    `sigEvents(list)` carries Event objects in seq order; `sigEngineChanged(dict)` tells
    views that a new engine/runner (block size, pool size, model shape) replaced the last.
    """

    sigEvents = Signal(list)
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
            self._buffer.append(event)

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
            return len(self._buffer) + self._num_ready

    def _take(self, limit: int) -> list[Event]:
        """Up to `limit` events, in seq order (GUI thread): the engine threads' list is
        taken whole in one swap, and batches are list slices of what was taken."""
        with self._lock:
            fresh, self._buffer = self._buffer, []
            unordered, self._out_of_order = self._out_of_order, False
        if fresh:
            if unordered:
                fresh.sort(key=_SEQ)
            if self._ready and fresh[0].seq < self._ready[-1][-1].seq:  # interleaved with what waits
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
            a = self._ready_at
            b = min(len(part), a + limit - len(batch))
            if a == 0 and b == len(part) and not batch:
                batch = part
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
            batch = self._take(min(MAX_BATCH, max_events - total))
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
            batch = self._take(MAX_BATCH if everything else self.batch_limit)
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
