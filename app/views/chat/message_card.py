"""A message card of the conversation panel: role, text, edit box, token strip, figures.

The figures name the request by the engine's request id (as every view does) and an
eviction a miss names is a link that scrubs the views to it.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSizePolicy, QVBoxLayout, QWidget

from app.runtime.chat_messages import MISS_TEXT, ChatMessage
from app.ui.token_strip import StripData, TokenStrip
from app.ui.widgets import EventLinkLabel, eviction_phrase

if TYPE_CHECKING:
    from app.runtime.state import PoolState


class MessageCard(QFrame):
    """A message bubble: role, text, edit box, token strip and request figures."""

    sigEditRequested = Signal(int, str)

    def __init__(self, index: int, message: ChatMessage, state: PoolState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.index = index
        self.state = state
        self.reuse_note = ""  # why this turn reused what it did (set by the view)
        self.setObjectName("message")
        self.setProperty("role", message.role)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 8, 12, 10)
        lay.setSpacing(6)
        head = QHBoxLayout()
        self.role_label = QLabel(message.role.upper(), self)
        self.role_label.setObjectName("role")
        head.addWidget(self.role_label)
        self.miss_badge = QLabel("", self)
        self.miss_badge.setObjectName("missBadge")
        head.addWidget(self.miss_badge)
        head.addStretch(1)
        self.edit_button = QPushButton("Edit", self)
        self.edit_button.setObjectName("flat")
        self.edit_button.setToolTip("edit this message and re-run everything after it")
        self.edit_button.clicked.connect(self.begin_edit)
        head.addWidget(self.edit_button)
        lay.addLayout(head)
        self.text_label = QLabel(self)
        self.text_label.setWordWrap(True)
        self.text_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text_label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        lay.addWidget(self.text_label)
        self.editor = QPlainTextEdit(self)
        self.editor.setFixedHeight(90)
        self.editor.hide()
        lay.addWidget(self.editor)
        self.edit_row = QWidget(self)
        row = QHBoxLayout(self.edit_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addStretch(1)
        cancel = QPushButton("Cancel", self.edit_row)
        cancel.clicked.connect(self.end_edit)
        self.rerun_button = QPushButton("Save && re-run", self.edit_row)
        self.rerun_button.setObjectName("primary")
        self.rerun_button.clicked.connect(self._submit_edit)
        row.addWidget(cancel)
        row.addWidget(self.rerun_button)
        self.edit_row.hide()
        lay.addWidget(self.edit_row)
        self.strip = TokenStrip(self)
        lay.addWidget(self.strip)
        self.stats = EventLinkLabel(state, "", self)
        self.stats.setObjectName("stats")
        self.stats.setWordWrap(True)
        lay.addWidget(self.stats)
        self.set_message(message)

    def set_message(self, message: ChatMessage) -> None:
        self.message = message
        # Replies are usually Markdown; a user's text is shown as typed.
        self.text_label.setTextFormat(Qt.TextFormat.MarkdownText if message.role == "assistant"
                                      else Qt.TextFormat.PlainText)
        self.text_label.setText(message.content or ("…" if message.role == "assistant" else ""))
        self.setProperty("stale", "true" if message.stale else "false")
        self.style().unpolish(self)
        self.style().polish(self)
        r = message.result
        if r is None or message.stale:
            self.stats.setText("waiting to be re-run" if message.stale else "")
            self.stats.setVisible(message.stale)
            return
        self.stats.show()
        self.stats.setText(self.stats_html(r, message.forced))

    def stats_html(self, r: Any, forced: bool) -> str:
        """The request's figures; its name is the engine's request id, as in every other view."""
        miss = r.miss
        parts = [f"request <b>{html.escape(str(r.request_id))}</b>", f"prompt {r.num_prompt_tokens}",
                 f"cached {r.num_cached_tokens}", f"computed {r.num_computed_tokens}"]
        if miss is not None:
            where = f"miss: {MISS_TEXT.get(miss.reason, miss.reason)} at block {miss.first_miss_block}"
            if miss.reason == "evicted":
                where += f" ({eviction_phrase(miss.evicted_by_seq, self.state)})"
            parts.append(where)
        if not forced:
            parts.append(f"TTFT {r.ttft_ms:.0f} ms")
            parts.append(f"{len(r.output_token_ids)} tokens in {r.decode_ms:.0f} ms")
        text = " · ".join(parts)
        if self.reuse_note:
            text += f"<br><i>{html.escape(self.reuse_note)}</i>"
        return text

    def set_reuse_note(self, note: str) -> None:
        self.reuse_note = note
        if self.message.result is not None and not self.message.stale:
            self.stats.setText(self.stats_html(self.message.result, self.message.forced))

    def append_text(self, text: str) -> None:
        self.message.content += text
        self.text_label.setText(self.message.content)

    def set_strip(self, data: StripData) -> None:
        self.strip.set_data(data)
        # Only where the miss falls inside the message itself (an edit); a reply's strip is
        # its whole request, where the marker alone says enough.
        inside = data.miss_position is not None and self.message.role == "user"
        self.miss_badge.setText("● first miss here" if inside else "")
        self.miss_badge.setToolTip(data.miss_text)

    def begin_edit(self) -> None:
        self.editor.setPlainText(self.message.content)
        for w in (self.editor, self.edit_row):
            w.show()
        self.text_label.hide()
        self.editor.setFocus()

    def end_edit(self) -> None:
        for w in (self.editor, self.edit_row):
            w.hide()
        self.text_label.show()

    def _submit_edit(self) -> None:
        text = self.editor.toPlainText().strip()
        self.end_edit()
        if text and text != self.message.content:
            self.sigEditRequested.emit(self.index, text)
