"""Holds on automatic collection (app.runtime.collector): a window's collector and each
background job paused by `jobs.collector_paused` hold it off; it comes back only with the
last hold. H4 (2026-12-04) found a job ending under a window opened meanwhile switched it
back on there, and two overlapping jobs the first to end switched it on under the second."""

from __future__ import annotations

import gc
import threading

from app.runtime import collector
from app.runtime.jobs import collector_paused
from app.runtime.context import make_test_context
from app.window.main_window import MainWindow


def test_a_job_that_ends_under_a_window_leaves_collection_to_the_window(qtbot, tmp_path):
    assert gc.isenabled()
    started, finish = threading.Event(), threading.Event()

    def job() -> None:
        with collector_paused():
            started.set()
            finish.wait(30)

    t = threading.Thread(target=job)
    t.start()
    started.wait(30)
    ctx = make_test_context(tmp_path)
    w = MainWindow(ctx, load_model=False)
    qtbot.addWidget(w)
    w.show()
    finish.set()
    t.join()
    assert not gc.isenabled()  # the window's collector still holds it
    w.close()
    assert gc.isenabled()
    ctx.shutdown()


def test_overlapping_jobs_hold_it_off_until_the_last_ends():
    assert gc.isenabled()
    first, second = collector_paused(), collector_paused()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second job still runs
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_off_before_the_first_hold_stays_off():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_gui_threads_checks_wait_while_a_job_runs(qtbot):
    """A check during a job collected on the GUI thread what the job's end freezes anyway:
    while an attach's tokenizer thread imported transformers, two such checks stalled the
    window 17-25 ms each (bench gui's attach step, 2026-12-05)."""
    c = collector.GuiThreadCollector(interval_ms=60_000)  # checked by hand below
    try:
        threshold = c.threshold[0]
        with collector_paused():
            junk = [[] for _ in range(threshold * 3)]  # young objects past the threshold
            assert gc.get_count()[0] > threshold
            assert c.check() is None  # waits for the job
            assert c.collections == [0, 0, 0]
            assert collector.jobs_running() == 1
        assert collector.jobs_running() == 0
        more = [[] for _ in range(threshold * 3)]  # (the first junk kept: a free counts down)
        assert gc.get_count()[0] > threshold
        assert c.check() in (0, 1)  # no job: the check collects as before
        assert sum(c.collections) == 1
        del junk, more
    finally:
        c.stop()
        c.deleteLater()
