"""The app context: the few shared objects every panel is built from, and the one subject.

A panel factory takes one `AppContext` and reads the bridge (engine events as Qt
signals), the pool state (the projection of those events), the model worker, the store,
the settings, the current runner and the current `Subject` (what every view shows: a live
session, an opened session or trace, a demo, an attached server). Nothing here draws.
The bridge, the pool state and the remote controller are built at their first use (the
window's first paint at the latest): they import numpy and the remote engine, which the
window does not need to come up.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import weakref
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from PySide6.QtCore import QCoreApplication, QObject, QSettings, QThread, Signal
from shiboken6 import Shiboken

from app.runtime import allocator
from app.runtime.imports import BACKGROUND_IMPORTS, import_shared
from app.runtime.worker import ModelWorker

if TYPE_CHECKING:
    from app.runtime.bridge import EngineBridge
    from app.runtime.remote import RemoteController
    from app.runtime.state import PoolState
    from engine.core.events import EventBus

ORGANIZATION = "Cachescope"
APPLICATION = "Cachescope"


SUBJECT_KINDS = ("session", "trace", "demo", "server", "usage")


@dataclass(slots=True, frozen=True)
class Subject:
    """What every view shows right now.

    `kind` is "session" (a live or opened chat session), "trace" (a replayed token or block
    trace), "demo" (a guided demo in its own engine), "server" (an attached vLLM pool) or
    "usage" (an API usage log, compared with what the engine predicts);
    `title` names it in the window title and the views that do not apply to it;
    `unsaved` marks work that is lost if another subject replaces it (a chat with no store).
    """

    kind: str
    title: str
    unsaved: bool = False
    source: str | None = None  # a file path, demo name or server endpoint

    def __post_init__(self) -> None:
        if self.kind not in SUBJECT_KINDS:
            raise ValueError(f"a subject is one of {', '.join(SUBJECT_KINDS)}, not {self.kind!r}")

    @property
    def is_chat(self) -> bool:
        return self.kind == "session"

    def describe(self) -> str:
        word = {"session": "the session", "trace": "the trace", "demo": "the demo", "server": "the server",
                "usage": "the usage log"}[self.kind]
        return f"{word} \u201c{self.title}\u201d"


class BlockSelection(QObject):
    """The block the user picked last, in any view; `sigBlockSelected(block_id or None)` on each pick."""

    sigBlockSelected = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.block_id: int | None = None

    def select(self, block_id: int | None) -> None:
        self.block_id = None if block_id is None else int(block_id)
        self.sigBlockSelected.emit(self.block_id)


def _warm_live_log() -> None:
    try:
        with BACKGROUND_IMPORTS:  # not importing numba at the same moment as the model load
            from engine.core.live_log import warm_up

            warm_up()
    except Exception:  # noqa: BLE001 - a failed warm-up only means the first batch loads them
        pass


def _warm_attach() -> None:
    """An attach's compiled code (the columnar pool and its typed dict, the wire decoder,
    the compiled receive, the placer's and the overlay's passes: `engine.warmup.warm_attach`,
    0.4 s of CPU): the first attach had loaded them on the GUI thread, the window frozen
    0.43-0.46 s at File > Attach."""
    try:
        with BACKGROUND_IMPORTS:
            from engine.warmup import warm_attach

            warm_attach()
    except Exception:  # noqa: BLE001 - a failed warm-up only means the first attach loads them
        pass


def _warm_compiled() -> None:
    """The warm-up thread: the live log's compiled passes, then an attach's."""
    _warm_live_log()
    _warm_attach()


def __getattr__(name: str) -> Any:
    # `engine_info` lives with the bridge, which imports the live log (numpy): it is read
    # from there at its first use, so that importing the context stays light.
    if name == "engine_info":
        from app.runtime.bridge import engine_info

        return engine_info
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class JobCancelled(Exception):
    """Raised inside a worker job whose user pressed Cancel (a long trace load or a demo)."""


class CancelToken:
    """A flag a long job checks (through its event bus) so Cancel stops it between events."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def listener(self, _event: Any) -> None:
        # Subscribed to the job's own bus: the engine emits from the worker thread, so the
        # exception unwinds the job there; the engine it leaves half-done is thrown away.
        if self._event.is_set():
            raise JobCancelled("cancelled")


def runner_engine_info(runner: Any) -> dict[str, Any]:
    """`engine_info` for an `engine.model.runner.ModelRunner`."""
    from app.runtime.bridge import engine_info

    loaded = getattr(runner, "loaded", None)
    mgr = runner.manager
    try:
        per_layer = list(runner.kv_pool.per_layer_bytes())
    except AttributeError:
        per_layer = []
    dtype = getattr(loaded, "dtype", None)
    return engine_info(block_size=mgr.block_size, num_blocks=mgr.num_blocks,
                       model=getattr(loaded, "name", None), num_layers=getattr(loaded, "num_layers", 0),
                       num_kv_heads=getattr(loaded, "num_kv_heads", 0), head_dim=getattr(loaded, "head_dim", 0),
                       dtype=None if dtype is None else str(dtype).replace("torch.", ""),
                       per_layer_bytes=per_layer)


class AppContext(QObject):
    """Shared objects of one app window. Attributes are plain and public.

    `runner` is the current `engine.model.runner.ModelRunner` or None (no model loaded yet, or a
    trace is open); `sigRunnerChanged(runner)` fires when it changes. `show_error` is the
    one way to tell the user that something failed: a modal dialog with one sentence, or,
    with `suppress_dialogs`, an entry in `errors` (tests).

    `bridge`, `state` and `remote` are built together at the first read of any of them
    (`build_runtime`), which emits `sigRuntimeReady` once: the window reads none of them
    before its first paint.
    """

    sigRunnerChanged = Signal(object)
    sigSessionChanged = Signal(object)  # session id (int | str) or None, after `set_session`
    sigStoreClosing = Signal()  # the store is about to close: whoever writes to it finishes now
    sigThemeChanged = Signal(str)  # "dark" | "light", after the style sheet changed
    sigSubjectChanged = Signal(object)  # the new Subject, after the views were pointed at it
    sigJobChanged = Signal(str)  # the cancellable job now running ("" when none)
    sigRuntimeReady = Signal()  # the bridge, the pool state and the remote controller were just built

    def __init__(self, settings: QSettings | None = None, store: Any = None,
                 suppress_dialogs: bool = False, parent: QObject | None = None) -> None:
        # Owned by the application until `shutdown`, not by this Python object: Python's cyclic
        # collector runs on whichever thread allocates (the model worker, a subscriber, the
        # live log's warm-up), and a context it freed was destroyed there with its children;
        # the bridge's frame timer, still running in one never shut down, cannot be stopped
        # from that thread, fired on the freed bridge and crashed the GUI thread in
        # processEvents. One never shut down now lives as long as the application.
        app = QCoreApplication.instance() if parent is None else None
        super().__init__(parent if parent is not None else app)
        self._owned_by_app = app is not None
        self._gui_thread = threading.get_ident()
        allocator.tune()  # a window's process gives its outgrown arrays back (cachescope does it first)
        self._bridge: EngineBridge | None = None
        self._warm: threading.Thread | None = None  # the live log's passes loading (build_runtime)
        self._state: PoolState | None = None
        self._remote: RemoteController | None = None
        self.worker = ModelWorker(self)
        self.selection = BlockSelection(self)
        self.store = store
        self.settings = settings if settings is not None else QSettings(ORGANIZATION, APPLICATION)
        self.subject = Subject("session", "New session")
        self.job: CancelToken | None = None
        self.job_name = ""
        # Tests answer "replace unsaved work?" here instead of in a dialog (None: ask).
        self.answer_replace: bool | None = None
        self.runner: Any = None
        self.loaded: Any = None  # engine.model.loader.LoadedModel once loaded
        self.model_name: str | None = None  # --model, None = bundled default
        # Why the last model load failed (None: it did not); the app goes on without a model.
        self.model_error: str | None = None
        self.session_id: Any = None
        self.suppress_dialogs = suppress_dialogs
        self.errors: list[str] = []
        # How the window asks and tells (modal message boxes); None: nobody to ask, so the
        # context answers yes and writes errors to stderr. The context itself draws nothing.
        self.ask_dialog: Callable[[str, str], bool] | None = None  # (title, text) -> yes?
        self.error_dialog: Callable[[str, str], None] | None = None  # (title, text)
        self._at_shutdown: list[Any] = []

    # ------------------------------------------------------------------ runtime, built at first use
    def build_runtime(self) -> None:
        """Build the bridge, the pool state and the remote controller if not built yet."""
        if self._bridge is not None:
            return
        if QThread.currentThread() is not self.thread():
            # Built on a worker, its timers and signals would live on that thread.
            raise RuntimeError("the context's bridge and pool state are built on the GUI thread first "
                               "(call build_runtime there before a worker uses them)")
        from app.runtime.bridge import EngineBridge
        from app.runtime.remote import RemoteController
        from app.runtime.state import PoolState

        bridge = EngineBridge(self)
        state = PoolState(bridge)  # connected to the bridge before any view is
        bridge.follow(state)  # the state's live log gets its rows made on the engine threads
        self._bridge, self._state = bridge, state
        # The attached vLLM server, if any, and the tokenizer that decodes its token ids.
        self._remote = RemoteController(self)
        # The live log's compiled passes (numba and its disk cache) load on a thread of their
        # own now, not on the GUI thread at the first batch a chat, demo or stream appends
        # (0.4-1 s frozen, measured by bench gui's ingestion), and then an attach's.
        import_shared()  # not imported by both threads at once
        self._warm = threading.Thread(target=_warm_compiled, name="live-log-warm-up", daemon=True)
        self._warm.start()
        self.sigRuntimeReady.emit()

    def wait_warm(self, timeout: float | None = None) -> bool:
        """Wait until the live log's and an attach's compiled code is loaded (`build_runtime`
        starts it); True once it is."""
        if self._warm is None:
            return False
        self._warm.join(timeout)
        return not self._warm.is_alive()

    @property
    def runtime_ready(self) -> bool:
        return self._bridge is not None

    @property
    def bridge(self) -> EngineBridge:
        """Engine events as Qt signals (`app.runtime.bridge.EngineBridge`)."""
        if self._bridge is None:
            self.build_runtime()
        return self._bridge

    @property
    def state(self) -> PoolState:
        """The pool as the events so far leave it (`app.runtime.state.PoolState`)."""
        if self._state is None:
            self.build_runtime()
        return self._state

    @property
    def remote(self) -> RemoteController:
        """The attached vLLM server, if any (`app.runtime.remote.RemoteController`)."""
        if self._remote is None:
            self.build_runtime()
        return self._remote

    # ------------------------------------------------------------------ engines
    def set_runner(self, runner: Any, activate: bool = True) -> None:
        """Make `runner` current: its events go to the bridge and views reset to its shape.

        With `activate=False` the views stay on what they show (an opened trace); the
        runner takes over when the user chats (`activate_runner`).
        """
        self.runner = runner
        if runner is not None and activate:
            self.attach_events(runner.manager.events, runner_engine_info(runner))
        self.sigRunnerChanged.emit(runner)

    def activate_runner(self) -> bool:
        """Point the bridge back at the runner's engine (after a trace replay); False if no runner."""
        if self.runner is None:
            return False
        if self.bridge.bus is not self.runner.manager.events:
            self.set_runner(self.runner)
        return True

    def new_event_bus(self, info: dict[str, Any]) -> EventBus:
        """A fresh bus wired to the bridge for a headless engine (trace replay); views reset."""
        from engine.core.events import EventBus

        bus = EventBus()
        self.attach_events(bus, info)
        return bus

    # ------------------------------------------------------------------ subject
    def may_replace_subject(self, new_title: str) -> bool:
        """True if the current subject may be replaced: nothing unsaved, or the user agreed."""
        if not self.subject.unsaved:
            return True
        if self.answer_replace is not None:
            return self.answer_replace
        if self.suppress_dialogs or self.ask_dialog is None:
            return True
        text = (f"Opening {new_title} replaces {self.subject.describe()}, which is not saved "
                f"(its messages live only in this window). Replace it?")
        return self.ask_dialog("Replace the current subject?", text)

    def open_subject(self, subject: Subject, ask: bool = True) -> bool:
        """Make `subject` current (asking first if unsaved work would be replaced); False if
        the user said no. The views go back to live and hear `sigSubjectChanged`.

        This is also the hook for a new source of events (an attached vLLM server): open a
        `Subject("server", ...)`, then `attach_events(bus, info)`.
        """
        if ask and not self.may_replace_subject(subject.describe()):
            return False
        self.subject = subject
        self.state.scrub_to(None)
        self.sigSubjectChanged.emit(subject)
        return True

    def mark_unsaved(self, unsaved: bool) -> None:
        """The current subject now has (or no longer has) work that is not saved."""
        if self.subject.unsaved != unsaved:
            self.subject = replace(self.subject, unsaved=unsaved)

    def rename_subject(self, title: str) -> None:
        if title and title != self.subject.title:
            self.subject = replace(self.subject, title=title)
            self.sigSubjectChanged.emit(self.subject)

    def attach_events(self, bus: EventBus, info: dict[str, Any]) -> None:
        """The one way to point every view at an engine: listen to `bus`, reset to `info`."""
        self.bridge.attach(bus)
        self.bridge.set_engine(info)

    # ------------------------------------------------------------------ cancellable jobs
    def start_job(self, name: str, bus: EventBus | None = None) -> CancelToken:
        """A cancel token for a long job whose engine emits on `bus` (a trace replay); a job
        that builds its engines later (a demo) subscribes the token to each itself."""
        token = CancelToken()
        if bus is not None:
            bus.subscribe(token.listener)
        self.job, self.job_name = token, name
        self.sigJobChanged.emit(name)
        return token

    def cancel_job(self) -> bool:
        """Ask the running long job to stop at its next event; False if none runs."""
        if self.job is None:
            return False
        self.job.cancel()
        return True

    def end_job(self, token: CancelToken | None = None) -> None:
        if token is not None and token is not self.job:
            return
        self.job, self.job_name = None, ""
        self.sigJobChanged.emit("")

    # ------------------------------------------------------------------ store and session
    def open_store(self, path: str | Path, accept: Callable[[Any], None] | None = None) -> Any:
        """Make the Cachescope database at `path` the store, closing the one before; returns it.

        `accept(store)` may refuse the new store by raising (it holds no chat, say): the new
        one is closed and the old one stays, open.
        """
        from engine.store.database import Store

        store = Store(path)
        if accept is not None:
            try:
                accept(store)
            except BaseException:
                store.close()
                raise
        self.close_store()
        self.store = store
        return store

    def close_store(self) -> None:
        """Close the store (its writers first hear `sigStoreClosing`); the context has none after."""
        store, self.store = self.store, None
        if store is None:
            return
        self.sigStoreClosing.emit()
        if hasattr(store, "close"):
            store.close()

    def set_session(self, session_id: Any) -> None:
        """The session the chat records into now (None: a new one, created at the first message)."""
        self.session_id = session_id
        self.sigSessionChanged.emit(session_id)

    # ------------------------------------------------------------------ errors
    def show_error(self, text: str, title: str = "Cachescope") -> None:
        text = str(text).strip() or "Something went wrong."
        self.errors.append(text)
        if self.suppress_dialogs or self.error_dialog is None:
            sys.stderr.write(f"cachescope: {text}\n")
            return
        self.error_dialog(title, text)

    def at_shutdown(self, fn: Any) -> None:
        """Call `fn()` at shutdown, after the worker stopped and before the store closes
        (a view's writer thread commits what it queued)."""
        self._at_shutdown.append(fn)

    def shutdown(self) -> None:
        """Stop the worker thread and the bridge timer; call once when the window closes."""
        if self._remote is not None:
            self._remote.stop()
        self.worker.stop()
        for fn in self._at_shutdown:
            fn()
        self._at_shutdown.clear()
        if self._bridge is not None:
            self._bridge.stop()
        try:
            self.close_store()
        except Exception:  # noqa: BLE001 - closing must not block shutdown
            pass
        if self._owned_by_app:  # stopped: it goes when the last Python reference does (see __del__)
            self._owned_by_app = False
            self.setParent(None)

    def __del__(self) -> None:
        # The last reference went on another thread (its collection found the context in a
        # cycle): the context is deleted on its own thread, at its next pass of the event
        # loop, and this wrapper lets go of it without deleting it here.
        if getattr(self, "_gui_thread", None) not in (None, threading.get_ident()) and Shiboken.isValid(self) \
                and Shiboken.ownedByPython(self):
            self.deleteLater()
            Shiboken.invalidate(self)


def make_test_context(tmp_dir: str | Path | None = None, store: Any = None) -> AppContext:
    """A ready context for pytest-qt tests: bridge, state and worker, no model, no dialogs.

    Settings go to an INI file in `tmp_dir` (a fresh temporary directory by default, removed
    with the context or at exit, as `tempfile.TemporaryDirectory` does), so tests never touch
    the user's real settings and leave nothing behind.
    """
    if QCoreApplication.instance() is None:
        raise RuntimeError("create a QApplication first (pytest-qt's qapp or qtbot fixture)")
    folder = Path(tmp_dir) if tmp_dir is not None else Path(tempfile.mkdtemp(prefix="cachescope-test-"))
    settings = QSettings(str(folder / "settings.ini"), QSettings.Format.IniFormat)
    ctx = AppContext(settings=settings, store=store, suppress_dialogs=True)
    if tmp_dir is None:
        weakref.finalize(ctx, discard_settings, settings, folder)
    return ctx


def discard_settings(settings: QSettings, folder: str | Path) -> None:
    """Write `settings` out, then remove `folder`: a QSettings writes what it still holds when it
    is destroyed, which (after the folder went) made the folder again, left in /tmp. At
    interpreter exit the QSettings may be gone before this runs (PySide6 deleted it): it
    has nothing left to write, and the folder still goes."""
    try:
        settings.sync()
    except RuntimeError:  # "Internal C++ object (PySide6.QtCore.QSettings) already deleted"
        pass
    shutil.rmtree(folder, ignore_errors=True)
