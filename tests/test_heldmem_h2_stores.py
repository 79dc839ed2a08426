"""A journal log's per-store columns in fewer bytes (`engine.core.live_journal.JournalStores`):
the pool store numbers as the runs a pool's ticks make (`_Steps`), the tenants as one value
while every store has one. Read back equal to the values appended, on a recorded-shape
stream of the bench's held pool and on values that break every run."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.live_journal import _Steps, commit_journal, journal_log, prepare_journal


def test_steps_read_back_what_was_appended_and_fall_back_to_values():
    rng = np.random.default_rng(7)
    runs, plain = _Steps(), _Steps()
    want_runs, want_plain = [], []
    for tick in range(200):
        # two pools interleaved: each tick a run of one of them; now and then a pool starts again
        first = 0 if tick % 50 == 0 else (want_runs[-1] + 1 if tick % 3 else 10_000 + tick * 100)
        ticked = np.arange(first, first + int(rng.integers(1, 300)))
        runs.append(ticked)
        want_runs += ticked.tolist()
        noise = rng.integers(0, 1 << 20, int(rng.integers(1, 50)))
        plain.append(noise)
        want_plain += noise.tolist()
    assert runs.n == len(want_runs) and runs.take(np.arange(runs.n)).tolist() == want_runs
    assert runs.take(5) == want_runs[5] and runs.take(-1) == want_runs[-1]
    assert runs.nbytes < 4 * runs.n / 10  # a few runs, not a value a store
    assert runs._values is None and plain._values is not None  # values that break every run: kept as values
    ids = rng.integers(0, plain.n, 500)
    assert plain.take(ids).tolist() == [want_plain[i] for i in ids.tolist()]
    with pytest.raises(IndexError):
        runs.take(np.array([runs.n]))


def test_a_held_pools_stores_read_their_pool_arrays_from_runs():
    from app.commands._bench_gui import _churn_frames, _held_frames
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    log, pool = journal_log(16), journal_pool_class()("h2", rank=0)
    n = 20_000
    frames = list(_held_frames(n)) + list(_churn_frames(n, 8))
    for seq, payload in enumerate(frames):
        pool.apply(fastwire.decode_columns(seq, payload))
        if seq % 64 == 63 or seq >= len(frames) - 8:
            commit_journal(log, prepare_journal(log, pool.take_journal(), pool, "h2", 0))
    stores = log.columnar.store_attributes
    assert len(stores) == n + 8 * 64
    # each store's tokens and parent read through the runs equal the pool's own per-store arrays
    j = stores.journals[0].arrays()
    local = stores._local.take(np.arange(len(stores)))
    assert local.tolist() == list(range(len(stores)))  # one pool: one run
    assert stores._local.nbytes <= 12 * 1024 and stores.tenants.nbytes == 0  # their first room, not 4 B a store
    some = np.array([0, 1, 63, 64, 4095, n - 1, n, len(stores) - 1])
    assert stores.tokens(some) == [tuple(j.token_ids(int(s)).tolist()) for s in local[some]]
    assert [stores[int(i)][1] for i in some] == stores.tokens(some)
    assert stores.tenant_names(some) == [None] * len(some)
    parents = stores.parents(some)
    assert parents[0] is None and parents[1] is not None  # a chain's first block, then its second
