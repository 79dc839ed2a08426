"""fastwire.decode_columns_many: a run of frames read by one compiled call gives what
decode_columns gives each frame (every ColumnarBatch field, the same MalformedFrame)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.remote import colpool, fastwire
from engine.remote.wire import MalformedFrame
from tests.test_colpool import state
from tests.test_fastwire import FIXTURES, HOSTILE, _batch, _bench_frames, _stored


def _fields(b: fastwire.ColumnarBatch) -> dict[str, Any]:
    """Every field of a batch as plain values; `data` up to its last token id (an odd
    count's last half word is left as it was: nobody reads it)."""
    keys = b.keys.copy()
    for row in b.rows:  # a 32-byte digest's key is left for the pool to fill: not read here
        if row[fastwire.R_WIDTH] == 32:
            keys[row[fastwire.R_HASH0]:row[fastwire.R_HASH0] + row[fastwire.R_NHASH]] = 0
    out = {"seq": b.seq, "ts": b.ts, "rank": b.data_parallel_rank, "rows": (b.rows.dtype, b.rows.tolist()),
           "parents": (b.parents.dtype, b.parents.tolist()), "keys": (keys.dtype, keys.tolist()),
           "tokens": (b.tokens.dtype, b.tokens.tolist()), "events": b.events, "payload": b.payload,
           "num_keys": b.num_keys, "num_tokens": b.num_tokens, "data": None}
    if b.data is not None:
        used = 2 * (len(b.rows) + b.num_keys) + b.num_tokens
        out["data"] = (b.data.dtype, len(b.data), b.data.view(np.uint32)[:used].tolist())
    return out


def _outcome(decode: Any, *args: Any) -> Any:
    try:
        got = decode(*args)
    except MalformedFrame as exc:
        return ("malformed", str(exc))
    return [_fields(b) for b in got] if isinstance(got, list) else _fields(got)


def _one_by_one(first_seq: int, payloads: list[bytes]) -> list[fastwire.ColumnarBatch]:
    return [fastwire.decode_columns(first_seq + i, p) for i, p in enumerate(payloads)]


def test_a_recorded_stream_reads_as_frame_by_frame():
    frames = _bench_frames(3_000)
    assert all(fastwire.common_columns(i, p) is not None for i, p in enumerate(frames))  # the compiled route
    for run in (64, 7, 1):
        for s in range(0, len(frames), run):
            assert _outcome(fastwire.decode_columns_many, 100 + s, frames[s:s + run]) \
                == _outcome(_one_by_one, 100 + s, frames[s:s + run])
    assert fastwire.decode_columns_many(5, []) == []


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_frames_read_as_frame_by_frame(name):
    """Recorded vLLM and SGLang frames, common and not (events kept whole, digests), in runs."""
    payloads = [p for _, p in FIXTURES[name]]
    for s in range(0, len(payloads), 16):
        run = payloads[s:s + 16]
        try:
            _one_by_one(s, run)
        except MalformedFrame:  # a run with a malformed frame: the same error, nothing returned
            with pytest.raises(MalformedFrame):
                fastwire.decode_columns_many(s, run)
            continue
        assert _outcome(fastwire.decode_columns_many, s, run) == _outcome(_one_by_one, s, run)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_frame_among_common_ones(name):
    good = _bench_frames(200)
    run = good[:3] + [HOSTILE[name]] + good[3:6]
    assert _outcome(fastwire.decode_columns_many, 9, run) == _outcome(_one_by_one, 9, run)
    assert _outcome(fastwire.decode_columns_many, 9, [HOSTILE[name]]) == _outcome(_one_by_one, 9, [HOSTILE[name]])


def test_odd_and_even_token_counts_side_by_side():
    """Frames whose token ids end mid-word, next to each other in the shared data."""
    frames = [_batch(_stored(block_hashes=[2 ** 63 + n], token_ids=list(range(n)))) for n in (15, 1, 16, 3)]
    got = fastwire.decode_columns_many(0, frames)
    assert [b.num_tokens for b in got] == [15, 1, 16, 3] and all(b.data is not None for b in got)
    assert [b.tokens.tolist() for b in got] == [list(range(n)) for n in (15, 1, 16, 3)]
    assert [b.keys.tolist() for b in got] == [[2 ** 63 + n] for n in (15, 1, 16, 3)]
    assert _outcome(fastwire.decode_columns_many, 0, frames) == _outcome(_one_by_one, 0, frames)


def test_a_pool_fed_by_runs_equals_one_fed_frame_by_frame():
    frames = _bench_frames(3_000)
    by_run, by_frame = colpool.ColumnarPool("t"), colpool.ColumnarPool("t")
    for s in range(0, len(frames), 64):
        by_run.apply_many(fastwire.decode_columns_many(s, frames[s:s + 64]))
    for i, p in enumerate(frames):
        by_frame.apply(fastwire.decode_columns(i, p))
    assert by_run.num_cached > 0
    assert state(by_run) == state(by_frame)
