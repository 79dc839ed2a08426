"""Opening files from the window: what a file is (a trace, a recorded attach, a session
database, a conversation), who opens it, and the file dialogs. Replaying a trace is
`app.runtime.replays.TraceReplays`; the chat's store is the conversation's controller.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QDockWidget, QFileDialog, QWidget

from engine.core.errors import InputError, TraceError, show_path

# What opening a file needs (the file sniffers, the trace readers, msgspec, the remote engine
# for a recorded attach) is imported when a file is opened: the window comes up without it.
if TYPE_CHECKING:
    from app.runtime.context import AppContext
    from app.window.panels import PanelMap
    from app.window.recent import RecentFiles

OPEN_FILTER = "Cachescope files (*.jsonl *.json *.db *.sqlite);;All files (*)"
IMPORT_FILTER = "Conversations (*.json *.jsonl);;All files (*)"
CAPTURE_SLICE_S = 0.03  # a recorded attach's replay between two passes of the window's loop
# A capture shorter than this to replay is drawn once, at its end; a longer one fills the views
# as it goes (as a progress dialog shows only for a long task: Qt's waits 4 s)
CAPTURE_FIRST_VIEW_S = 0.5


class FileOpener:
    """Opens what the user picked into the window's views; every failure is one sentence
    through `ctx.show_error`."""

    def __init__(self, ctx: AppContext, parent: QWidget, recent: RecentFiles, panels: PanelMap,
                 docks: dict[str, QDockWidget], replay_trace: Callable[..., None]) -> None:
        self.ctx = ctx
        self.parent = parent  # of the file dialogs
        self.recent = recent
        self.panels = panels
        self.docks = docks
        self.replay_trace = replay_trace  # (path, on_done=...): the window's, which knows the pool size

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.parent, "Open a trace, conversation or session",
                                              self.recent.last_dir(), OPEN_FILTER)
        if path:
            self.open_file(path)

    def import_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.parent, "Import conversations", self.recent.last_dir(),
                                              IMPORT_FILTER)
        if path:
            self.open_file(path)

    def export_dialog(self) -> None:
        conversation = self.panels.get("conversation")
        path, _ = QFileDialog.getSaveFileName(self.parent, "Export conversation", str(Path.home() / "conversation.json"),
                                              "OpenAI messages (*.json)")
        if not path or conversation is None:
            return
        try:
            conversation.export_json(path)
        except OSError as exc:
            self.ctx.show_error(_error_sentence(exc, "The conversation could not be saved"))

    def open_folder_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self.parent, "Open a folder of kv-cache-tester traces",
                                                self.recent.last_dir())
        if path:
            self.open_file(path)

    def open_file(self, path: str | Path, on_done: Callable[[Any], None] | None = None) -> bool:
        """Open a trace (replayed on the worker), a kv-cache-tester trace or folder of them, a
        usage log, a session database or a conversation file."""
        from app.runtime.captures import latest_capture
        from app.runtime.jobs import classify_file
        from engine.core.validation import check_regular_file
        from engine.store.usage_logs import looks_like_usage_log

        p = Path(path)
        if not p.exists():
            self.ctx.show_error(f"{show_path(p)}: no such file.")
            return False
        if p.is_dir():
            return self.open_weka(p, on_done)
        try:  # a FIFO or a device: reading it would block or never end
            check_regular_file(p, "trace, conversation or session file")
        except InputError as exc:
            self.ctx.show_error(_error_sentence(exc, f"{p.name} could not be opened"))
            return False
        kind = classify_file(p)
        if kind == "weka":
            return self.open_weka(p, on_done)
        if kind == "conversation" and looks_like_usage_log(p):
            return self.open_usage(p, on_done)
        if not self.ctx.may_replace_subject(f"\u201c{p.name}\u201d"):
            return False
        self.recent.add(p)
        if kind == "trace":
            self.replay_trace(p, on_done=on_done)
            return True
        if kind == "session" and latest_capture(p) is not None:  # a recorded vLLM attach
            return self.open_capture(p, on_done)
        conversation = self.panels.get("conversation")
        if conversation is None:
            self.ctx.show_error("The conversation panel is not available, so conversations cannot be opened.")
            return False
        opener = conversation.open_store if kind == "session" else conversation.import_file
        return self._open(p, "conversation", lambda: opener(p), on_done)

    def open_capture(self, p: Path, on_done: Callable[[Any], None] | None = None) -> bool:
        """Show a recorded attach: the views reset to its pool, then its frames replayed a
        slice of CAPTURE_SLICE_S at a time between the window's passes (the status bar says
        how far), so a large capture fills the views as a live attach does; another subject
        stops it. `on_done(None)` once every frame is in, or the replay stopped."""
        from app.runtime.captures import begin_capture
        from app.runtime.remote import VIEW_FRAME_S

        try:
            job = begin_capture(self.ctx, p)
        except (InputError, ValueError, OSError) as exc:
            self.ctx.show_error(_error_sentence(exc, f"{p.name} could not be opened"))
            return False
        self.docks["block_table"].raise_()
        if job is None:  # a capture of events: shown already
            if on_done is not None:
                on_done(None)
            return True
        timer = QTimer(self.parent)
        timer.setInterval(0)
        status = self.parent.statusBar() if hasattr(self.parent, "statusBar") else None

        def end(message: str = "") -> None:
            timer.stop()
            timer.deleteLater()
            self.ctx.sigSubjectChanged.disconnect(stopped)
            job.cancel()
            if message and status is not None:
                status.showMessage(message, 8000)
            if on_done is not None:
                on_done(None)

        def stopped(*_args: Any) -> None:  # another subject: this capture no longer shows
            end(f"Stopped opening {p.name}.")

        told = [time.monotonic() + CAPTURE_FIRST_VIEW_S - VIEW_FRAME_S]

        def step() -> None:
            # the views hear of the rows every VIEW_FRAME_S, as a live attach's burst, from
            # CAPTURE_FIRST_VIEW_S on (a redraw after every slice made the open of 464,827
            # events 0.34 -> 0.46 s; one at 0.2 s, 0.43 s)
            now = time.monotonic()
            tell = now - told[0] >= VIEW_FRAME_S
            if tell:
                told[0] = now
            try:
                done = job.step(CAPTURE_SLICE_S, tell)
            except Exception as exc:  # noqa: BLE001 - a damaged file, or whatever else stopped it: said once, stopped
                self.ctx.show_error(_error_sentence(exc, f"{p.name} could not be opened"))
                end()
                return
            if done:
                end(f"Opened {p.name}: {len(self.ctx.state.log):,} events from {job.num_frames:,} recorded batches.")
            elif status is not None:
                status.showMessage(f"Opening {p.name}: {job.fraction:.0%}\u2026")

        self.ctx.sigSubjectChanged.connect(stopped)
        timer.timeout.connect(step)
        timer.start()
        return True

    def _open(self, p: Path, dock: str, open_it: Callable[[], Any], on_done: Callable[[Any], None] | None) -> bool:
        try:
            open_it()
        except (InputError, TraceError, ValueError, OSError) as exc:
            self.ctx.show_error(_error_sentence(exc, f"{p.name} could not be opened"))
            return False
        self.docks[dock].raise_()
        if on_done is not None:
            on_done(None)
        return True

    # ---------------------------------------------------------------- kv-cache-tester traces, usage logs
    def open_weka(self, p: Path, on_done: Callable[[Any], None] | None = None) -> bool:
        """Replay a kv-cache-tester file, or a folder of them as concurrent users, on the worker:
        its events reach the pool views, its summary the Traces panel."""
        from app.runtime.bridge import engine_info
        from app.runtime.context import Subject
        from engine.analysis.weka import unbounded_capacity
        from engine.store.weka import load_weka, merged_requests

        try:
            traces = load_weka(p)
        except (InputError, OSError) as exc:
            self.ctx.show_error(_error_sentence(exc, f"{p.name} could not be opened"))
            return False
        if not self.ctx.may_replace_subject(f"\u201c{p.name}\u201d"):
            return False
        self.recent.add(p)
        size = traces[0].block_size
        capacity = unbounded_capacity(merged_requests(traces), size)
        self.ctx.open_subject(Subject("trace", p.name, source=str(p)), ask=False)
        bus = self.ctx.new_event_bus(engine_info(block_size=size, num_blocks=capacity, model=None))
        token = self.ctx.start_job(f"replaying {p.name}", bus)

        def done(summary: dict) -> None:
            self.ctx.end_job(token)
            view = self.panels.get("traces")
            if view is not None:
                view.show_weka(summary)
                self.docks["traces"].raise_()
            if on_done is not None:
                on_done(summary)

        def failed(exc: BaseException) -> None:
            self.ctx.end_job(token)
            self.ctx.show_error(_error_sentence(exc, f"{p.name} could not be replayed"))
            if on_done is not None:
                on_done(None)

        self.ctx.worker.submit(_weka_job, traces, bus, on_done=done, on_error=failed)
        return True

    def open_usage(self, p: Path, on_done: Callable[[Any], None] | None = None) -> bool:
        """Make a usage log the subject (the window's title, every panel that follows the
        subject) and compare its observed caching with the prediction on the worker; the
        Traces panel lists each request, the Billing panel plots cost per turn. The pool
        views show an empty pool: the log has no engine of the app's to draw."""
        from app.runtime.bridge import engine_info
        from app.runtime.context import Subject
        from engine.core.events import EventBus

        if not self.ctx.may_replace_subject(f"\u201c{p.name}\u201d"):
            return False
        self.recent.add(p)
        subject = Subject("usage", p.name, source=str(p))
        self.ctx.open_subject(subject, ask=False)
        self.ctx.attach_events(EventBus(), engine_info(block_size=16, num_blocks=0, model=None))

        def done(result: dict) -> None:
            if self.ctx.subject is not subject:  # another subject was opened meanwhile: it is shown
                if on_done is not None:
                    on_done(None)
                return
            view = self.panels.get("traces")
            if view is not None:
                view.show_usage(result)
                self.docks["traces"].raise_()
            billing = self.panels.get("billing")
            if billing is not None and hasattr(billing, "show_usage"):
                billing.show_usage(result)
            if on_done is not None:
                on_done(result)

        def failed(exc: BaseException) -> None:
            self.ctx.show_error(_error_sentence(exc, f"{p.name} could not be read as a usage log"))
            if on_done is not None:
                on_done(None)

        self.ctx.worker.submit(_usage_job, str(p), on_done=done, on_error=failed)
        return True


def _weka_job(traces: list[Any], bus: Any) -> dict:
    """Worker thread: the kv-cache-tester summary, its unbounded replay emitting on `bus`."""
    from engine.analysis.weka import weka_summary

    return weka_summary(traces, events=bus)


def _usage_job(path: str) -> dict:
    """Worker thread: a usage log beside its prediction (a vLLM log on an unbounded engine of
    16-token blocks; `cachescope usage` takes the server's own block size and pool)."""
    from engine.analysis.usage import compare_usage
    from engine.model.loader import load_tokenizer
    from engine.store.usage_logs import read_usage_log

    entries = read_usage_log(path)
    meta = Path(path).with_name(Path(path).name.removesuffix(".jsonl") + ".meta.json")
    block_size = capacity = None
    if meta.is_file():  # a recorded log says what server it came from
        import json

        info = json.loads(meta.read_text())
        block_size = info.get("block_size")
        capacity = info.get("num_gpu_blocks") - 1 if isinstance(info.get("num_gpu_blocks"), int) else None
    return compare_usage(entries, load_tokenizer(None), block_size, capacity)


def _error_sentence(exc: BaseException, what: str) -> str:
    """`app.runtime.jobs.error_sentence`, imported at the first failure (see the imports)."""
    from app.runtime.jobs import error_sentence

    return error_sentence(exc, what)
