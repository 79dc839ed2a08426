"""`TraceReplays`: replays a trace file on the worker and hands the views the whole result.

The worker replays on the compiled kernel and keeps its columnar log as it is: a
`engine.core.columnar_log.ColumnarEventLog` (events built only for the rows a view shows,
series and checkpoints computed from the columns), with no Python object per event. Where
the kernel cannot run the trace, the Python engine does and its events fill an
`engine.core.projection.EventLog`. Either is built off the GUI thread; the GUI thread then
adopts it in one step (`PoolState.adopt_log`), so the views redraw once for the whole
trace instead of once per bridge batch, and no event passes the bridge. Nothing here draws: the window shows `sigProgress` and the sentences in its
status bar.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QTimer, Signal

from app.runtime.allocator import release_freed, release_freed_soon
from app.runtime.bridge import engine_info
from app.runtime.context import JobCancelled, Subject
from app.runtime.jobs import error_sentence, trace_block_size

if TYPE_CHECKING:
    from app.runtime.context import AppContext, CancelToken
    from engine.core.columnar_log import ColumnarEventLog
    from engine.core.projection import EventLog

# The worker builds the log this many events at a time, checking Cancel between chunks.
LOG_CHUNK = 65_536


class ReplayCancelled(JobCancelled):
    """Cancel pressed during a trace replay; `log` holds the events built so far (or None)."""

    def __init__(self, log: EventLog | None) -> None:
        super().__init__("cancelled")
        self.log = log


def capacity_of(requests: Any, block_size: int) -> int:
    """`app.runtime.jobs.trace_capacity` from requests already read (no second pass over
    the file): about half of everything the trace holds, at least 64 blocks, at most 16K."""
    num_tokens = 0
    for r in requests:
        if r.tokens is not None:
            num_tokens += len(r.tokens) + len(r.output_tokens or ())
        else:
            num_tokens += r.input_length + r.output_length
    return _capacity(num_tokens, block_size)


def _capacity(num_tokens: int, block_size: int) -> int:
    return max(64, min(16384, num_tokens // block_size // 2))


def kernel_replay_job(path: str, block_size: int, capacity_blocks: int | None,
                      cancel: CancelToken | None = None) -> tuple[dict, EventLog | ColumnarEventLog]:
    """Worker-thread job: replay a trace on the compiled kernel where it can run it and
    wrap its columnar log (series and live state computed here, off the GUI thread); the
    Python engine otherwise, its events built into an `EventLog`. Returns the result dict
    (settings and totals; the per-request rows are the log's, not repeated) and the log.
    Cancel is checked after the replay (the kernel's log is whole or nothing)
    and between chunks of an `EventLog`: `ReplayCancelled` carries the part built.
    `capacity_blocks` None sizes the pool to the trace (`capacity_of`) once it is read."""
    from engine.core.columnar_log import ColumnarEventLog
    from engine.core.events import EventBus
    from engine.core.projection import EventLog
    from engine.core.replay import ReplayConfig, replay
    from engine.core.trace import read_trace

    log: EventLog | None = None

    def check() -> None:
        if cancel is not None and cancel.cancelled:
            raise ReplayCancelled(log if log is not None and len(log) else None)

    requests: Any = read_trace(path, block_size)
    try:
        from engine.kernel.replay import prepare, replay_kernel, unsupported_reason
    except ImportError:  # numba missing: the Python engine runs everything
        prepare = None
    if prepare is not None and unsupported_reason(ReplayConfig(block_size=block_size, capacity_blocks=1)) is None:
        # Each request's ids go into the arrays as it is read and the request is kept
        # without them: the parsed trace's id tuples never all live at once.
        arrays = prepare(requests, block_size, keep_content=False)
        requests = arrays.requests
        release_freed()  # the parsed ids freed: else the window holds the peak
        if capacity_blocks is None:  # `capacity_of` from the arrays: each request's prompt and output sizes
            capacity_blocks = _capacity(int(arrays.nprompt.sum()) + int(arrays.nout.sum()), block_size)
        config = ReplayConfig(block_size=block_size, capacity_blocks=capacity_blocks, seed=0)
        if unsupported_reason(config, arrays) is None:
            run = replay_kernel(arrays, config, record=True, source=str(path))
            assert run.log is not None
            check()
            # The views read the log; the result is the settings and totals (its per-request
            # rows, a dict each, would be the largest thing kept for a 1M-request trace).
            result = run.result.to_dict(with_requests=False)
            recorded = run.log
            del arrays, requests, run  # before the series and indexes are built in their place
            release_freed()  # the replay's temporaries, likewise
            columnar = ColumnarEventLog(recorded, time=time.time())
            columnar.warm()  # series, live state, indexes: here, on the worker, not on the first paint
            columnar.settle()  # the arrays kept moved down into the space the passes freed
            release_freed()  # the passes' temporaries
            check()
            result["config"]["trace"] = str(path)
            return result, columnar
        requests = read_trace(path, block_size)  # the Python engine needs the ids the arrays took
    requests = list(requests)
    if capacity_blocks is None:
        capacity_blocks = capacity_of(requests, block_size)
    config = ReplayConfig(block_size=block_size, capacity_blocks=capacity_blocks, seed=0)
    log = EventLog(capacity_blocks, block_size)
    # the Python engine, the reference
    collected: list = []
    bus = EventBus()
    bus.subscribe(collected.append)
    if cancel is not None:
        bus.subscribe(cancel.listener)
    try:
        result = replay(requests, config, bus, source=str(path))
    except JobCancelled:
        log.extend(collected)
        raise ReplayCancelled(log if len(log) else None) from None
    check()
    chunk: list = []
    for event in collected:
        chunk.append(event)
        if len(chunk) >= LOG_CHUNK:
            log.extend(chunk)
            chunk = []
            check()
    log.extend(chunk)
    result.config["trace"] = str(path)
    return result.to_dict(with_requests=False), log


class _ReleaseAfterPaints(QObject):
    """For `SETTLE_MS` after an open, each paint of a window is followed by a heap trim:
    the views' first draws of a whole log come over several paints (throttled redraws,
    pyqtgraph's images and paths made at the paint), and the temporaries they free, 1.4 MB
    over the Mooncake trace, glibc otherwise keeps resident. The trim runs on the releaser's
    thread (`release_freed_soon`): ~0.3 ms on a fresh window's heap, but it walks the whole
    heap, and on one left large by an earlier attach it took tens of ms of a GUI tick."""

    SETTLE_MS = 1000

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self._pending = False
        self._app = QCoreApplication.instance()
        self._app.installEventFilter(self)
        QTimer.singleShot(self.SETTLE_MS, self._stop)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.UpdateRequest and not self._pending:
            self._pending = True
            QTimer.singleShot(0, self._release)  # after the paint this request starts
        return False

    def _release(self) -> None:
        self._pending = False
        release_freed_soon()

    def _stop(self) -> None:
        self._app.removeEventFilter(self)
        self.deleteLater()


class TraceReplays(QObject):
    """Every signal is emitted in the GUI thread.

    `sigProgress(text, fraction)`: a replay runs (fraction < 0); `sigShown(summary)`: the
    views show the whole replay; `sigCancelled(text)`: the user stopped it (the views keep
    the part built); `sigFailed(sentence)`.
    """

    sigProgress = Signal(str, float)
    sigShown = Signal(str)
    sigCancelled = Signal(str)
    sigFailed = Signal(str)

    def __init__(self, ctx: AppContext, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.last_result: dict | None = None

    def start(self, path: Path, num_blocks: int | None = None,
              on_done: Callable[[Any], None] | None = None) -> None:
        """Replay `path` in a pool of `num_blocks` (None: sized to the trace); `on_done(result
        dict)` once the views show it all, `on_done(None)` if it failed or was cancelled."""
        block_size = trace_block_size(path)
        # None: the worker sizes the pool from the requests it reads (one pass over the file)
        capacity = num_blocks or None
        self.ctx.open_subject(Subject("trace", path.name, source=str(path)), ask=False)
        bus = self.ctx.new_event_bus(engine_info(block_size=block_size, num_blocks=capacity or 0, model=None))
        # The replay's events reach the views as one log, not through the bridge.
        self.ctx.bridge.detach()
        token = self.ctx.start_job(f"replaying {path.name}", bus)
        self.sigProgress.emit(f"replaying {path.name}", -1.0)

        def done(value: tuple[dict, EventLog | ColumnarEventLog]) -> None:
            self.ctx.end_job(token)
            result, log = value
            self.last_result = result
            t = result["totals"]
            self.sigProgress.emit(f"{path.name}: drawing {len(log):,} events", 1.0)
            if capacity is None:  # the views learn the pool the worker sized
                self.ctx.bridge.set_engine(engine_info(block_size=block_size, num_blocks=log.live.num_blocks,
                                                       model=None))
            self.ctx.state.adopt_log(log)
            if QCoreApplication.instance() is not None:  # the views' first draws' temporaries handed back
                _ReleaseAfterPaints(self)
            self.sigShown.emit(f"{path.name}: {t['requests']:,} requests, hit rate {t['hit_rate']:.1%}, "
                               f"{t['evicted_blocks']:,} evictions")
            if on_done is not None:
                on_done(result)

        def failed(exc: BaseException) -> None:
            self.ctx.end_job(token)
            if isinstance(exc, JobCancelled):
                log = getattr(exc, "log", None)
                if log is not None:
                    self.ctx.state.adopt_log(log)
                self.sigCancelled.emit(f"{path.name}: cancelled; the views show the part replayed")
            else:
                self.sigFailed.emit(error_sentence(exc, f"{path.name} could not be replayed"))
            if on_done is not None:
                on_done(None)

        self.ctx.worker.submit(kernel_replay_job, str(path), block_size, capacity, token, on_done=done,
                               on_error=failed)
