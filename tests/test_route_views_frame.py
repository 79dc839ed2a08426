"""The journal route's pace with its placing thread (`JournalFeed`, `RemoteController.tick`):
while rows are still on their way (journalled by the pools and not taken yet) the views hear
of the blocks written at most once a VIEW_FRAME_S, not after every bite of the feed, and at
once when the last rows are written; a feed that rests between bites takes at once when a
busy stream pauses, and not while a slow one trickles."""

from __future__ import annotations

import threading

from app.runtime import journal_feed
from app.runtime import remote as remote_mod
from app.runtime.journal_feed import JournalFeed
from test_journal_app import RECORDED, _rank_frames, _same
from test_journal_tick import _controller


def _fed(bite: int):
    path, ranks = RECORDED["vllm_connector_frames"]
    ctrl, state, ref = _controller(_rank_frames(path, ranks))
    feed = JournalFeed(ctrl.attachment, state.log, ctrl._taken, lambda: bite)
    ctrl._feed = feed
    return ctrl, state, ref, feed


def test_views_hear_at_their_frame_while_rows_are_on_their_way_and_at_once_at_the_end(monkeypatch):
    ctrl, state, ref, feed = _fed(bite=4)
    total = ctrl.pending_rows()
    assert total > 16
    monkeypatch.setattr(remote_mod, "VIEW_FRAME_S", 3600.0)
    heard = []
    state.sigChanged.connect(lambda: heard.append(len(state.log)))
    bites = 0
    while ctrl.pending_rows():
        feed.step()  # the placing thread's bite, then the GUI ticks until it is written
        bites += 1
        while feed.num_ready or ctrl._tell:
            ctrl.tick()
        ctrl.tick()  # a tick that finds nothing placed
    assert bites > 3 and len(state.log) == total
    # the first bite tells (none told for an hour before it), then only the last one: every
    # bite between left rows in the pool's journal, so it was no burst's end
    assert heard == [4, total]
    _same(state, ref, "paced", in_order=True)


def _rest_returns(feed: JournalFeed, timeout_s: float) -> bool:
    done = threading.Event()
    t = threading.Thread(target=lambda: (feed._rest(), done.set()), daemon=True)
    t.start()
    returned = done.wait(timeout_s)
    feed.stop()  # wakes a rest still waiting
    t.join(10)
    return returned


def test_a_feed_takes_at_once_when_a_busy_stream_pauses(monkeypatch):
    ctrl, state, _, feed = _fed(bite=10)
    monkeypatch.setattr(journal_feed, "TAKE_EVERY_S", 3600.0)
    monkeypatch.setattr(journal_feed, "QUIET_ROWS", 8)
    assert feed.step() == 10 and ctrl.pending_rows() > 10  # a full bite: the stream is busy, and rows still wait
    assert _rest_returns(feed, 30.0), "the feed waited out TAKE_EVERY_S after the burst"


def test_a_feed_rests_while_a_slow_stream_trickles(monkeypatch):
    ctrl, state, _, feed = _fed(bite=10)
    waiting = ctrl.pending_rows()
    monkeypatch.setattr(journal_feed, "TAKE_EVERY_S", 3600.0)
    monkeypatch.setattr(journal_feed, "QUIET_ROWS", waiting + 1)  # fewer rows wait than a busy stream brings
    feed._last_bite = 3  # and the last bite was a small one
    looks = []
    real = feed._journalled
    monkeypatch.setattr(feed, "_journalled", lambda: looks.append(1) or real())
    assert not _rest_returns(feed, 0.5)
    assert len(looks) >= 3  # it looked, and stayed
