"""The journal pool's batch times of a run applied at once (`journal_pool_class().apply_many`):
each journal row is dated by its own batch's time, as applying the batches one by one dates
it, for runs whose numbers follow on (a subscriber's run: the row's batch is found by its
number less the first) and for runs with gaps (found by search). The frames are the
recorded stream's and vLLM 0.33's own (their rare events go through `apply` inside the run).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire
from engine.remote.overlay import journal_pool_class
from engine.remote.wire import parse_pub
from tests.test_vllm_attach import fixture_frames


def _payloads() -> list[bytes]:
    """The recorded stream's frames with vLLM 0.33's recorded PUB frames (both ranks: a clear,
    32-byte hashes, extra keys) put in among them, and each frame's time set apart."""
    payloads = recorded_stream(6_000, gpu_blocks=1_500, seed=11)[0]
    vllm = [parse_pub(f)[2] for rank in (0, 1) for f in fixture_frames(rank, "pub")]
    for i, p in enumerate(vllm):
        payloads.insert(37 + 53 * i, p)
    return payloads


def _pools(seqs: list[int], sizes: tuple[int, ...]):
    payloads = _payloads()
    batches = [fastwire.decode_columns(seq, payloads[i]) for i, seq in enumerate(seqs)]
    pool_class = journal_pool_class()
    alone, runs = pool_class("a"), pool_class("r")
    for b in batches:
        alone.apply(b)
    at, step = 0, 0
    while at < len(batches):
        size = sizes[step % len(sizes)]
        runs.apply_many(batches[at:at + size])
        at += size
        step += 1
    return batches, alone, runs


@pytest.mark.parametrize("gaps", [False, True])
def test_a_run_dates_each_row_by_its_batch(gaps):
    num = len(_payloads())
    # with gaps: numbers that go up by 1 to 3 (a subscriber hands on runs that follow on;
    # `Attachment`'s held batches after a refill, or a caller, need not)
    seqs = [s * 2 - (s % 3 == 0) if gaps else s for s in range(1, num + 1)]
    assert seqs == sorted(set(seqs))
    batches, alone, runs = _pools(seqs, (1, 2, 64, 5, 256, 300))
    n = alone.num_journal_rows
    assert n == runs.num_journal_rows > 20_000
    assert any(b.events for b in batches), "vLLM's own frames are applied as rare events"
    got = runs.times_of(runs.journal_since(0))
    assert np.array_equal(got, alone.times_of(alone.journal_since(0)))
    # and each row's time is the time of the batch its journal row names
    ts_of = {b.seq: b.ts for b in batches}
    want = np.array([ts_of[int(s)] for s in runs.J[:n, colpool.J_SEQ]])
    assert np.array_equal(got, want)
    assert len(set(got.tolist())) > 400  # the frames' times differ: a row dated by a neighbour shows


def test_a_run_that_is_not_in_order_is_applied_one_by_one():
    batches, _, _ = _pools(list(range(40)), (40,))
    pool = journal_pool_class()("o")
    shuffled = batches[:10] + batches[12:20] + batches[10:12]
    pool.apply_many(shuffled)
    ref = journal_pool_class()("r")
    for b in shuffled:
        ref.apply(b)
    assert np.array_equal(pool.times_of(pool.journal_since(0)), ref.times_of(ref.journal_since(0)))
    assert pool.num_batches == 20
