"""The conversation panel: chat with the local model, streamed, with editable history.

Each message card has a token strip showing how the prefix cache served its tokens.
Editing an earlier message re-runs every later turn; what the edit invalidated shows in
the strips here and, through engine events, in every other view. Model calls run on the
model worker; sessions persist in `engine.store.database.Store` when the context has one,
written on the store's writer thread (`app.views.chat.chat_store`), never on the GUI thread.
A trace or demo is another subject: the panel then says it does not apply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QScrollArea,
                               QSizePolicy, QSpinBox, QVBoxLayout, QWidget)

from app.ui import theme
from app.runtime.context import Subject
from app.runtime.chat_store import ChatRecorder
from app.views.chat.message_card import MessageCard
from app.runtime.chat_messages import ChatMessage, chat_dicts, reuse_reason, title_of
from app.ui.token_strip import STATE_LABELS
from app.views.chat.strips import strip_data
from app.ui.widgets import PanelView
from engine.core.errors import CapacityError, InputError
from engine.model.chat import requests_after_edit

if TYPE_CHECKING:
    from app.runtime.context import AppContext

LEGEND_STATES = ("cached", "computed", "partial", "generated", "pending")
PLACEHOLDER = ("Ask the model something. Every message shows which of its tokens came from the prefix cache; "
               "edit an earlier message to see what it invalidates.")


class ConversationView(PanelView):
    """Chat panel. Public API used by the window and tests: `send`, `edit_message`,
    `new_session`, `open_store`, `import_file`, `export_json`, `messages`, `is_generating`."""

    sigTurnFinished = Signal(int)  # index of the assistant message just completed
    sigIdle = Signal()  # every queued turn has run
    _sigToken = Signal(int, str)  # emitted on the worker thread by the runner's callback

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.messages: list[ChatMessage] = []
        self.cards: list[MessageCard] = []
        self._queue: list[int] = []  # user message indices still to run, in order
        self._current: int | None = None  # assistant index being generated
        self._recorder: ChatRecorder | None = None
        self._texts: dict[int, str] = {}
        self._texts_of: Any = None
        self._sigToken.connect(self._on_token)
        self._build()
        ctx.sigRunnerChanged.connect(self._on_runner_changed)
        ctx.at_shutdown(self._stop_recorder)

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
        self.max_tokens.setValue(int(self.ctx.settings.value("chat/max_new_tokens", 48)))
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
        for i, m in enumerate(self.messages):
            self._add_card(i, m)
        self.placeholder.setVisible(not self.messages)
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

    # ------------------------------------------------------------------ state
    @property
    def is_generating(self) -> bool:
        return self._current is not None or bool(self._queue)

    def _block_size(self) -> int:
        runner = self.ctx.runner
        return runner.manager.block_size if runner is not None else 16

    def refresh_strips(self) -> None:
        runner = self.ctx.runner
        if runner is None or not self.messages:
            return
        if self._texts_of is not runner.tokenizer:  # token texts are remembered per tokenizer
            self._texts, self._texts_of = {}, runner.tokenizer
        block_size = self._block_size()
        for card, data in zip(self.cards, strip_data(runner.tokenizer, self.messages, block_size, self._texts)):
            card.set_strip(data)
        previous = None
        for card, m in zip(self.cards, self.messages):
            if m.role == "assistant" and m.result is not None and not m.stale:
                card.set_reuse_note(reuse_reason(m.result, previous, block_size))
                previous = m

    def _set_status(self, text: str) -> None:
        self.status.setText(text)

    # ------------------------------------------------------------------ sending and editing
    def _send_clicked(self) -> None:
        text = self.input.toPlainText().strip()
        if text and self.send(text):
            self.input.clear()

    def send(self, text: str) -> bool:
        """Append a user message and generate the reply; False if a turn is still running."""
        text = text.strip()
        if not text:
            return False
        if not self.ctx.subject.is_chat:
            # Chatting leaves the trace or demo: the live session is the subject again.
            self._clear(PLACEHOLDER)
            self.ctx.open_subject(Subject("session", "New session"), ask=False)
        self.state.scrub_to(None)
        self.messages.append(ChatMessage("user", text))
        if len(self.messages) == 1:
            self._set_title(title_of(text))
        self._add_card(len(self.messages) - 1, self.messages[-1])
        self._persist(len(self.messages) - 1)
        self.ctx.mark_unsaved(self.ctx.store is None)
        self._queue.append(len(self.messages) - 1)
        if self._current is None:
            self._run_next()
        else:  # queued behind the turn being generated, which is never interrupted
            self._set_status(f"generating… ({len(self._queue)} queued)")
        self._scroll_to_end()
        return True

    def edit_message(self, index: int, text: str) -> bool:
        """Replace message `index` and re-run every later turn; False if busy or out of range."""
        if self.is_generating:
            self._set_status("wait for the reply to finish before editing")
            return False
        if not 0 <= index < len(self.messages):
            self.ctx.show_error(f"There is no message {index} to edit.")
            return False
        edited = self.messages[index]
        edited.content = text.strip()
        if edited.role == "assistant":  # the user's words now stand in for the model's
            edited.result, edited.forced, edited.stale = None, True, False
        for m in self.messages[index + 1:]:
            m.stale = m.role == "assistant"
        self._persist(index)
        first_user = next((j for j, m in enumerate(self.messages) if m.role == "user"), None)
        if index == first_user:  # the title is the first message: it follows the edit
            self._set_title(title_of(edited.content))
            if self._recorder is not None and self._recorder.has_session:
                self._recorder.rename(title_of(edited.content))
        for card, m in zip(self.cards, self.messages):
            card.set_message(m)
        # The same requests `cachescope sessions edit --generate` re-runs: every one whose prompt
        # holds the edit (an edited reply is kept as written, so its own request is not re-run).
        self._queue = requests_after_edit([m.role for m in self.messages], index, keep_replies=False)
        self._run_next()
        return True

    def model_unavailable(self) -> None:
        """The model failed to load (`ctx.model_error`): stop waiting for it."""
        if self._current is None and self._queue:
            self._run_next()

    def _run_next(self) -> None:
        if not self._queue:
            self._current = None
            self._set_status("")
            self.refresh_strips()
            self.sigIdle.emit()
            return
        runner = self.ctx.runner
        if runner is None and self.ctx.model_error is not None:
            # The model failed to load: nothing will resume these turns, so drop them
            # rather than wait for ever (the recorded replies stay as they are).
            self._queue, self._current = [], None
            self._set_status("no model: turns as recorded")
            self.sigIdle.emit()
            return
        if runner is None:
            self._set_status("waiting for the model to load…")
            return  # _on_runner_changed resumes
        self.ctx.activate_runner()
        self.state.scrub_to(None)
        u = self._queue.pop(0)
        if u + 1 < len(self.messages) and self.messages[u + 1].role == "assistant":
            reply = self.messages[u + 1]
        else:
            reply = ChatMessage("assistant", "")
            self.messages.insert(u + 1, reply)
            self._queue = [j + 1 for j in self._queue]
            self._rebuild_cards()
        forced = reply.forced and not reply.stale and reply.result is None and bool(reply.content)
        if not forced:
            reply.content, reply.forced = "", False
        reply.result, reply.stale = None, False
        self._current = u + 1
        self.cards[u + 1].set_message(reply)
        self._set_status("replaying…" if forced else "generating…")
        self._scroll_to_end()
        history = chat_dicts(self.messages[:u + 1])
        emit = self._sigToken.emit
        max_new = self.max_tokens.value()  # read here: widgets belong to the GUI thread

        def job() -> Any:
            if forced:  # teacher-forced: only the prompt matters, the recorded reply is kept
                return runner.generate(runner.render_chat(history), max_new_tokens=1)
            return runner.chat(history, max_new_tokens=max_new, on_token=lambda tid, s: emit(tid, s))

        self.ctx.worker.submit(job, on_done=self._on_turn_done, on_error=self._on_turn_failed)

    def _on_token(self, token_id: int, text: str) -> None:
        if self._current is not None and self._current < len(self.cards):
            self.cards[self._current].append_text(text)
            self._follow()

    def _on_turn_done(self, result: Any) -> None:
        j = self._current
        if j is None:
            return
        reply = self.messages[j]
        if not reply.forced:
            reply.content = result.output_text
        reply.result = result
        self.cards[j].set_message(reply)
        self._persist(j)
        self._record_request(j, result)
        if not reply.forced:
            self.state.record_timing(str(result.request_id), float(result.ttft_ms))
        self.refresh_strips()
        self._follow()
        self.sigTurnFinished.emit(j)
        self._current = None
        self._run_next()

    def _on_turn_failed(self, exc: BaseException) -> None:
        j, self._current, self._queue = self._current, None, []
        if j is not None and j < len(self.messages) and not self.messages[j].content:
            self.cards[j].text_label.setText("(no reply)")
        self._set_status("")
        if isinstance(exc, CapacityError):
            self.ctx.show_error(f"The request was refused: {exc}")
        elif isinstance(exc, (InputError, ValueError)):
            self.ctx.show_error(str(exc))
        else:
            self.ctx.show_error(f"The model failed: {type(exc).__name__}: {exc}")
        self.sigIdle.emit()

    def _on_runner_changed(self, runner: Any) -> None:
        if runner is not None and self._queue and self._current is None:
            self._run_next()
        else:
            self.refresh_strips()

    # ------------------------------------------------------------------ subject
    def show_subject(self, subject: Subject) -> None:
        if subject.is_chat:
            self.title_label.setText(subject.title)
            return
        # A trace or demo has requests but no messages: say so instead of showing an
        # earlier chat beside another subject's pool.
        what = {"trace": "a trace holds token ids, not messages",
                "demo": "the demo's requests and what they show are in the Demo guide",
                "server": "an attached server sends cache events, not messages"}.get(subject.kind, "")
        self._clear(f"The conversation does not apply to {subject.describe()}: {what}. "
                    f"Type a message to start a new chat session with the local model.")
        self.title_label.setText(subject.title)

    def _clear(self, placeholder: str) -> None:
        if self.is_generating:
            return  # a turn in flight finishes into its own session
        self.messages = []
        self._use_store(self.ctx.store, None)
        self.placeholder.setText(placeholder)
        self._rebuild_cards()

    def _set_title(self, title: str) -> None:
        self.title_label.setText(title)
        if self.ctx.subject.is_chat:
            self.ctx.rename_subject(title)

    # ------------------------------------------------------------------ sessions
    def new_session(self) -> bool:
        """Start an empty chat (asking first if the current one is not saved); False if not."""
        if self.is_generating:
            self._set_status("wait for the reply to finish before starting a new session")
            return False
        if not self.ctx.open_subject(Subject("session", "New session")):
            return False
        self.messages = []
        self._use_store(self.ctx.store, None)
        self.title_label.setText("New session")
        self.placeholder.setText(PLACEHOLDER)
        self._rebuild_cards()
        self.ctx.sigSessionChanged.emit(None)
        return True

    def load_messages(self, messages: list[tuple[str, str]], title: str, replay: bool = True) -> None:
        """Show recorded messages and (with `replay`) run them through the engine, keeping
        recorded replies and generating missing ones."""
        self.messages = [ChatMessage(role, content, forced=role == "assistant", stored=True) for role, content in messages]
        self.title_label.setText(title)
        self.placeholder.setText(PLACEHOLDER)
        self._rebuild_cards()
        if replay:
            if self._recorder is not None:
                self._recorder.new_run()
            self._queue = [j for j, m in enumerate(self.messages) if m.role == "user"]
            if self.ctx.runner is not None:
                self.ctx.worker.submit(self._reset_engine, self.ctx.runner, on_error=lambda exc: None)
            self._run_next()

    @staticmethod
    def _reset_engine(runner: Any) -> None:
        if not runner.manager.running_request_ids:
            runner.manager.reset()  # a fresh cache, so the replay's hits are its own

    def open_store(self, path: str | Path) -> None:
        """Open a Cachescope database and its latest chat session."""
        from engine.store.database import Store

        store = Store(path)
        chats = [s for s in store.list_sessions() if s.kind == "chat" and s.num_messages]
        if not chats:
            store.close()
            raise InputError(f"{path} holds no chat session to open")
        if self.ctx.store is not None and self.ctx.store is not store:
            self._stop_recorder()
            self.ctx.store.close()
        self.ctx.store = store
        session = chats[-1]
        self.ctx.session_id = session.id
        self._use_store(store, session.id)
        self.ctx.open_subject(Subject("session", session.title, source=str(path)), ask=False)
        self.load_messages([(m.role, m.content) for m in store.messages(session.id)], session.title)
        self.ctx.sigSessionChanged.emit(session.id)

    def import_file(self, path: str | Path) -> None:
        """Import conversations (OpenAI, ShareGPT, Anthropic, MT-Bench); show and replay the first."""
        from engine.store.formats import load_conversations

        convs = [c for c in load_conversations(path) if c.kind == "chat" and c.messages]
        if not convs:
            raise InputError(f"{path} holds no conversation with messages")
        conv = convs[0]
        self.ctx.session_id = None
        self._use_store(self.ctx.store, None)
        if self._recorder is not None:
            self._recorder.import_conversation(conv.title, list(conv.messages), block_size=self._block_size(),
                                               source_path=str(path), source_format=conv.format)
            for other in convs[1:]:  # the others are kept in the store, each its own session
                self._recorder.import_conversation(other.title, list(other.messages), current=False,
                                                   block_size=self._block_size(), source_path=str(path),
                                                   source_format=other.format)
        # The file it came from keeps it: replacing it loses nothing.
        self.ctx.open_subject(Subject("session", conv.title, source=str(path)), ask=False)
        self.load_messages([(m.role, m.content) for m in conv.messages], conv.title)
        self.ctx.sigSessionChanged.emit(None)

    def export_json(self, path: str | Path) -> None:
        data = {"messages": chat_dicts(self.messages)}
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")

    # ------------------------------------------------------------------ persistence (writer thread)
    def _use_store(self, store: Any, session_id: int | None) -> None:
        """Record into `session_id` of `store` (a new session at the first message for None)."""
        self._stop_recorder()
        if store is None:
            return
        self._recorder = ChatRecorder(store, session_id)  # no parent: it may outlive the view at shutdown
        self._recorder.sigSessionCreated.connect(self._on_session_created)
        self._recorder.sigFailed.connect(self.ctx.show_error)

    def _stop_recorder(self) -> None:
        if self._recorder is not None:
            try:
                self._recorder.stop()
            except Exception as exc:  # noqa: BLE001 - the write error was reported already
                self.ctx.errors.append(str(exc))
            self._recorder = None

    def flush_store(self) -> None:
        """Wait until every queued write is committed (tests; the window before closing)."""
        if self._recorder is not None:
            self._recorder.flush()

    def _on_session_created(self, session_id: int) -> None:
        self.ctx.session_id = session_id
        self.ctx.sigSessionChanged.emit(session_id)

    def _persist(self, index: int) -> None:
        if self.ctx.store is not None and self._recorder is None:
            self._use_store(self.ctx.store, self.ctx.session_id)
        rec = self._recorder
        if rec is None:
            return
        if not rec.has_session:
            first = next((m.content for m in self.messages if m.role == "user"), "chat")
            runner = self.ctx.runner
            rec.create_session(title_of(first), model=runner.loaded.name if runner is not None else None,
                               block_size=self._block_size(),
                               capacity_blocks=runner.manager.num_blocks if runner is not None else 4096)
        m = self.messages[index]
        if m.stored:
            rec.edit_message(index, m.role, m.content)
        else:
            rec.add_message(index, m.role, m.content)
            m.stored = True

    def _record_request(self, index: int, r: Any) -> None:
        rec = self._recorder
        if rec is None or not rec.has_session:
            return
        miss = r.miss
        rec.record_request(
            self._block_size(), request_id=str(r.request_id),
            prompt_token_ids=list(r.prompt_token_ids), output_token_ids=list(r.output_token_ids),
            prompt_tokens=r.num_prompt_tokens, cached_tokens=r.num_cached_tokens,
            computed_tokens=r.num_computed_tokens, miss_reason=getattr(miss, "reason", None),
            first_miss_block=getattr(miss, "first_miss_block", None),
            divergence_token=getattr(miss, "divergence_token", None), message_position=index,
            ttft_ms=r.ttft_ms, prefill_ms=r.prefill_ms, decode_ms=r.decode_ms, output_text=r.output_text)
