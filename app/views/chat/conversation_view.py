"""The conversation panel: draws the chat with the local model, streamed, with editable history.

Each message card has a token strip showing how the prefix cache served its tokens.
Editing an earlier message re-runs every later turn; what the edit invalidated shows in
the strips here and, through engine events, in every other view. The chat itself (the
messages, the queue of turns on the model worker, the session's recorder) is run by
`app.runtime.chat.ChatController`; this view draws what it reports and forwards what the
user does. A trace or demo is another subject: the panel then says it does not apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QScrollArea,
                               QSizePolicy, QSpinBox, QVBoxLayout, QWidget)

from app.ui import theme
from app.runtime.chat import DEFAULT_MAX_NEW_TOKENS, ChatController
from app.runtime.context import Subject
from app.views.chat.message_card import MessageCard
from app.ui.token_strip import STATE_LABELS
from app.runtime.chat_messages import ChatMessage, reuse_reason
from app.views.chat.strips import strip_data
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext

LEGEND_STATES = ("cached", "computed", "partial", "generated", "pending")
PLACEHOLDER = ("Ask the model something. Every message shows which of its tokens came from the prefix cache; "
               "edit an earlier message to see what it invalidates.")
NOT_CHAT = {"trace": "a trace holds token ids, not messages",
            "demo": "the demo's requests and what they show are in the Demo guide",
            "server": "an attached server sends cache events, not messages",
            "usage": "a usage log holds an API's recorded requests and cached tokens, shown in Traces and Billing"}


class ConversationView(PanelView):
    """Chat panel. Public API used by the window and tests: `send`, `edit_message`,
    `new_session`, `open_store`, `import_file`, `export_json`, `messages`, `is_generating`;
    `chat` is the controller that runs it."""

    sigTurnFinished = Signal(int)  # index of the assistant message just completed
    sigIdle = Signal()  # every queued turn has run

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.chat = ChatController(ctx, self)
        self.cards: list[MessageCard] = []
        self._texts: dict[int, str] = {}
        self._texts_of: object = None
        self._build()
        self._connect_chat()
        ctx.sigRunnerChanged.connect(lambda _runner: self.refresh_strips())
        if not ctx.subject.is_chat:  # built after a trace or demo became the subject
            self.show_subject(ctx.subject)
            self._rebuild_cards()

    def _connect_chat(self) -> None:
        chat = self.chat
        chat.max_new_tokens = self.max_tokens.value()
        self.max_tokens.valueChanged.connect(lambda v: setattr(chat, "max_new_tokens", v))
        chat.sigMessagesReset.connect(self._rebuild_cards)
        chat.sigMessageAdded.connect(self._on_message_added)
        chat.sigMessageChanged.connect(lambda i: self.cards[i].set_message(chat.messages[i]))
        chat.sigTurnStarted.connect(lambda _i: self._scroll_to_end())
        chat.sigToken.connect(self._on_token)
        chat.sigTurnFinished.connect(self._on_turn_finished)
        chat.sigTurnFailed.connect(lambda i: self.cards[i].text_label.setText("(no reply)"))
        chat.sigIdle.connect(self.refresh_strips)
        chat.sigStatus.connect(self.status.setText)
        chat.sigTitleChanged.connect(self.title_label.setText)
        chat.sigTurnFinished.connect(self.sigTurnFinished)
        chat.sigIdle.connect(self.sigIdle)

    # ------------------------------------------------------------------ layout
    def _build(self) -> None:
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        lay.setSpacing(8)
        head = QHBoxLayout()
        self.title_label = QLabel("New session", self)
        self.title_label.setObjectName("heading")
        # A long first message must not widen the panel: the title is cut to fit instead.
        self.title_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.title_label.setMinimumWidth(60)
        head.addWidget(self.title_label, 1)
        lay.addLayout(head)
        # One wrapping line, so a narrow dock (1280x800) shows every state, grey included.
        self.legend = QLabel(self)
        self.legend.setObjectName("muted")
        self.legend.setWordWrap(True)
        self.legend.setToolTip("\n".join(STATE_LABELS[s] for s in LEGEND_STATES))
        self._paint_legend()
        lay.addWidget(self.legend)
        self.scroll = QScrollArea(self)
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        column = QWidget()
        column.setObjectName("chatColumn")
        self.column = QVBoxLayout(column)
        self.column.setContentsMargins(2, 2, 6, 2)
        self.column.setSpacing(10)
        self.placeholder = QLabel(PLACEHOLDER, column)
        self.placeholder.setObjectName("muted")
        self.placeholder.setWordWrap(True)
        self.column.addWidget(self.placeholder)
        self.column.addStretch(1)
        self.scroll.setWidget(column)
        lay.addWidget(self.scroll, 1)
        self.input = QPlainTextEdit(self)
        self.input.setPlaceholderText("Message (Ctrl+Enter to send)")
        self.input.setFixedHeight(56)
        lay.addWidget(self.input)
        row = QHBoxLayout()
        self.status = QLabel("", self)
        self.status.setObjectName("muted")
        self.status.setWordWrap(True)
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        row.addWidget(self.status, 1)
        row.addWidget(QLabel("max", self))
        self.max_tokens = QSpinBox(self)
        self.max_tokens.setRange(1, 2048)
        self.max_tokens.setToolTip("the most tokens a reply may have")
        self.max_tokens.setValue(int(self.ctx.settings.value("chat/max_new_tokens", DEFAULT_MAX_NEW_TOKENS)))
        self.max_tokens.valueChanged.connect(lambda v: self.ctx.settings.setValue("chat/max_new_tokens", v))
        row.addWidget(self.max_tokens)
        self.send_button = QPushButton("Send", self)
        self.send_button.setObjectName("primary")
        self.send_button.clicked.connect(self._send_clicked)
        row.addWidget(self.send_button)
        lay.addLayout(row)
        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            QShortcut(QKeySequence(keys), self.input, activated=self._send_clicked)

    def _paint_legend(self) -> None:
        colors = theme.palette()
        words = {"pending": "not run yet (grey)"}
        self.legend.setText(" &nbsp; ".join(f"<span style='color:{colors[s]}'>■</span>&nbsp;{words.get(s, s)}"
                                            for s in LEGEND_STATES))

    def apply_theme(self, name: str) -> None:
        self._paint_legend()
        for card in self.cards:
            card.strip.update()

    def _rebuild_cards(self) -> None:
        for card in self.cards:
            # Out of the widget tree at once: a deferred delete alone leaves the old card
            # painted over the new ones until the event loop gets round to it.
            self.column.removeWidget(card)
            card.hide()
            card.setParent(None)
            card.deleteLater()
        self.cards = []
        for i, m in enumerate(self.chat.messages):
            self._add_card(i, m)
        subject = self.ctx.subject
        self.placeholder.setText(PLACEHOLDER if subject.is_chat else self._not_chat_text(subject))
        self.placeholder.setVisible(not self.chat.messages)
        self.refresh_strips()

    def _add_card(self, index: int, message: ChatMessage) -> MessageCard:
        card = MessageCard(index, message, self.state, self)
        card.sigEditRequested.connect(self.edit_message)
        self.column.insertWidget(self.column.count() - 1, card)
        self.cards.append(card)
        self.placeholder.hide()
        return card

    def _scroll_to_end(self) -> None:
        QTimer.singleShot(0, lambda: self.scroll.verticalScrollBar().setValue(self.scroll.verticalScrollBar().maximum()))

    def _follow(self) -> None:
        """Keep the newest turn in sight while it streams, unless the user scrolled up to read."""
        bar = self.scroll.verticalScrollBar()
        if bar.maximum() - bar.value() < 3 * max(1, bar.pageStep()) // 4 + 40:
            self._scroll_to_end()

    # ------------------------------------------------------------------ what the chat reports
    @property
    def messages(self) -> list[ChatMessage]:
        return self.chat.messages

    @property
    def is_generating(self) -> bool:
        return self.chat.is_generating

    def refresh_strips(self) -> None:
        runner = self.ctx.runner
        messages = self.chat.messages
        if runner is None or not messages:
            return
        if self._texts_of is not runner.tokenizer:  # token texts are remembered per tokenizer
            self._texts, self._texts_of = {}, runner.tokenizer
        block_size = self.chat.block_size()
        for card, data in zip(self.cards, strip_data(runner.tokenizer, messages, block_size, self._texts)):
            card.set_strip(data)
        previous = None
        for card, m in zip(self.cards, messages):
            if m.role == "assistant" and m.result is not None and not m.stale:
                card.set_reuse_note(reuse_reason(m.result, previous, block_size))
                previous = m

    def _on_message_added(self, index: int) -> None:
        self._add_card(index, self.chat.messages[index])
        self._scroll_to_end()

    def _on_token(self, _token_id: int, text: str) -> None:
        current = self.chat.current
        if current is not None and current < len(self.cards):
            self.cards[current].append_text(text)
            self._follow()

    def _on_turn_finished(self, _index: int) -> None:
        self.refresh_strips()
        self._follow()

    # ------------------------------------------------------------------ what the user does
    def _send_clicked(self) -> None:
        text = self.input.toPlainText().strip()
        if text and self.send(text):
            self.input.clear()

    def send(self, text: str) -> bool:
        """Append a user message and generate the reply; False if there is nothing to send."""
        return self.chat.send(text)

    def edit_message(self, index: int, text: str) -> bool:
        """Replace message `index` and re-run every later turn; False if busy or out of range."""
        return self.chat.edit_message(index, text)

    def new_session(self) -> bool:
        """Start an empty chat (asking first if the current one is not saved); False if not."""
        return self.chat.new_session()

    def model_unavailable(self) -> None:
        self.chat.model_unavailable()

    def load_messages(self, messages: list[tuple[str, str]], title: str, replay: bool = True) -> None:
        self.chat.load_messages(messages, title, replay)

    def open_store(self, path: str | Path) -> None:
        self.chat.open_store(path)

    def import_file(self, path: str | Path) -> None:
        self.chat.import_file(path)

    def export_json(self, path: str | Path) -> None:
        self.chat.export_json(path)

    def flush_store(self) -> None:
        self.chat.flush_store()

    # ------------------------------------------------------------------ subject
    def show_subject(self, subject: Subject) -> None:
        # A trace or demo has requests but no messages: say so instead of showing an
        # earlier chat beside another subject's pool.
        if not subject.is_chat:
            self.chat.clear()  # a turn in flight finishes into its own session
        self.title_label.setText(subject.title)

    @staticmethod
    def _not_chat_text(subject: Subject) -> str:
        return (f"The conversation does not apply to {subject.describe()}: {NOT_CHAT.get(subject.kind, '')}. "
                f"Type a message to start a new chat session with the local model.")
