"""Frames the one-pass reader read whole keep their parents, hashes and token ids in one
array (`ColumnarBatch.data`), and `apply_many` joins a run of them by that array alone
(`colpool._join_data`): the views equal the columns reader's arrays, and the pool and its
journal equal those of the frames applied one at a time and of the same frames given as
separate arrays."""

from __future__ import annotations

import numpy as np

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.colpool import NUM_J, S_JROWS, S_JSTORES, S_TOKUSED, ColumnarPool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import state


def _payloads() -> list[bytes]:
    payloads, _, _ = recorded_stream(3_000, gpu_blocks=400, seed=12)  # evictions, CPU stores
    return payloads


def _as_arrays(b: fastwire.ColumnarBatch) -> fastwire.ColumnarBatch:
    """The same frame with its three arrays given (copies), no data: `apply_many`'s other path."""
    return fastwire.ColumnarBatch(b.seq, b.ts, b.data_parallel_rank, b.rows.copy(), b.parents.copy(),
                                  b.keys.copy(), b.tokens.copy(), {}, b.payload)


def test_the_views_of_a_frames_data_are_the_columns_readers_arrays():
    for seq, p in enumerate(_payloads()[:300]):
        fast = fastwire.decode_columns(seq, p)
        assert fast.data is not None and fast.data.dtype == np.uint64
        slow = fastwire._columns(seq, p)
        assert np.array_equal(fast.rows, slow.rows)
        for name in ("parents", "keys", "tokens"):
            got, want = getattr(fast, name), getattr(slow, name)
            assert got.dtype == want.dtype and np.array_equal(got, want), name
        # the data holds exactly those: a parent a row, the hashes, the token ids two a word
        assert len(fast.data) == len(fast.rows) + len(fast.keys) + (len(fast.tokens) + 1) // 2


def test_runs_joined_by_their_data_give_the_pool_and_journal_of_one_at_a_time():
    payloads = _payloads()
    for journal in (False, True):
        one = ColumnarPool("t", journal=journal)
        joined = ColumnarPool("t", journal=journal)
        arrays = ColumnarPool("t", journal=journal)
        for seq, p in enumerate(payloads):
            one.apply(fastwire.decode_columns(seq, p))
        for a in range(0, len(payloads), 64):
            run = [fastwire.decode_columns(seq, payloads[seq]) for seq in range(a, min(a + 64, len(payloads)))]
            joined.apply_many(run)
            arrays.apply_many([_as_arrays(b) for b in run])
        assert state(joined) == state(one) == state(arrays)
        used = int(joined.S[S_TOKUSED])
        assert used == int(arrays.S[S_TOKUSED])
        assert np.array_equal(joined.tok[:used], arrays.tok[:used])
        if journal:
            r, o = int(joined.S[S_JROWS]), int(joined.S[S_JSTORES])
            assert r > 10_000 and r == int(arrays.S[S_JROWS]) and o == int(arrays.S[S_JSTORES])
            assert np.array_equal(joined.J[:r, :NUM_J], arrays.J[:r, :NUM_J])
            assert np.array_equal(joined.JS[:o], arrays.JS[:o])


def test_a_joined_run_with_a_token_id_past_16_bits_widens_the_token_array():
    """The joined data's uint32 view holds hashes too: the largest token id is found per
    frame's token ids, and one of 2**16 or more widens the pool's token array to uint32."""
    def h(i: int) -> bytes:
        return ((1 << 63) + i).to_bytes(8, "big")

    def frames(big: int) -> list[bytes]:
        return [encode_batch(1.0 + i, [VllmEvent("BlockStored", (h(i),), h(i - 1) if i else None,
                                                 tuple(range(16 * i, 16 * i + 15)) + (big if i == 5 else 7,), 16)])
                for i in range(8)]

    narrow = ColumnarPool("t")  # every id below 2**16 (the hashes beside them in the data are not ids)
    narrow.apply_many([fastwire.decode_columns(seq, p) for seq, p in enumerate(frames(65_535))])
    assert narrow.tok.dtype == np.uint16
    assert narrow.tiers["GPU"][h(5)].token_ids == tuple(range(80, 95)) + (65_535,)
    frames = frames(70_000)
    pool = ColumnarPool("t")
    run = [fastwire.decode_columns(seq, p) for seq, p in enumerate(frames)]
    assert all(b.data is not None for b in run)
    pool.apply_many(run)
    assert pool.tok.dtype == np.uint32
    for i in range(8):
        assert pool.tiers["GPU"][h(i)].token_ids == tuple(range(16 * i, 16 * i + 15)) + (70_000 if i == 5 else 7,)
