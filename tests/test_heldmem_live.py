"""The live pool of a live columnar log is moved on in its own arrays, not copied whole each
batch (`engine.core.live_log._LiveColumns`); what is kept past the next batch (a scrub to
the last event, a worker's snapshot, checkpoint 0) is a copy and does not move with it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_heldmem_ref import NUM_BLOCKS


def _feed(state, pool, frames, first: int, last: int, per_tick: int) -> None:
    from engine.remote import fastwire

    for seq in range(first, last):
        pool.apply(fastwire.decode_columns(seq, frames[seq]))
        if seq % per_tick == per_tick - 1 or seq == last - 1:
            rows = pool.take_journal()
            state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
            pool.release_journal(rows.stop)


def _same(a, b) -> None:
    assert a.seq == b.seq and a.num_blocks == b.num_blocks
    assert np.array_equal(a.ref_counts, b.ref_counts)
    assert np.array_equal(a.hash_keys, b.hash_keys)
    assert np.array_equal(a.free_order(), b.free_order())
    assert a.counters == b.counters


@pytest.fixture
def held(qtbot):
    from app.commands._bench_gui import _held_frames
    from app.runtime.context import make_test_context
    from engine.remote.overlay import journal_pool_class

    ctx = make_test_context()
    ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    yield ctx.state, journal_pool_class()("test"), list(_held_frames(NUM_BLOCKS))
    ctx.shutdown()


def test_the_live_pool_is_not_copied_each_batch(held):
    from app.commands._bench_gui import HELD_FRAME_BLOCKS, _held_frames

    state, pool, _ = held
    frames = list(_held_frames(10 * HELD_FRAME_BLOCKS))
    _feed(state, pool, frames, 0, 8, 8)
    _feed(state, pool, frames, 8, 9, 1)  # grown by a quarter: room for the next frame
    before = state.log.live.hash_keys
    _feed(state, pool, frames, 9, 10, 1)
    after = state.log.live.hash_keys
    assert after.size == before.size + HELD_FRAME_BLOCKS
    assert np.shares_memory(before, after)  # the old code copied the whole pool here
    _same(state.log.state_at(int(state.log.last_seq)), state.log.live)


def test_what_is_kept_past_a_batch_does_not_move_with_the_live_pool(held):
    state, pool, frames = held
    half = len(frames) // 2
    _feed(state, pool, frames, 0, half, 2)
    last = int(state.log.last_seq)
    state.scrub_to(last)
    scrubbed = state.projection
    frozen = state.log.snapshot()
    kept = scrubbed.hash_keys.copy(), scrubbed.free_order(), scrubbed.num_blocks
    _feed(state, pool, frames, half, len(frames), 2)
    assert state.log.live.num_blocks == NUM_BLOCKS > kept[2]
    assert np.array_equal(scrubbed.hash_keys, kept[0]) and np.array_equal(scrubbed.free_order(), kept[1])
    _same(frozen.live, scrubbed)
    # the pool at that event, made again from the checkpoints, is the one kept
    _same(state.log.state_at(last), scrubbed)
    # and the live pool is the one the checkpoints make at the last event
    state.scrub_to(None)
    _same(state.log.state_at(int(state.log.last_seq)), state.log.live)


def local_log(num_blocks: int, tokens, num_requests: int, **log_options):
    """A local `num_blocks`-block pool's log (block size 4) after `num_requests` requests,
    request i's tokens `tokens(i)`, each taken and freed, and a function `more(first, last)`
    that appends requests first..last-1."""
    from engine.core.events import EventBus
    from engine.core.hashing import BlockHasher
    from engine.core.live_log import LiveColumnarLog
    from engine.core.manager import PrefixCacheManager, Request

    bus = EventBus()
    events: list = []
    bus.subscribe(events.append)
    manager = PrefixCacheManager(num_blocks, 4, BlockHasher(seed=0), bus)
    log = LiveColumnarLog(num_blocks, 4, **log_options)

    def more(first: int, last: int) -> None:
        for i in range(first, last):
            manager.allocate(Request(f"r{i}", tokens(i)))
            manager.finish(f"r{i}")
            log.extend(events[len(log):])

    more(0, num_requests)
    return log, more


def _local_pool(num_requests: int, checkpoint_rows: int | None = None):
    """A local 8-block pool's log after `num_requests` requests of 13 tokens."""
    return local_log(8, lambda i: list(range(10 * i, 10 * i + 13)), num_requests, checkpoint_rows=checkpoint_rows)


def test_a_scrub_to_the_last_event_stays_there_in_a_pool_that_does_not_grow():
    log, more = _local_pool(3)
    last = int(log.last_seq)
    scrubbed, frozen = log.state_at(last), log.snapshot()
    kept = scrubbed.hash_keys.copy(), scrubbed.free_order()
    more(3, 9)  # the same 8 blocks taken, freed and evicted again
    assert np.array_equal(scrubbed.hash_keys, kept[0]) and np.array_equal(scrubbed.free_order(), kept[1])
    _same(frozen.live, scrubbed)
    _same(log.state_at(last), scrubbed)
    assert not np.array_equal(log.live.hash_keys, kept[0])


def test_a_local_pools_first_checkpoint_stays_the_initial_pool():
    log, _ = _local_pool(6, checkpoint_rows=4)
    first = log.columnar._cp_states[0]
    assert not first.ref_counts.any() and (first.hash_keys == -1).all()
    assert np.array_equal(first.free_pos, np.arange(8))
    assert log.live.hash_keys.max() >= 0  # while the live pool holds hashes
