"""prepare_journal's per-row reads of a pool's per-store fields (`_per_store`): indexed first,
then widened, the same values as widening the whole field first."""

import numpy as np

from engine.core.live_journal import _per_store

JS = np.dtype([("parent", np.uint64), ("tok0", np.uint32), ("ntok", np.uint16), ("tenant", np.uint16),
               ("pwidth", np.uint8)], align=False)  # narrow fields of packed records, as a pool's


def test_narrow_fields_read_as_the_whole_field_widened():
    rng = np.random.default_rng(3)
    rows = np.zeros(500, JS)
    rows["parent"] = rng.integers(0, 2**63, 500, dtype=np.uint64) * 2 + 1  # the top bit set too
    rows["tenant"] = rng.integers(0, 65_535, 500)
    rows["pwidth"] = rng.integers(0, 3, 500)
    is_st = rng.random(40) < 0.7
    at = np.where(is_st, rng.integers(0, 500, 40), 0)
    for name, dtype in (("parent", np.uint64), ("tenant", np.int64), ("pwidth", np.int64)):
        want = np.where(is_st, np.asarray(rows[name], dtype)[at], 0).astype(dtype)
        got = _per_store(rows[name], at, is_st, dtype)
        assert got.dtype == dtype and np.array_equal(got, want), name


def test_a_pool_with_no_stores_yet_reads_zeros():
    got = _per_store(np.zeros(0, JS)["tenant"], np.zeros(3, np.int64), np.zeros(3, bool), np.int64)
    assert got.dtype == np.int64 and np.array_equal(got, [0, 0, 0])
