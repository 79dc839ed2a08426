"""The model worker: jobs run off the GUI thread, in order, and report back in the GUI thread."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import QThread

from app.runtime.worker import ModelWorker
from engine.core.errors import InputError


@pytest.fixture
def worker(qtbot):
    w = ModelWorker()
    yield w
    w.stop()


def test_submit_runs_off_the_gui_thread_and_calls_back_on_it(qtbot, worker):
    gui = threading.get_ident()
    seen: dict = {}

    def job(a, b, scale=1):
        seen["job_thread"] = threading.get_ident()
        return (a + b) * scale

    def done(result):
        seen["result"] = result
        seen["done_thread"] = threading.get_ident()

    with qtbot.waitSignal(worker.sigFinished, timeout=5000):
        worker.submit(job, 2, 3, scale=10, on_done=done)
    assert seen["result"] == 50
    assert seen["job_thread"] != gui
    assert seen["done_thread"] == gui


def test_errors_go_to_on_error_and_the_worker_keeps_running(qtbot, worker):
    errors: list[BaseException] = []
    results: list[int] = []

    def bad():
        raise InputError("the model file is corrupt")

    with qtbot.waitSignal(worker.sigFailed, timeout=5000):
        worker.submit(bad, on_done=results.append, on_error=errors.append)
    assert len(errors) == 1 and str(errors[0]) == "the model file is corrupt"
    assert results == []
    with qtbot.waitSignal(worker.sigFinished, timeout=5000):
        worker.submit(lambda: 7, on_done=results.append)
    assert results == [7]


def test_jobs_run_in_submission_order_and_busy_is_reported(qtbot, worker):
    order: list[int] = []
    busy: list[bool] = []
    worker.sigBusy.connect(busy.append)
    gate = threading.Event()
    worker.submit(gate.wait, 5)
    for i in range(5):
        worker.submit(order.append, i)
    gate.set()
    qtbot.waitUntil(lambda: len(order) == 5 and busy and busy[-1] is False, timeout=5000)
    assert order == [0, 1, 2, 3, 4]
    assert busy[0] is True


def test_progress_reported_from_a_job_reaches_the_gui(qtbot, worker):
    got: list[tuple[str, float]] = []
    worker.sigProgress.connect(lambda text, f: got.append((text, f)))

    def job():
        for i in range(3):
            worker.report_progress(f"step {i}", i / 2)

    with qtbot.waitSignal(worker.sigFinished, timeout=5000):
        worker.submit(job)
    qtbot.waitUntil(lambda: len(got) == 3, timeout=2000)
    assert got == [("step 0", 0.0), ("step 1", 0.5), ("step 2", 1.0)]


def test_stop_finishes_the_current_job_drops_the_rest_and_joins(qtbot):
    w = ModelWorker()
    started = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def slow():
        started.set()
        release.wait(5)
        ran.append("slow")

    w.submit(slow)
    w.submit(ran.append, "dropped")
    assert started.wait(5)
    threading.Timer(0.05, release.set).start()
    assert w.stop() is True
    assert not w.is_running
    assert ran == ["slow"]
    assert isinstance(w.qthread, QThread)
    with pytest.raises(RuntimeError, match="stopped"):
        w.submit(ran.append, "late")
    assert w.stop() is True  # stopping twice is harmless
