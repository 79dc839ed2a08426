"""A journal tick's one time appended as one value written in place (`_Growing.append_one`,
`_Runs.extend_same`): read back bit for bit across the column's growth, and a narrow column
widened when a value passes its margin, as `append` widens it."""

from __future__ import annotations

import numpy as np

from engine.core.live_log import _NARROW_MARGIN, _Growing, _Runs


def test_one_value_at_a_time_reads_back_across_growth_and_widening():
    col, want = _Growing(np.int64, narrow=np.int32), []
    for v in range(3_000):  # past the first 1,024 values' room
        col.append_one(v * 7 - 5)
        want.append(v * 7 - 5)
    assert col.buf.dtype == np.int32 and col.view.tolist() == want
    top = int(np.iinfo(np.int32).max) - _NARROW_MARGIN
    col.append_one(top)  # the last value the narrow column keeps
    assert col.buf.dtype == np.int32
    col.append_one(top + 1)  # past it: the column widens, the values kept
    want += [top, top + 1]
    assert col.buf.dtype == np.int64 and col.view.tolist() == want
    low = _Growing(np.int64, narrow=np.int32)
    low.append_one(int(np.iinfo(np.int32).min) + _NARROW_MARGIN - 1)
    assert low.buf.dtype == np.int64 and low.view.tolist() == [int(np.iinfo(np.int32).min) + _NARROW_MARGIN - 1]


def test_a_ticks_time_kept_as_one_run_reads_back_bit_for_bit():
    runs, parts = _Runs(), []
    rng = np.random.default_rng(2)
    values = [1.5, 1.5, -0.0, 0.0, np.nan, np.nan, *rng.random(3_000).tolist()]  # past the runs' room
    for v in values:
        k = int(rng.integers(1, 5))
        runs.extend_same(v, k)
        parts.append(np.full(k, v))
    want = np.concatenate(parts)
    assert np.array_equal(runs[0:runs.n].view(np.int64), want.view(np.int64))
    assert len(runs._values.view) == len(values) - 2  # 1.5 twice and NaN twice: one run each
