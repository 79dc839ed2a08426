"""The first-start dialog: converting the bundled model, with progress and a Cancel button.

The first start of a fresh install converts the bundled GGUF to safetensors in the user
cache folder (about 20 s on an idle 2-core machine, longer on a busy one). The status bar
alone would leave a new user wondering why the chat does nothing, so while a conversion
runs this small non-modal dialog names the step, the elapsed time, and offers Cancel.

Cancelling is cooperative: the loader calls its progress callback between steps, and the
callback made here raises `LoadCancelled` once Cancel was pressed, so the job stops before
its next step and the loader removes its half-written temporary folder.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QProgressBar, QVBoxLayout, QWidget

from engine.model.loader import LoadCancelled, needs_conversion

CANCELLED_MESSAGE = ("Loading the model was cancelled before it was ready; Engine > Load model (Ctrl+L) "
                     "starts it again.")


class ModelLoadDialog(QDialog):
    """Step text, a progress bar, the time elapsed, and Cancel."""

    def __init__(self, parent: QWidget | None, on_cancel: Callable[[], None]) -> None:
        super().__init__(parent)
        self.setObjectName("model_load_dialog")
        self.setWindowTitle("Preparing the model")
        self.setModal(False)
        self._on_cancel = on_cancel
        self._started = time.monotonic()
        layout = QVBoxLayout(self)
        intro = QLabel("The first start converts the bundled model (SmolLM2-135M-Instruct) for this "
                       "computer. This happens once; later starts load it in a few seconds.")
        intro.setWordWrap(True)
        self.step_label = QLabel("starting")
        self.bar = QProgressBar(self)
        self.bar.setRange(0, 1000)
        self.elapsed_label = QLabel("")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel, self)
        self.buttons.rejected.connect(self.cancel)
        for widget in (intro, self.step_label, self.bar, self.elapsed_label, self.buttons):
            layout.addWidget(widget)
        self.setMinimumWidth(440)
        self._tick = QTimer(self, interval=500, timeout=self._update_elapsed)
        self._tick.start()
        self._update_elapsed()

    def set_step(self, text: str, fraction: float) -> None:
        self.step_label.setText(text[:1].upper() + text[1:])
        self.bar.setValue(int(max(0.0, min(1.0, fraction)) * 1000))

    def cancel(self) -> None:
        """Ask the job to stop at its next step; the dialog stays until the job has stopped."""
        if not self.buttons.isEnabled():
            return
        self.buttons.setEnabled(False)
        self.step_label.setText("Stopping after the current step…")
        self._on_cancel()

    def reject(self) -> None:  # Escape and the window's close button mean Cancel too
        self.cancel()

    def finish(self) -> None:
        self._tick.stop()
        self.done(QDialog.DialogCode.Accepted)

    def _update_elapsed(self) -> None:
        self.elapsed_label.setText(f"{time.monotonic() - self._started:.0f} s elapsed "
                                   f"(about 20 s on an idle computer)")


class ModelLoadMonitor(QObject):
    """Gives the model-load job a cancellable progress callback and shows the dialog while
    a first-start conversion runs. One per main window."""

    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self._window = window
        self._worker = window.ctx.worker
        self._cancel = threading.Event()
        self.dialog: ModelLoadDialog | None = None
        self._worker.sigProgress.connect(self._on_progress)
        self._worker.sigBusy.connect(self._on_busy)

    def progress_callback(self, model: str | None) -> Callable[[str, float], None]:
        """The `progress` to hand to `load_model_job`; opens the dialog if `model` needs converting."""
        self._cancel = cancel = threading.Event()  # a fresh flag per load: an old Cancel does not leak
        if needs_conversion(model) and not self._window.ctx.suppress_dialogs:
            self.show_dialog()
        report = self._worker.report_progress

        def progress(text: str, fraction: float) -> None:  # runs on the worker thread
            if cancel.is_set():
                raise LoadCancelled(CANCELLED_MESSAGE)
            report(text, fraction)

        return progress

    def show_dialog(self) -> ModelLoadDialog:
        if self.dialog is None:
            self.dialog = ModelLoadDialog(self._window, self.request_cancel)
            self.dialog.finished.connect(self._forget_dialog)
            self.dialog.show()
        return self.dialog

    def request_cancel(self) -> None:
        self._cancel.set()

    @property
    def is_cancel_requested(self) -> bool:
        return self._cancel.is_set()

    def _on_progress(self, text: str, fraction: float) -> None:
        if self.dialog is not None and fraction >= 0 and not self._cancel.is_set():
            self.dialog.set_step(text, fraction)

    def _on_busy(self, busy: bool) -> None:
        # The worker going idle means the load job ended, whichever way; main_window reports it.
        if not busy and self.dialog is not None:
            self.dialog.finish()

    def _forget_dialog(self, *_args: Any) -> None:
        if self.dialog is not None:
            self.dialog.deleteLater()
        self.dialog = None
