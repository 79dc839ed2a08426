"""`ModelLoad`: loads the model on the worker and readies the process for it, in one place.

The window starts a load and hears `sigLoaded(runner)` or `sigFailed(sentence)`; what it
shows meanwhile (a progress bar, the first-start conversion dialog) stays in the window.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any, Callable

from PySide6.QtCore import QObject, Signal

from app.runtime.jobs import error_sentence, load_model_job

if TYPE_CHECKING:
    from app.runtime.context import AppContext


class ModelLoad(QObject):
    """`start()` queues a load on `ctx.worker`; both signals are emitted in the GUI thread.

    `sigLoaded(runner)` comes once the runner is built and its objects are frozen for the
    collector; `sigFailed(sentence)` once `ctx.model_error` says why there is no model.
    """

    sigLoaded = Signal(object)
    sigFailed = Signal(str)

    def __init__(self, ctx: AppContext, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx

    def start(self, num_blocks: int, block_size: int, progress: Callable[[str, float], None]) -> None:
        self.ctx.model_error = None
        self.ctx.worker.submit(load_model_job, self.ctx.model_name, num_blocks, block_size, progress,
                               on_done=self._loaded, on_error=self._failed)

    def _loaded(self, runner: Any) -> None:
        # The model's objects live as long as the app: keep the collector from walking them
        # again on every full collection, which would stall the GUI while events stream in.
        gc.collect()
        gc.freeze()
        self.sigLoaded.emit(runner)

    def _failed(self, exc: BaseException) -> None:
        self.ctx.model_error = error_sentence(exc, "The model could not be loaded")
        self.sigFailed.emit(self.ctx.model_error)
