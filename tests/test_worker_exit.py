"""A model worker nobody stopped does not abort the interpreter's exit: Qt ends the process
with qFatal (status 134, "QThread: Destroyed while thread ... is still running") when a
running QThread is destroyed, which is how a CI worker process ended (2026-12-04)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import time
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.runtime.worker import ModelWorker
worker = ModelWorker()
worker.submit(time.sleep, 0.3)   # busy when the script ends
print("exiting", flush=True)
"""


def test_a_worker_left_running_is_stopped_at_exit():
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "exiting"
    assert "Destroyed while thread" not in out.stderr
    assert out.returncode == 0, out.stderr[-2000:]
