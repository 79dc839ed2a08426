"""The compiled placer reads each stored row's parent (code, width) and tenant from the
pool's per-store arrays (its keys, explicit parents and runs of stores) in one compiled pass
(`_CompiledPlacer.store_fields`), where numpy gathers read them before: the same int64s, on a
recorded vLLM stream's journal and on made-up arrays (a parent code past 2**63, a tenant past
2**32), and the reader is compiled when the placer is."""

from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")


def _gathered(journal, stores):
    """What prepare_journal read before: numpy gathers, then the int64 conversions."""
    return (np.asarray(journal.parent)[stores].view(np.int64),
            np.asarray(journal.parent_width)[stores].astype(np.int64),
            np.asarray(journal.tenant)[stores].astype(np.int64))


def test_store_fields_match_the_gathers_on_a_recorded_stream():
    from engine.bench.attach import recorded_stream
    from engine.core.live_journal import _CompiledPlacer
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    payloads, _, _ = recorded_stream(3_000, gpu_blocks=300)
    pool = journal_pool_class()("test")
    placer = _CompiledPlacer()
    rng = np.random.default_rng(7)
    checked = parents = 0
    for start in range(0, len(payloads), 16):
        pool.apply_many([fastwire.decode_columns(s, payloads[s]) for s in range(start, min(len(payloads), start + 16))])
        journal = pool.take_journal()
        stores = np.asarray(journal.store, np.int64)[np.asarray(journal.op) == 0]
        if not len(stores):
            continue
        # the tick's stores, and any earlier ones in any order, repeated
        for picked in (stores, rng.integers(0, int(stores.max()) + 1, 64)):
            got, want = placer.store_fields(journal, picked), _gathered(journal, picked)
            assert all(np.array_equal(g, w) for g, w in zip(got, want)), start
        parents += int(np.count_nonzero(_gathered(journal, stores)[1]))
        checked += 1
    assert checked > 10 and parents > 0  # stores under a parent were read


def test_store_fields_read_parents_and_runs():
    from engine.core.live_journal import _CompiledPlacer, _compiled
    from engine.remote.colpool import PX_KEY, PX_STORE, RX_TENANT, StoreParents, StoreRuns

    rng = np.random.default_rng(3)
    n = 500
    keys = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    keys[:2] = [2**64 - 1, 2**63]  # the parents of stores 1 and 2 (chained)
    pwidth = rng.integers(0, 3, n).astype(np.uint8)
    pwidth[:3] = [0, 1, 1]
    # about a third of the stores with a parent are their event's first: a parent of their own
    explicit = np.flatnonzero((pwidth > 0) & (rng.random(n) < 0.3))
    explicit = explicit[explicit > 2]
    px = np.zeros((len(explicit), 2), np.int64)
    px[:, PX_STORE] = explicit
    px[:, PX_KEY] = rng.integers(-2**63, 2**63 - 1, len(explicit), dtype=np.int64, endpoint=True)
    # runs of stores, a tenant each (+ 1; one past 2**32)
    firsts = np.concatenate(([0], np.sort(rng.choice(np.arange(1, n), 40, replace=False))))
    rx = np.zeros((len(firsts), 4), np.int64)
    rx[:, 0], rx[:, 1] = firsts, 16
    rx[:, 2] = rng.integers(0, 2**33, len(firsts))
    rx[:, 3] = firsts * 16

    class Journal:
        parent = StoreParents(keys, pwidth, px)
        parent_width, tenant = pwidth, StoreRuns(rx, n, RX_TENANT)

        @classmethod
        def per_store(cls):  # (a journal's per-store arrays: these)
            return cls

    fields = _compiled()[4]
    compiled_before = len(fields.signatures)
    stores = np.concatenate([[0, 1, 2, 499], rng.integers(0, n, 300), np.arange(3, 200)]).astype(np.int64)
    got = _CompiledPlacer().store_fields(Journal, stores)
    want = _gathered(Journal, stores)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert got[0][0] == 0 and got[0][1] == -1 and got[0][2] == -2**63  # a parent code's bits, as the int64 view
    assert len(explicit) > 20 and set(got[0][np.isin(stores, explicit)].tolist()) <= set(px[:, PX_KEY].tolist())
    assert len(fields.signatures) == compiled_before  # the warm-up compiled this layout's reader
