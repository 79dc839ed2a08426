"""The columnar pool's (tier, hash) table: uint32 entries holding a fingerprint of the hash
beside its slot (an absent hash is found absent from the table alone), and the pre-touch
pass that reads a run's entries and rows before the run uses them. Held to the reference
`RemotePool` where fingerprints collide at every other entry, with extreme hashes, and
shown to read only."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import _synthetic, state


def _one_bit_table(pool: ColumnarPool) -> None:
    """Give an empty pool's table 1 fingerprint bit (31 slot bits): half of the entries a
    probe passes share the hash's fingerprint, so the slot rows decide."""
    assert pool.num_cached == 0
    pool.tab[-1] = 31


def _both(frames: list[tuple[int, bytes]], max_removed: int = 200_000, one_bit: bool = True,
          many: int = 16, seed: int = 0) -> tuple[dict, dict]:
    ref = RemotePool("t", max_removed=max_removed)
    col = ColumnarPool("t", max_removed=max_removed)
    if one_bit:
        _one_bit_table(col)
    rng = random.Random(seed)
    held = []
    for seq, payload in frames:
        ref.apply(fastwire.decode_batch(seq, payload))
        held.append(fastwire.decode_columns(seq, payload))
        if len(held) >= rng.randint(1, many):
            col.apply_many(held)
            held = []
    col.apply_many(held)
    return state(col), state(ref)


def test_the_table_holds_a_fingerprint_beside_the_slot():
    pool = ColumnarPool("t")
    bits = int(pool.tab[-1])
    size = len(pool.tab) - 1
    assert 1 << (bits - 1) <= size < 1 << bits  # the fewest bits that hold size + 1
    payloads, _, _ = recorded_stream(300, gpu_blocks=10_000)
    pool.apply_many([fastwire.decode_columns(s, p) for s, p in enumerate(payloads)])
    tab = pool.tab[:-1].astype(np.int64)
    used = tab[tab != 0]
    assert len(used) == pool.num_cached and int(pool.tab[-1]) == (len(pool.tab) - 1).bit_length()
    slots = (used & ((1 << int(pool.tab[-1])) - 1)) - 1
    assert sorted(slots.tolist()) == np.flatnonzero(pool.F[:, colpool.F_TIER] > 0).tolist()
    fps = used >> int(pool.tab[-1])
    assert len(set(fps.tolist())) > 1  # fingerprints are there, not all zero


def test_bench_frames_with_colliding_fingerprints_give_the_reference_pool():
    payloads, _, _ = recorded_stream(4_000, gpu_blocks=600, seed=7)  # evictions all along
    frames = list(enumerate(payloads))
    col, ref = _both(frames, max_removed=700)
    assert col == ref
    col, ref = _both(frames, max_removed=700, one_bit=False, many=64, seed=1)
    assert col == ref


@pytest.mark.parametrize("seed", range(3))
def test_synthetic_frames_with_colliding_fingerprints_give_the_reference_pool(seed):
    frames = _synthetic(300, seed)
    col, ref = _both(frames, seed=seed)
    assert col == ref


def test_extreme_hashes_give_the_reference_pool():
    """Hashes 0, 1, 2**63, 2**64 - 1 and neighbours (vLLM's unsigned 64-bit values) stored,
    stored again, removed and stored once more, on GPU and CPU."""
    edge = [0, 1, 2, (1 << 63) - 1, 1 << 63, (1 << 63) + 1, (1 << 64) - 2, (1 << 64) - 1]
    h = [v.to_bytes(8, "big") for v in edge]
    steps = [
        [VllmEvent("BlockStored", tuple(h[:4]), None, tuple(range(64)), 16),
         VllmEvent("BlockStored", tuple(h[4:]), h[3], tuple(range(64, 128)), 16, medium="CPU")],
        [VllmEvent("BlockStored", tuple(h[:4]), None, tuple(range(64)), 16),  # vLLM's reuse report
         VllmEvent("BlockRemoved", (h[0], h[7], h[5]), medium="GPU")],
        [VllmEvent("BlockRemoved", (h[7], h[6]), medium="CPU"),
         VllmEvent("BlockStored", (h[7], h[0]), h[1], tuple(range(32)), 16)],
        [VllmEvent("BlockRemoved", tuple(h), medium="GPU"), VllmEvent("BlockRemoved", tuple(h), medium="CPU")],
    ]
    frames = [(i, encode_batch(1.0 + i, step, 0)) for i, step in enumerate(steps)]
    for one_bit in (True, False):
        col, ref = _both(frames, one_bit=one_bit, many=2)
        assert col == ref
    assert _both(frames[:-1])[0] != _both(frames)[1]  # the comparison can fail


def test_the_pretouch_pass_reads_only():
    payloads, _, _ = recorded_stream(2_000, gpu_blocks=500, seed=2)
    batches = [fastwire.decode_columns(s, p) for s, p in enumerate(payloads)]
    pool = ColumnarPool("t", max_removed=300)
    pool.apply_many(batches[:100])
    run = batches[100:140]
    rows = np.concatenate([b.rows for b in run])
    keys = np.concatenate([b.keys for b in run])
    parents = np.concatenate([b.parents for b in run])
    nk = np.array([len(b.keys) for b in run])
    rows[:, fastwire.R_HASH0] += np.repeat(np.cumsum(nk) - nk, [len(b.rows) for b in run])
    arrays = {name: getattr(pool, name).copy() for name in ("tab", "K", "L", "C", "F", "S")}
    maps = [(m, [a.copy() for a in (m.tab, m.k, m.w, m.v, m.fifo, m.os)]) for m in (pool.removed, pool.departed_map)]
    ra, dp = ((m.tab, m.k, m.w, m.v, m.fifo, m.os) for m in (pool.removed, pool.departed_map))
    assert len(pool.removed) == 300 and len(pool.departed_map) == 300  # full: the removals drop the oldest
    colpool._pretouch(pool.tab, pool.K, pool.L, pool.C, pool.F, *ra, *dp, rows, parents, keys, 0, len(rows))
    for name, before in arrays.items():
        assert np.array_equal(getattr(pool, name), before), name
    for m, before in maps:
        assert all(np.array_equal(a, b) for a, b in zip((m.tab, m.k, m.w, m.v, m.fifo, m.os), before))


def test_a_pool_larger_than_one_table_is_refused_in_one_sentence():
    with pytest.raises(ValueError, match="more than one table holds"):
        ColumnarPool._new_table(1 << 31)
