"""A journal tick counts the pool's blocks before and after its rows without `blocks_at`'s
np.iinfo (two a tick): `live_log._blocks_before` must give what `ColumnarLog.blocks_at` gives
at every row of a live log that grew (a recorded vLLM stream's journal), of one that began
with blocks, and past the rows written."""

from __future__ import annotations

import numpy as np

from engine.core.live_journal import append_journal, journal_log
from engine.core.live_log import _blocks_before
from engine.remote import fastwire
from engine.remote.colpool import ColumnarPool


def _journal_fed(num_batches: int):
    from tests.test_colpool import _synthetic

    log = journal_log(16)
    pool = ColumnarPool("tcp://10.0.0.5:5557", rank=0, journal=True)
    for i, (seq, payload) in enumerate(_synthetic(num_batches, 4)):
        pool.apply(fastwire.decode_columns(seq, payload))
        if i % 5 == 4:
            append_journal(log, pool.take_journal(), pool, "tcp://10.0.0.5:5557")
            col = log.columnar
            assert _blocks_before(col, col.num_rows) == col.blocks_at(col.num_rows) == col.num_blocks
    return log


def test_blocks_before_every_row_equal_blocks_at():
    col = _journal_fed(300).columnar
    assert col.num_blocks > col.initial_blocks == 0 and col.num_rows > 500
    rows = list(range(0, col.num_rows + 3)) + [col.num_rows + 10**6, 2**31 + 5]
    got = [_blocks_before(col, r) for r in rows]
    assert got == [int(col.blocks_at(r)) for r in rows]
    assert len(set(got)) > 50  # rows inside the log, where blocks were still being born


def test_a_log_that_began_with_blocks():
    from engine.core.live_log import LiveColumnarLog
    from tests.test_live_log import _remote_events

    from tests.test_colpool import _synthetic

    events = _remote_events(_synthetic(80, 2), 1, 0)
    log = LiveColumnarLog(8, 16)
    log.extend(events)
    col = log.columnar
    assert col.initial_blocks == 8
    rows = range(0, col.num_rows + 2)
    assert [_blocks_before(col, r) for r in rows] == [int(col.blocks_at(r)) for r in rows]
    fresh = LiveColumnarLog(8, 16).columnar  # no block born: the initial ones at every row
    assert _blocks_before(fresh, 0) == _blocks_before(fresh, 10) == 8 == int(np.asarray(fresh.blocks_at(10)))
