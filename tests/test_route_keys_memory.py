"""A journal-fed log's hash ids and stores keep no per-row pool or width while one pool feeds
it with 8-byte hashes (the per-row columns are uniform: no buffer), and still read each
digest, identity and store from the right pool once a second pool's rows come in."""

from __future__ import annotations

import numpy as np

from engine.bench.attach import recorded_stream
from engine.core.live_journal import append_journal, journal_log
from engine.remote import fastwire
from engine.remote.overlay import journal_pool_class


def _pool(rank: int, seed: int, num_events: int = 3000):
    payloads, _, _ = recorded_stream(num_events, gpu_blocks=300, seed=seed)
    pool = journal_pool_class()("route", rank=rank)
    for start in range(0, len(payloads), 32):
        pool.apply_many([fastwire.decode_columns(s, payloads[s])
                         for s in range(start, min(len(payloads), start + 32))])
    return pool


def test_one_pool_keeps_no_per_row_pool_or_width():
    pool = _pool(0, 1)
    log = journal_log(16)
    journal = pool.take_journal()
    assert append_journal(log, journal, pool, pool.source, 0) == len(journal) > 5000
    keys, stores = log.columnar.keys, log.columnar.store_attributes
    assert keys._pool.nbytes == keys._width.nbytes == stores._pool.nbytes == 0
    ids = np.arange(len(keys))
    want = [pool.hash_of(int(k), int(w)) for k, w in zip(journal.key.tolist(), journal.width.tolist())]
    assert keys.digests(ids) == want and keys.digest(7) == want[7]
    assert stores[3][1] == tuple(journal.token_ids(int(journal.store[np.flatnonzero(journal.op == 0)[3]])).tolist())


def test_a_second_pool_is_told_apart_row_by_row():
    first, second = _pool(0, 1), _pool(1, 2)
    log = journal_log(16)
    want: list[bytes] = []
    tokens: list[tuple] = []
    for pool in (first, second, first):
        journal = pool.take_journal()
        if not len(journal):
            pool.apply_many([fastwire.decode_columns(10**6 + i, p)
                             for i, p in enumerate(recorded_stream(300, gpu_blocks=300, seed=9)[0])])
            journal = pool.take_journal()
        append_journal(log, journal, pool, pool.source, pool.rank)
        want += [pool.hash_of(int(k), int(w)) for k, w in zip(journal.key.tolist(), journal.width.tolist())]
        tokens += [tuple(journal.token_ids(int(s)).tolist()) for s in journal.store[journal.op == 0].tolist()]
    keys, stores = log.columnar.keys, log.columnar.store_attributes
    assert keys._pool.nbytes > 0 and stores._pool.nbytes > 0  # made a buffer by the second pool
    assert set(keys._pool.view.tolist()) == {0, 1}
    assert keys.digests(np.arange(len(keys))) == want
    assert stores.tokens(np.arange(len(stores))) == tokens
