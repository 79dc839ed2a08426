"""fastwire.decode_columns_many builds a run's batches with `ColumnarBatch.of_run` when
every frame is common (not through `__init__`'s 14 arguments): every slot of each batch
equals the one `__init__` gives for the same frame, for frames with a rank and without; a
run holding an uncommon frame is built as before; the pool fed either way is the same."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import state


def _slots(b: fastwire.ColumnarBatch) -> dict:
    """Every slot as it is held (no view made: `_rows`, `_data`, ... as they are)."""
    return {name: getattr(b, name) for name in fastwire.ColumnarBatch.__slots__}


def _by_init(first_seq: int, batches: list[fastwire.ColumnarBatch]) -> list[fastwire.ColumnarBatch]:
    """The batches as `ColumnarBatch.__init__` makes them from the same run's figures."""
    run = batches[0].run
    meta = run.meta
    return [fastwire.ColumnarBatch(first_seq + at, float(run.tss[at]),
                                   None if meta[at, fastwire.M_RANK] < 0 else int(meta[at, fastwire.M_RANK]),
                                   None, None, None, None, {}, b.payload, None, int(meta[at, fastwire.M_KEYS]),
                                   int(meta[at, fastwire.M_TOKENS]), run, at) for at, b in enumerate(batches)]


@pytest.mark.parametrize("rank", [0, 3, None])
def test_a_common_run_is_the_batches_init_makes(rank):
    payloads, _, _ = recorded_stream(3_000, gpu_blocks=400, seed=rank or 0)
    if rank != 0:  # the recorded frames name rank 0: the same events with another rank or none
        payloads = [encode_batch(1.0 + i, [VllmEvent("BlockStored", ((i + 1 | 1 << 63).to_bytes(8, "big"),), None,
                                                     tuple(range(16)), 16)], rank) for i in range(200)]
    batches = fastwire.decode_columns_many(7, payloads[:64])
    assert all(b.run is batches[0].run for b in batches)
    want = _by_init(7, batches)
    for got, made in zip(batches, want):
        a, b = _slots(got), _slots(made)
        assert a.keys() == b.keys() and all(a[k] is b[k] or a[k] == b[k] for k in a if k != "run")
        assert a["run"] is b["run"] and type(a["seq"]) is int and type(a["ts"]) is float
        assert got.data_parallel_rank == rank
        # and the frame's views: what decode_columns reads of it alone
        one = fastwire.decode_columns(got.seq, got.payload)
        assert np.array_equal(got.rows, one.rows) and np.array_equal(got.keys, one.keys)
        assert np.array_equal(got.tokens, one.tokens) and np.array_equal(got.parents, one.parents)


def test_a_run_with_an_uncommon_frame_is_built_as_before():
    payloads, _, _ = recorded_stream(2_000, gpu_blocks=400, seed=3)
    odd = encode_batch(5.0, [VllmEvent("BlockStored", ((9 | 1 << 63).to_bytes(8, "big"),), None, (1, 2), 16,
                                       lora_name="x")], 0)
    run = payloads[:20] + [odd] + payloads[20:40]
    batches = fastwire.decode_columns_many(0, run)
    assert batches[20].run is None and batches[20].events
    for at in (0, 19, 21, 40):
        assert batches[at].run is batches[0].run and not batches[at].events
    one = [fastwire.decode_columns(seq, p) for seq, p in enumerate(run)]
    assert [(b.seq, b.ts, b.data_parallel_rank, b.num_keys, b.num_tokens) for b in batches] == \
        [(b.seq, b.ts, b.data_parallel_rank, b.num_keys, b.num_tokens) for b in one]


def test_a_pool_fed_the_runs_equals_one_fed_frame_by_frame():
    payloads, _, _ = recorded_stream(6_000, gpu_blocks=800, seed=5)
    many, one = colpool.ColumnarPool("t", journal=True), colpool.ColumnarPool("t", journal=True)
    for i in range(0, len(payloads), 64):
        many.apply_many(fastwire.decode_columns_many(i, payloads[i:i + 64]))
    for seq, p in enumerate(payloads):
        one.apply(fastwire.decode_columns(seq, p))
    assert state(many) == state(one)
    a, b = many.take_journal(), one.take_journal()
    # (slots may differ: room is made once a run, so the free list is not the one a frame at a time leaves)
    assert all(np.array_equal(getattr(a, c), getattr(b, c)) for c in ("op", "tier", "seq", "key", "width", "store"))
