"""The columnar pool's (tier, hash) table keeps each entry's displacement (how far past its
home it sits, saturated at 2**bits - 1) beside the fingerprint, so that a backward-shift
deletion moves entries back without reading their slots' rows. Every entry's displacement
is exact (or saturated when at least that far), and pools whose tables keep 4, 2 or no
displacement bits give the reference pool on streams that evict all along."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.pool import RemotePool
from tests.test_colpool import _synthetic, state


def _displacements_are_exact(pool: ColumnarPool) -> int:
    """Check every entry's displacement against its slot's home; how many are saturated."""
    size = len(pool.tab) - 1
    sb = int(pool.tab[-1])
    db = max(0, min(4, 24 - sb))
    dmax = (1 << db) - 1
    saturated = 0
    for i in np.flatnonzero(pool.tab[:-1]).tolist():
        e = int(pool.tab[i])
        s = (e & ((1 << sb) - 1)) - 1
        x = colpool._mix(pool.K[s, 0], pool.F[s, colpool.F_W], np.int64(pool.F[s, colpool.F_TIER]) - 1)
        d = (i - int(colpool._home(np.uint64(x), size))) % size
        assert (e >> sb) & dmax == min(d, dmax), (i, d)
        saturated += d >= dmax
    return saturated


@pytest.mark.parametrize("slot_bits", [None, 22, 31])  # 4 displacement bits (its own), 2, none
def test_bench_frames_give_the_reference_pool_with_exact_displacements(slot_bits):
    payloads, _, _ = recorded_stream(3_000, gpu_blocks=600, seed=11)  # evictions all along
    ref = RemotePool("t", max_removed=700)
    col = ColumnarPool("t", max_removed=700, capacity=8192)  # (room for the stream: no new table)
    if slot_bits is not None:
        col.tab[-1] = slot_bits  # fewer fingerprint and displacement bits (the slots fit either way)
    for i in range(0, len(payloads), 16):
        col.apply_many(fastwire.decode_columns_many(i, payloads[i:i + 16]))
        for seq in range(i, min(i + 16, len(payloads))):
            ref.apply(fastwire.decode_batch(seq, payloads[seq]))
    assert len(col.F) == 8192 and int(col.tab[-1]) == (slot_bits or (len(col.tab) - 1).bit_length())
    saturated = _displacements_are_exact(col)
    assert saturated == (col.num_cached if slot_bits == 31 else saturated)
    if slot_bits == 22:
        assert saturated > 0  # entries 3 or more past their homes: their rows read on a deletion
    assert state(col) == state(ref)


@pytest.mark.parametrize("seed", range(2))
def test_synthetic_frames_give_the_reference_pool_with_exact_displacements(seed):
    frames = _synthetic(300, seed)
    ref, col = RemotePool("t"), ColumnarPool("t")
    for seq, payload in frames:
        ref.apply(fastwire.decode_batch(seq, payload))
        col.apply(fastwire.decode_columns(seq, payload))
    _displacements_are_exact(col)
    assert state(col) == state(ref)
