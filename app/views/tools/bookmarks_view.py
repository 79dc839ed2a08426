"""The Bookmarks panel: marks and notes on events and requests, a guided walk through a capture.

F2 and Shift+F2 step to the next and previous bookmark (wrapping), Ctrl+B bookmarks the
event shown; going to a bookmark scrubs the pool to its event (a request's: its start).
Bookmarks of a saved session live in its database (`engine.store.bookmarks`) and travel in
its session file; a capture that is not a session keeps them while it is open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout, QLabel, QLineEdit, QListWidget, QListWidgetItem, QPlainTextEdit, QPushButton, QSplitter,
    QVBoxLayout, QWidget,
)

from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject

NEXT_KEY, PREVIOUS_KEY, ADD_KEY = "F2", "Shift+F2", "Ctrl+B"


class BookmarksView(PanelView):
    """`sigWentTo(seq)` fires after the pool was scrubbed to a bookmark's event."""

    sigWentTo = Signal(int)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("bookmarks_view")
        self.current_id: int | None = None
        self._scratch: Any = None  # an in-memory store for a capture that is not a session
        self._scratch_session: int | None = None
        self.where = QLabel()
        self.where.setObjectName("bookmarks_where")
        self.where.setWordWrap(True)
        self.list = QListWidget()
        self.list.setObjectName("bookmarks_list")
        self.list.setSpacing(3)
        self.list.setWordWrap(True)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemActivated.connect(lambda item: self.go_to(item.data(Qt.ItemDataRole.UserRole)))
        self.title = QLineEdit()
        self.title.setPlaceholderText("title")
        self.note = QPlainTextEdit()
        self.note.setPlaceholderText("a note: what to look at here, and why")
        self._save_timer = QTimer(self)
        self._save_timer.setSingleShot(True)
        self._save_timer.setInterval(400)
        self._save_timer.timeout.connect(self._save_text)
        self.title.textEdited.connect(lambda _t: self._save_timer.start())
        self.note.textChanged.connect(self._note_changed)
        add_event = QPushButton("Bookmark event")
        add_event.setToolTip(f"bookmark the event the pool shows ({ADD_KEY})")
        add_event.clicked.connect(self.add_current_event)
        add_request = QPushButton("Bookmark request")
        add_request.setToolTip("bookmark the request of the event the pool shows")
        add_request.clicked.connect(self.add_current_request)
        remove = QPushButton("Remove")
        remove.clicked.connect(self.remove_current)
        prev_b = QPushButton("\u25c0 Previous")
        prev_b.setToolTip(PREVIOUS_KEY)
        prev_b.clicked.connect(lambda: self.step(False))
        next_b = QPushButton("Next \u25b6")
        next_b.setToolTip(NEXT_KEY)
        next_b.clicked.connect(lambda: self.step(True))
        buttons = QHBoxLayout()
        for b in (add_event, add_request, remove):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(prev_b)
        buttons.addWidget(next_b)
        editor = QWidget()
        ed = QVBoxLayout(editor)
        ed.setContentsMargins(0, 0, 0, 0)
        ed.addWidget(self.title)
        ed.addWidget(self.note, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.list)
        split.addWidget(editor)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        col = QVBoxLayout(self)
        col.addWidget(self.where)
        col.addLayout(buttons)
        col.addWidget(split, 1)
        for key, fn in ((NEXT_KEY, lambda: self.step(True)), (PREVIOUS_KEY, lambda: self.step(False)),
                        (ADD_KEY, self.add_current_event)):
            sc = QShortcut(QKeySequence(key), self)
            sc.setContext(Qt.ShortcutContext.WindowShortcut)
            sc.activated.connect(fn)
        ctx.sigSessionChanged.connect(lambda _sid: self.reload())
        self.reload()

    # ---- where the bookmarks live
    def _target(self) -> tuple[Any, int]:
        """The store and session that hold the bookmarks of what is shown."""
        from engine.store.bookmarks import Bookmarks

        sid = getattr(self.ctx, "session_id", None)
        if self.ctx.store is not None and isinstance(sid, int):
            return Bookmarks(self.ctx.store), sid
        if self._scratch is None:
            from engine.store.database import Store

            self._scratch = Store(":memory:")
            self._scratch_session = self._scratch.create_session(self.ctx.subject.title or "capture", "trace",
                                                                 block_size=16, capacity_blocks=1)
        return Bookmarks(self._scratch), int(self._scratch_session)

    @property
    def is_saved(self) -> bool:
        return self.ctx.store is not None and isinstance(getattr(self.ctx, "session_id", None), int)

    def bookmarks(self) -> list[Any]:
        marks, sid = self._target()
        return marks.list(sid)

    def reload(self) -> None:
        rows = self.bookmarks()
        self.where.setText(
            f"{len(rows)} bookmark{'s' if len(rows) != 1 else ''} of session {self.ctx.session_id}, saved with it. "
            f"{NEXT_KEY} / {PREVIOUS_KEY} step through them, {ADD_KEY} marks the event shown."
            if self.is_saved else
            f"{len(rows)} bookmark{'s' if len(rows) != 1 else ''}. This capture is not a saved session, so they "
            f"last while it is open. {NEXT_KEY} / {PREVIOUS_KEY} step, {ADD_KEY} marks the event shown.")
        self.list.blockSignals(True)
        self.list.clear()
        for i, b in enumerate(rows, 1):
            first = b.note.strip().splitlines()[0] if b.note.strip() else ""
            if len(first) > 140:
                first = first[:140].rsplit(" ", 1)[0] + "\u2026"
            item = QListWidgetItem(f"{i}. {b.label}" + (f"\n    {first}" if first else ""))
            item.setData(Qt.ItemDataRole.UserRole, b.id)
            self.list.addItem(item)
            if b.id == self.current_id:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        self._show_current()

    # ---- adding and editing
    def add_event(self, seq: int, title: str = "", note: str = "") -> Any:
        marks, sid = self._target()
        mark = marks.add(sid, event_seq=int(seq), title=title, note=note)
        self.current_id = mark.id
        self.reload()
        return mark

    def add_request(self, request_id: str, title: str = "", note: str = "") -> Any:
        marks, sid = self._target()
        mark = marks.add(sid, request_id=str(request_id), title=title, note=note)
        self.current_id = mark.id
        self.reload()
        return mark

    def add_current_event(self) -> Any:
        seq = self.state.current_seq
        if seq is None:
            self.ctx.show_error("There is no event to bookmark yet: run a request or open a trace first.")
            return None
        event = self.state.log.event_at_seq(seq)
        return self.add_event(seq, _describe(event))

    def add_current_request(self) -> Any:
        seq = self.state.current_seq
        event = self.state.log.event_at_seq(seq) if seq is not None else None
        rid = getattr(event, "request_id", None) or getattr(event, "by_request_id", None)
        if rid is None:
            self.ctx.show_error("The event shown belongs to no request; pick an event of a request first.")
            return None
        return self.add_request(rid)

    def remove_current(self) -> None:
        if self.current_id is None:
            return
        marks, _ = self._target()
        marks.remove(self.current_id)
        self.current_id = None
        self.reload()

    def _note_changed(self) -> None:
        if not self.note.signalsBlocked():
            self._save_timer.start()

    def _save_text(self) -> None:
        if self.current_id is None:
            return
        marks, _ = self._target()
        marks.update(self.current_id, title=self.title.text(), note=self.note.toPlainText())
        row = self.list.currentRow()
        self.reload()
        self.list.setCurrentRow(row)

    def _on_current(self, item: QListWidgetItem | None, _previous: Any = None) -> None:
        if self._save_timer.isActive():
            self._save_timer.stop()
            self._save_text()
        self.current_id = item.data(Qt.ItemDataRole.UserRole) if item is not None else None
        self._show_current()

    def _show_current(self) -> None:
        mark = next((b for b in self.bookmarks() if b.id == self.current_id), None)
        for w in (self.title, self.note):
            w.blockSignals(True)
            w.setEnabled(mark is not None)
        self.title.setText(mark.title if mark else "")
        self.note.setPlainText(mark.note if mark else "")
        for w in (self.title, self.note):
            w.blockSignals(False)

    # ---- stepping
    def step(self, forward: bool = True) -> Any:
        marks, sid = self._target()
        mark = marks.step(sid, self.current_id, forward)
        if mark is None:
            return None
        self.current_id = mark.id
        self.reload()
        self.go_to(mark.id)
        return mark

    def go_to(self, bookmark_id: int | None) -> int | None:
        """Scrub the pool to a bookmark's event; returns its seq (None when not in this log)."""
        mark = next((b for b in self.bookmarks() if b.id == bookmark_id), None)
        if mark is None:
            return None
        if mark.target == "event":
            seq = mark.event_seq
        else:
            seq = self.state.find(lambda e: e.kind == "request_started" and e.request_id == mark.request_id,
                                  True, -1)
        if seq is None or not self.state.contains(seq):
            self.ctx.show_error(f"{mark.label[0].upper() + mark.label[1:]} is not in the event log shown; "
                                f"replay the session to see it.")
            return None
        self.state.scrub_to(seq)
        self.sigWentTo.emit(int(seq))
        return seq

    def show_subject(self, subject: Subject) -> None:
        if self._scratch is not None:
            self._scratch.close()
        self._scratch = None
        self._scratch_session = None
        self.current_id = None
        self.reload()


def _describe(event: Any) -> str:
    if event is None:
        return ""
    rid = getattr(event, "request_id", None) or getattr(event, "by_request_id", None)
    return f"{event.kind}" + (f" of {rid}" if rid else "")


class EventLink(QObject):
    """A deep link (`cachescope gui FILE --event N`): once the file's events have arrived and
    the worker is idle, scrub the pool to event N, or say that the log has no such event."""

    POLL_MS = 100

    def __init__(self, ctx: AppContext, seq: int, timeout_s: float = 600.0) -> None:
        super().__init__(ctx)
        self.ctx, self.seq = ctx, int(seq)
        self.done = False
        self._left = int(timeout_s * 1000 / self.POLL_MS)
        self._timer = QTimer(self)
        self._timer.timeout.connect(self._poll)
        self._timer.start(self.POLL_MS)

    def _poll(self) -> None:
        ctx, state = self.ctx, self.ctx.state
        self._left -= 1
        busy = ctx.worker.is_busy or ctx.bridge.num_pending
        if busy and self._left > 0:
            return
        self._timer.stop()
        self.done = True
        if state.contains(self.seq):
            state.scrub_to(self.seq)
            return
        span = state.seq_range
        has = f"its events are {span[0]} to {span[1]}" if span else "it has no events"
        ctx.show_error(f"There is no event {self.seq} to open at: {has}.")
