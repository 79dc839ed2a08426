"""fastwire.decode_columns_many reads a run's frames where they lie (their addresses and
sizes handed to the compiled pass, no join of the payloads): on recorded vLLM frames each
batch's views equal `decode_columns`' of the frame alone, whatever buffer type carries it
(bytes read in place; bytearray, memoryview and bytes subclasses as bytes copies); the
run's room bound covers every frame's own bound; a pool fed the runs equals one fed the
same frames one by one."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire
from engine.remote.wire import MalformedFrame
from tests.test_colpool import state


class _Sub(bytes):
    pass


def _same_as_alone(batches, payloads) -> None:
    assert len(batches) == len(payloads)
    for got, p in zip(batches, payloads):
        one = fastwire.decode_columns(got.seq, bytes(p))
        assert got.ts == one.ts and got.data_parallel_rank == one.data_parallel_rank and got.events == one.events
        assert got.num_keys == one.num_keys and got.num_tokens == one.num_tokens
        assert np.array_equal(got.rows, one.rows) and np.array_equal(got.keys, one.keys)
        assert np.array_equal(got.tokens, one.tokens) and np.array_equal(got.parents, one.parents)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, _Sub, "mixed"])
def test_each_frame_is_read_where_it_lies(kind):
    payloads, _, _ = recorded_stream(6_000, gpu_blocks=500, seed=5)
    run = payloads[:64]
    if kind == "mixed":  # bytes among others: the others as copies, the bytes as they are
        given = [p if i % 3 else bytearray(p) for i, p in enumerate(run)]
    else:
        given = [kind(p) for p in run]
    batches = fastwire.decode_columns_many(11, given)
    assert all(b.run is batches[0].run and not b.events for b in batches)
    assert [b.seq for b in batches] == list(range(11, 11 + len(run)))
    assert all(b.payload is p for b, p in zip(batches, given))  # the caller's own objects kept
    _same_as_alone(batches, run)


@pytest.mark.parametrize("bad", [b"", b"\x90", "cut"])
def test_a_bad_frame_raises_what_decode_columns_raises(bad):
    payloads, _, _ = recorded_stream(2_000, gpu_blocks=300, seed=2)
    bad = payloads[1][:len(payloads[1]) // 2] if bad == "cut" else bad
    with pytest.raises(MalformedFrame) as alone:
        fastwire.decode_columns(5, bad)
    with pytest.raises(MalformedFrame) as many:
        fastwire.decode_columns_many(3, [payloads[0], bytearray(payloads[2]), bad, payloads[3]])
    assert str(many.value) == str(alone.value)


def test_the_runs_room_covers_each_frames_bound():
    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = rng.integers(0, 5_000, rng.integers(1, 80))
        rows, words = fastwire._run_room(len(sizes), int(sizes.sum()))
        assert rows >= sum(n // 18 + 1 for n in sizes.tolist())
        assert words >= sum(n // 18 + 1 + n // 9 + 1 + (n + 1) // 2 for n in sizes.tolist())


@pytest.mark.parametrize("journal", [False, True])
def test_a_pool_fed_the_runs_equals_one_fed_frame_by_frame(journal):
    payloads, _, _ = recorded_stream(20_000, gpu_blocks=2_000, seed=9)
    a = colpool.ColumnarPool("a", journal=journal)
    b = colpool.ColumnarPool("b", journal=journal)
    c = colpool.ColumnarPool("c", journal=journal)
    for i in range(0, len(payloads), 64):
        a.apply_many(fastwire.decode_columns_many(i, [bytearray(p) if i % 128 else p for p in payloads[i:i + 64]]))
        c.apply_many(fastwire.decode_columns_many(i, payloads[i:i + 64]))
    for i, p in enumerate(payloads):
        b.apply(fastwire.decode_columns(i, p))
    assert state(a) == state(b) == state(c)
    if journal:
        ja, jb, jc = a.take_journal(), b.take_journal(), c.take_journal()
        assert all(np.array_equal(getattr(ja, name), getattr(jc, name)) for name in ("slot", "op", "seq", "key"))
        # (slots may differ: room is made once a run, not as a frame at a time leaves it)
        for name in ("op", "tier", "seq", "store", "key", "width"):
            assert np.array_equal(getattr(ja, name), getattr(jb, name)), name
