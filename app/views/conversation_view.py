"""The conversation panel: chat with the local model, streamed, with editable history.

Each message card has a token strip showing how the prefix cache served its tokens.
Editing an earlier message re-runs every later turn; what the edit invalidated shows in
the strips here and, through engine events, in every other view. Model calls run on the
model worker; sessions persist in `engine.store.database.Store` when the context has one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QScrollArea,
                               QSizePolicy, QSpinBox, QVBoxLayout, QWidget)

from app import theme
from app.views.token_strip import (MISS_TEXT, STATE_LABELS, ChatMessage, StripData, TokenStrip, chat_dicts,
                                   strip_data, title_of)
from engine.core.errors import CapacityError, InputError



class MessageCard(QFrame):
    """A message bubble: role, text, edit box, token strip and request figures."""

    sigEditRequested = Signal(int, str)

    def __init__(self, index: int, message: ChatMessage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.index = index
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
        self.stats = QLabel("", self)
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
        miss = r.miss
        parts = [f"prompt {r.num_prompt_tokens}", f"cached {r.num_cached_tokens}", f"computed {r.num_computed_tokens}"]
        if miss is not None:
            parts.append(f"miss: {MISS_TEXT.get(miss.reason, miss.reason)} at block {miss.first_miss_block}")
        if not message.forced:
            parts.append(f"TTFT {r.ttft_ms:.0f} ms")
            parts.append(f"{len(r.output_token_ids)} tokens in {r.decode_ms:.0f} ms")
        self.stats.setText(" · ".join(parts))

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


class ConversationView(QWidget):
    """Chat panel. Public API used by the window and tests: `send`, `edit_message`,
    `new_session`, `open_store`, `import_file`, `export_json`, `messages`, `is_generating`."""

    sigTurnFinished = Signal(int)  # index of the assistant message just completed
    sigIdle = Signal()  # every queued turn has run
    _sigToken = Signal(int, str)  # emitted on the worker thread by the runner's callback

    def __init__(self, ctx: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.messages: list[ChatMessage] = []
        self.cards: list[MessageCard] = []
        self._queue: list[int] = []  # user message indices still to run, in order
        self._current: int | None = None  # assistant index being generated
        self._run_id: int | None = None
        self._num_requests = 0
        self._texts: dict[int, str] = {}
        self._texts_of: Any = None
        self._sigToken.connect(self._on_token)
        self._build()
        ctx.sigRunnerChanged.connect(self._on_runner_changed)
        ctx.sigThemeChanged.connect(self._on_theme)

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
        head = QHBoxLayout()
        head.addStretch(1)
        self.legend: dict[str, QLabel] = {}
        for state in ("cached", "computed", "partial", "generated"):
            chip = QLabel(self)
            chip.setObjectName("muted")
            chip.setToolTip(STATE_LABELS[state])
            head.addWidget(chip)
            self.legend[state] = chip
        self._paint_legend()
        lay.addLayout(head)
        self.scroll = QScrollArea(self)
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        column = QWidget()
        column.setObjectName("chatColumn")
        self.column = QVBoxLayout(column)
        self.column.setContentsMargins(2, 2, 6, 2)
        self.column.setSpacing(10)
        self.placeholder = QLabel("Ask the model something. Every message shows which of its tokens came "
                                  "from the prefix cache; edit an earlier message to see what it invalidates.", column)
        self.placeholder.setObjectName("muted")
        self.placeholder.setWordWrap(True)
        self.column.addWidget(self.placeholder)
        self.column.addStretch(1)
        self.scroll.setWidget(column)
        lay.addWidget(self.scroll, 1)
        self.input = QPlainTextEdit(self)
        self.input.setPlaceholderText("Message (Ctrl+Enter to send)")
        self.input.setFixedHeight(72)
        lay.addWidget(self.input)
        row = QHBoxLayout()
        self.status = QLabel("", self)
        self.status.setObjectName("muted")
        row.addWidget(self.status, 1)
        row.addWidget(QLabel("max tokens", self))
        self.max_tokens = QSpinBox(self)
        self.max_tokens.setRange(1, 2048)
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
        for state, chip in self.legend.items():
            chip.setText(f"<span style='color:{colors[state]}'>■</span> {state}")

    def _on_theme(self, name: str) -> None:
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
        card = MessageCard(index, message, self)
        card.sigEditRequested.connect(self.edit_message)
        self.column.insertWidget(self.column.count() - 1, card)
        self.cards.append(card)
        self.placeholder.hide()
        return card

    def _scroll_to_end(self) -> None:
        QTimer.singleShot(0, lambda: self.scroll.verticalScrollBar().setValue(self.scroll.verticalScrollBar().maximum()))

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
        for card, data in zip(self.cards, strip_data(runner.tokenizer, self.messages, self._block_size(), self._texts)):
            card.set_strip(data)

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
        if self.is_generating:
            self.ctx.show_error("The model is still answering; wait for it to finish before sending.")
            return False
        self.messages.append(ChatMessage("user", text))
        if len(self.messages) == 1:
            self.title_label.setText(title_of(text))
        self._add_card(len(self.messages) - 1, self.messages[-1])
        self._persist(len(self.messages) - 1)
        self._queue = [len(self.messages) - 1]
        self._run_next()
        return True

    def edit_message(self, index: int, text: str) -> bool:
        """Replace message `index` and re-run every later turn; False if busy or out of range."""
        if self.is_generating:
            self.ctx.show_error("The model is still answering; wait for it to finish before editing.")
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
        for card, m in zip(self.cards, self.messages):
            card.set_message(m)
        first = index if self.messages[index].role == "user" else index + 1
        self._queue = [j for j in range(first, len(self.messages)) if self.messages[j].role == "user"]
        self._run_next()
        return True

    def _run_next(self) -> None:
        if not self._queue:
            self._current = None
            self._set_status("")
            self.refresh_strips()
            self.sigIdle.emit()
            return
        runner = self.ctx.runner
        if runner is None:
            self._set_status("waiting for the model to load…")
            return  # _on_runner_changed resumes
        self.ctx.activate_runner()
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
        if not reply.forced and self.ctx.state is not None and hasattr(self.ctx.state, "record_timing"):
            self.ctx.state.record_timing(str(result.request_id), float(result.ttft_ms))
        self.refresh_strips()
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

    # ------------------------------------------------------------------ sessions
    def new_session(self) -> None:
        if self.is_generating:
            self.ctx.show_error("The model is still answering; wait for it to finish first.")
            return
        self.messages = []
        self.ctx.session_id = None
        self._run_id = None
        self.title_label.setText("New session")
        self._rebuild_cards()
        self.ctx.sigSessionChanged.emit(None)

    def load_messages(self, messages: list[tuple[str, str]], title: str, replay: bool = True) -> None:
        """Show recorded messages and (with `replay`) run them through the engine, keeping
        recorded replies and generating missing ones."""
        self.messages = [ChatMessage(role, content, forced=role == "assistant", stored=True) for role, content in messages]
        self.title_label.setText(title)
        self._rebuild_cards()
        if replay:
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
            self.ctx.store.close()
        self.ctx.store = store
        session = chats[-1]
        self.ctx.session_id = session.id
        self._run_id = None
        self.load_messages([(m.role, m.content) for m in store.messages(session.id)], session.title)
        self.ctx.sigSessionChanged.emit(session.id)

    def import_file(self, path: str | Path) -> None:
        """Import conversations (OpenAI, ShareGPT, Anthropic, MT-Bench); show and replay the first."""
        from engine.store.formats import load_conversations

        convs = [c for c in load_conversations(path) if c.kind == "chat" and c.messages]
        if not convs:
            raise InputError(f"{path} holds no conversation with messages")
        first = None
        store = self.ctx.store
        for conv in convs:
            sid = None
            if store is not None:
                with store.atomic():
                    sid = store.create_session(conv.title, "chat", block_size=self._block_size(),
                                               source_path=str(path), source_format=conv.format)
                    for pos, m in enumerate(conv.messages):
                        store.add_message(sid, m.role, m.content, m.extra, position=pos)
            first = first or (conv, sid)
        conv, sid = first
        self.ctx.session_id = sid
        self._run_id = None
        self.load_messages([(m.role, m.content) for m in conv.messages], conv.title)
        self.ctx.sigSessionChanged.emit(sid)

    def export_json(self, path: str | Path) -> None:
        data = {"messages": chat_dicts(self.messages)}
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")

    # ------------------------------------------------------------------ persistence
    def _session(self) -> int | None:
        store = self.ctx.store
        if store is None:
            return None
        if self.ctx.session_id is None:
            first = next((m.content for m in self.messages if m.role == "user"), "chat")
            runner = self.ctx.runner
            self.ctx.session_id = store.create_session(
                title_of(first), "chat", model=getattr(getattr(runner, "loaded", None), "name", None),
                block_size=self._block_size(),
                capacity_blocks=runner.manager.num_blocks if runner is not None else 4096)
            self.title_label.setText(title_of(first))
            self.ctx.sigSessionChanged.emit(self.ctx.session_id)
        return self.ctx.session_id

    def _persist(self, index: int) -> None:
        try:
            sid = self._session()
            if sid is None:
                return
            m = self.messages[index]
            if m.stored:
                self.ctx.store.edit_message(sid, index, m.content, m.role)
            else:
                self.ctx.store.add_message(sid, m.role, m.content, position=index)
                m.stored = True
        except Exception as exc:  # noqa: BLE001 - a full disk must not end the chat
            self.ctx.show_error(f"The message could not be saved: {exc}")

    def _record_request(self, index: int, r: Any) -> None:
        store = self.ctx.store
        if store is None or self.ctx.session_id is None:
            return
        try:
            if self._run_id is None:
                self._run_id = store.create_run(self.ctx.session_id, "live", {"block_size": self._block_size()})
                self._num_requests = 0
            miss = r.miss
            store.record_request(
                self._run_id, self._num_requests, request_id=str(r.request_id),
                prompt_token_ids=list(r.prompt_token_ids), output_token_ids=list(r.output_token_ids),
                prompt_tokens=r.num_prompt_tokens, cached_tokens=r.num_cached_tokens,
                computed_tokens=r.num_computed_tokens, miss_reason=getattr(miss, "reason", None),
                first_miss_block=getattr(miss, "first_miss_block", None),
                divergence_token=getattr(miss, "divergence_token", None), message_position=index,
                ttft_ms=r.ttft_ms, prefill_ms=r.prefill_ms, decode_ms=r.decode_ms, output_text=r.output_text)
            self._num_requests += 1
        except Exception as exc:  # noqa: BLE001
            self.ctx.show_error(f"The request could not be saved: {exc}")
