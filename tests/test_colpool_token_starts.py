"""A journalled `ColumnarPool` keeps no token count, tenant or token start per store: the
stores are kept as runs of one count and tenant (RX), and each store's token ids are appended
after the one before's, so its start is its run's first's and the counts of the stores before
it in its run (`StoreRuns`). Read as an int, an array of stores, a slice or whole; on a real
stream and on one whose counts and tenants change, every store's ids read through it are the
ids the frames stored."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.colpool import RX_NTOK, RX_TENANT, RX_TOK0, S_NRX, ColumnarPool, StoreRuns
from engine.remote.wire import VllmEvent, decode_batch, encode_batch


def _runs(counts: np.ndarray, tenants: np.ndarray) -> np.ndarray:
    """RX's rows for stores of these counts and tenants (+ 1), made one store at a time."""
    rows, start = [], 0
    for o, (n, t) in enumerate(zip(counts.tolist(), tenants.tolist())):
        if not rows or rows[-1][1:3] != [n, t]:
            rows.append([o, n, t, start])
        start += n
    return np.array(rows, np.int64).reshape(-1, 4)


def test_counts_tenants_and_starts_read_from_the_runs_any_way():
    rng = np.random.default_rng(5)
    # runs of full blocks, a part now and then, tenants that change between runs
    counts = np.where(rng.random(5_000) < 0.9, 16, rng.integers(0, 16, 5_000))
    tenants = np.repeat(rng.integers(0, 3, 50), 100)
    want = {RX_NTOK: counts, RX_TENANT: tenants,
            RX_TOK0: np.concatenate(([0], np.cumsum(counts, dtype=np.int64)[:-1]))}
    rx = _runs(counts, tenants)
    assert len(rx) < len(counts) // 4
    picks = rng.integers(0, 5_000, 200)
    for column, values in want.items():
        field = StoreRuns(rx, len(counts), column)
        assert len(field) == 5_000 and np.array_equal(np.asarray(field), values)
        assert np.array_equal(field[picks], values[picks]) and np.array_equal(field[10:20], values[10:20])
        assert [field[o] for o in (0, 1, 4_999, -1)] == [int(values[o]) for o in (0, 1, 4_999, -1)]
        assert isinstance(field[3], int)
        with pytest.raises(IndexError):
            field[5_000]
        with pytest.raises(IndexError):
            field[np.array([0, 5_000])]


def test_every_store_of_a_real_stream_reads_the_token_ids_it_stored():
    payloads, _, _ = recorded_stream(6_000, gpu_blocks=1_500, seed=11)
    pool = ColumnarPool("t", journal=True)
    stored = []  # each stored block's token ids, in store order, as the frames give them
    for seq, p in enumerate(payloads):
        for e in decode_batch(seq, p).events:
            if e.kind == "BlockStored":
                n = len(e.block_hashes)
                size = len(e.token_ids) // n if n else 0
                stored.extend(e.token_ids[i * size:(i + 1) * size] for i in range(n))
        pool.apply(fastwire.decode_columns(seq, p))
        if seq % 97 == 96:  # rows taken and released as a reader does, the stores kept whole
            pool.release_journal(pool.take_journal().stop)
    j = pool.journal_since(pool.journal_base)
    assert len(j.token_count) == len(stored) > 1_000
    for o in range(len(stored)):
        assert tuple(j.token_ids(o).tolist()) == tuple(stored[o]), o
    assert np.array_equal(np.asarray(j.token_start),
                          np.concatenate(([0], np.cumsum(np.asarray(j.token_count, np.int64))[:-1])))


def test_stores_of_changing_counts_and_tenants_read_back_from_their_runs():
    """Blocks of 16 ids, a part block, a block with none and salted blocks (each salt a
    tenant): every store's count, tenant and ids are the frame's, through runs of them."""
    h = [bytes(7) + bytes([i]) for i in range(12)]
    frames = [[VllmEvent("BlockStored", (h[0], h[1]), None, tuple(range(32)), 16)],
              [VllmEvent("BlockStored", (h[2], h[3]), h[1], tuple(range(100, 120)), 16)],  # 16, then 4
              [VllmEvent("BlockStored", (h[4],), h[3], (), 16)],  # no token ids
              [VllmEvent("BlockStored", (h[5], h[6]), h[4], tuple(range(200, 232)), 16, extra_keys=(("a",), ("b",)))],
              [VllmEvent("BlockStored", (h[7], h[8]), h[6], tuple(range(300, 332)), 16)]]
    pool = ColumnarPool("t", journal=True)
    for seq, events in enumerate(frames):
        pool.apply(fastwire.decode_columns(seq, encode_batch(1.0 + seq, events, 0)))
    j = pool.journal_since(0)
    assert np.asarray(j.token_count).tolist() == [16, 16, 16, 4, 0, 16, 16, 16, 16]
    tenants = [pool.tenant_names[t - 1] if t else None for t in np.asarray(j.tenant).tolist()]
    assert tenants[:5] == [None] * 5 and tenants[5:7] == ["a", "b"]
    assert [tuple(j.token_ids(o).tolist()) for o in (0, 3, 4, 6)] == [
        tuple(range(16)), tuple(range(116, 120)), (), tuple(range(216, 232))]
    assert int(pool.S[S_NRX]) < 9  # runs, not a row a store
