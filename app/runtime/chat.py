"""`ChatController`: runs the chat with the local model; the conversation view only draws it.

It owns the messages, the queue of turns still to run (each on the model worker, in
order, never interrupted) and the session's recorder (writes on the store's writer
thread). It reports through signals, in the GUI thread. Which turns an edit re-runs is
`engine.model.chat.requests_after_edit`, as for `cachescope sessions edit`; the store
and the current session belong to the context (`open_store`, `set_session`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from app.runtime.chat_messages import ChatMessage, chat_dicts, title_of
from app.runtime.chat_store import ChatRecorder
from app.runtime.context import Subject
from engine.core.errors import CapacityError, InputError
from engine.model.chat import requests_after_edit

if TYPE_CHECKING:
    from app.runtime.context import AppContext

DEFAULT_MAX_NEW_TOKENS = 48


def _chat_sessions(store: Any) -> list[Any]:
    return [s for s in store.list_sessions() if s.kind == "chat" and s.num_messages]


class ChatController(QObject):
    """The chat of one conversation panel. Every signal is delivered in the GUI thread.

    `sigMessagesReset()`: the list was replaced or a message inserted (draw it again);
    `sigMessageAdded(i)`, `sigMessageChanged(i)`: one message; `sigTurnStarted(i)`: reply `i`
    is being generated; `sigToken(token_id, text)`: one streamed token of it (emitted on the
    worker thread, queued to GUI slots); `sigTurnFinished(i)`, `sigTurnFailed(i)`;
    `sigIdle()`: every queued turn has run; `sigStatus(text)`, `sigTitleChanged(title)`.
    """

    sigMessagesReset = Signal()
    sigMessageAdded = Signal(int)
    sigMessageChanged = Signal(int)
    sigTurnStarted = Signal(int)
    sigToken = Signal(int, str)
    sigTurnFinished = Signal(int)
    sigTurnFailed = Signal(int)
    sigIdle = Signal()
    sigStatus = Signal(str)
    sigTitleChanged = Signal(str)

    def __init__(self, ctx: AppContext, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.messages: list[ChatMessage] = []
        self.max_new_tokens = DEFAULT_MAX_NEW_TOKENS
        self.current: int | None = None  # assistant index being generated
        self._queue: list[int] = []  # user message indices still to run, in order
        self._waiting_for_model = False  # the queue waits for sigRunnerChanged to resume it
        self._recorder: ChatRecorder | None = None
        ctx.sigRunnerChanged.connect(self._on_runner_changed)
        ctx.sigStoreClosing.connect(self._stop_recorder)
        ctx.at_shutdown(self._stop_recorder)

    @property
    def is_generating(self) -> bool:
        return self.current is not None or bool(self._queue)

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    def block_size(self) -> int:
        runner = self.ctx.runner
        return runner.manager.block_size if runner is not None else 16

    # ------------------------------------------------------------------ sending and editing
    def send(self, text: str) -> bool:
        """Append a user message and generate the reply; False if there is nothing to send."""
        text = text.strip()
        if not text:
            return False
        if not self.ctx.subject.is_chat:
            # Chatting leaves the trace or demo: the live session is the subject again.
            self.ctx.open_subject(Subject("session", "New session"), ask=False)
            self.clear()
        self.ctx.state.scrub_to(None)
        self.messages.append(ChatMessage("user", text))
        index = len(self.messages) - 1
        if index == 0:
            self._set_title(title_of(text))
        self.sigMessageAdded.emit(index)
        self._persist(index)
        self.ctx.mark_unsaved(self.ctx.store is None)
        self._queue.append(index)
        if self.current is None:
            self._run_next()
        else:  # queued behind the turn being generated, which is never interrupted
            self.sigStatus.emit(f"generating… ({len(self._queue)} queued)")
        return True

    def edit_message(self, index: int, text: str) -> bool:
        """Replace message `index` and re-run every later turn; False if busy or out of range."""
        if self.is_generating:
            self.sigStatus.emit("wait for the reply to finish before editing")
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
        for j in range(len(self.messages)):
            self.sigMessageChanged.emit(j)
        # The same requests `cachescope sessions edit --generate` re-runs: every one whose prompt
        # holds the edit (an edited reply is kept as written, so its own request is not re-run).
        self._queue = requests_after_edit([m.role for m in self.messages], index, keep_replies=False)
        self._run_next()
        return True

    def model_unavailable(self) -> None:
        """The model failed to load (`ctx.model_error`): stop waiting for it."""
        if self.current is None and self._queue:
            self._run_next()

    def _run_next(self) -> None:
        if not self._queue:
            self.current = None
            self.sigStatus.emit("")
            self.sigIdle.emit()
            return
        runner = self.ctx.runner
        if runner is None and self.ctx.model_error is not None:
            # The model failed to load: nothing will resume these turns, so drop them
            # rather than wait for ever (the recorded replies stay as they are).
            self._queue, self.current = [], None
            self.sigStatus.emit("no model: turns as recorded")
            self.sigIdle.emit()
            return
        if runner is None:
            self._waiting_for_model = True
            self.sigStatus.emit("waiting for the model to load…")
            return  # _on_runner_changed resumes
        self._waiting_for_model = False
        # After a trace this points the bridge back at the runner and emits sigRunnerChanged:
        # _on_runner_changed must not start the turn this call is about to start.
        self.ctx.activate_runner()
        self.ctx.state.scrub_to(None)
        u = self._queue.pop(0)
        if u + 1 < len(self.messages) and self.messages[u + 1].role == "assistant":
            reply = self.messages[u + 1]
        else:
            reply = ChatMessage("assistant", "")
            self.messages.insert(u + 1, reply)
            self._queue = [j + 1 for j in self._queue]
            self.sigMessagesReset.emit()
        forced = reply.forced and not reply.stale and reply.result is None and bool(reply.content)
        if not forced:
            reply.content, reply.forced = "", False
        reply.result, reply.stale = None, False
        self.current = u + 1
        self.sigMessageChanged.emit(u + 1)
        self.sigStatus.emit("replaying…" if forced else "generating…")
        self.sigTurnStarted.emit(u + 1)
        history = chat_dicts(self.messages[:u + 1])
        emit = self.sigToken.emit
        max_new = self.max_new_tokens

        def job() -> Any:
            if forced:  # teacher-forced: only the prompt matters, the recorded reply is kept
                return runner.generate(runner.render_chat(history), max_new_tokens=1)
            return runner.chat(history, max_new_tokens=max_new, on_token=lambda tid, s: emit(tid, s))

        self.ctx.worker.submit(job, on_done=self._on_turn_done, on_error=self._on_turn_failed)

    def _on_turn_done(self, result: Any) -> None:
        j = self.current
        if j is None:
            return
        reply = self.messages[j]
        if not reply.forced:
            reply.content = result.output_text
        reply.result = result
        self.sigMessageChanged.emit(j)
        self._persist(j)
        self._record_request(j, result)
        if not reply.forced:
            self.ctx.state.record_timing(str(result.request_id), float(result.ttft_ms))
        self.sigTurnFinished.emit(j)
        self.current = None
        self._run_next()

    def _on_turn_failed(self, exc: BaseException) -> None:
        j, self.current, self._queue = self.current, None, []
        if j is not None and j < len(self.messages) and not self.messages[j].content:
            self.sigTurnFailed.emit(j)
        self.sigStatus.emit("")
        if isinstance(exc, CapacityError):
            self.ctx.show_error(f"The request was refused: {exc}")
        elif isinstance(exc, (InputError, ValueError)):
            self.ctx.show_error(str(exc))
        else:
            self.ctx.show_error(f"The model failed: {type(exc).__name__}: {exc}")
        self.sigIdle.emit()

    def _on_runner_changed(self, runner: Any) -> None:
        if runner is not None and self._waiting_for_model and self._queue and self.current is None:
            self._run_next()

    def _set_title(self, title: str) -> None:
        self.sigTitleChanged.emit(title)
        if self.ctx.subject.is_chat:
            self.ctx.rename_subject(title)

    # ------------------------------------------------------------------ sessions
    def clear(self) -> bool:
        """Forget the messages (a new subject); False while a turn runs, which finishes into
        its own session."""
        if self.is_generating:
            return False
        self.messages = []
        self._use_store(self.ctx.store, None)
        self.sigMessagesReset.emit()
        return True

    def new_session(self) -> bool:
        """Start an empty chat (asking first if the current one is not saved); False if not."""
        if self.is_generating:
            self.sigStatus.emit("wait for the reply to finish before starting a new session")
            return False
        if not self.ctx.open_subject(Subject("session", "New session")):
            return False
        self.messages = []
        self._use_store(self.ctx.store, None)
        self.sigTitleChanged.emit("New session")
        self.sigMessagesReset.emit()
        self.ctx.set_session(None)
        return True

    def load_messages(self, messages: list[tuple[str, str]], title: str, replay: bool = True) -> None:
        """Show recorded messages and (with `replay`) run them through the engine, keeping
        recorded replies and generating missing ones."""
        self.messages = [ChatMessage(role, content, forced=role == "assistant", stored=True) for role, content in messages]
        self.sigTitleChanged.emit(title)
        self.sigMessagesReset.emit()
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
        """Open a Cachescope database (it becomes the context's store) and its latest chat session."""
        def has_chat(store: Any) -> None:
            if not _chat_sessions(store):
                raise InputError(f"{path} holds no chat session to open")

        store = self.ctx.open_store(path, accept=has_chat)
        session = _chat_sessions(store)[-1]
        self._use_store(store, session.id)
        self.ctx.open_subject(Subject("session", session.title, source=str(path)), ask=False)
        self.load_messages([(m.role, m.content) for m in store.messages(session.id)], session.title)
        self.ctx.set_session(session.id)

    def import_file(self, path: str | Path) -> None:
        """Import conversations (OpenAI, ShareGPT, Anthropic, MT-Bench); show and replay the first."""
        from engine.store.formats import load_conversations

        convs = [c for c in load_conversations(path) if c.kind == "chat" and c.messages]
        if not convs:
            raise InputError(f"{path} holds no conversation with messages")
        conv = convs[0]
        self._use_store(self.ctx.store, None)
        if self._recorder is not None:
            self._recorder.import_conversation(conv.title, list(conv.messages), block_size=self.block_size(),
                                               source_path=str(path), source_format=conv.format)
            for other in convs[1:]:  # the others are kept in the store, each its own session
                self._recorder.import_conversation(other.title, list(other.messages), current=False,
                                                   block_size=self.block_size(), source_path=str(path),
                                                   source_format=other.format)
        # The file it came from keeps it: replacing it loses nothing.
        self.ctx.open_subject(Subject("session", conv.title, source=str(path)), ask=False)
        self.load_messages([(m.role, m.content) for m in conv.messages], conv.title)
        self.ctx.set_session(None)  # the imported session's id arrives by sigSessionCreated

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
        self._recorder.sigSessionCreated.connect(self.ctx.set_session)
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
                               block_size=self.block_size(),
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
            self.block_size(), request_id=str(r.request_id),
            prompt_token_ids=list(r.prompt_token_ids), output_token_ids=list(r.output_token_ids),
            prompt_tokens=r.num_prompt_tokens, cached_tokens=r.num_cached_tokens,
            computed_tokens=r.num_computed_tokens, miss_reason=getattr(miss, "reason", None),
            first_miss_block=getattr(miss, "first_miss_block", None),
            divergence_token=getattr(miss, "divergence_token", None), message_position=index,
            ttft_ms=r.ttft_ms, prefill_ms=r.prefill_ms, decode_ms=r.decode_ms, output_text=r.output_text)
