"""A background thread's priority below the GUI thread's (`engine.core.threads`), read
back from the kernel: per thread on Linux, the calling thread only."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from engine.core.threads import lower_priority

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads have their own nice value on Linux")


def _on_a_thread(fn):
    out = {}

    def run():
        out["got"] = fn()
        out["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out


@linux
def test_the_calling_thread_only_is_lowered():
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    out = _on_a_thread(lambda: lower_priority(5))
    assert out["nice"] == min(19, here + 5) == out["got"]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == here  # the caller's own is as it was


@linux
def test_no_steps_changes_nothing_and_the_ceiling_holds():
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert _on_a_thread(lambda: lower_priority(0)) == {"got": None, "nice": here}
    assert _on_a_thread(lambda: lower_priority(40))["nice"] == 19
