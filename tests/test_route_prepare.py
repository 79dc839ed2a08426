"""prepare_journal's compiled pass (`_CompiledPlacer.scan` and `place_rows`: a tick's counts,
(batch, tier) pairs and store numbers, and each table row's seq, store id, pair and batch)
against the numpy and Python path it replaced (`_scan_numpy`, `_place`), on recorded vLLM
frames through a journalling pool: its rows are strided views of the pool's."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.core.live_journal import (
    _compiled, _CompiledPlacer, _scan_numpy, commit_journal, journal_log, prepare_journal,
)
from engine.remote import fastwire
from engine.remote.overlay import journal_pool_class

pytestmark = pytest.mark.skipif(not _compiled(), reason="numba is not installed")


def _ticks(num_events: int = 6000, per_tick: int = 16) -> tuple[object, list]:
    payloads, _, _ = recorded_stream(num_events, gpu_blocks=400)
    pool = journal_pool_class()("route")
    ticks = []
    for start in range(0, len(payloads), per_tick):
        pool.apply_many([fastwire.decode_columns(s, payloads[s])
                         for s in range(start, min(len(payloads), start + per_tick))])
        ticks.append(pool.take_journal())
    return pool, ticks


def _scan_args(journal) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(getattr(journal, f), np.int64) for f in ("op", "seq", "tier", "store", "width"))


def _same_scan(got, want) -> None:
    for name in ("store_local", "pairs", "of_pair", "batches", "batch_of_pair"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert (got.num_stored, got.num_cleared, got.width_range) == (want.num_stored, want.num_cleared, want.width_range)


def test_the_compiled_scan_reads_a_tick_as_numpy_does():
    _, ticks = _ticks()
    placer = _CompiledPlacer()
    assert sum(len(t) for t in ticks) > 20_000 and not ticks[3].op.flags.contiguous
    for journal in ticks:
        _same_scan(placer.scan(*_scan_args(journal)), _scan_numpy(*_scan_args(journal)))


def test_batches_out_of_order_are_sorted_as_numpy_sorts_them():
    _, ticks = _ticks(2000)
    op, seq, tier, store, width = _scan_args(ticks[2])
    seq = seq[::-1].copy()  # the rows' batches descending: no longer a pool's order
    got = _CompiledPlacer().scan(op, seq, tier, store, width)
    _same_scan(got, _scan_numpy(op, seq, tier, store, width))
    assert len(got.pairs) > 2 and np.all(np.diff(got.pairs) > 0)


def test_prepared_rows_are_the_python_placers():
    pool, ticks = _ticks()
    fast, slow = journal_log(16), journal_log(16, compiled=False)
    num_stored = 0
    for journal in ticks:
        a = prepare_journal(fast, journal, pool, pool.source, 0)
        b = prepare_journal(slow, journal, pool, pool.source, 0)
        cols = [0, 1, 2, 3, 4, 5, 7]  # column 6 (the info) is the commit's
        assert a.table[:, cols].tolist() == b.table[:, cols].tolist()
        assert np.array_equal(a.rows.table_pair, b.rows.table_pair)
        assert np.array_equal(a.rows.table_batch, b.rows.table_batch)
        assert np.array_equal(a.rows.store_local, b.rows.store_local)
        assert np.array_equal(a.store_tenants, b.store_tenants) and np.array_equal(a.born, b.born)
        assert (a.r0, a.seq0, a.key0, a.store0, a.num_blocks) == (b.r0, b.seq0, b.key0, b.store0, b.num_blocks)
        commit_journal(fast, a)
        commit_journal(slow, b)
        num_stored += int(np.count_nonzero(np.asarray(journal.op) == 0))
    assert num_stored > 5000 and fast.columnar.num_rows == slow.columnar.num_rows
    for name in ("kind", "seq", "request", "block", "hash", "a", "b", "flag"):
        assert np.array_equal(fast.columnar.col(name), slow.columnar.col(name)), name
