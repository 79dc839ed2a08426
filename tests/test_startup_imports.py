"""The window's first paint imports nothing heavy: numpy, numba, torch, transformers,
pyqtgraph, the remote engine and the trace readers come after it, and what was put off
(the pool state, the panels, the store, the demos) is there once the window is up.

Each case runs in a fresh interpreter (offscreen), as a user's start does: the modules
imported before the first paint are read from `sys.modules` at that moment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What the first paint must not wait for (issue 20: the window up in under 1.0 s).
HEAVY = ("numpy", "numba", "llvmlite", "torch", "transformers", "pyqtgraph", "scipy", "msgspec", "zmq",
         "sqlite_utils", "engine.remote", "engine.kernel", "engine.demos", "engine.core.live_log",
         "app.runtime.state", "app.views")

# The window as `cachescope bench gui` starts it (app.commands._bench_gui._WINDOW_CHILD): the
# modules at the first paint, then the pool state and every start-up panel once built.
_BENCH_WINDOW = """
import json, sys
from PySide6.QtWidgets import QApplication
app = QApplication(sys.argv[:1])
from app.runtime.context import make_test_context
from app.window.main_window import MainWindow
HEAVY = %r
ctx = make_test_context(sys.argv[1])
w = MainWindow(ctx, load_model=False)
w.show()
while not w.first_painted:
    app.processEvents()
at_paint = sorted(m for m in HEAVY if m in sys.modules)
while not w.startup_done:
    app.processEvents()
built = sorted(n for n in w.panels if w.panels.is_built(n))
print(json.dumps({"at_paint": at_paint, "runtime": ctx.runtime_ready, "built": built,
                  "scrub_bar": w.scrub_toolbar.widgetForAction(w.scrub_toolbar.actions()[0]) is w.scrub_bar,
                  "numpy_after": "numpy" in sys.modules}))
ctx.shutdown()
w.deleteLater()
app.processEvents()
"""

# `cachescope gui --no-model` itself: an event filter reads `sys.modules` as the main window
# gets its first UpdateRequest, and the app is left once the demos are installed.
_GUI_COMMAND = """
import json, sys
from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication
app = QApplication(sys.argv[:1])
HEAVY = %r
seen = {}

class Watch(QObject):
    def eventFilter(self, obj, event):
        if event.type() == QEvent.Type.UpdateRequest and obj.objectName() == "MainWindow" and "window" not in seen:
            seen["at_paint"] = sorted(m for m in HEAVY if m in sys.modules)
            seen["window"] = obj
        return False

def poll():
    w = seen.get("window")
    if w is not None and getattr(w, "demo_runner", None) is not None and "result" not in seen:
        timer.stop()  # the command's own clean-up (its store closed) is not what is read here
        seen["result"] = {"at_paint": seen["at_paint"], "store": w.ctx.store is not None,
                          "demo_actions": len(w.demos_menu.actions()), "demo_guide": "demo_guide" in w.docks}
        app.quit()

watch = Watch()
app.installEventFilter(watch)
timer = QTimer()
timer.timeout.connect(poll)
timer.start(20)
from app.cli import main
code = main(["gui", "--no-model"])
print(json.dumps({**seen.get("result", {}), "exit": code}))
"""


def _run(code: str, *args: str, tmp_path: Path) -> dict:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "XDG_DATA_HOME": str(tmp_path / "data"), "CACHESCOPE_DB": str(tmp_path / "cachescope.db")}
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_benched_window_paints_before_anything_heavy_is_imported(tmp_path):
    out = _run(_BENCH_WINDOW % (HEAVY,), str(tmp_path), tmp_path=tmp_path)
    assert out["at_paint"] == []
    # What was put off is built after the first paint: the pool state (numpy), the scrub bar
    # in its toolbar and every panel the window shows at start.
    assert out["runtime"] and out["numpy_after"] and out["scrub_bar"]
    assert {"conversation", "block_table", "timeline", "metrics", "event_log"} <= set(out["built"])


def test_the_gui_command_paints_before_the_store_and_the_demos(tmp_path):
    out = _run(_GUI_COMMAND % (HEAVY,), tmp_path=tmp_path)
    assert out["at_paint"] == []
    # Opened and installed once the window is up, as they were before it showed.
    assert out["store"] and out["demo_guide"] and out["demo_actions"] > 1
    assert out["exit"] == 0


def test_the_context_builds_its_runtime_once_at_the_first_read_on_the_gui_thread(qtbot, tmp_path):
    import threading

    from app.runtime.context import make_test_context

    ctx = make_test_context(tmp_path)
    try:
        assert not ctx.runtime_ready
        off_thread: list[BaseException] = []
        worker = threading.Thread(target=lambda: off_thread.extend(_raised(lambda: ctx.state)))
        worker.start()
        worker.join()
        assert len(off_thread) == 1 and "GUI thread" in str(off_thread[0]) and not ctx.runtime_ready
        with qtbot.waitSignal(ctx.sigRuntimeReady, timeout=1000):
            state = ctx.state
        # One runtime: the state follows the bridge it was built with, the remote beside them.
        assert ctx.bridge is state.bridge and ctx.state is state and ctx.remote is ctx.remote
        with qtbot.assertNotEmitted(ctx.sigRuntimeReady):
            ctx.build_runtime()
    finally:
        ctx.shutdown()


def _raised(read) -> list[BaseException]:
    try:
        read()
    except RuntimeError as exc:
        return [exc]
    return []
