"""The model worker: one thread that owns all model work (loading, converting, generating).

The thread blocks on its input queue, runs one job at a time in submission order, and
reports back only through signals, which Qt delivers in the GUI thread. Stop it with
`stop()`, which sends a stop message and waits for the thread. A worker still running when
the interpreter exits (its owner never stopped it: a script, a test, an error on the way
out) is stopped then: Qt aborts the process (qFatal, exit status 134) when a running
QThread is destroyed.
"""

from __future__ import annotations

import atexit
import queue
import threading
import traceback
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from PySide6.QtCore import QObject, QThread, Signal


@dataclass(slots=True)
class _Job:
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict = field(default_factory=dict)
    on_done: Callable[[Any], None] | None = None
    on_error: Callable[[BaseException], None] | None = None


_STOP = object()
_RUNNING: "weakref.WeakSet[ModelWorker]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    """Before the interpreter tears its objects down, stop the workers nobody stopped."""
    for worker in list(_RUNNING):
        try:
            worker.stop()
        except RuntimeError:  # its Qt objects already gone: nothing left running
            pass


class _Thread(QThread):
    def __init__(self, owner: "ModelWorker") -> None:
        super().__init__()
        self._owner = owner

    def run(self) -> None:  # runs in the worker thread
        owner = self._owner
        while True:
            job = owner._queue.get()
            if job is _STOP:
                return
            owner._set_busy(True)
            try:
                result = job.fn(*job.args, **job.kwargs)
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the GUI
                exc.__cachescope_traceback__ = traceback.format_exc()  # type: ignore[attr-defined]
                owner._sigFailed.emit(job, exc)
            else:
                owner._sigFinished.emit(job, result)
            finally:
                if owner._queue.empty():
                    owner._set_busy(False)


class ModelWorker(QObject):
    """Runs submitted callables on one background thread, in order.

    `submit(fn, *args, on_done=None, on_error=None, **kwargs)` returns at once; `on_done(result)`
    or `on_error(exc)` is later called in the GUI thread. `sigBusy(bool)` follows whether
    jobs are running; `sigProgress(text, fraction)` relays `report_progress` calls made by
    jobs (fraction in [0, 1], or a negative value for "busy, unknown length").
    """

    sigBusy = Signal(bool)
    sigProgress = Signal(str, float)
    sigFinished = Signal(object)  # result of any job, after its on_done
    sigFailed = Signal(object)  # exception of any job, after its on_error
    _sigFinished = Signal(object, object)
    _sigFailed = Signal(object, object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._queue: queue.Queue = queue.Queue()
        self._busy = False
        self._busy_lock = threading.Lock()
        self._sigFinished.connect(self._deliver_done)
        self._sigFailed.connect(self._deliver_error)
        self._thread = _Thread(self)
        self._thread.setObjectName("cachescope-model-worker")
        self._thread.start()
        _RUNNING.add(self)

    # ------------------------------------------------------------------ GUI thread API
    def submit(self, fn: Callable[..., Any], *args: Any, on_done: Callable[[Any], None] | None = None,
               on_error: Callable[[BaseException], None] | None = None, **kwargs: Any) -> None:
        if not self._thread.isRunning():
            raise RuntimeError("the model worker has been stopped")
        self._queue.put(_Job(fn, args, kwargs, on_done, on_error))

    @property
    def is_busy(self) -> bool:
        return self._busy

    @property
    def is_running(self) -> bool:
        return self._thread.isRunning()

    @property
    def qthread(self) -> QThread:
        return self._thread

    def stop(self, timeout_ms: int = 30_000) -> bool:
        """Finish the job in hand, drop the rest, stop the thread; True if it ended in time."""
        if not self._thread.isRunning():
            return True
        while True:  # drop queued jobs: the app is closing
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(_STOP)
        ended = self._thread.wait(timeout_ms)
        if ended:
            _RUNNING.discard(self)
        return ended

    # ------------------------------------------------------------------ worker thread API
    def report_progress(self, text: str, fraction: float) -> None:
        """Callable from a job: show `text` and a progress fraction in the GUI."""
        self.sigProgress.emit(str(text), float(fraction))

    def _set_busy(self, busy: bool) -> None:
        with self._busy_lock:
            if busy == self._busy:
                return
            self._busy = busy
        self.sigBusy.emit(busy)

    # ------------------------------------------------------------------ delivery (GUI thread)
    def _deliver_done(self, job: _Job, result: Any) -> None:
        if job.on_done is not None:
            job.on_done(result)
        self.sigFinished.emit(result)

    def _deliver_error(self, job: _Job, exc: BaseException) -> None:
        if job.on_error is not None:
            job.on_error(exc)
        self.sigFailed.emit(exc)
