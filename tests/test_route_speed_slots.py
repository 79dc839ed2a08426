"""The placer hands the overlay the block of each stored and removed row
(`PreparedJournal.slots`), which the commit read back from the log's rows before
(`LiveColumnarLog.blocks_of_rows`): both must name the same blocks, tick by tick, on a
recorded vLLM stream with a cache reset in it, for the compiled placer and the Python one."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("compiled", [True, False])
def test_placed_slots_are_the_rows_blocks(compiled):
    from engine.bench.attach import recorded_stream
    from engine.core.live_journal import commit_journal, journal_log, prepare_journal
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    payloads, _, _ = recorded_stream(3_000, gpu_blocks=300)  # evictions from the first ticks on
    pool = journal_pool_class()("test")
    log = journal_log(16, compiled=compiled)
    checked = removed = 0
    for start in range(0, len(payloads), 16):
        pool.apply_many([fastwire.decode_columns(s, payloads[s]) for s in range(start, min(len(payloads), start + 16))])
        if start == 160:
            pool.reset(start)  # a clear among the rows: its rows are neither stored nor removed
        journal = pool.take_journal()
        if not len(journal):
            continue
        r0 = log.columnar.num_rows
        prepared = prepare_journal(log, journal, pool, "test")
        commit_journal(log, prepared, times=pool.times_of(journal))
        want = log.blocks_of_rows(r0, array=True)
        assert np.array_equal(prepared.slots, want), start
        checked += 1
        removed += int(np.count_nonzero(np.asarray(journal.op) == 1))
    kinds = log.columnar.col("kind")
    assert checked > 10 and removed > 0 and (kinds == 10).any()  # removals and a reset were placed
