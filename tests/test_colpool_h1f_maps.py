"""Where the removal maps (removed_at, departed) stop holding the same keys in the same
order, as vLLM's streams keep them: a key stored again (out of removed_at only), a key new
to departed alone (a removal of another KV cache group), and a key named again in one
removal after departed, which drops its oldest key by key, dropped it (removed_at drops its
own only at the removal's end: the reference's fast path). Any form that shares work
between the maps while they agree must split exactly there; the maps and the pool are
checked against the reference after every frame, one frame at a time and in runs, and
the streams are checked to part the reference's maps exactly where they say."""

from __future__ import annotations

import pytest

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmBatch, VllmEvent, encode_batch
from tests.test_colpool import state
from tests.test_fastwire import FIXTURES


def _h(i: int) -> bytes:
    return (i * 0x9E3779B97F4A7C15 % (1 << 64)).to_bytes(8, "big")


def _same_maps(pool: ColumnarPool, ref: RemotePool) -> None:
    assert list(pool.removed_at.items()) == list(ref.removed_at.items())
    assert list(pool.departed.items()) == list(ref.departed.items())
    for h in list(ref.departed)[::5]:
        assert pool.departed_map.get(*pool._key(h)) == tuple(ref.departed[h])
        assert pool.removal_of(h) == ref.removed_at.get(h)
    assert len(pool.maps) == len(set(ref.removed_at) | set(ref.departed))


def _check(frames: list, max_removed: int, run: int = 16) -> list[bool]:
    """Apply `frames` ((seq, payload) pairs or `VllmBatch`es) to the reference and to two
    columnar pools (one frame at a time, and `run` frames at a time); every frame's maps
    and pool the reference's. Whether the reference's maps held the same keys in the same
    order after each frame."""
    ref = RemotePool("t", max_removed=max_removed)
    one, many = ColumnarPool("t", max_removed=max_removed), ColumnarPool("t", max_removed=max_removed)
    alike = []
    batches = [f if isinstance(f, VllmBatch) else fastwire.decode_batch(*f) for f in frames]
    cols = [f if isinstance(f, VllmBatch) else fastwire.decode_columns(*f) for f in frames]
    for b, c in zip(batches, cols):
        ref.apply(b)
        one.apply(c)
        _same_maps(one, ref)
        alike.append(list(ref.removed_at) == list(ref.departed))
    for i in range(0, len(cols), run):
        many.apply_many(cols[i:i + run])
    want = state(ref)
    assert state(one) == want
    assert state(many) == want
    _same_maps(many, ref)
    return alike


def _frames(*steps: list[VllmEvent], batches: bool = False) -> list:
    """One frame a step; `batches`: as `VllmBatch`es (a removal's group, which vLLM 0.33's
    frames leave out, kept)."""
    if batches:
        return [VllmBatch(seq, 1.0 + seq, tuple(events), 0) for seq, events in enumerate(steps)]
    return [(seq, encode_batch(1.0 + seq, list(events), 0)) for seq, events in enumerate(steps)]


def _removed(keys, **kw) -> VllmEvent:
    return VllmEvent("BlockRemoved", tuple(_h(i) for i in keys), **kw)


def _stored(keys, **kw) -> VllmEvent:
    return VllmEvent("BlockStored", tuple(_h(i) for i in keys), None, tuple(range(16 * len(keys))), 16, **kw)


def test_a_recorded_stream_keeps_the_maps_alike_past_the_bound():
    payloads, _, _ = recorded_stream(6_000, gpu_blocks=300)
    frames = list(enumerate(payloads))
    alike = _check(frames, 500, run=64)
    assert all(alike)
    pool = ColumnarPool("t", max_removed=500)
    pool.apply_many([fastwire.decode_columns(seq, p) for seq, p in frames])
    assert len(pool.removed) == 500 and pool.num_removed > 2_000  # the bound dropped keys


@pytest.mark.parametrize("name", sorted(FIXTURES))
@pytest.mark.parametrize("max_removed", [3, 200_000])
def test_every_fixture_gives_the_reference_maps(name, max_removed):
    _check(FIXTURES[name], max_removed, run=7)


def test_a_key_stored_again_parts_the_maps():
    frames = _frames([_stored(range(1, 9))], [_removed(range(1, 9))], [_removed([20, 21])],
                     [_stored([4, 6])], [_removed([30, 31, 32])], [_removed([4, 40, 41, 42, 43, 44, 45])],
                     [_removed(range(50, 60))])
    alike = _check(frames, 6)
    assert alike == [True, True, True, False, True, True, True]  # alike again once 6 left both


def test_a_key_new_to_departed_alone_parts_the_maps():
    # hash 3 held in group 0: a removal of group 1 counts it in departed, not removed_at
    frames = _frames([_stored(range(1, 6))], [_removed([1, 2])], [_removed([2], group_idx=1)],
                     [_removed([3], group_idx=1)], [_removed([4, 5, 60, 61])], [_removed(range(70, 80))],
                     batches=True)
    alike = _check(frames, 4)
    assert alike == [True, True, True, False, True, True]


@pytest.mark.parametrize("again, parts", [(1, True), (2, True), (3, False), (5, False), (6, False)])
def test_a_key_named_again_in_one_removal_parts_the_maps_only_once_departed_dropped_it(again, parts):
    # the maps hold 1..5 at their bound of 5; one removal names 6, 7 (departed drops 1, then
    # 2, removed_at keeps them until the removal ends) and then `again`
    frames = _frames([_removed(range(1, 6))], [_removed([6, 7, again])], [_removed([8, 1, 9])],
                     [_removed(range(20, 27))])
    alike = _check(frames, 5)
    assert alike == ([True, False, False, True] if parts else [True] * 4)


def test_a_key_named_twice_within_the_bound_keeps_the_maps_alike():
    frames = _frames([_removed(range(1, 4))], [_removed([4, 2, 4, 1])], [_removed([9, 9, 10, 3, 11])])
    assert _check(frames, 5) == [True, True, True]


def test_clears_and_group_removals_of_keys_in_both_keep_the_maps_alike():
    # a cleared tier and removals of group 1's copies trim both maps key by key (no key
    # new to one map alone): they stay alike
    frames = _frames([_stored(range(1, 7)), _stored(range(10, 14), medium="CPU")],
                     [_removed([1, 2])], [VllmEvent("AllBlocksCleared", medium="CPU")],
                     [_stored([20, 21], group_idx=1)], [_removed([20, 21], group_idx=1)],
                     [_removed(range(3, 7))], [VllmEvent("AllBlocksCleared")], batches=True)
    alike = _check(frames, 5)
    assert all(alike)
