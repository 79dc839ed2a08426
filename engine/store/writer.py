"""`StoreWriter`: the store's single writer thread, fed by a queue (STYLE habit 7).

The app persists engine events through it so that a burst never blocks the model worker;
headless commands use the same calls with `threaded=False`.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable

from engine.core.events import Event

if TYPE_CHECKING:
    from engine.store.database import Store

_STOP = object()


class StoreWriter:
    """The store's single writer thread, fed by a queue, so event bursts never block.

    It owns its queue, blocks on `get()`, and coalesces everything queued into one
    transaction. `flush()` waits until all earlier writes are committed; `stop()` sends a
    stop message and joins. With `threaded=False` the same calls write at once, which is
    what headless commands use. A failed write is kept in `error` and re-raised by
    `flush()`/`stop()`; later writes are dropped rather than half-applied.
    """

    def __init__(self, store: Store, threaded: bool = True, max_batch: int = 5000) -> None:
        self.store = store
        self.threaded = threaded
        self.max_batch = max_batch
        self.error: BaseException | None = None
        self.num_committed_batches = 0
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._loop, name="cachescope-store-writer", daemon=True)
            self._thread.start()

    # -- producer side (any thread)
    def record_events(self, run_id: int, events: Iterable[Event | dict[str, Any]]) -> None:
        self._put(("events", run_id, list(events)))

    def record_frames(self, run_id: int, frames: list[tuple]) -> None:
        """Queue a recorded attach's frames (`Store.record_frames` rows) for `run_id`."""
        self._put(("frames", run_id, frames))

    def record_request(self, run_id: int, idx: int, **fields: Any) -> None:
        self._put(("request", run_id, idx, fields))

    def call(self, fn: Callable[[Store], Any]) -> None:
        """Run `fn(store)` on the writer, inside the current batch's transaction."""
        self._put(("call", fn))

    def listener(self, run_id: int) -> Callable[[Event], None]:
        """An `EventBus` listener that queues every event for `run_id`."""
        def on_event(event: Event) -> None:
            self._put(("events", run_id, [event]))
        return on_event

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything queued so far is committed; re-raise a write error."""
        if self._thread is not None:
            done = threading.Event()
            self._queue.put(done)
            if not done.wait(timeout):
                raise TimeoutError("the store writer did not commit in time")
        self._raise()

    def stop(self) -> None:
        """Commit what is queued, stop the thread and join it."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _put(self, item: Any) -> None:
        if self._thread is None:
            if self.threaded:
                raise RuntimeError("the store writer was stopped")
            with self.store.atomic():
                self._apply(item)
            self.num_committed_batches += 1
        else:
            self._queue.put(item)

    # -- writer thread
    def _apply(self, item: Any) -> None:
        if item[0] == "events":
            self.store.record_events(item[1], item[2])
        elif item[0] == "frames":
            self.store.record_frames(item[1], item[2])
        elif item[0] == "request":
            self.store.record_request(item[1], item[2], **item[3])
        else:
            item[1](self.store)

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._queue.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            writes = [b for b in batch if isinstance(b, tuple)]
            if writes and self.error is None:
                try:
                    with self.store.atomic():
                        for item in writes:
                            self._apply(item)
                    self.num_committed_batches += 1
                except BaseException as exc:  # noqa: BLE001 - reported through flush()/stop()
                    self.error = exc
            for b in batch:
                if isinstance(b, threading.Event):
                    b.set()
                elif b is _STOP:
                    stopping = True
