"""`engine.core.live_log.warm_up` loads the live log's compiled pass off the GUI thread.

Without it the first batch a window appends (its first chat message) loads numba and the
compiled series pass on the GUI thread: 1.4-1.7 s measured on this machine, against
16-40 ms once warmed. The model's load job calls it on the worker.
"""

from __future__ import annotations

import pytest

from app.runtime import jobs
from engine.core import columnar_log
from engine.core.live_log import warm_up


def test_warm_up_compiles_the_series_pass_a_live_log_runs():
    loop = columnar_log._compiled_series_loop()
    if loop is None:
        pytest.skip("numba is not installed")
    warm_up()
    assert loop.signatures, "the compiled series pass was not run"


def test_the_model_load_job_warms_the_live_log_after_building_the_runner(monkeypatch):
    import engine.core.live_log as live_log
    import engine.model.loader as loader
    import engine.model.runner as runner

    calls: list[str] = []
    monkeypatch.setattr(loader, "load_model", lambda model, progress=None: calls.append("load") or "model")
    monkeypatch.setattr(runner, "ModelRunner", lambda *a, **k: calls.append("runner") or "runner")
    monkeypatch.setattr(live_log, "warm_up", lambda: calls.append("warm_up"))
    steps: list[str] = []
    assert jobs.load_model_job(None, 8, 4, lambda text, fraction: steps.append(text)) == "runner"
    assert calls == ["load", "runner", "warm_up"]
    assert steps[-1] == "readying the event log"


def test_the_context_loads_the_live_logs_passes_off_the_gui_thread_once_its_runtime_is_built(qtbot, monkeypatch):
    # Without it the first batch a chat, demo or stream appends loads numba and the series
    # pass on the GUI thread (0.4-1 s frozen in bench gui's ingestion).
    import threading

    from app.runtime import context as context_module
    from app.runtime.context import make_test_context

    threads: list[str] = []
    real = context_module._warm_live_log
    monkeypatch.setattr(context_module, "_warm_live_log",
                        lambda: (threads.append(threading.current_thread().name), real()))
    ctx = make_test_context()
    assert ctx.wait_warm(0) is False  # nothing built, nothing loading
    ctx.build_runtime()
    assert ctx.wait_warm(120) is True
    assert threads == ["live-log-warm-up"]
    loop = columnar_log._compiled_series_loop()
    if loop is not None:
        assert loop.signatures
    ctx.build_runtime()  # built once, warmed once
    assert threads == ["live-log-warm-up"]
    ctx.shutdown()  # its bridge timer stops here, on the GUI thread, not when a collection frees it


_FIRST_ATTACH = r"""
import os, socket, sys, threading
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from numba.core import dispatcher
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.runtime.context import make_test_context
from app.runtime.remote import AttachSettings
from app.window.main_window import MainWindow
from engine.remote.attachment import AttachOptions
folder = sys.argv[1]  # the test's own tmp_path: nothing is left in /tmp
w = MainWindow(make_test_context(folder), load_model=False)
w.show()
app.processEvents()
getattr(w, "finish_startup", lambda: None)()
app.processEvents()
assert w.ctx.wait_warm(120)
loads = []
real = dispatcher.Dispatcher._compile_for_args
def counted(self, *args, **kws):
    if threading.current_thread() is threading.main_thread():
        loads.append(self.py_func.__name__)
    return real(self, *args, **kws)
dispatcher.Dispatcher._compile_for_args = counted
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
w.attach_remote(AttachSettings(AttachOptions((f"tcp://127.0.0.1:{port}",), (), "kv-events")))
app.processEvents()
w.remote.detach()
w.ctx.shutdown()
print(",".join(loads))
"""


def test_an_attach_after_the_warm_up_loads_no_compiled_code_on_the_gui_thread(tmp_path):
    """The context's warm-up thread loads an attach's compiled code too: File > Attach in a
    fresh window (a process of its own, nothing loaded before) loads none on the GUI thread
    once `wait_warm` returns. Before, it loaded 49 functions there, 0.43-0.46 s frozen."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    got = subprocess.run([sys.executable, "-c", _FIRST_ATTACH, str(tmp_path)], cwd=root, capture_output=True,
                         text=True, timeout=240)
    assert got.returncode == 0, got.stderr[-2000:]
    loads = got.stdout.strip().splitlines()[-1] if got.stdout.strip() else ""
    assert loads == "", f"loaded on the GUI thread at the attach: {loads}"


_AT_ONCE = """
import json, threading
from engine.core import live_journal, live_log
from engine.remote import overlay
errors = {}
for name, first_use in (("placer", live_journal._compiled), ("overlay", overlay._compiled_observe),
                        ("cells", overlay._compiled_cells), ("log", live_log._compiled_journal_loop)):
    barrier = threading.Barrier(4)
    def run():
        barrier.wait()
        try:
            first_use()
        except Exception as exc:
            errors.setdefault(name, []).append(type(exc).__name__)
    threads = [threading.Thread(target=run) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
print(json.dumps(errors))
"""


def test_the_compiled_code_made_at_first_use_is_made_once_when_threads_get_there_at_once():
    """A window's warm-up thread and an attach's placing (or GUI) thread may be the first two
    to use the placer's, the overlay's and the live log's compiled code, at once: each is made
    under `engine.core.threads.COMPILE_ONCE`. Without it the second jitted the first's
    dispatchers (numba's TypeError: the placer's, three of four threads in a fresh process)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    got = subprocess.run([sys.executable, "-c", _AT_ONCE], cwd=root, capture_output=True, text=True, timeout=240)
    assert got.returncode == 0, got.stderr[-2000:]
    assert json.loads(got.stdout.strip().splitlines()[-1]) == {}
