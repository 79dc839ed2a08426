"""A test context made without a folder (what `bench gui` and the tests make) removes its
settings folder at interpreter exit, also when PySide6 has deleted its QSettings first: the
finalizer's sync raised "Internal C++ object ... already deleted", printed a traceback at
exit and left an empty /tmp/cachescope-test-* folder behind each bench run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import shiboken6
from pathlib import Path
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.runtime.context import make_test_context
ctx = make_test_context()
folder = Path(ctx.settings.fileName()).parent
print(folder, flush=True)
assert folder.is_dir()
shiboken6.delete(ctx.settings)  # gone before the finalizer, as at exit
"""


def test_the_settings_folder_goes_at_exit_when_qsettings_went_first():
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    folder = Path(out.stdout.strip().splitlines()[-1])
    assert folder.name.startswith("cachescope-test-")
    assert not folder.exists()
    assert "Traceback" not in out.stderr and "already deleted" not in out.stderr
