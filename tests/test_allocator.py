"""app.runtime.allocator: an app process gives a freed array of 4 MiB or more back to the
system. Under glibc's default, the first freed mmapped block raises the threshold to its
size, so a second array of that size comes from the heap and, freed below its top, stays
in the process; the script below shows both, each in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, os, sys
import numpy as np
if sys.argv[1] == "tuned":
    from app.runtime.allocator import tune
    assert tune()
elif sys.argv[1] == "window":                # what a window's process does: an AppContext
    from PySide6.QtWidgets import QApplication
    app = QApplication([])
    from app.runtime.context import make_test_context
    ctx = make_test_context()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
a = np.ones(2_000_000)                      # 16 MB, mmapped either way
del a                                       # glibc's default now raises its threshold to 16 MB
b = np.ones(2_000_000)                      # the default: from the heap
keep = np.ones(1000)                        # something after it on the heap
before = rss()
del b                                       # a hole below the heap's top
print(json.dumps({"released_mb": (before - rss()) / 1e6}))
"""


def _released(arm: str) -> float:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    out = subprocess.run([sys.executable, "-c", SCRIPT, arm], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["released_mb"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_array_goes_back_to_the_system_only_when_tuned():
    assert _released("tuned") > 15  # its 16 MB unmapped at once
    assert _released("default") < 1  # the test can fail: glibc's default keeps it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_window_process_is_tuned_by_its_context():
    assert _released("window") > 15


HUGE = """
import json, os, sys
if sys.argv[1] == "before":
    import numpy as np                      # imported first, as a test's or a bench's process has it
from app.runtime.allocator import tune
tune()
import numpy as np
print(json.dumps({"huge": bool(np._core.multiarray._get_madvise_hugepage())}))
"""


def _huge_pages(arm: str, **env: str) -> bool:
    env = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"} | env
    out = subprocess.run([sys.executable, "-c", HUGE, arm], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["huge"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="numpy asks for huge pages on Linux only")
def test_a_tuned_process_asks_for_no_huge_pages_unless_the_user_does():
    assert not _huge_pages("after") and not _huge_pages("before")  # numpy imported after tune, and before it
    assert _huge_pages("before", NUMPY_MADVISE_HUGEPAGE="1")  # the user's choice stands


def test_a_heap_trim_asked_by_a_tick_runs_on_its_own_thread_and_once_more_if_asked_meanwhile(monkeypatch):
    # malloc_trim walks the whole heap: 41.6 ms of an attached window's tick on a heap that
    # other work left large. The window's thread asks for it and goes on; requests made while
    # it runs are not lost: one run after it hands back what was freed since.
    import threading

    from app.runtime import allocator

    started, go = threading.Event(), threading.Event()
    runs: list[int] = []

    def slow_trim() -> bool:
        runs.append(threading.get_ident())
        started.set()
        assert go.wait(10)
        return True

    monkeypatch.setattr(allocator, "release_freed", slow_trim)
    allocator.release_freed_soon()  # returns while the trim is still running
    assert started.wait(10) and len(runs) == 1 and runs[0] != threading.get_ident()
    allocator.release_freed_soon()
    allocator.release_freed_soon()
    assert not allocator.wait_released(0.05)  # still running: the caller was not held
    go.set()
    assert allocator.wait_released(10)
    assert len(runs) == 2  # the two asked meanwhile: one run after the first
    allocator.release_freed_soon()
    assert allocator.wait_released(10) and len(runs) == 3 and len(set(runs)) == 1  # the same thread


def test_a_heap_trim_waits_for_the_caller_to_free_what_it_was_working_on(monkeypatch):
    # a journal tick asks for the trim from inside its work and frees its temporaries as it
    # returns: run at once, the trim missed them (bench held's 1M-block pool kept 25.5 MB, 25 B
    # a block, that a trim after the tick handed back). A run starts RELEASE_DELAY_S after the
    # request, by when the caller (here 20 ms later) has freed them.
    import threading

    from app.runtime import allocator

    freed = threading.Event()
    seen: list[bool] = []
    monkeypatch.setattr(allocator, "release_freed", lambda: seen.append(freed.is_set()) or True)
    assert allocator.wait_released(10)  # any earlier test's runs done
    allocator.release_freed_soon()
    time.sleep(0.02)  # the rest of the tick
    freed.set()  # its temporaries freed as it returns
    assert allocator.wait_released(10)
    assert seen == [True]
