"""The Demos menu: runs a guided demo on the model worker with its events flowing through
the bridge, so every view shows it, and explains it in a "Demo guide" dock.

A demo is a subject of its own (`AppContext.open_subject`): starting one asks before it
replaces unsaved work, and it fills the panels its story is about. The scenarios live in
`engine.demos`; this module only wires them to the app; findings are put in words here.
"""

from __future__ import annotations

import html
import threading
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QDockWidget, QTextBrowser, QVBoxLayout, QWidget

from app.runtime.context import AppContext, CancelToken, JobCancelled, Subject, runner_engine_info
from app.demos.words import finding_rows, step_details
from engine.demos import DEMOS, DemoEnv, get_demo, run_demo
from engine.core.events import EventBus
from engine.demos.env import DemoEngine

if TYPE_CHECKING:
    from app.window.main_window import MainWindow

# How long the worker waits for the GUI thread to point the views at a new engine. The GUI
# answers within a frame; the limit only matters while the window is closing.
ENGINE_SWITCH_TIMEOUT_S = 10.0
# Which dock shows each demo best; the Demo guide dock is raised as well.
DOCK_FOR_DEMO = {
    "kv-grows-per-step": "kv_memory", "kv-memory-70b-128k": "kv_memory", "multi-turn-reuse": "metrics",
    "semantic-false-positive": "semantic", "prompt-caching-bill": "billing", "default-system-prompt-diff": "diff",
    "reordered-rag-chunks": "diff", "timestamp-at-front": "diff",
    "quantized-kv-cache": "kv_memory", "prefix-saves-prefill-only": "metrics", "hashing-costs-something": "metrics",
    "deepcopy-vs-shared-blocks": "timeline",
    "tool-order": "diff", "ab-setting-splits-cache": "hash_chains", "summarize-vs-truncate": "diff",
    "breakpoint-on-user-message": "billing", "cacheblend-rag": "diff",
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
        steps = "".join(f"<li>{html.escape(str(s['action']))}{_small(step_details(s))}</li>" for s in result["steps"])
        findings = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>"
                           for k, v in finding_rows(result["findings"]))
        self.browser.setHtml(
            f"<h3>{html.escape(result['title'])}</h3><p>{html.escape(result['explanation'])}</p>"
            f"<h4>Steps</h4><ol>{steps}</ol><h4>Findings</h4><table cellspacing='4'>{findings}</table>"
            f"<p><i>The same result as JSON: cachescope demo {html.escape(result['name'])} --json</i></p>")

    def show_failure(self, name: str, message: str) -> None:
        self.browser.setHtml(f"<h3>{html.escape(name)}</h3><p>The demo failed: {html.escape(message)}</p>")

    def show_cancelled(self, name: str) -> None:
        self.browser.setHtml(f"<h3>{html.escape(get_demo(name).title)}</h3><p>Cancelled. The views show "
                             f"what the demo had done when it stopped.</p>")


def _small(text: str) -> str:
    return f"<br><small>{html.escape(text)}</small>" if text else ""


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

    def __init__(self, ctx: AppContext, window: MainWindow | None = None, model: Any = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent if parent is not None else ctx)
        self.ctx = ctx
        self.window = window
        self.guide: DemoGuide | None = None
        self.results: dict[str, dict[str, Any]] = {}
        self.running: str | None = None
        self._model = model
        self._embedder: Any = None
        self._token: CancelToken | None = None
        self._shown: dict[str, Any] = {}
        self._sigEngine.connect(self._on_engine, Qt.ConnectionType.QueuedConnection)

    # ------------------------------------------------------------------ GUI thread
    def run(self, name: str) -> bool:
        """Start demo `name` on the worker; False (and a dialog) if one is running or the name is bad."""
        if self.running is not None:
            self.ctx.show_error(f"The demo {self.running!r} is still running; wait for it to finish.")
            return False
        try:
            demo = get_demo(name)
        except ValueError as exc:
            self.ctx.show_error(str(exc))
            return False
        if not self.ctx.open_subject(Subject("demo", demo.title, source=name)):
            return False
        from app.runtime.bridge import engine_info  # with the live log (numpy): not at install

        # Until the demo builds its first engine the views show an empty pool, never the
        # previous subject's (a demo that builds none, like the 70B one, keeps it empty).
        self.ctx.attach_events(EventBus(), engine_info(block_size=16, num_blocks=0, model=None))
        self.running = name
        self._token = self.ctx.start_job(f"the demo \u201c{demo.title}\u201d")
        if self.guide is not None:
            self.guide.show_running(name)
            self._raise("demo_guide")
        self.sigStarted.emit(name)
        self.ctx.worker.submit(self._job, name, on_done=self._done, on_error=lambda exc: self._failed(name, exc))
        return True

    def cancel(self) -> bool:
        """Stop the running demo at its next engine event; False if none runs."""
        if self.running is None or self._token is None:
            return False
        self._token.cancel()
        return True

    def _on_engine(self, engine: DemoEngine, ready: threading.Event) -> None:
        from app.runtime.bridge import engine_info

        try:
            if engine.runner is not None:
                info = runner_engine_info(engine.runner)
            else:
                info = engine_info(block_size=engine.block_size, num_blocks=engine.num_blocks, model=None)
            self.ctx.attach_events(engine.bus, info)
        finally:
            ready.set()

    def _finish_job(self) -> None:
        self.running = None
        self.ctx.end_job(self._token)
        self._token = None

    def _done(self, result: dict[str, Any]) -> None:
        self._finish_job()
        self.results[result["name"]] = result
        self.ctx.bridge.flush(everything=True)
        for t in result.get("timings", ()):
            self.ctx.state.record_timing(t["request_id"], t["ttft_ms"], t.get("cold_ttft_ms"))
        if self.guide is not None:
            self.guide.show_result(result)
        self._show_in_panels(result)
        self.sigFinished.emit(result)

    def _failed(self, name: str, exc: BaseException) -> None:
        from app.runtime.jobs import error_sentence  # with the trace readers (msgspec): not at install

        self._finish_job()
        if isinstance(exc, JobCancelled):
            if self.guide is not None:
                self.guide.show_cancelled(name)
            self.sigFailed.emit(name, "cancelled")
            return
        message = error_sentence(exc, f"The demo {name} failed")
        if self.guide is not None:
            self.guide.show_failure(name, message)
        self.ctx.show_error(message)
        self.sigFailed.emit(name, message)

    def _show_in_panels(self, result: dict[str, Any]) -> None:
        """Fill the panels a demo's story is about with what it computed, then raise them."""
        panels = self.window.panels if self.window is not None else {}
        name, findings = result["name"], result["findings"]
        for panel in panels_to_fill(name, findings):
            if panel == "diff":
                msgs = findings["diff_messages"]
                panels["diff"].show_messages(msgs["a"], msgs["b"], source=result["title"])
            elif panel == "billing" and name == "breakpoint-on-user-message":
                show_breakpoint_bill(panels["billing"], findings)
            elif panel == "billing":
                from engine.demos.env import RESOURCES

                billing = panels["billing"]
                billing.set_provider("anthropic", findings.get("model"))
                billing.set_source(str(RESOURCES / "billing_long_session.json"))
            elif panel == "semantic":
                cache = self._shown.get("semantic_cache")
                queries = findings.get("queries") or []
                # The story is a wrong answer served: look that question up first.
                pick = next((q for q in queries if q.get("served_wrong_answer")), queries[0] if queries else None)
                if cache is not None:
                    panels["semantic"].show_cache(cache, pick["prompt"] if pick else None, result["title"])
            elif panel == "kv_memory" and name == "quantized-kv-cache":
                panels["kv_memory"].show_quantized(findings)
            elif panel == "kv_memory":
                show_kv_what_if(panels["kv_memory"], findings)
        self._raise(DOCK_FOR_DEMO.get(name, "block_table"))
        self._raise("demo_guide")

    def _raise(self, dock_name: str) -> None:
        docks = self.window.docks if self.window is not None else {}
        dock = docks.get(dock_name)
        if dock is not None:
            dock.show()
            dock.raise_()

    # ------------------------------------------------------------------ worker thread
    def _announce(self, engine: DemoEngine) -> None:
        token = self._token
        if token is not None:
            if token.cancelled:
                raise JobCancelled("cancelled")
            engine.bus.subscribe(token.listener)
        ready = threading.Event()
        self._sigEngine.emit(engine, ready)
        ready.wait(ENGINE_SWITCH_TIMEOUT_S)

    def _current_model(self) -> Any:
        if self._model is not None:
            return self._model
        runner = self.ctx.runner
        return runner.loaded if runner is not None else self.ctx.loaded

    def _job(self, name: str) -> dict[str, Any]:
        env = DemoEnv(model=self._current_model(), embedder=self._embedder, on_engine=self._announce)
        try:
            return run_demo(name, env)
        finally:
            # Keep what the demo loaded, so the next demo does not load it again.
            self._model = self._model or env.loaded_model
            self._embedder = env.loaded_embedder
            self._shown = dict(env.shown)


def panels_to_fill(name: str, findings: dict[str, Any]) -> list[str]:
    """The panels (object names) a demo fills with its own inputs, beside the event views."""
    out = []
    if findings.get("diff_messages"):
        out.append("diff")
    out += {"prompt-caching-bill": ["billing"], "semantic-false-positive": ["semantic"],
            "kv-memory-70b-128k": ["kv_memory"], "kv-grows-per-step": [],
            "quantized-kv-cache": ["kv_memory"], "breakpoint-on-user-message": ["billing"]}.get(name, [])
    return out


def show_breakpoint_bill(view: Any, findings: dict[str, Any]) -> None:
    """Bill the demo's requests in the billing panel with the breakpoint on the user message
    (the last block): the table shows every request writing and none reading. Typing 0 in
    its breakpoints field bills the fix, the breakpoint on the system block."""
    from pathlib import Path

    from engine.demos.env import RESOURCES

    view.set_provider("anthropic", findings.get("model"))
    view.breakpoints.setText(",".join(str(b) for b in findings["on_user_message"]["breakpoints"]))
    view.set_source(str(RESOURCES / Path(findings["file"]).name))


_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "float8", "fp32": "float32"}


def show_kv_what_if(view: Any, findings: dict[str, Any]) -> None:
    """Point the KV panel's what-if at the demo's model, length and first data type."""
    preset = "llama-3.1-70b"
    i = view.preset_box.findData(preset)
    if i >= 0:
        view.preset_box.setCurrentIndex(i)
    dtypes = [_DTYPE_NAMES.get(row["dtype"], row["dtype"]) for row in findings.get("per_dtype", ())]
    if dtypes and view.dtype_box.findText(dtypes[0]) >= 0:
        view.dtype_box.setCurrentIndex(view.dtype_box.findText(dtypes[0]))
    view.tokens_box.setValue(int(findings.get("tokens") or view.tokens_box.value()))


def install_demos(window: MainWindow, model: Any = None) -> DemoRunner:
    """Add every demo to `window`'s Demos menu and a "Demo guide" dock; returns the runner."""
    runner = DemoRunner(window.ctx, window, model=model)
    guide = DemoGuide(window)
    runner.guide = guide
    dock = QDockWidget("Demo guide", window)
    dock.setObjectName("demo_guide")
    dock.setWidget(guide)
    window.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, dock)
    host = window.docks.get("conversation")
    if host is not None:
        window.tabifyDockWidget(host, dock)
    window.docks["demo_guide"] = dock
    window.view_menu.addAction(dock.toggleViewAction())
    window.ctx.sigSubjectChanged.connect(lambda subject: subject.kind != "demo" and guide.show_intro())
    for demo in DEMOS:
        window.add_demo_action(demo.title, demo.summary, lambda name=demo.name: runner.run(name))
    window.demo_runner = runner
    return runner
