"""Cyclic garbage is collected on the GUI thread only while a main window is open
(app.runtime.collector): a background thread's allocations never set off a collection that
would run a Qt object's destructor on that thread."""

from __future__ import annotations

import gc
import threading

import pytest

from app.runtime import collector
from app.runtime.context import make_test_context
from app.window.main_window import MainWindow


class _Cyclic:
    """Garbage in a cycle; records the thread that finally collects it."""

    freed_on: list[str] = []

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        _Cyclic.freed_on.append(threading.current_thread().name)


@pytest.fixture
def window(qtbot, tmp_path):
    ctx = make_test_context(tmp_path)
    w = MainWindow(ctx, load_model=False)
    qtbot.addWidget(w)
    w.show()
    yield w
    ctx.shutdown()


def _churn() -> None:
    """What a tokenizer load does to the collector: far past every threshold, in cycles."""
    for _ in range(50):
        _Cyclic()
        for _ in range(2000):
            a: list = []
            a.append(a)


def test_a_background_threads_cycles_are_freed_on_the_gui_thread(window, qtbot):
    assert not gc.isenabled()
    _Cyclic.freed_on.clear()
    t = threading.Thread(target=_churn, name="churn")
    t.start()
    t.join()
    assert _Cyclic.freed_on == []  # the churning thread collected nothing
    qtbot.waitUntil(lambda: len(_Cyclic.freed_on) == 50, timeout=5000)
    assert set(_Cyclic.freed_on) == {threading.main_thread().name}
    # by the timer: a young collection, or a generation-1 one when earlier young collections
    # had already passed that threshold (CI, 2026-12-04; twelve gc.collect(0) first: [0, 1, 0])
    assert sum(collector.active().collections) >= 1


def test_without_a_window_the_thread_collects_itself():
    """The test above can fail: with automatic collection the churn frees on its own thread."""
    assert collector.active() is None and gc.isenabled()
    _Cyclic.freed_on.clear()
    t = threading.Thread(target=_churn, name="churn")
    t.start()
    t.join()
    assert "churn" in _Cyclic.freed_on


def test_closing_the_last_window_gives_automatic_collection_back(qtbot, tmp_path):
    assert gc.isenabled()
    ctx = make_test_context(tmp_path)
    first, second = MainWindow(ctx, load_model=False), MainWindow(ctx, load_model=False)
    for w in (first, second):
        qtbot.addWidget(w)
        w.show()
    assert not gc.isenabled()
    first.close()
    assert not gc.isenabled()  # one is still open
    second.close()
    assert gc.isenabled() and collector.active() is None
    second.show()  # shown again: its cycles go back to the GUI thread
    assert not gc.isenabled()
    second.close()
    assert gc.isenabled()
    ctx.shutdown()


def test_each_check_collects_the_generation_the_interpreter_would(qtbot):
    c = collector.GuiThreadCollector(interval_ms=10_000)
    try:
        t0, t1, t2 = c.threshold
        gc.collect()
        assert c.check() is None  # nothing allocated since
        junk = [[] for _ in range(t0 + 10)]
        assert c.check() == 0
        for _ in range(t1 + 1):
            junk.extend([] for _ in range(t0 + 10))
            gc.collect(0)
        junk.extend([] for _ in range(t0 + 10))
        assert c.check() == 1
        assert c.collections[:2] == [1, 1]
    finally:
        c.stop()
        c.deleteLater()
    assert gc.isenabled()


def _past_the_young_thresholds(junk: list, c: collector.GuiThreadCollector) -> None:
    """Counts past generation 1's and generation 2's thresholds, as a stream's allocations
    would leave them: more gen-0 collections than t1 and more gen-1 collections than t2."""
    t0, t1, t2 = c.threshold
    for _ in range(t2 + 1):
        gc.collect(1)
    for _ in range(t1 + 1):
        junk.extend([] for _ in range(t0 + 10))
        gc.collect(0)
    junk.extend([] for _ in range(t0 + 10))


def test_a_full_collection_waits_for_a_quarter_of_the_old_generation_as_cpython_does(qtbot):
    c = collector.GuiThreadCollector(interval_ms=10_000)
    try:
        gc.collect()
        c.long_lived_total, c.long_lived_pending = 4_000_000, 0
        junk: list = []
        _past_the_young_thresholds(junk, c)
        # the interpreter's counts alone would ask for a full collection (c1 > t1, c2 > t2)
        assert gc.get_count()[1] > c.threshold[1] and gc.get_count()[2] > c.threshold[2]
        assert c.check() == 1  # but what reached the old generation is far from a quarter of it
        assert c.collections == [0, 1, 0]
        assert c.long_lived_pending >= c.threshold[0] * (c.threshold[1] + 2)  # junk survived, promoted
        c.long_lived_pending = c.long_lived_total // 4 + 1
        _past_the_young_thresholds(junk, c)
        assert c.check() == 2
        assert c.long_lived_pending == 0
        assert len(junk) < c.long_lived_total <= len(gc.get_objects(2)) + 100  # what survived it, counted again
    finally:
        c.stop()
        c.deleteLater()
    assert gc.isenabled()
