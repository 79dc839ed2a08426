"""`TraceReplays`: replays a trace file on the worker through a fresh engine whose events
reach the views through the bridge, and says when the views have drawn all of them.
Nothing here draws: the window shows `sigProgress` and the sentences in its status bar.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.runtime.bridge import engine_info
from app.runtime.context import JobCancelled, Subject
from app.runtime.jobs import error_sentence, trace_block_size, trace_capacity

if TYPE_CHECKING:
    from app.runtime.context import AppContext

DEFAULT_CAPACITY = 1024  # blocks, when the trace cannot be read to size the pool
# Once a replay is done, the events still in the bridge go to the views this many per
# turn of the event loop: one repaint per turn, not one per frame-sized batch.
BULK_EVENTS = 100_000


def kernel_replay_job(path: str, bus: Any, block_size: int, capacity_blocks: int) -> dict:
    """Worker-thread job: replay a trace on the compiled kernel where it can run it (the
    Python engine otherwise); its events reach `bus` after the run, in seq order."""
    from engine.core.replay import ReplayConfig
    from engine.kernel.dispatch import replay_with
    from engine.core.trace import read_trace

    config = ReplayConfig(block_size=block_size, capacity_blocks=capacity_blocks, seed=0)
    result = replay_with("auto", read_trace(path, block_size), config, events=bus, source=str(path))
    result.config["trace"] = str(path)
    return result.to_dict()


@dataclass(slots=True)
class _Shown:
    """A finished replay waiting for the views to draw the events still in the bridge."""

    name: str
    summary: str
    then: Callable[[], None]


class TraceReplays(QObject):
    """Every signal is emitted in the GUI thread.

    `sigProgress(text, fraction)`: a replay runs (fraction < 0) or the views are drawing
    its events; `sigShown(summary)`: the views show the whole replay; `sigCancelled(text)`:
    the user stopped it (the views keep the part replayed); `sigFailed(sentence)`.
    """

    sigProgress = Signal(str, float)
    sigShown = Signal(str)
    sigCancelled = Signal(str)
    sigFailed = Signal(str)

    def __init__(self, ctx: AppContext, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.last_result: dict | None = None
        self._waiting: list[_Shown] = []
        # The engine is done before the views have drawn every event: each batch the
        # bridge hands them says how far they are, and the last one ends the wait.
        ctx.bridge.sigEvents.connect(self._on_events)
        self._bulk = QTimer(self)
        self._bulk.setInterval(0)
        self._bulk.timeout.connect(self._drain)

    def start(self, path: Path, num_blocks: int | None = None,
              on_done: Callable[[Any], None] | None = None) -> None:
        """Replay `path` in a pool of `num_blocks` (None: sized to the trace); `on_done(result
        dict)` once the views show it all, `on_done(None)` if it failed or was cancelled."""
        block_size = trace_block_size(path)
        try:
            capacity = num_blocks or trace_capacity(path, block_size)
        except (OSError, TypeError, ValueError):
            capacity = DEFAULT_CAPACITY
        self.ctx.open_subject(Subject("trace", path.name, source=str(path)), ask=False)
        bus = self.ctx.new_event_bus(engine_info(block_size=block_size, num_blocks=capacity, model=None))
        token = self.ctx.start_job(f"replaying {path.name}", bus)
        self.sigProgress.emit(f"replaying {path.name}", -1.0)

        def done(result: dict) -> None:
            self.ctx.end_job(token)
            self.last_result = result
            t = result["totals"]
            summary = (f"{path.name}: {t['requests']:,} requests, hit rate {t['hit_rate']:.1%}, "
                       f"{t['evicted_blocks']:,} evictions")
            self._waiting.append(_Shown(path.name, summary, lambda: on_done(result) if on_done is not None else None))
            self._on_events()
            if self._waiting:
                self._bulk.start()

        def failed(exc: BaseException) -> None:
            self.ctx.end_job(token)
            if isinstance(exc, JobCancelled):
                self.sigCancelled.emit(f"{path.name}: cancelled; the views show the part replayed")
            else:
                self.sigFailed.emit(error_sentence(exc, f"{path.name} could not be replayed"))
            if on_done is not None:
                on_done(None)

        self.ctx.worker.submit(kernel_replay_job, str(path), bus, block_size, capacity, on_done=done, on_error=failed)

    def _drain(self) -> None:
        if not self._waiting or not self.ctx.bridge.flush_bulk(BULK_EVENTS):
            self._bulk.stop()

    def _on_events(self, _batch: list | None = None) -> None:
        if not self._waiting:
            return
        pending = self.ctx.bridge.num_pending
        if pending:
            shown = len(self.ctx.state.log)
            self.sigProgress.emit(f"{self._waiting[-1].name}: showing events, {shown:,} of {shown + pending:,}",
                                  shown / max(1, shown + pending))
            return
        waiting, self._waiting = self._waiting, []
        for w in waiting:
            self.sigShown.emit(w.summary)
            w.then()
