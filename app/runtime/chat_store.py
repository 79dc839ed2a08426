"""`ChatRecorder`: writes one chat session to the store on the store's writer thread.

The chat controller never touches SQLite on the GUI thread: every write (the session
row, messages, edits, served requests) is queued, in order, to an
`engine.store.writer.StoreWriter`. A session id the writer assigns reaches the GUI by
`sigSessionCreated`; a failed write by `sigFailed` with one sentence.
"""

from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

from engine.store.database import Store
from engine.store.writer import StoreWriter

FLUSH_TIMEOUT_S = 30.0


class _Ref:
    """An id the writer thread fills in; later queued writes read it (they run after)."""

    __slots__ = ("id",)

    def __init__(self, value: int | None = None) -> None:
        self.id = value


class ChatRecorder(QObject):
    """Queues the writes of one chat session; `session_id` is known once `sigSessionCreated` fired."""

    sigSessionCreated = Signal(int)
    sigFailed = Signal(str)

    def __init__(self, store: Store, session_id: int | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.writer = StoreWriter(store)
        self._session = _Ref(session_id)
        self._run = _Ref()
        self._num_requests = 0
        self._pending_session = False

    @property
    def has_session(self) -> bool:
        return self._session.id is not None or self._pending_session

    @property
    def session_id(self) -> int | None:
        return self._session.id

    def _queue(self, what: str, fn: Callable[[Store], Any]) -> None:
        def run(store: Store) -> None:
            try:
                fn(store)
            except Exception as exc:  # noqa: BLE001 - a full disk must not end the chat
                self.sigFailed.emit(f"The {what} could not be saved: {exc}")
        self.writer.call(run)

    # ------------------------------------------------------------------ GUI thread
    def create_session(self, title: str, **fields: Any) -> None:
        """Queue the session row; its id arrives by `sigSessionCreated`."""
        self._pending_session = True
        ref, emit = self._session, self.sigSessionCreated.emit

        def create(store: Store) -> None:
            ref.id = store.create_session(title, "chat", **fields)
            emit(ref.id)
        self._queue("session", create)

    def import_conversation(self, title: str, messages: list[Any], current: bool = True, **fields: Any) -> None:
        """Queue a whole imported conversation as a new session (one transaction); with
        `current`, later writes go to it, otherwise it is only kept in the store."""
        ref = self._session if current else _Ref()
        emit = self.sigSessionCreated.emit if current else (lambda _sid: None)
        if current:
            self._pending_session = True

        def write(store: Store) -> None:
            ref.id = store.create_session(title, "chat", **fields)
            for pos, m in enumerate(messages):
                store.add_message(ref.id, m.role, m.content, m.extra, position=pos)
            emit(ref.id)
        self._queue("conversation", write)

    def add_message(self, position: int, role: str, content: str) -> None:
        ref = self._session
        self._queue("message", lambda store: store.add_message(ref.id, role, content, position=position))

    def edit_message(self, position: int, role: str, content: str) -> None:
        ref = self._session
        self._queue("message", lambda store: store.edit_message(ref.id, position, content, role))

    def rename(self, title: str) -> None:
        ref = self._session
        self._queue("title", lambda store: store.update_session(ref.id, title=title))

    def record_request(self, block_size: int, **fields: Any) -> None:
        """Queue one served request (a run is created for the session's first)."""
        ref, run, idx = self._session, self._run, self._num_requests
        self._num_requests += 1

        def write(store: Store) -> None:
            if run.id is None:
                run.id = store.create_run(ref.id, "live", {"block_size": block_size})
            store.record_request(run.id, idx, **fields)
        self._queue("request", write)

    def new_run(self) -> None:
        """The next request starts a new run (a replay of the session)."""
        self._run = _Ref()
        self._num_requests = 0

    def flush(self) -> None:
        """Wait until every queued write is committed (tests, closing)."""
        self.writer.flush(FLUSH_TIMEOUT_S)

    def stop(self) -> None:
        self.writer.stop()
