"""What the window keeps per block of an attached pool: no ref counts while no request holds
a block (a journal's log never has one), and the heap's freed pages handed back after a
tick big enough to have left holes (`app.runtime.state.RELEASE_ROWS`)."""

from __future__ import annotations

import numpy as np
import pytest

NUM_BLOCKS = 40_000


def _journal_ticks(state, num_blocks: int, frames_per_tick: int) -> list[int]:
    """`num_blocks` of bench held's frames into a journal pool, its rows into `state` every
    `frames_per_tick` frames; the events each tick appended."""
    from app.commands._bench_gui import _held_frames
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    pool = journal_pool_class()("test")
    made = []
    frames = list(_held_frames(num_blocks))
    for seq, payload in enumerate(frames):
        pool.apply(fastwire.decode_columns(seq, payload))
        if seq % frames_per_tick == frames_per_tick - 1 or seq == len(frames) - 1:
            rows = pool.take_journal()
            made.append(state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))]))
            pool.release_journal(rows.stop)
    return made


@pytest.fixture
def journal_ctx(qtbot):
    from app.runtime.context import make_test_context

    ctx = make_test_context()
    ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    yield ctx
    ctx.shutdown()


def test_a_journal_log_keeps_no_ref_counts(journal_ctx):
    state = journal_ctx.state
    _journal_ticks(state, NUM_BLOCKS, 2)
    live = state.log.live
    assert live.num_blocks == NUM_BLOCKS
    assert live.ref_counts.shape == (NUM_BLOCKS,) and live.ref_counts.strides[0] == 0
    assert not live.ref_counts.any() and live.num_in_use == 0
    # the live pool holds a hash and a free-queue place a block, nothing for its ref count
    capacity = len(state.log.columnar._bufs[1])  # blocks the live pool's arrays have room for
    assert capacity >= NUM_BLOCKS and state.log.nbytes_by_part()["live"] <= 12 * capacity
    # and it still answers as the pool scrubbed to its last event does (made from checkpoints)
    past = state.log.state_at(int(state.log.last_seq))
    assert np.array_equal(past.ref_counts, live.ref_counts)
    assert np.array_equal(past.hash_keys, live.hash_keys)
    assert np.array_equal(past.free_order(), live.free_order())


def test_a_local_pool_keeps_its_ref_counts():
    from engine.core.live_log import LiveColumnarLog
    from engine.core.events import EventBus
    from engine.core.hashing import BlockHasher
    from engine.core.manager import PrefixCacheManager, Request

    bus = EventBus()
    events = []
    bus.subscribe(events.append)
    manager = PrefixCacheManager(8, 4, BlockHasher(seed=0), bus)
    manager.allocate(Request("a", list(range(13))))
    log = LiveColumnarLog(8, 4)
    log.extend(events)
    held = log.live.ref_counts
    assert held.strides[0] != 0 and held.max() == 1  # the request holds its blocks
    manager.finish("a")
    log.extend(events[len(log):])
    assert not log.live.ref_counts.any()
    assert log.live.ref_counts.strides[0] != 0  # once a request held a block, the counts are kept


def test_a_big_tick_hands_the_heaps_freed_pages_back(journal_ctx, monkeypatch):
    import app.runtime.state as state_mod

    released = []
    monkeypatch.setattr(state_mod, "release_freed_soon", lambda: released.append(1) or True)
    monkeypatch.setattr(state_mod, "RELEASE_ROWS", 10_000)
    made = _journal_ticks(journal_ctx.state, NUM_BLOCKS, 1)  # 8,192 rows a tick: none released
    assert max(made) < 10_000 and not released
    journal_ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True,
                                   "model": "vLLM"})
    made = _journal_ticks(journal_ctx.state, NUM_BLOCKS, 2)  # 16,384 rows a tick
    assert len(released) == sum(1 for n in made if n >= 10_000) > 0
