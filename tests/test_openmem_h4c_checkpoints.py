"""A finished log's checkpoints kept packed (engine.core.columnar.PackedPool): each read
back exactly as the pool it snapshots, scrubs through them equal to the reference
projection, and the packed form several times smaller than 16 bytes a block.
"""

from __future__ import annotations

import numpy as np
import pytest

import engine.core.columnar as columnar
from engine.core.columnar import FREE_ABSENT, TAIL_BASE, PackedInts, PackedPool, PoolArrays
from engine.core.pool_state import Counters
from engine.core.replay import ReplayConfig
from engine.core.trace import load_trace
from engine.kernel import replay_kernel
from tests.test_columnar import TRACES, assert_views_equal, reference_states, view_of


def _log(limit: int = 600, capacity: int = 300):
    requests = load_trace(TRACES / "mooncake_conversation_trace.jsonl", 512)[:limit]
    return replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=capacity), record=True).log


def _assert_snapshots_exact(log) -> None:
    """Each checkpoint read back equals the pool moved there from the first row, unpacked."""
    assert all(isinstance(s, PackedPool) for s in log._cp_states)
    for row, packed in zip(log._cp_rows, log._cp_states):
        want = log._advance(log.initial_state(), 0, row)
        for name, dtype in (("ref_counts", np.int32), ("hash_keys", np.int32), ("free_pos", np.int64)):
            got = getattr(packed, name)
            assert got.dtype == dtype and np.array_equal(got, getattr(want, name)), (row, name)
        assert packed.num_rows == row and packed.counters == want.counters


def test_every_checkpoint_reads_back_the_pool_it_snapshots_and_scrubs_equal_the_reference():
    log = _log()
    log.build_checkpoints(every=997)  # many snapshots, each with places at the tail and at the head
    assert len(log._cp_rows) >= 8
    _assert_snapshots_exact(log)
    # at least one snapshot holds a block taken (ref > 0), one out of the queue, and a head place
    states = [s.whole() for s in log._cp_states[1:]]
    assert any(s.ref_counts.any() for s in states)
    assert any((s.free_pos == FREE_ABSENT).any() for s in states)
    assert any((s.free_pos < 0).any() for s in states)
    packed = sum(s.nbytes for s in log._cp_states)
    assert packed < 16 * log.num_blocks * len(log._cp_states) / 2.5
    seqs = log.col("seq")
    targets = sorted({int(seqs[r - 1]) for r in log._cp_rows[1:]} | {int(seqs[r]) for r in log._cp_rows[1:]}
                     | {0, len(log) - 1})
    ref = reference_states(list(log.events()), 300, 512, targets)
    log.settle()  # the packed snapshots copied: still the same pools
    _assert_snapshots_exact(log)
    for seq in reversed(targets):  # scrubbing back, each from its nearest checkpoint
        assert_views_equal(view_of(log, seq), ref[seq])


def test_the_whole_trace_keeps_its_snapshots_in_under_half_the_bytes():
    log = _log(limit=3000, capacity=2000)
    log.build_checkpoints(every=1 << 15)
    assert len(log._cp_rows) >= 5
    _assert_snapshots_exact(log)
    assert sum(s.nbytes for s in log._cp_states) < 16 * log.num_blocks * len(log._cp_states) / 2


@pytest.mark.parametrize("values", [
    np.zeros(1000, np.int32),  # a constant: no bytes a value
    np.full(7, -1, np.int32),
    np.array([], np.int32),
    np.array([5], np.int32),
    np.r_[np.zeros(990, np.int32), np.arange(1, 11, dtype=np.int32)],  # mostly one value
    np.r_[np.zeros(990, np.int32), np.array([-2**31, 2**31 - 1] * 5, np.int32)],  # its others span all of int32
    np.arange(-1, 300_000, 7, dtype=np.int32),  # three bytes a value
    np.array([-2**31, 2**31 - 1, 0], np.int32),  # four
    np.array([0, 1 << 33, -(1 << 20)], np.int64),  # five
    np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64),  # eight
    np.random.default_rng(1).integers(-70_000, 70_000, 5000).astype(np.int32),
])
def test_packed_ints_read_back_exactly(values):
    packed = PackedInts(values)
    got = packed.whole()
    assert got.dtype == values.dtype and np.array_equal(got, values)
    assert np.array_equal(packed.fresh().whole(), values)
    assert packed.nbytes <= values.nbytes


def _places(*parts) -> np.ndarray:
    return np.concatenate([np.asarray(p, np.int64) for p in parts])


@pytest.mark.parametrize("free_pos", [
    np.arange(50, dtype=np.int64),  # the initial queue
    _places(np.arange(10), [FREE_ABSENT] * 3, TAIL_BASE + 2 * np.arange(100, 140, 3)),
    _places([-7, -5, -6], [FREE_ABSENT], TAIL_BASE + 2 * np.array([9, 4_000_000]) - 1,  # grown blocks
            TAIL_BASE + 2 * np.array([10, 11])),
    _places([FREE_ABSENT] * 4),  # nothing queued
    _places([FREE_ABSENT], TAIL_BASE + np.array([-1, 0])),  # born on row 0, freed on row 0
    _places([-(1 << 30)], TAIL_BASE + 2 * np.array([3, 1 << 31])),
    np.zeros(0, np.int64),
])
def test_free_queue_places_read_back_exactly(free_pos):
    n = len(free_pos)
    state = PoolArrays(3, 9, np.zeros(n, np.int32), np.full(n, -1, np.int32), free_pos, Counters())
    packed = PackedPool(state)
    assert np.array_equal(packed.free_pos, free_pos) and packed.free_pos.dtype == np.int64
    assert np.array_equal(packed.fresh().whole().free_pos, free_pos)


def test_the_check_fails_on_a_wrong_packing(monkeypatch):
    """Places remapped with the queue's absent code one off, or values packed a byte too
    narrow, are caught by the checks above."""
    log = _log(limit=300)
    pack = columnar._pack_places

    def absent_off(free_pos):
        codes, top, first_tail, absent = pack(free_pos)
        return codes, top, first_tail, absent + 1

    monkeypatch.setattr(columnar, "_pack_places", absent_off)
    log.build_checkpoints(every=997)
    with pytest.raises(AssertionError):
        _assert_snapshots_exact(log)
    monkeypatch.undo()
    init = PackedInts.__init__

    def narrow(self, values):
        init(self, values)
        if self.width > 1:
            self.width -= 1
            self.data = np.ascontiguousarray(self.data.reshape(-1, self.width + 1)[:, :self.width]).reshape(-1)

    monkeypatch.setattr(PackedInts, "__init__", narrow)
    log.build_checkpoints(every=997)
    with pytest.raises(AssertionError):
        _assert_snapshots_exact(log)
