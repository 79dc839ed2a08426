"""The one object that turns engine events into Qt signals.

Engine listeners run on whatever thread drives the engine (the model worker); they only
append to a lock-protected buffer. A GUI-thread timer flushes that buffer once per frame
as one `sigEvents(list)` batch, so a burst of thousands of events costs one repaint.
"""

from __future__ import annotations

import threading
import time
from collections import deque
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
        self._buffer: deque[Event] = deque()
        self._unsubscribe: Callable[[], None] | None = None
        self._bus: EventBus | None = None
        self.engine_info: dict[str, Any] = {}
        self.num_flushes = 0
        self.num_events = 0
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
        # Runs on the engine thread: keep it to one append under the lock.
        with self._lock:
            self._buffer.append(event)

    def push(self, events: list[Event]) -> None:
        """Queue already-built events (e.g. a stored session's log) as if they were emitted."""
        with self._lock:
            self._buffer.extend(events)

    @property
    def num_pending(self) -> int:
        with self._lock:
            return len(self._buffer)

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
            with self._lock:
                if not self._buffer:
                    break
                n = min(MAX_BATCH, max_events - total, len(self._buffer))
                pop = self._buffer.popleft
                batch = [pop() for _ in range(n)]
            if any(batch[i].seq > batch[i + 1].seq for i in range(len(batch) - 1)):
                batch.sort(key=lambda e: e.seq)
            self.num_flushes += 1
            self.num_events += len(batch)
            total += len(batch)
            self.sigEvents.emit(batch)
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
            limit = MAX_BATCH if everything else self.batch_limit
            with self._lock:
                if not self._buffer:
                    break
                if len(self._buffer) <= limit:
                    batch = list(self._buffer)
                    self._buffer.clear()
                else:  # popping from the front costs the batch, not the whole backlog
                    pop = self._buffer.popleft
                    batch = [pop() for _ in range(limit)]
                backlog = bool(self._buffer)
            # Several emitting threads can interleave appends; seq is the true order.
            if any(batch[i].seq > batch[i + 1].seq for i in range(len(batch) - 1)):
                batch.sort(key=lambda e: e.seq)
            self.num_flushes += 1
            self.num_events += len(batch)
            total += len(batch)
            t = time.perf_counter()
            self.sigEvents.emit(batch)
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
                self._timer.setInterval(1 if backlog else self._frame_ms)
                break
        return total

    def stop(self) -> None:
        self._timer.stop()
        self.detach()
