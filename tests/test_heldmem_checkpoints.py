"""A live log's newest checkpoint is kept as its differences from the live pool, not as a
whole copy (`engine.core.live_log._LivePool`): every scrub still gives the pool the rows
make from the start, and a worker's snapshot keeps the checkpoints as they were."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_heldmem_live import _same, local_log


@pytest.fixture(autouse=True)
def _differences_at_this_scale(monkeypatch):
    from engine.core import live_log

    monkeypatch.setattr(live_log, "NEWEST_AS_DIFFERENCES_BLOCKS", 1_000)


def _from_the_start(log, seq: int):
    """The pool after event `seq`, the rows applied from the first, no checkpoint read."""
    col = log.columnar
    n = col.rows_upto(seq)
    return col._advance(col.initial_state(), 0, n)


def _check_scrubs(log, seqs) -> None:
    for seq in seqs:
        got, want = log.state_at(int(seq)), _from_the_start(log, int(seq))
        assert np.array_equal(got.hash_keys, want.hash_keys), seq
        assert np.array_equal(got.ref_counts, want.ref_counts), seq
        assert np.array_equal(got.arrays.free_pos, want.free_pos), seq
        assert got.counters == want.counters, seq


def _local_log(num_requests: int):
    """A 2,048-block local pool's log (requests of 9 blocks taken and freed: a few hundred
    blocks change between two checkpoints, so their differences are kept, not whole
    arrays), checkpoints from 64 rows apart, and a function appending more requests."""
    return local_log(2048, lambda i: [(13 * i + j) % 9973 for j in range(36)], num_requests,
                     checkpoint_rows=64, max_checkpoints=4)


def test_scrubs_of_a_pool_whose_blocks_change_after_the_newest_checkpoint():
    from engine.core.live_log import _LivePool

    log, more = _local_log(60)
    assert len(log.columnar._cp_states) >= 3
    newest = log.columnar._cp_states[-1]
    assert isinstance(newest.newer, _LivePool) and isinstance(newest.parts["hash_keys"], tuple)
    _check_scrubs(log, log.seqs[::7])
    frozen = log.snapshot()
    seqs = log.seqs[::5].copy()
    more(60, 200)  # the live pool moves on, new checkpoints are made and thinned
    _check_scrubs(log, log.seqs[::7])
    for seq in seqs:  # the snapshot's scrubs are the pool as it was
        _same(frozen.state_at(int(seq)), log.state_at(int(seq)))


@pytest.fixture
def held_state(qtbot, monkeypatch):
    import app.runtime.state as state_mod
    from app.commands._bench_gui import _held_frames
    from app.runtime.context import make_test_context
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    monkeypatch.setattr(state_mod, "REMOTE_CHECKPOINT_EVENTS", 8_192)
    ctx = make_test_context()
    ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    pool = journal_pool_class()("test")
    for seq, payload in enumerate(_held_frames(100_000)):
        pool.apply(fastwire.decode_columns(seq, payload))
        rows = pool.take_journal()
        ctx.state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
        pool.release_journal(rows.stop)
    yield ctx.state
    ctx.shutdown()


def test_a_held_pools_checkpoints_keep_no_whole_copy(held_state):
    log = held_state.log
    states = log.columnar._cp_states
    assert len(states) >= 3 and states[-1].num_blocks >= 50_000
    # a growing pool's newest checkpoint is the live pool's first blocks: a copy was 12 B a
    # block, its differences a mark a block (the blocks kept) and nearly none
    assert log.nbytes_by_part()["checkpoints"] < 2.0 * log.live.num_blocks
    _check_scrubs(log, [log.columnar.col("seq")[r - 1] for r in log.columnar._cp_rows[1:]] +
                  [int(log.last_seq) - 1, int(log.seqs[len(log) // 3])])


def test_scrubs_of_a_journal_log_whose_pool_reuses_its_blocks(monkeypatch):
    """An attached server's log (recorded vLLM frames, a 600-block GPU tier and its CPU
    offload: blocks freed and reused all along), checkpoints 400 rows apart, the newest kept as
    its differences: the blocks a tick changes are marked a bit each (`_keep_newest`), and
    every scrub gives the pool the rows make from the start."""
    from engine.core import live_log
    from engine.core.live_journal import append_journal, journal_log
    from engine.remote import fastwire
    from engine.bench.attach import recorded_stream
    from engine.remote.colpool import ColumnarPool

    monkeypatch.setattr(live_log, "NEWEST_AS_DIFFERENCES_BLOCKS", 100)
    log = journal_log(16, checkpoint_rows=400, max_checkpoints=6)
    pool = ColumnarPool("tcp://10.0.0.5:5557", journal=True)
    for i, payload in enumerate(recorded_stream(4_000, gpu_blocks=600)[0]):
        pool.apply(fastwire.decode_columns(i, payload))
        if i % 8 == 7:
            append_journal(log, pool.take_journal(), pool, "tcp://10.0.0.5:5557")
    append_journal(log, pool.take_journal(), pool, "tcp://10.0.0.5:5557")
    assert type(log.columnar._cp_states[-1]).__name__ == "_DeltaState" and log._marks is not None
    assert log._marks.nbytes == (log.columnar._cp_states[-1].num_blocks + 7) // 8
    _check_scrubs(log, log.seqs[::2])
