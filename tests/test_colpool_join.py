"""The starts of a run of frames joined for one compiled call (`colpool._join_starts`),
against numpy's fix-ups, and the frames given to `apply_many` left as they were."""
import numpy as np

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire
from engine.remote.fastwire import KIND_REMOVED, R_HASH0, R_KIND, R_NHASH, R_NTOK, R_TOK0
from tests.test_colpool import state


def _frames(num_events, seed):
    payloads, _, _ = recorded_stream(num_events, gpu_blocks=500, seed=seed)
    return [fastwire.decode_columns(seq, p) for seq, p in enumerate(payloads)]


def test_joined_starts_and_figures_are_numpys():
    frames = [f for f in _frames(3_000, 4)[:64] if len(f.rows)]
    assert len(frames) > 10 and any((f.rows[:, R_KIND] == KIND_REMOVED).any() for f in frames)
    rows = np.concatenate([f.rows for f in frames])
    want = rows.copy()
    nk = np.array([len(f.keys) for f in frames])
    nt = np.array([len(f.tokens) for f in frames])
    per = np.array([len(f.rows) for f in frames])
    want[:, R_TOK0] += np.repeat(np.cumsum(nt) - nt, per)
    want[:, R_HASH0] += np.repeat(np.cumsum(nk) - nk, per)
    sizes = np.stack([per, nk, nt], axis=1).astype(np.int64)
    figures = colpool._join_starts(rows, sizes)
    assert np.array_equal(rows, want)
    assert figures == (int(want[:, R_NHASH].sum()), int(want[:, R_NTOK].max()), int(want[:, R_NHASH].max()),
                       int(want[want[:, R_KIND] == KIND_REMOVED, R_NHASH].sum()))
    # every joined row names its own frame's hashes and token ids
    keys, tokens = np.concatenate([f.keys for f in frames]), np.concatenate([f.tokens for f in frames])
    r = 0
    for f in frames:
        for i in range(len(f.rows)):
            h0, nh, t0, n = f.rows[i, R_HASH0], f.rows[i, R_NHASH], f.rows[i, R_TOK0], f.rows[i, R_NTOK]
            assert np.array_equal(keys[rows[r, R_HASH0]:rows[r, R_HASH0] + nh], f.keys[h0:h0 + nh])
            assert np.array_equal(tokens[rows[r, R_TOK0]:rows[r, R_TOK0] + n], f.tokens[t0:t0 + n])
            r += 1


def test_a_run_with_empty_frames_leaves_its_frames_and_gives_the_pool_of_one_at_a_time():
    frames = _frames(2_000, 6)
    empty = fastwire.ColumnarBatch(0, 0.0, None, frames[0].rows[:0], frames[0].parents[:0], frames[0].keys[:0],
                                   frames[0].tokens[:0], {}, None)
    run = []
    for i, f in enumerate(frames):  # an empty frame between every few, with its own seq
        run.append(f)
        if i % 5 == 0:
            run.append(fastwire.ColumnarBatch(f.seq, f.ts, None, empty.rows, empty.parents, empty.keys,
                                              empty.tokens, {}, None))
    before = [f.rows.copy() for f in run]
    many, one = colpool.ColumnarPool("many"), colpool.ColumnarPool("one")
    for i in range(0, len(run), 64):
        many.apply_many(run[i:i + 64])
    for f in run:
        one.apply(f)
    assert all(np.array_equal(f.rows, b) for f, b in zip(run, before))
    assert many.num_batches == one.num_batches == len(run)
    assert many.num_cached == one.num_cached > 0
    assert state(many) == state(one)
