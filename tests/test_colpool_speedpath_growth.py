"""A journalled `ColumnarPool`'s token ids and store rows are copied whole into a new array
each time they grow (readers hold views of them): they grow by half again up to 8 times
their small size, so a pool makes few copies on its way there, and it still equals the
reference and the pool that grows one frame at a time."""

from __future__ import annotations

import numpy as np

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.colpool import S_JSTORES, S_TOKUSED, ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import decode_batch

HOLD = 64  # frames applied at once, as an attachment applies them


class _SmallPool(ColumnarPool):
    """Small growth thresholds (class attributes, so a test stream crosses them quickly)."""

    _tokens_small = 1 << 16
    _rows_small = 1 << 12


def _columns(rows) -> np.ndarray:
    """A journal's rows but their slots (which slot a pool hands out depends on how its
    slot arrays grew)."""
    return np.column_stack([rows.op, rows.tier, rows.seq, rows.store, rows.key.view(np.int64), rows.width])


def test_a_journalled_pool_copies_its_token_ids_and_store_rows_few_times():
    """A steady stream, taken and released after every 64 frames (a reader's views alive
    across the next apply, as the app's feed holds them): below 8 times the small size the
    token array and the store rows are made again at most 8 times each (an eighth at a
    time: 13 and 12)."""
    payloads, _, _ = recorded_stream(16_000, gpu_blocks=2_000, seed=5)
    frames = [fastwire.decode_columns(seq, p) for seq, p in enumerate(payloads)]
    pool = _SmallPool("t", journal=True)
    tok_copies = store_copies = 0
    taken = []
    rows = None
    for i in range(0, len(frames), HOLD):
        tok, js = pool.tok, pool.JS
        pool.apply_many(frames[i:i + HOLD])
        if pool.tok is not tok and len(tok) < 8 * _SmallPool._tokens_small:
            tok_copies += 1
        if pool.JS is not js and len(js) < 8 * _SmallPool._rows_small:
            store_copies += 1
        rows = pool.take_journal()  # held until the next bite: the arrays it views are copied, not resized
        taken.append(_columns(rows))
        pool.release_journal(rows.stop)
    assert int(pool.S[S_TOKUSED]) > 8 * _SmallPool._tokens_small  # the stream crossed both regions
    assert int(pool.S[S_JSTORES]) > 8 * _SmallPool._rows_small
    assert 1 <= tok_copies <= 8 and 1 <= store_copies <= 8  # 7 and 6; an eighth at a time, 13 and 12
    # the same rows, token ids and pool as a pool that grows one frame at a time, and the reference
    one = ColumnarPool("t", journal=True)
    for f in frames:
        one.apply(f)
    assert np.array_equal(np.concatenate(taken), _columns(one.take_journal()))
    n = int(pool.S[S_TOKUSED])
    assert n == int(one.S[S_TOKUSED]) and np.array_equal(pool.tok[:n], one.tok[:n])
    o = int(pool.S[S_JSTORES])
    assert pool.JS.dtype == one.JS.dtype and pool.JS[:o].tobytes() == one.JS[:o].tobytes()
    ref = RemotePool("t")
    for seq, f in enumerate(frames):
        ref.apply(decode_batch(seq, f.payload))
    assert pool.num_cached == ref.num_cached and pool.cached_hashes() == ref.cached_hashes()
    assert list(pool.removed_at.items()) == list(ref.removed_at.items())
    assert {h: list(v) for h, v in pool.departed.items()} == {h: list(v) for h, v in ref.departed.items()}
