"""A worker that dies fails the run instead of hanging it.

Each test runs a small suite of its own through `pytest -n 2 --dist loadfile` (as `make test`
does) with this project's pytest settings (pyproject.toml), in a child process bounded by a
timeout: a run that hangs fails the test when the bound passes, it is no measurement.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HANG_BOUND_S = 240  # far past what the runs below need even on a loaded machine; a hang never ends

FILLER = "import time\n\ndef test_a():\n    time.sleep(0.3)\n\ndef test_b():\n    time.sleep(0.3)\n\ndef test_c():\n    pass\n"


def run_suite(folder: Path, *options: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONFAULTHANDLER": ""}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(folder), "-p", "no:cacheprovider", "-q", "-n", "2", "--dist", "loadfile", *options,
                           str(folder)], cwd=folder, env=env, capture_output=True, text=True, timeout=HANG_BOUND_S)


def test_a_segfault_in_a_late_file_fails_the_run(tmp_path):
    # The shape of the hang: the crash comes after the dead worker has finished other files,
    # when nothing is left to hand out (pytest-xdist 3.8 then re-queued its finished files).
    # Files start by number of tests, most first: the two-test file is the last.
    for i in range(6):
        (tmp_path / f"test_f{i}.py").write_text(FILLER)
    (tmp_path / "test_z.py").write_text(
        "import ctypes\n\ndef test_crash():\n    ctypes.string_at(0)  # a read of address 0: SIGSEGV\n\n"
        "def test_after():\n    pass\n")
    done = run_suite(tmp_path)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "crashed while running 'test_z.py::test_crash'" in done.stdout
    assert "18 passed" in done.stdout  # every other file ran before it


def test_a_test_stuck_where_no_signal_reaches_it_ends_the_worker(tmp_path):
    # pytest-timeout's SIGALRM cannot stop a thread stuck in C code; here the signal is blocked.
    (tmp_path / "test_f.py").write_text(FILLER)
    (tmp_path / "test_stuck.py").write_text(
        "import signal, time\n\ndef test_stuck():\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\n    time.sleep(600)\n")
    done = run_suite(tmp_path, "-o", "timeout=2", "-o", "faulthandler_timeout=6")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "crashed while running 'test_stuck.py::test_stuck'" in done.stdout
    assert "Timeout (0:00:06)!" in done.stderr  # faulthandler's dump of every thread


def test_the_faulthandler_backstop_outlasts_any_test():
    """faulthandler's exit must not end a test that pytest-timeout would let run: 300 s, and
    moved on by the wait for the numba warm-up (tests/conftest.py)."""
    from conftest import _WARMUP_WAIT_S  # tests/ is on sys.path

    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert ini["faulthandler_exit_on_timeout"] is True
    assert ini["faulthandler_timeout"] > ini["timeout"] + _WARMUP_WAIT_S
    assert "--max-worker-restart=0" in ini["addopts"].split()
