"""What the start-up's threads import is never imported by two of them at once
(app.runtime.imports): the packages the GUI thread's panels share with the live log's warm-up
or with the model load are imported before those threads start, and the two threads take turns.

Each thread's imports are read in a fresh interpreter, from the moment `import_shared()` has
run on top of what the window imports before it (the runtime's modules): a package, or a
module of one, that two of them would import then is a race Python 3.11's importlib can lose
(`KeyError: 'colorama'` left the Conversation panel unbuilt once in about 50 starts).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_AFTER_SHARED = """
import json, os, sys
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
from PySide6.QtWidgets import QApplication
qapp = QApplication(sys.argv[:1])
import app.window.main_window  # the window, up before the runtime is built
import app.runtime.bridge, app.runtime.remote, app.runtime.state  # what build_runtime imports first
from app.runtime.imports import import_shared
import_shared()
before = set(sys.modules)
%s
print(json.dumps({m: hasattr(sys.modules[m], "__path__") for m in sorted(set(sys.modules) - before)}))
"""

# What each thread runs after import_shared(): the GUI thread builds every panel (pyqtgraph
# first, as a panel's build does), the warm-up and the model load run their own jobs.
_GUI = """
from app.ui import theme
theme.apply_plot_defaults()
from app.window.panels import PANELS, load_factory
for spec in PANELS:
    load_factory(spec.factory)
"""
_WARM = "from app.runtime.context import _warm_live_log; _warm_live_log()"
_MODEL = "from app.runtime.jobs import load_model_job; load_model_job(None, 64, 16, lambda *a: None)"


def _imports(code: str) -> dict[str, bool]:
    proc = subprocess.run([sys.executable, "-c", _AFTER_SHARED % code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _shared_packages(a: dict[str, bool], b: dict[str, bool]) -> list[str]:
    """Modules both import that are packages or in one (a plain top-level module is safe)."""
    return sorted(m for m in a.keys() & b.keys() if "." in m or a[m])


def test_the_panels_share_no_package_with_the_warm_up_or_the_model_load():
    gui = _imports(_GUI)
    assert "pyqtgraph" in gui and "app.views.pool.block_table_view" in gui  # the panels' own, read
    warm = _imports(_WARM)
    assert "numba" in warm
    assert _shared_packages(gui, warm) == []
    model = _imports(_MODEL)
    assert "torch" in model and "transformers" in model
    assert _shared_packages(gui, model) == []
    # The warm-up and the model load share numba and more: they take turns (below).
    assert "numba" in model and _shared_packages(warm, model)


def test_the_warm_up_waits_while_the_model_load_imports(monkeypatch):
    """`_warm_live_log` imports nothing while another thread holds BACKGROUND_IMPORTS."""
    from app.runtime import context
    from app.runtime.imports import BACKGROUND_IMPORTS

    warmed: list[float] = []
    fake = types.ModuleType("engine.core.live_log")
    fake.warm_up = lambda: warmed.append(time.monotonic())
    monkeypatch.setitem(sys.modules, "engine.core.live_log", fake)
    with BACKGROUND_IMPORTS:
        thread = threading.Thread(target=context._warm_live_log)
        thread.start()
        time.sleep(0.3)
        assert warmed == [] and thread.is_alive()
        released = time.monotonic()
    thread.join(10)
    assert not thread.is_alive() and len(warmed) == 1 and warmed[0] >= released
