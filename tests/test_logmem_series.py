"""A journal-fed live log's series move on a tick at a time: the pool's size after each
event is counted by the series pass from the blocks born in the tick, not searched for per
event; it must give `blocks_at`'s answer on a recorded stream whose pool grows inside ticks."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def fed():
    from app.runtime.journal_feed import JournalPools, take_journal_rows
    from app.runtime.live_path import FRAMES_PER_TICK
    from app.runtime.state import PoolState
    from engine.bench.attach import recorded_stream
    from engine.core.live_journal import prepare_journal
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    payloads, _, _ = recorded_stream(6000, gpu_blocks=600)  # evictions from the first ticks on
    pool = journal_pool_class()("test")
    att = JournalPools([pool])
    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    taken: dict[int, int] = {}
    spans = []
    for start in range(0, len(payloads), FRAMES_PER_TICK // 4):
        with att.lock:
            pool.apply_many([fastwire.decode_columns(s, payloads[s])
                             for s in range(start, min(len(payloads), start + FRAMES_PER_TICK // 4))])
        got = take_journal_rows(att, taken, 1 << 30)
        r0 = state.log.columnar.num_rows
        state.apply_prepared([(prepare_journal(state.log, h, p, p.source, int(p.rank)), t) for h, p, t in got[0]],
                             notify=False)
        spans.append((r0, state.log.columnar.num_rows))
    return state.log, spans


def test_the_recorded_pool_grows_inside_ticks(fed):
    # what the series pass must count on: births inside a tick, not only between them
    log, spans = fed
    col = log.columnar
    assert col.num_blocks > col.initial_blocks and len(spans) > 10
    grew = 0
    for r0, r1 in spans:
        want = col.blocks_at(np.arange(r0 + 1, r1 + 1, dtype=np.int64))
        grew += int(want[-1] > want[0]) if r1 > r0 else 0
    assert grew


def test_the_empty_series_is_the_pool_less_what_is_held(fed):
    log, _ = fed
    s = log.series
    size = log.columnar.blocks_at(np.asarray(log.ends, np.int64))
    assert np.array_equal(np.asarray(s.empty), size - np.asarray(s.in_use) - np.asarray(s.cached_free))
    assert int(np.asarray(s.evicted)[-1]) > 0 and len(s.empty) == len(log)


def test_head_prepends_counted_by_the_compiled_pass_are_those_of_the_rows():
    from engine.core.columnar import FREED
    from tests.test_heldmem_live import local_log

    log, more = local_log(8, lambda i: list(range(10 * i, 10 * i + 13 + i % 9)), 40, checkpoint_rows=64)
    col = log.columnar
    kind, flag, block = col.col("kind"), col.col("flag"), col.col("block")
    heads = np.concatenate(([0], np.cumsum((kind == FREED) & (flag == 0) & (block >= 0))))
    assert int(heads[-1]) > 0 and col._heads_after is not None
    for row, count in [*col._head_marks.items(), col._heads_after]:
        assert count == int(heads[row]), row
    for seq in (3, len(log) // 2, len(log) - 2):  # scrubs move states on from the checkpoints' marks
        log.state_at(seq)
        row, count = col._heads_after
        assert count == int(heads[row])
