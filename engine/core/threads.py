"""The CPU priority of a background thread, below the thread that draws; and the lock of
the compiled code a module makes at its first use.

A desktop app keeps its work threads below its GUI thread (Qt's `QThread.LowPriority`,
macOS's utility QoS), so that when both are ready to run on a busy machine the window's
pass of the event loop goes first and the work waits a moment. On Linux each thread is a
task with its own nice value (`setpriority(PRIO_PROCESS, thread id)`); elsewhere this does
nothing. Raising it back needs privileges, so it is for threads that do one job and end (a
subscriber's, a placer's), never for a pool's threads shared with other work.

    def run():
        lower_priority(BACKGROUND_NICE)  # first thing on the thread
        ...

`COMPILE_ONCE` is held while a module makes its numba functions at their first use (its
helpers jitted and their module names rebound to the dispatchers; `made_once`): a window's
warm-up thread and an attach's placing or GUI thread reached them at once, and the second
jitted the first's dispatchers (numba's TypeError: the placing thread stopped, or a GUI tick
failed).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable


def lower_priority(nice: int) -> int | None:
    """Lower the calling thread's priority by `nice` steps (Linux); its nice value after,
    or None where threads have none of their own (other systems) or it could not be set."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return None
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, now + nice))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:  # a sandbox without setpriority: the thread runs as it was
        return None


COMPILE_ONCE = threading.RLock()  # (re-entrant: one module's first use makes another's)


def made_once(made: list[Any], make: Callable[[], list[Any]]) -> list[Any]:
    """`made`, filled with what `make()` returns the first time it is asked for, under
    COMPILE_ONCE (a thread that comes while another makes it waits for that one). A filled
    list is read without the lock, so a GUI tick does not wait while other code is made; it
    is filled whole (`extend`), so such a reader sees every entry. `make()` returning nothing
    (numba missing) leaves it empty, to be tried again at the next ask."""
    if not made:
        with COMPILE_ONCE:
            if not made:
                made.extend(make())
    return made
