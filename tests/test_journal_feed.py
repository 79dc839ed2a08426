"""The journal route's placing thread (`app.runtime.journal_feed.JournalFeed`): rows placed off
the GUI thread and written by the ticks show what the event route shows, on every recorded
server, in small bites and across ranks (tests/test_journal_app's comparison); a tick writes
at most its budget of placed rows; a drain at detach writes what was placed first, then
places the rest itself; blocks placed for a log the state no longer shows are dropped; rows
committed out of the order they were placed are refused; a placing thread that failed
hands the rest to the ticks."""

from __future__ import annotations

import threading
import time

import pytest

from app.runtime import journal_feed
from app.runtime import remote as remote_mod
from app.runtime.journal_feed import JournalFeed
from engine.core.live_journal import commit_journal, prepare_journal
from test_journal_app import RECORDED, _rank_frames, _same
from test_journal_tick import _controller


def _with_feed(ctrl, state, bite=lambda: 7):
    feed = JournalFeed(ctrl.attachment, state.log, ctrl._taken, bite)
    ctrl._feed = feed
    return feed


def _tick_until_done(ctrl, qtbot=None, timeout_s: float = 60.0) -> list[int]:
    sizes = []
    deadline = time.monotonic() + timeout_s
    while ctrl.pending_rows():
        assert time.monotonic() < deadline, "the ticks did not reach every row"
        sizes.append(ctrl.tick())
        time.sleep(0.001)
    return sizes


@pytest.mark.parametrize("name", list(RECORDED))
def test_rows_placed_on_the_thread_show_what_the_event_route_shows(monkeypatch, name):
    path, ranks = RECORDED[name]
    ctrl, state, ref = _controller(_rank_frames(path, ranks))
    total = ctrl.pending_rows()
    assert total > 8
    bite = max(3, total // 30)  # some 30 bites, 2 rows each on the smallest stream
    monkeypatch.setattr(remote_mod, "MIN_TICK_ROWS", bite - 1)
    monkeypatch.setattr(remote_mod, "TICK_BUDGET_S", 1e-12)  # a tick writes bite - 1 placed rows, or a block more
    feed = _with_feed(ctrl, state, bite=lambda: bite)
    feed.start()
    try:
        sizes = _tick_until_done(ctrl)
    finally:
        feed.stop()
    assert feed.error is None and sum(sizes) == total == len(state.log)
    assert max(sizes) < 2 * bite and len([s for s in sizes if s]) >= total // (2 * bite)  # bites, not one
    _same(state, ref, name, in_order=ranks == 1)


def test_a_drain_writes_what_was_placed_then_places_the_rest_itself():
    path, ranks = RECORDED["vllm_zmq_frames (2 ranks)"]
    ctrl, state, ref = _controller(_rank_frames(path, ranks))
    total = ctrl.pending_rows()
    feed = _with_feed(ctrl, state, bite=lambda: 2)
    for _ in range(3):  # three bites placed, not written, no thread running
        assert feed.step() > 0
    placed = feed.num_ready
    assert 0 < placed < total and len(state.log) == 0 and ctrl.pending_rows() == total
    assert ctrl.tick(drain=True) == total and ctrl.pending_rows() == 0 and ctrl._feed is None
    _same(state, ref, "drained", in_order=False)


def test_a_tick_writes_at_most_its_budget_of_placed_rows(monkeypatch):
    path, ranks = RECORDED["vllm_connector_frames"]
    ctrl, state, _ = _controller(_rank_frames(path, ranks))
    monkeypatch.setattr(remote_mod, "MIN_TICK_ROWS", 8)
    monkeypatch.setattr(remote_mod, "TICK_BUDGET_S", 1e-12)
    feed = _with_feed(ctrl, state, bite=lambda: 3)
    while feed.step():
        pass
    total = ctrl.pending_rows()
    assert feed.num_ready == total > 18
    assert ctrl.tick() == 9 and len(state.log) == 9  # three blocks of 3 reach the budget, the rest waits
    assert feed.num_ready == ctrl.pending_rows() == total - 9


def test_blocks_placed_for_another_log_are_dropped_and_order_is_kept():
    path, ranks = RECORDED["vllm_connector_frames"]
    ctrl, state, _ = _controller(_rank_frames(path, ranks))
    feed = _with_feed(ctrl, state, bite=lambda: 6)
    assert feed.step() and feed.step()
    first, second = feed.pop_ready(), feed.pop_ready()
    with pytest.raises(ValueError, match="in the order they were prepared"):
        commit_journal(state.log, second[0])
    assert len(state.log) == 0
    state.set_engine(dict(state.engine_info))  # a new log (another attach)
    assert state.apply_prepared([first, second]) == 0 and len(state.log) == 0
    pool = ctrl.attachment.pools[0]
    again = prepare_journal(state.log, pool.journal_since(0), pool, pool.source, 0)
    assert commit_journal(state.log, again) == len(state.log) > 0


def test_a_placing_thread_that_failed_hands_the_rest_to_the_ticks(monkeypatch):
    path, ranks = RECORDED["vllm_connector_frames"]
    ctrl, state, ref = _controller(_rank_frames(path, ranks))
    total = ctrl.pending_rows()
    told = []
    ctrl.sigMessage.connect(told.append)
    feed = _with_feed(ctrl, state, bite=lambda: 9)
    assert feed.step() == 9
    boom = threading.Event()

    def fail(*_args, **_kw):
        boom.set()
        raise RuntimeError("placer broke")

    monkeypatch.setattr(journal_feed, "take_journal_rows", fail)
    feed.start()
    assert boom.wait(10)
    feed._thread.join(10)
    assert isinstance(feed.error, RuntimeError)
    monkeypatch.undo()
    assert ctrl.tick() == total and ctrl.pending_rows() == 0 and ctrl._feed is None
    assert told and "placing thread stopped" in told[0]
    _same(state, ref, "after a failure", in_order=True)
