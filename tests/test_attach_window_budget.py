"""An attach's GUI tick in a busy window: the rows a tick writes are sized by the GUI thread's
own time, not the wall clock's (a machine busy with other work, or a subscriber thread holding
the GIL, must not shrink the blocks to MIN_TICK_ROWS, where each block's fixed price takes most
of the tick); and the attach bench's check for the end never waits on the attachment's lock."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from app.commands._bench_live_attach import _finished
from app.runtime import remote as remote_mod
from app.runtime.remote import RemoteController
from app.runtime.state import PoolState


class _SlowWall(PoolState):
    """Writes nothing, says 10,000 rows a call, and takes 20 ms of wall clock to do it (asleep:
    what waiting for a core or the GIL looks like to the GUI thread)."""

    def apply_prepared(self, prepared, notify=True):
        started = time.perf_counter()
        time.sleep(0.02)
        self.journal_seconds = time.perf_counter() - started
        return 10_000


def test_the_tick_budget_counts_the_gui_threads_time_not_the_waits(qapp):
    ctrl = RemoteController(SimpleNamespace(sigSubjectChanged=SimpleNamespace(connect=lambda f: None)))
    state = _SlowWall()
    for _ in range(20):
        assert ctrl._apply(state, [], prepared=True) == 10_000
    # 20 ms of waiting for 10,000 rows would read as 2 us a row: 5,000 rows a 10 ms tick
    assert ctrl._limit() > 10 * remote_mod.TICK_BUDGET_S / 2e-6


def test_the_bench_asks_for_the_end_without_waiting_for_the_lock():
    lock = threading.RLock()
    pool = SimpleNamespace(last_batch_seq=9)
    ctrl = SimpleNamespace(attachment=SimpleNamespace(lock=lock, pools=[pool]),
                           health=lambda: SimpleNamespace(missed=0), pending_rows=lambda: 0)
    assert _finished(ctrl, 10, journal=True)
    held, release = threading.Event(), threading.Event()

    def hold():  # a subscriber applying a burst
        with lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        held.wait(10)
        # a check that waited would get the lock only when `hold` gives up, and say True
        assert not _finished(ctrl, 10, journal=True)
    finally:
        release.set()
        t.join()
    assert _finished(ctrl, 10, journal=True) and not _finished(ctrl, 11, journal=True)
    pool.last_batch_seq = 3
    ctrl.health = lambda: SimpleNamespace(missed=1)  # a batch lost: ends too
    assert _finished(ctrl, 10, journal=False)
