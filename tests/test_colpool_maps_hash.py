"""A key's hash computed once and handed on (the table's probe to its insertion and
deletion, one map hash to both removal maps): a CPU tier's blocks stored, removed, cleared
and stored again, the pool and its maps still the reference's, in runs and one at a time."""

from __future__ import annotations

from engine.remote import fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import state


def _h(i: int) -> bytes:
    return (i * 0x9E3779B97F4A7C15 % (1 << 64)).to_bytes(8, "big")


def _frames() -> list[bytes]:
    """Chains on GPU and CPU, removals of held and never-held hashes on both (both maps), the CPU
    tier cleared with hundreds of blocks on it (each slot leaves the table by its tier's
    hash), then the same hashes stored on CPU again (found through the table and the maps)."""
    frames = []
    for f in range(40):
        events = []
        for c in range(4):
            base = 1 + (f * 4 + c) * 8
            medium = "CPU" if c % 2 else "GPU"
            events.append(VllmEvent("BlockStored", tuple(_h(base + j) for j in range(8)), None,
                                    tuple(range(8 * 16)), 16, medium=medium))
        if f % 3 == 2:  # the oldest chain of this frame leaves, and two hashes never stored
            events.append(VllmEvent("BlockRemoved", tuple(_h(1 + f * 32 + j) for j in range(8))
                                    + (_h(10**6 + f), _h(10**6 + f + 1))))
            events.append(VllmEvent("BlockRemoved", tuple(_h(9 + f * 32 + j) for j in range(4)), medium="CPU"))
        if f == 25:
            events.append(VllmEvent("AllBlocksCleared", medium="CPU"))
        if f > 30:  # back on CPU: hashes the clear sent to the maps
            events.append(VllmEvent("BlockStored", tuple(_h(9 + (f - 31) * 32 + j) for j in range(8)), None,
                                    tuple(range(8 * 16)), 16, medium="CPU"))
        frames.append(encode_batch(1.0 + f, events, 0))
    return frames


def test_a_cleared_cpu_tier_and_its_hashes_stored_again_give_the_reference_pool():
    frames = _frames()
    ref = RemotePool("t", max_removed=150)
    for seq, p in enumerate(frames):
        ref.apply(fastwire.decode_batch(seq, p))
    assert ref.num_cleared and 0 < len(ref.removed_at) <= 150 and ref.num_cached_in("CPU")
    one, many = ColumnarPool("t", max_removed=150), ColumnarPool("t", max_removed=150)
    for seq, p in enumerate(frames):
        one.apply(fastwire.decode_columns(seq, p))
    cols = [fastwire.decode_columns(seq, p) for seq, p in enumerate(frames)]
    for i in range(0, len(cols), 7):
        many.apply_many(cols[i:i + 7])
    want = state(ref)
    assert state(one) == want
    assert state(many) == want
    for h in list(ref.departed)[::5]:
        assert many.departed_map.get(*many._key(h)) == tuple(ref.departed[h])
