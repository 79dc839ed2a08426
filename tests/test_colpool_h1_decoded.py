"""A run of frames `decode_columns_many` read is applied from the arrays its compiled pass
read them into (`ColumnarPool._apply_decoded`): the pool, its removal maps and its journal
equal those of the same frames applied one at a time, whole runs or pieces of them, mixed
with other runs and with frames read alone; the figures its pass notes per frame are the
rows' own; a journalled pool's arrays grown while a reader holds their views keep them."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire
from engine.remote.colpool import S_JROWS, S_JSTORES, S_TOKUSED, ColumnarPool
from engine.remote.fastwire import (
    KIND_REMOVED, M_KEYS, M_MOST_HASHES, M_MOST_ID, M_MOST_TOKENS, M_REMOVALS, M_ROWS, M_TOKENS, R_KIND, R_NHASH,
    R_NTOK,
)
from engine.remote.wire import MalformedFrame, VllmEvent, encode_batch
from tests.test_colpool import state
from tests.test_fastwire import FIXTURES


def _payloads() -> list[bytes]:
    return recorded_stream(3_000, gpu_blocks=400, seed=21)[0]  # evictions, CPU stores


def _alone(batches: list[fastwire.ColumnarBatch]) -> list[fastwire.ColumnarBatch]:
    """The same frames read one by one (no run): `apply_many` joins them as before."""
    return [fastwire.decode_columns(b.seq, b.payload) for b in batches]


def _one_at_a_time(frames: list[bytes], journal: bool) -> ColumnarPool:
    pool = ColumnarPool("one", journal=journal)
    for seq, p in enumerate(frames):
        pool.apply(fastwire.decode_columns(seq, p))
    return pool


def _same(a: ColumnarPool, b: ColumnarPool) -> None:
    """The same pool, array for array (the free list's order, slots and token ranges depend
    on when the pool grew: `b` made its room at the same calls)."""
    assert state(a) == state(b)
    assert np.array_equal(a.S, b.S)
    used = int(a.S[S_TOKUSED])
    assert np.array_equal(a.tok[:used], b.tok[:used])
    if a.journal:
        r, o = int(a.S[S_JROWS]), int(a.S[S_JSTORES])
        assert r > 0 and np.array_equal(a.J[:r], b.J[:r])
        assert a.JS[:o].tobytes() == b.JS[:o].tobytes() and np.array_equal(a.SO, b.SO)


@pytest.fixture
def decoded_calls(monkeypatch: Any) -> list[int]:
    """The frames each `_run_decoded` call applied (the route through a run's arrays)."""
    calls: list[int] = []
    entry = colpool._run_decoded_py
    SEQS = list(inspect.signature(entry.py_func).parameters).index("seqs")  # (by name: the arguments grow)

    def counted(*args: Any) -> Any:
        calls.append(len(args[SEQS]))
        return entry(*args)

    monkeypatch.setattr(colpool, "_run_decoded_py", counted)
    return calls


@pytest.mark.parametrize("journal", [False, True])
def test_runs_from_their_arrays_give_the_pool_of_one_frame_at_a_time(journal, decoded_calls):
    payloads = _payloads()
    many, joined = ColumnarPool("many", journal=journal), ColumnarPool("joined", journal=journal)
    for a in range(0, len(payloads), 64):
        run = fastwire.decode_columns_many(a, payloads[a:a + 64])
        many.apply_many(run)
        joined.apply_many(_alone(run))
    assert sum(decoded_calls) == len(payloads)  # every frame of `many` went through the run's arrays
    assert many.num_cached > 0 and many.num_removed > 0
    assert state(many) == state(_one_at_a_time(payloads, journal))
    _same(many, joined)


@pytest.mark.parametrize("journal", [False, True])
def test_pieces_and_mixtures_of_runs(journal, decoded_calls):
    """A run cut in pieces, two or three runs in one call (an attachment holds across reads:
    their room made once, as the join route makes it), frames read alone between them, and
    a frame the pass did not read (a connector's medium) in the middle of a run: each
    applied as its frames one at a time, and array for array as the join route does."""
    payloads = _payloads()[:600]
    disk = encode_batch(1.0, [VllmEvent("BlockStored", ((77 << 56).to_bytes(8, "big"),), None, tuple(range(16)), 16,
                                        medium="DISK")], 0)
    frames = payloads[:100] + [disk] + payloads[100:]
    many, joined = ColumnarPool("many", journal=journal), ColumnarPool("joined", journal=journal)
    runs = [fastwire.decode_columns_many(a, frames[a:a + 20]) for a in range(0, len(frames), 20)]
    assert len(runs) > 10 and runs[5][0].run is None  # the DISK frame, read by the reference
    assert runs[5][1].run is runs[5][2].run is not None
    calls = [runs[0][:8], runs[0][8:], runs[1] + runs[2][:5], runs[2][5:], runs[3] + runs[4][:1]]
    calls += [runs[4][1:] + runs[5]]
    calls += [[fastwire.decode_columns(120 + i, frames[120 + i]) for i in range(10)] + runs[6][10:]]
    calls += [runs[7][:5], runs[7][5:] + runs[8] + runs[9][:3]]  # three runs in one call
    calls += [b for r in [runs[9][3:]] + runs[10:] for b in ([r[:7], r[7:]] if len(r) > 7 else [r])]
    for batches in calls:
        many.apply_many(batches)
        joined.apply_many(_alone(batches))
    assert decoded_calls and sum(decoded_calls) < len(frames)
    assert state(many) == state(_one_at_a_time(frames, journal))
    _same(many, joined)


def test_a_pass_notes_each_frames_figures():
    payloads = [p for name in sorted(FIXTURES) if name.startswith("vllm") for _, p in FIXTURES[name]] + _payloads()
    for a in range(0, len(payloads), 64):
        try:
            got = fastwire.decode_columns_many(a, payloads[a:a + 64])
        except MalformedFrame:
            continue
        for b in got:
            if b.run is None:
                continue
            meta, rows, tokens = b.run.meta[b.run_at], b.rows, b.tokens
            assert meta[M_ROWS] == len(rows) and meta[M_KEYS] == len(b.keys) and meta[M_TOKENS] == len(tokens)
            assert meta[M_REMOVALS] == int(rows[rows[:, R_KIND] == KIND_REMOVED, R_NHASH].sum())
            assert meta[M_MOST_TOKENS] == (int(rows[:, R_NTOK].max()) if len(rows) else 0)
            assert meta[M_MOST_HASHES] == (int(rows[:, R_NHASH].max()) if len(rows) else 0)
            assert meta[M_MOST_ID] == (int(tokens.max()) if len(tokens) else 0)


def test_a_journal_grown_under_a_readers_views_keeps_them():
    payloads = _payloads()
    pool, free = ColumnarPool("t", journal=True), ColumnarPool("free", journal=True)
    held = []
    for a in range(0, len(payloads), 64):
        rows = pool.take_journal()  # views of J, JS and the token array, kept across growths
        held.append((rows, rows.op.copy(), rows.key.copy(), np.array(rows.parent), rows.tokens.copy()))
        pool.apply_many(fastwire.decode_columns_many(a, payloads[a:a + 64]))
        free.apply_many(fastwire.decode_columns_many(a, payloads[a:a + 64]))  # no reader: grown in place
    assert len(held[-1][0]) > 0
    for rows, op, key, parent, tokens in held:
        assert np.array_equal(rows.op, op) and np.array_equal(rows.key, key)
        assert np.array_equal(rows.parent, parent) and np.array_equal(rows.tokens, tokens)
    _same(pool, free)
