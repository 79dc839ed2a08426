"""A live log's growing arrays grown where they lie (`engine.core.growth.regrow`: a resize,
unless a reader holds a view, then a copy), its columns by an eighth, and a journal's log
without the per-block hash array its placer makes needless (`_live_keys`)."""

from __future__ import annotations

import numpy as np

from engine.core.columnar import ColumnarLog
from engine.core.growth import regrow
from engine.core.live_journal import commit_journal, journal_log, prepare_journal
from engine.core.live_log import _Growing


class _Owner:
    def __init__(self, arr):
        self.arr = arr


def test_regrow_resizes_in_place_or_copies_when_a_view_is_held():
    owner = _Owner(np.arange(5000, dtype=np.int32))
    regrow(owner, "arr", 9000, 5000)
    assert len(owner.arr) == 9000 and owner.arr[:5000].tolist() == list(range(5000))
    kept = owner.arr[:10]  # a reader's view: the array may not move under it
    first = owner.arr
    regrow(owner, "arr", 20_000, 9000)
    assert owner.arr is not first and len(owner.arr) == 20_000 and len(first) == 9000
    assert kept.tolist() == list(range(10)) and owner.arr[:5000].tolist() == list(range(5000))
    cols = {"a": np.arange(100, dtype=np.int64)}
    a = cols["a"].ctypes.data
    del first, kept
    regrow(cols, "a", 50, 50)  # shrunk too, in a dict
    assert cols["a"].tolist() == list(range(50)) and cols["a"].ctypes.data == a


def test_a_logs_columns_grow_by_an_eighth_and_keep_every_row():
    rng = np.random.default_rng(5)
    log = ColumnarLog(16, 16)
    written = []
    for _ in range(60):  # ticks of a few hundred rows, past the first 1,024 rows' room many times
        k = int(rng.integers(1, 800))
        table = rng.integers(0, 200, (k, 8)).astype(np.int64)  # kind and flag are bytes
        log.write_rows(table, True)
        written.append(table)
        cap = len(log._cols["kind"])
        assert cap <= max(1024, log.num_rows + log.num_rows // 8 + 800)  # by half: up to 1.5 x the rows
    table = np.concatenate(written)
    assert log.col("seq").tolist() == table[:, 1].tolist() and log.col("a").tolist() == table[:, 5].tolist()
    assert log.col("kind").tolist() == table[:, 0].tolist()


def test_a_growing_column_keeps_its_values_when_a_reader_holds_a_view():
    g = _Growing(np.int64, np.int32)
    g.append(np.arange(1000))
    seen = g.view  # a reader's view of the first 1,000
    g.append(np.arange(1000, 5000))
    assert seen.tolist() == list(range(1000)) and g.view.tolist() == list(range(5000))


def test_a_journal_log_keeps_no_per_block_hash_array():
    from app.commands._bench_gui import _held_frames
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    log, pool = journal_log(16), journal_pool_class()("h2g", rank=0)
    for seq, payload in enumerate(_held_frames(3 * 8192)):
        pool.apply(fastwire.decode_columns(seq, payload))
        commit_journal(log, prepare_journal(log, pool.take_journal(), pool, "h2g", 0))
    col = log.columnar
    assert col.num_blocks == 3 * 8192 and col._live_keys is None
    assert (log.live.hash_keys >= 0).all()  # every block held, as the live pool says
