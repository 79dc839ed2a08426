"""Opening files from the window: what a file is (a trace, a recorded attach, a session
database, a conversation), who opens it, and the file dialogs. Replaying a trace is
`app.runtime.replays.TraceReplays`; the chat's store is the conversation's controller.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from PySide6.QtWidgets import QDockWidget, QFileDialog, QWidget

from app.runtime.captures import latest_capture, open_capture
from app.runtime.jobs import classify_file, error_sentence
from engine.core.errors import InputError, TraceError, show_path
from engine.core.validation import check_regular_file

if TYPE_CHECKING:
    from app.runtime.context import AppContext
    from app.window.panels import PanelMap
    from app.window.recent import RecentFiles

OPEN_FILTER = "Cachescope files (*.jsonl *.json *.db *.sqlite);;All files (*)"
IMPORT_FILTER = "Conversations (*.json *.jsonl);;All files (*)"


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
            self.ctx.show_error(error_sentence(exc, "The conversation could not be saved"))

    def open_file(self, path: str | Path, on_done: Callable[[Any], None] | None = None) -> bool:
        """Open a trace (replayed on the worker), a session database or a conversation file."""
        p = Path(path)
        if not p.exists():
            self.ctx.show_error(f"{show_path(p)}: no such file.")
            return False
        if p.is_dir():
            self.ctx.show_error(f"{show_path(p)} is a folder; open a trace, conversation or session file.")
            return False
        try:  # a FIFO or a device: reading it would block or never end
            check_regular_file(p, "trace, conversation or session file")
        except InputError as exc:
            self.ctx.show_error(error_sentence(exc, f"{p.name} could not be opened"))
            return False
        kind = classify_file(p)
        if not self.ctx.may_replace_subject(f"\u201c{p.name}\u201d"):
            return False
        self.recent.add(p)
        if kind == "trace":
            self.replay_trace(p, on_done=on_done)
            return True
        if kind == "session" and latest_capture(p) is not None:  # a recorded vLLM attach
            return self._open(p, "block_table", lambda: open_capture(self.ctx, p), on_done)
        conversation = self.panels.get("conversation")
        if conversation is None:
            self.ctx.show_error("The conversation panel is not available, so conversations cannot be opened.")
            return False
        opener = conversation.open_store if kind == "session" else conversation.import_file
        return self._open(p, "conversation", lambda: opener(p), on_done)

    def _open(self, p: Path, dock: str, open_it: Callable[[], Any], on_done: Callable[[Any], None] | None) -> bool:
        try:
            open_it()
        except (InputError, TraceError, ValueError, OSError) as exc:
            self.ctx.show_error(error_sentence(exc, f"{p.name} could not be opened"))
            return False
        self.docks[dock].raise_()
        if on_done is not None:
            on_done(None)
        return True
