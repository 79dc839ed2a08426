"""An app context is destroyed on the GUI thread, whichever thread's collection lets it go.

Python's cyclic collector runs on whichever thread allocates past its threshold: a model
worker's job, the live log's warm-up, a vLLM subscriber. A context caught in a reference
cycle was destroyed there (seen in a -n 2 run of the GUI tests: contexts of earlier tests
freed on the model worker's QThread and on a `vllm-sub` thread). One never shut down (a
test that built its runtime and let it go) still had the bridge's frame timer running:
Qt cannot stop a timer from another thread ("QObject::killTimer: Timers cannot be stopped
from another thread"), the timer fired on the freed bridge and the GUI thread crashed in
`processEvents` (SIGSEGV, pytest-qt's `_process_events` on top: the crash of a cold-cache
`make test` at ~95%). Each scenario runs in a child process, so that the crash fails this
test instead of taking the pytest worker down.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PRELUDE = """
import gc, sys, threading, time
from PySide6.QtCore import QCoreApplication, QEvent, QEventLoop, QTimer
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.runtime.context import make_test_context

def collect_elsewhere():
    # what a worker thread's allocation sets off: a full collection on that thread
    t = threading.Thread(target=gc.collect, name="not-the-gui-thread")
    t.start()
    t.join()

def spin(ms):
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()
"""


def run_child(body: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONFAULTHANDLER": "1"}
    return subprocess.run([sys.executable, "-c", PRELUDE + body], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)


def test_a_context_never_shut_down_survives_a_collection_on_another_thread():
    done = run_child("""
destroyed_on = []
for _ in range(3):
    ctx = make_test_context()
    ctx.build_runtime()  # the bridge's frame timer runs from here on
    ctx.wait_warm(120)
    ctx.destroyed.connect(lambda *_: destroyed_on.append(threading.current_thread().name))
    del ctx  # never shut down: only the collector can find it now
    collect_elsewhere()
    spin(100)  # the GUI thread runs its timers
print("destroyed on", destroyed_on)
""")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Timers cannot be stopped from another thread" not in done.stderr
    assert "not-the-gui-thread" not in done.stdout


def test_a_context_shut_down_is_destroyed_on_the_gui_thread():
    done = run_child("""
destroyed_on = []
ctx = make_test_context()
ctx.build_runtime()
ctx.wait_warm(120)
ctx.destroyed.connect(lambda *_: destroyed_on.append(threading.current_thread().name))
ctx.shutdown()
assert ctx.errors == [] and ctx.store is None  # its fields still read after shutdown
del ctx
collect_elsewhere()
assert destroyed_on == [], destroyed_on  # not by that collection, nor before the loop runs
spin(50)
assert destroyed_on == ["MainThread"], destroyed_on
""")
    assert done.returncode == 0, done.stderr[-3000:]



def test_a_test_context_removes_its_settings_folder():
    """make_test_context's own temporary folder goes with the context, or at exit for one
    never let go of (1,034 of them had piled up in /tmp over a day of test runs)."""
    done = run_child("""
from pathlib import Path
ctx = make_test_context()
folder = Path(ctx.settings.fileName()).parent
ctx.settings.setValue("probe", 1)
ctx.settings.sync()
assert (folder / "settings.ini").exists()
ctx.shutdown()
del ctx
gc.collect()
spin(50)
print("gone after the context:", not folder.exists())
kept = make_test_context()  # held to the end: removed at exit
print("kept", Path(kept.settings.fileName()).parent)
""")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "gone after the context: True" in done.stdout
    kept = Path(done.stdout.split("kept ", 1)[1].strip())
    assert kept.name.startswith("cachescope-test-") and not kept.exists()


def test_a_test_context_leaves_no_folder_behind():
    # the settings' own destructor writes what it holds: after the folder went, it made it again
    done = run_child("""
import os
ctx = make_test_context()
folder = os.path.dirname(ctx.settings.fileName())
ctx.settings.setValue("window/geometry", b"x")  # what a window's close writes
ctx.shutdown()
del ctx
QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
spin(50)
gc.collect()
print("left", os.path.exists(folder))
""")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "left False" in done.stdout, done.stdout
