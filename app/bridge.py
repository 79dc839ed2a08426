"""The one object that turns engine events into Qt signals.

Engine listeners run on whatever thread drives the engine (the model worker); they only
append to a lock-protected buffer. A GUI-thread timer flushes that buffer once per frame
as one `sigEvents(list)` batch, so a burst of thousands of events costs one repaint.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer, Signal

from engine.events import Event, EventBus

FRAME_MS = 16
# One flush hands at most this many events to the views, so that a burst of a million
# events is spread over several frames instead of stalling one.
MAX_BATCH = 50_000


class EngineBridge(QObject):
    """Buffers events from any thread and re-emits them in the GUI thread, per frame.

    `sigEvents(list)` carries Event objects in seq order; `sigEngineChanged(dict)` tells
    views that a new engine/runner (block size, pool size, model shape) replaced the last.
    """

    sigEvents = Signal(list)
    sigEngineChanged = Signal(dict)

    def __init__(self, parent: QObject | None = None, frame_ms: int = FRAME_MS) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._buffer: list[Event] = []
        self._unsubscribe: Callable[[], None] | None = None
        self._bus: EventBus | None = None
        self.engine_info: dict[str, Any] = {}
        self.num_flushes = 0
        self.num_events = 0
        self.last_tick = time.perf_counter()
        self._timer = QTimer(self)
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

    def flush(self, everything: bool = False) -> int:
        """Emit the buffered events as one batch (or several of MAX_BATCH); returns how many."""
        self.last_tick = time.perf_counter()
        total = 0
        while True:
            with self._lock:
                if not self._buffer:
                    break
                if len(self._buffer) <= MAX_BATCH:
                    batch, self._buffer = self._buffer, []
                else:
                    batch, self._buffer = self._buffer[:MAX_BATCH], self._buffer[MAX_BATCH:]
            # Several emitting threads can interleave appends; seq is the true order.
            if any(batch[i].seq > batch[i + 1].seq for i in range(len(batch) - 1)):
                batch.sort(key=lambda e: e.seq)
            self.num_flushes += 1
            self.num_events += len(batch)
            total += len(batch)
            self.sigEvents.emit(batch)
            if not everything:
                break
        return total

    def stop(self) -> None:
        self._timer.stop()
        self.detach()
