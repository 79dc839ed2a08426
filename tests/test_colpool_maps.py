"""The columnar pool's ordered maps (removed_at, departed) as they grow, rebuild their
table and compact their FIFO: still the reference's, entry for entry and in order."""

from __future__ import annotations

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.pool import RemotePool
from tests.test_colpool import state


def test_grown_removal_maps_give_the_reference_pool():
    payloads, _, num_ops = recorded_stream(6_000, gpu_blocks=200, seed=7)
    ref = RemotePool("t", max_removed=3_000)
    pool = ColumnarPool("t", max_removed=3_000)
    batches = []
    for seq, p in enumerate(payloads):
        ref.apply(fastwire.decode_batch(seq, p))
        batches.append(fastwire.decode_columns(seq, p))
    for i in range(0, len(batches), 64):
        pool.apply_many(batches[i:i + 64])
    # the maps began at 1,024 entries: they grew (a new table) and dropped their oldest
    assert len(pool.removed) == len(ref.removed_at) == 3_000
    assert len(pool.departed_map) == len(ref.departed) == 3_000
    assert len(pool.removed.k) > 1_024
    assert state(pool) == state(ref)
    # and every hash the maps hold is found through the table, not only listed in order
    for h, (_, seq) in list(ref.removed_at.items())[::97]:
        assert pool.removal_of(h) == (None, seq)
