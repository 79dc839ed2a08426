"""The journal route's bounded GUI tick (`RemoteController.tick`): each tick applies at most
its budget of journal rows (shared between the pools), the rest at the next ticks, and the
log still gets every row in order: the recorded servers ticked in small bites show what the
event route shows (tests/test_journal_app's comparison). A subscriber holding the
attachment's lock makes a tick give up at once, not wait; a drain takes everything; the
views hear of a burst at their frame rate, and of its end at once."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QObject, Signal

from app.runtime import remote as remote_mod
from app.runtime.remote import RemoteController
from app.runtime.state import PoolState
from engine.core.events import EventBus
from engine.remote.overlay import journal_pool_class
from engine.remote.pool import RemotePool
from test_journal_app import RECORDED, _rank_frames, _same, feed_both


class Host(QObject):
    sigSubjectChanged = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.state = PoolState()
        self.state.set_engine({"remote": True, "journal": True, "block_size": 16, "num_blocks": 0})
        self.bridge = SimpleNamespace(flush=lambda everything=False: None, detach=lambda: None)


def _controller(streams):
    """A controller on a stand-in attachment whose journalling pools took every frame, and
    the reference state the same frames reach through RemotePool's events."""
    host = Host()
    ctrl = RemoteController(host)
    pools = [journal_pool_class()(f"tcp://10.0.0.5:{5557 + r}", r) for r in range(len(streams))]
    ref = PoolState(columnar=False)
    ref.set_engine({"remote": True, "block_size": 16, "num_blocks": 0})
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    rpools = [RemotePool(f"tcp://10.0.0.5:{5557 + r}", r, bus) for r in range(len(streams))]
    for r, frames in enumerate(streams):
        for seq, payload in frames:
            feed_both(pools[r], rpools[r], seq, payload)
    ref.apply_events(sorted(events, key=lambda e: e.seq))
    ref.ticks = [int(ref.log.last_seq)]  # where both logs hold the same events (ranks interleave)
    ctrl.attachment = SimpleNamespace(lock=threading.Lock(), pools=pools)
    ctrl.journalling, ctrl._num_ranks = True, len(streams)
    return ctrl, host.state, ref


@pytest.mark.parametrize("name", ["vllm_connector_frames", "sglang_zmq_frames"])
def test_ticks_in_small_bites_reach_every_row_and_show_the_event_route(monkeypatch, name):
    path, ranks = RECORDED[name]
    ctrl, state, ref = _controller(_rank_frames(path, ranks))
    total = ctrl.pending_rows()
    assert total > 12
    monkeypatch.setattr(remote_mod, "MIN_TICK_ROWS", 5)
    monkeypatch.setattr(remote_mod, "TICK_BUDGET_S", 1e-12)  # the floor: 5 rows a tick
    sizes = []
    while ctrl.pending_rows():
        sizes.append(ctrl.tick())
    assert max(sizes) <= 5 and sum(sizes) == total == len(state.log) and len(sizes) >= total // 5
    _same(state, ref, name, in_order=True)


def test_two_ranks_share_a_tick_and_every_row_arrives(monkeypatch):
    path, _ = RECORDED["vllm_zmq_frames (2 ranks)"]
    ctrl, state, ref = _controller(_rank_frames(path, 2))
    total = ctrl.pending_rows()
    monkeypatch.setattr(remote_mod, "MIN_TICK_ROWS", 6)
    monkeypatch.setattr(remote_mod, "TICK_BUDGET_S", 1e-12)
    sizes = []
    while ctrl.pending_rows():
        sizes.append(ctrl.tick())
    assert max(sizes) <= 6 and sum(sizes) == total == len(state.log)
    _same(state, ref, "two ranks", in_order=False)


def test_a_held_lock_makes_the_tick_give_up_and_a_drain_takes_everything():
    path, ranks = RECORDED["vllm_connector_frames"]
    ctrl, state, ref = _controller(_rank_frames(path, ranks))
    total = ctrl.pending_rows()
    lock = ctrl.attachment.lock
    lock.acquire()
    try:
        assert ctrl.tick() == 0 and len(state.log) == 0  # no wait for the subscriber
    finally:
        lock.release()
    assert ctrl.tick(drain=True) == total and ctrl.pending_rows() == 0
    _same(state, ref, "drained", in_order=True)


def test_views_hear_of_a_burst_at_their_frame_rate_and_of_its_end_at_once(monkeypatch):
    path, ranks = RECORDED["vllm_connector_frames"]
    ctrl, state, _ = _controller(_rank_frames(path, ranks))
    heard = []
    state.sigChanged.connect(lambda: heard.append(len(state.log)))
    monkeypatch.setattr(remote_mod, "MIN_TICK_ROWS", 3)
    monkeypatch.setattr(remote_mod, "TICK_BUDGET_S", 1e-12)
    monkeypatch.setattr(remote_mod, "VIEW_FRAME_S", 3600.0)
    ticks = 0
    while ctrl.pending_rows():
        ctrl.tick()
        ticks += 1
    assert ticks > 2
    # the first tick tells (none told for an hour before it), then only the last one
    assert heard == [3, len(state.log)]


def test_a_reader_holding_a_view_of_the_overlays_times_does_not_stop_the_ticks(monkeypatch):
    """A view's np.frombuffer of the lifetimes (or store times) alive across a tick: the
    array grows as a copy instead of raising BufferError and losing the tick's rows."""
    import numpy as np

    path, ranks = RECORDED["vllm_connector_frames"]
    ctrl, state, ref = _controller(_rank_frames(path, ranks))
    monkeypatch.setattr(remote_mod, "MIN_TICK_ROWS", 4)
    monkeypatch.setattr(remote_mod, "TICK_BUDGET_S", 1e-12)
    held = []
    while ctrl.pending_rows():
        o = state.remote
        held += [np.frombuffer(a, np.float64) for a in (o.lifetimes, o.stored_times, o.removed_times, o.sample_times)
                 if len(a)]
        held += [np.frombuffer(c, np.int64) for c in o.sample_counts if len(c)]
        ctrl.tick()
    assert held and len(state.log) == len(ref.log)
    _same(state, ref, "views held", in_order=True)
