"""A full batch table drops the rows no held slot names (`ColumnarPool._batch_rows`, compiled
`_drop_unnamed_bids`): the rows kept, in order, and every held slot's row renumbered, as
numpy's masks over every slot made them; narrow (uint32) and widened slot columns."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire


def _expected(pool: colpool.ColumnarPool, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """T, BSEQ, the live slots and their new rows, from numpy's masks (the reference)."""
    nb = pool._num_bids
    live = np.flatnonzero(pool.F[:, colpool.F_TIER] > 0)
    bids = pool.L[live, colpool.L_BID].astype(np.int64)
    named = np.zeros(nb, np.bool_)
    named[bids] = True
    used = np.flatnonzero(named)
    renumber = np.cumsum(named) - 1
    return pool.T[used].copy(), pool.BSEQ[used].copy(), live, renumber[bids]


@pytest.mark.parametrize("wide", [False, True])
def test_a_full_batch_table_keeps_the_rows_held_slots_name_in_order(wide):
    payloads, _, _ = recorded_stream(8_000, gpu_blocks=600, seed=3)
    pool = colpool.ColumnarPool("t")
    if wide:
        pool._widen()
    for i in range(0, len(payloads), 64):
        pool.apply_many(fastwire.decode_columns_many(i, payloads[i:i + 64]))
    before = pool.BSEQ[pool.L[np.flatnonzero(pool.F[:, colpool.F_TIER] > 0), colpool.L_BID].astype(np.int64)]
    k = len(pool.T) - pool._num_bids + 1  # one more than the room left: the table is compacted
    T, BSEQ, live, rows = _expected(pool, k)
    assert 0 < len(T) < pool._num_bids  # some rows named by no held slot
    nb0 = pool._num_bids
    pool._batch_rows(np.arange(10**6, 10**6 + k, dtype=np.int64), np.full(k, 7.5))
    nb = int(pool.S[colpool.S_BID])
    assert nb == len(T) and pool._num_bids == nb + k and nb < nb0
    assert np.array_equal(pool.T[:nb], T) and np.array_equal(pool.BSEQ[:nb], BSEQ)
    assert np.array_equal(pool.L[live, colpool.L_BID].astype(np.int64), rows)
    assert np.array_equal(pool.BSEQ[rows], before)  # each held slot still names its batch
    assert np.array_equal(pool.BSEQ[nb:nb + k], np.arange(10**6, 10**6 + k)) and (pool.T[nb:nb + k] == 7.5).all()
    assert not pool.BSEQ[nb + k:].any()
