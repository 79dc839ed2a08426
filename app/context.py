"""The app context: the few shared objects every panel is built from.

A panel factory takes one `AppContext` and reads the bridge (engine events as Qt
signals), the pool state (F's projection of those events), the model worker, the store,
the settings and the current runner. Nothing here draws; the main window lives apart.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QSettings, Signal
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from app.bridge import EngineBridge
from app.worker import ModelWorker
from engine.core.events import EventBus

ORGANIZATION = "Cachescope"
APPLICATION = "Cachescope"


def _make_state(bridge: EngineBridge) -> Any:
    # app.state is engineer F's; tolerate its absence while it is being written.
    try:
        from app.state import PoolState
    except ImportError as exc:
        sys.stderr.write(f"cachescope: warning: app.state is not available yet ({exc})\n")
        return None
    return PoolState(bridge)


def engine_info(*, block_size: int, num_blocks: int, model: str | None = None, num_layers: int = 0,
                num_kv_heads: int = 0, head_dim: int = 0, dtype: str | None = None,
                per_layer_bytes: list[int] | None = None) -> dict[str, Any]:
    """The `sigEngineChanged` dict; bytes are per block (K and V of every layer)."""
    per_layer = [int(b) for b in (per_layer_bytes or [])]
    per_block = [b // num_blocks for b in per_layer] if num_blocks else []
    return {"block_size": int(block_size), "num_blocks": int(num_blocks), "model": model,
            "num_layers": int(num_layers), "num_kv_heads": int(num_kv_heads), "head_dim": int(head_dim),
            "dtype": dtype, "bytes_per_block": int(sum(per_block)), "per_layer_bytes": per_layer}


def runner_engine_info(runner: Any) -> dict[str, Any]:
    """`engine_info` for an `engine.model.runner.ModelRunner` (engineer A's)."""
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
    """

    sigRunnerChanged = Signal(object)
    sigSessionChanged = Signal(object)  # session id (int | str) or None
    sigThemeChanged = Signal(str)  # "dark" | "light", after the style sheet changed

    def __init__(self, settings: QSettings | None = None, store: Any = None,
                 suppress_dialogs: bool = False, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge = EngineBridge(self)
        self.state = _make_state(self.bridge)
        self.worker = ModelWorker(self)
        self.store = store
        self.settings = settings if settings is not None else QSettings(ORGANIZATION, APPLICATION)
        self.runner: Any = None
        self.loaded: Any = None  # engine.model.loader.LoadedModel once loaded
        self.model_name: str | None = None  # --model, None = bundled default
        self.session_id: Any = None
        self.suppress_dialogs = suppress_dialogs
        self.errors: list[str] = []
        self.dialog_parent: QWidget | None = None

    # ------------------------------------------------------------------ engines
    def set_runner(self, runner: Any, activate: bool = True) -> None:
        """Make `runner` current: its events go to the bridge and views reset to its shape.

        With `activate=False` the views stay on what they show (an opened trace); the
        runner takes over when the user chats (`activate_runner`).
        """
        self.runner = runner
        if runner is not None and activate:
            self.bridge.attach(runner.manager.events)
            self.bridge.set_engine(runner_engine_info(runner))
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
        bus = EventBus()
        self.bridge.attach(bus)
        self.bridge.set_engine(info)
        return bus

    # ------------------------------------------------------------------ errors
    def show_error(self, text: str, title: str = "Cachescope") -> None:
        text = str(text).strip() or "Something went wrong."
        self.errors.append(text)
        if self.suppress_dialogs or QApplication.instance() is None:
            sys.stderr.write(f"cachescope: {text}\n")
            return
        QMessageBox.warning(self.dialog_parent, title, text)

    def shutdown(self) -> None:
        """Stop the worker thread and the bridge timer; call once when the window closes."""
        self.worker.stop()
        self.bridge.stop()
        if self.store is not None and hasattr(self.store, "close"):
            try:
                self.store.close()
            except Exception:  # noqa: BLE001 - closing must not block shutdown
                pass


def make_test_context(tmp_dir: str | Path | None = None, store: Any = None) -> AppContext:
    """A ready context for pytest-qt tests: bridge, state and worker, no model, no dialogs.

    Settings go to an INI file in `tmp_dir` (a fresh temporary directory by default), so
    tests never touch the user's real settings.
    """
    if QApplication.instance() is None:
        raise RuntimeError("create a QApplication first (pytest-qt's qapp or qtbot fixture)")
    folder = Path(tmp_dir) if tmp_dir is not None else Path(tempfile.mkdtemp(prefix="cachescope-test-"))
    settings = QSettings(str(folder / "settings.ini"), QSettings.Format.IniFormat)
    return AppContext(settings=settings, store=store, suppress_dialogs=True)
