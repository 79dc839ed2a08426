"""A journalled `ColumnarPool` keeps no token start in its store rows (13 bytes a store, not
17): each store's token ids are appended after the one before's, so its start is the sum of
the counts before it (`TokenStarts`, from the sum at every 256th store, `TokenMarks`). Read
as an int, an array of stores, a slice or whole, made up to a store in steps as readers ask;
on a real stream, every store's ids read through it are the ids the frames stored."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.colpool import ColumnarPool, TokenMarks, TokenStarts
from engine.remote.wire import decode_batch


def test_starts_are_the_sums_of_the_counts_before_read_any_way_and_in_steps():
    rng = np.random.default_rng(5)
    counts = rng.integers(0, 70, 5_000).astype(np.uint16)
    want = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)[:-1]))
    marks = TokenMarks()
    # readers asking further and further on (the marks made a step at a time), then back
    for o in (0, 1, 255, 256, 257, 300, 1_000, 4_999, 700, 3):
        starts = TokenStarts(marks, counts[:o + 1 + rng.integers(0, 10)])  # each reader's own view
        assert starts[o] == want[o], o
        assert starts[-1] == want[len(starts) - 1]
    assert len(marks.marks) == 4_999 // TokenMarks.STEP + 1
    assert np.array_equal(marks.marks, want[::TokenMarks.STEP])
    starts = TokenStarts(marks, counts)
    picks = rng.integers(0, 5_000, 12)
    assert np.array_equal(starts[picks], want[picks])  # a few: one at a time
    assert np.array_equal(starts[np.arange(5_000)], want)  # many: from the whole
    assert np.array_equal(starts[10:20], want[10:20]) and np.array_equal(np.asarray(starts), want)
    with pytest.raises(IndexError):
        starts[5_000]


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
    assert len(j.token_count) == len(stored) > 3 * TokenMarks.STEP
    for o in range(len(stored)):
        assert tuple(j.token_ids(o).tolist()) == tuple(stored[o]), o
    assert np.array_equal(np.asarray(j.token_start),
                          np.concatenate(([0], np.cumsum(np.asarray(j.token_count, np.int64))[:-1])))
