"""The remote overlay keeps no per-slot ranks while every store came from rank 0 (a single
server's, or rank 0 alone so far): 2 bytes a slot for nothing. A store from another rank
makes them (0 for every slot before), and from then on the overlay shows what the event
route shows, slot by slot, on vLLM's recorded two-rank stream whose rank 1 joins mid-stream."""

from __future__ import annotations

import numpy as np

from tests.test_journal_app import RECORDED, _rank_frames, _same, feed_both, tick_both


def _states():
    from app.runtime.state import PoolState
    from engine.core.events import EventBus
    from engine.remote.overlay import journal_pool_class
    from engine.remote.pool import RemotePool

    info = {"remote": True, "block_size": 16, "num_blocks": 0}
    js, rs = PoolState(), PoolState(columnar=False)
    js.set_engine({**info, "journal": True})
    rs.set_engine(info)
    rs.ticks = []
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    jpools = [journal_pool_class()(f"tcp://10.0.0.5:{5557 + r}", r) for r in range(2)]
    rpools = [RemotePool(f"tcp://10.0.0.5:{5557 + r}", r, bus) for r in range(2)]
    return js, rs, jpools, rpools, events


def _slot_ranks(state) -> list[int]:
    o, n = state.remote, state.projection.num_blocks
    return o.rank[:n][o.base[:n] > 0].tolist()


def test_rank_0_alone_keeps_no_ranks_and_rank_1_joining_shows_what_the_event_route_shows():
    path, ranks = RECORDED["vllm_zmq_frames (2 ranks)"]
    s0, s1 = _rank_frames(path, ranks)
    js, rs, jpools, rpools, events = _states()
    half = len(s0) // 2
    for seq, payload in s0[:half]:  # rank 0 alone, a tick a frame
        feed_both(jpools[0], rpools[0], seq, payload)
        tick_both(js, rs, jpools, [0, 1], events)
    o = js.remote
    n = js.projection.num_blocks
    assert n > 0 and o.num_stored > 0
    assert o._ranks is None and o.rank.shape == o.tier.shape and not o.rank.any()
    assert o.ranks(js.projection) == rs.remote.ranks(rs.projection) == {0: int(np.count_nonzero(o.base[:n]))}
    codes = o._codes.nbytes + (o._cells.nbytes if o._cells is not None else 0)
    # store time's run (uint32, since the store times are runs: 8 bytes a slot before), code (which
    # names the tier: no tier array since), aged code: no rank
    assert o.nbytes_by_part()["slots"] == 5 * len(o.tier) + codes
    _same(js, rs, "rank 0 alone", in_order=True)
    both = 0
    for i in range(max(len(s0) - half, len(s1))):  # then rank 1 too, a frame a tick
        for r, stream in ((0, s0[half:]), (1, s1)):
            if i < len(stream):
                feed_both(jpools[r], rpools[r], *stream[i])
                tick_both(js, rs, jpools, [0, 1], events)
                got = o.ranks(js.projection)
                assert got == rs.remote.ranks(rs.projection), i
                assert _slot_ranks(js) == _slot_ranks(rs), i  # one frame a tick: the same slots
                both += set(got) == {0, 1}
    assert both >= 3  # ticks where both ranks held blocks
    assert o._ranks is not None and o._ranks.dtype == np.uint16 and len(o._ranks) == len(o.tier)
    _same(js, rs, "rank 1 joined", in_order=True)
