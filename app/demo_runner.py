"""The Demos menu: runs a guided demo on the model worker with its events flowing through
the bridge, so every view shows it, and explains it in a "Demo guide" dock.

The scenarios themselves live in `engine.demos`; this module only wires them to the app.
"""

from __future__ import annotations

import html
import json
import threading
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QDockWidget, QTextBrowser, QVBoxLayout, QWidget

from app.context import engine_info, runner_engine_info
from engine.demos import DEMOS, DemoEnv, get_demo, run_demo
from engine.core.events import EventBus

# How long the worker waits for the GUI thread to point the views at a new engine. The GUI
# answers within a frame; the limit only matters while the window is closing.
ENGINE_SWITCH_TIMEOUT_S = 10.0
# Which dock shows each demo best; the Demo guide dock is raised as well.
DOCK_FOR_DEMO = {
    "kv-grows-per-step": "kv_memory", "kv-memory-70b-128k": "kv_memory", "multi-turn-reuse": "metrics",
    "semantic-false-positive": "semantic", "prompt-caching-bill": "billing", "default-system-prompt-diff": "diff",
    "reordered-rag-chunks": "diff", "timestamp-at-front": "diff",
}


class DemoGuide(QWidget):
    """A read-only page with the running or last demo: title, explanation, steps, findings."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("demo_guide")
        self.browser = QTextBrowser(self)
        self.browser.setOpenExternalLinks(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.browser)
        self.show_intro()

    def show_intro(self) -> None:
        items = "".join(f"<li><b>{html.escape(d.title)}</b>: {html.escape(d.summary)}</li>" for d in DEMOS)
        self.browser.setHtml(f"<h3>Guided demos</h3><p>Pick one from the Demos menu.</p><ul>{items}</ul>")

    def show_running(self, name: str) -> None:
        demo = get_demo(name)
        self.browser.setHtml(f"<h3>{html.escape(demo.title)}</h3><p>{html.escape(demo.explanation)}</p>"
                             f"<p><i>Running on the model worker…</i></p>")

    def show_result(self, result: dict[str, Any]) -> None:
        steps = "".join(f"<li>{html.escape(str(s['action']))}{_step_details(s)}</li>" for s in result["steps"])
        # Numbers first; tables of rows are in the steps above and in the JSON.
        items = sorted(((k, v) for k, v in result["findings"].items() if k not in _HIDDEN_FINDINGS),
                       key=lambda kv: isinstance(kv[1], (dict, list)))
        findings = "".join(f"<tr><td><b>{html.escape(str(k).replace('_', ' '))}</b></td>"
                           f"<td>{html.escape(_finding(v))}</td></tr>" for k, v in items)
        self.browser.setHtml(
            f"<h3>{html.escape(result['title'])}</h3><p>{html.escape(result['explanation'])}</p>"
            f"<h4>Steps</h4><ol>{steps}</ol><h4>Findings</h4><table cellspacing='4'>{findings}</table>"
            f"<p><i>The same result as JSON: cachescope demo {html.escape(result['name'])} --json</i></p>")

    def show_failure(self, name: str, message: str) -> None:
        self.browser.setHtml(f"<h3>{html.escape(name)}</h3><p>The demo failed: {html.escape(message)}</p>")


_STEP_KEYS = ("cached_tokens", "computed_tokens", "miss_reason", "first_miss_block", "tokens_with_kv", "total_bytes",
              "score", "decision", "guarded_decision", "cache_creation_input_tokens", "cache_read_input_tokens",
              "input_tokens", "per_request_gib")


def _step_details(step: dict[str, Any]) -> str:
    parts = [f"{k.replace('_', ' ')} {_short(step[k])}" for k in _STEP_KEYS if step.get(k) is not None]
    return f"<br><small>{html.escape(', '.join(parts))}</small>" if parts else ""


_HIDDEN_FINDINGS = ("diff_messages",)


def _finding(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return f"{len(value)} rows (see the steps, or the JSON)"
    return _short(value)


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit - 1] + "…"


class DemoRunner(QObject):
    """Runs demos for one main window (or, in tests, for a bare `AppContext`).

    `run(name)` returns at once; the demo runs on the context's model worker. Each engine a
    demo builds is announced here first (the worker waits), so the bridge follows it and
    the views reset to its shape. `sigFinished(result)` or `sigFailed(name, message)`
    follows; `results` keeps the last result of each demo.
    """

    sigStarted = Signal(str)
    sigFinished = Signal(dict)
    sigFailed = Signal(str, str)
    _sigEngine = Signal(object, object)  # engine, threading.Event: worker -> GUI thread

    def __init__(self, ctx: Any, window: Any = None, model: Any = None, parent: QObject | None = None) -> None:
        super().__init__(parent if parent is not None else ctx)
        self.ctx = ctx
        self.window = window
        self.guide: DemoGuide | None = None
        self.results: dict[str, dict[str, Any]] = {}
        self.running: str | None = None
        self._model = model
        self._embedder: Any = None
        self._sigEngine.connect(self._on_engine, Qt.ConnectionType.QueuedConnection)

    # ------------------------------------------------------------------ GUI thread
    def run(self, name: str) -> bool:
        """Start demo `name` on the worker; False (and a dialog) if one is running or the name is bad."""
        if self.running is not None:
            self.ctx.show_error(f"The demo {self.running!r} is still running; wait for it to finish.")
            return False
        try:
            get_demo(name)
        except ValueError as exc:
            self.ctx.show_error(str(exc))
            return False
        self.running = name
        if self.guide is not None:
            self.guide.show_running(name)
            self._raise("demo_guide")
        self.sigStarted.emit(name)
        self.ctx.worker.submit(self._job, name, on_done=self._done, on_error=lambda exc: self._failed(name, exc))
        return True

    def _on_engine(self, engine: Any, ready: threading.Event) -> None:
        try:
            bridge = self.ctx.bridge
            if isinstance(engine, EventBus):
                bridge.attach(engine)
                bridge.set_engine(engine_info(block_size=16, num_blocks=0, model=None))
            elif hasattr(engine, "manager"):
                bridge.attach(engine.manager.events)
                bridge.set_engine(runner_engine_info(engine))
            else:
                bridge.attach(engine.events)
                bridge.set_engine(engine_info(block_size=engine.block_size, num_blocks=engine.num_blocks, model=None))
        finally:
            ready.set()

    def _done(self, result: dict[str, Any]) -> None:
        self.running = None
        self.results[result["name"]] = result
        self.ctx.bridge.flush(everything=True)
        state = self.ctx.state
        if state is not None and hasattr(state, "record_timing"):
            for t in result.get("timings", ()):
                state.record_timing(t["request_id"], t["ttft_ms"], t.get("cold_ttft_ms"))
        if self.guide is not None:
            self.guide.show_result(result)
        self._show_in_panels(result)
        self.sigFinished.emit(result)

    def _failed(self, name: str, exc: BaseException) -> None:
        self.running = None
        from app.main_window import error_sentence

        message = error_sentence(exc, f"The demo {name} failed")
        if self.guide is not None:
            self.guide.show_failure(name, message)
        self.ctx.show_error(message)
        self.sigFailed.emit(name, message)

    def _show_in_panels(self, result: dict[str, Any]) -> None:
        """Hand a demo's inputs to the panels that compute their own view of them."""
        panels = getattr(self.window, "panels", {}) if self.window is not None else {}
        findings = result["findings"]
        msgs = findings.get("diff_messages")
        diff = panels.get("diff")
        if msgs and diff is not None and hasattr(diff, "set_texts"):
            diff.set_texts(json.dumps(msgs["a"], ensure_ascii=False), json.dumps(msgs["b"], ensure_ascii=False))
        billing = panels.get("billing")
        if result["name"] == "prompt-caching-bill" and billing is not None and hasattr(billing, "set_source"):
            from engine.demos.env import RESOURCES

            if hasattr(billing, "set_provider"):
                billing.set_provider("anthropic", findings.get("model"))
            billing.set_source(str(RESOURCES / "billing_long_session.json"))
        self._raise(DOCK_FOR_DEMO.get(result["name"], "block_table"))
        self._raise("demo_guide")

    def _raise(self, dock_name: str) -> None:
        docks = getattr(self.window, "docks", {}) if self.window is not None else {}
        dock = docks.get(dock_name)
        if dock is not None:
            dock.show()
            dock.raise_()

    # ------------------------------------------------------------------ worker thread
    def _announce(self, engine: Any) -> None:
        ready = threading.Event()
        self._sigEngine.emit(engine, ready)
        ready.wait(ENGINE_SWITCH_TIMEOUT_S)

    def _current_model(self) -> Any:
        if self._model is not None:
            return self._model
        runner = getattr(self.ctx, "runner", None)
        return getattr(runner, "loaded", None) or getattr(self.ctx, "loaded", None)

    def _job(self, name: str) -> dict[str, Any]:
        env = DemoEnv(model=self._current_model(), embedder=self._embedder, on_engine=self._announce)
        try:
            return run_demo(name, env)
        finally:
            # Keep what the demo loaded, so the next demo does not load it again.
            self._model = self._model or env.loaded_model
            self._embedder = env.loaded_embedder


def install_demos(window: Any, model: Any = None) -> DemoRunner:
    """Add every demo to `window`'s Demos menu and a "Demo guide" dock; returns the runner."""
    runner = DemoRunner(window.ctx, window, model=model)
    guide = DemoGuide(window)
    runner.guide = guide
    dock = QDockWidget("Demo guide", window)
    dock.setObjectName("demo_guide")
    dock.setWidget(guide)
    window.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, dock)
    host = getattr(window, "docks", {}).get("conversation")
    if host is not None:
        window.tabifyDockWidget(host, dock)
    if hasattr(window, "docks"):
        window.docks["demo_guide"] = dock
    if hasattr(window, "view_menu"):
        window.view_menu.addAction(dock.toggleViewAction())
    for demo in DEMOS:
        window.add_demo_action(demo.title, demo.summary, lambda name=demo.name: runner.run(name))
    window.demo_runner = runner
    return runner
