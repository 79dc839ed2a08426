"""The columnar pool's two removal maps (removed_at, departed) share one set of entries:
keys stored again after they left (out of removed_at, still in departed), removed again
(back last in removed_at, in place in departed), dropped by one map's bound while the other
keeps them, removals of one KV cache group and of hashes never held, a cleared tier. The
maps must stay the reference's, key for key and in order, one frame at a time and in runs."""

from __future__ import annotations

import random

from engine.remote import fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import state


def _h(i: int) -> bytes:
    return (i * 0x9E3779B97F4A7C15 % (1 << 64)).to_bytes(8, "big")


def _frames(num_frames: int, seed: int) -> list[bytes]:
    """Chains stored on GPU and CPU, removed, stored again and removed again; a few hashes
    never stored, removals of KV cache group 1 (a copy there or not), the CPU tier cleared."""
    rng = random.Random(seed)
    held = {"GPU": [], "CPU": []}
    gone: list[tuple[str, int]] = []
    fresh = 1
    frames = []
    for f in range(num_frames):
        events = []
        for _ in range(rng.randint(1, 3)):
            medium = "CPU" if rng.random() < 0.3 else "GPU"
            if gone and rng.random() < 0.5:  # hashes that left, stored again
                n = rng.randint(1, min(4, len(gone)))
                back = [gone.pop(rng.randrange(len(gone))) for _ in range(n)]
                keys = [i for _, i in back]
            else:
                keys = list(range(fresh, fresh + rng.randint(1, 4)))
                fresh += len(keys)
            group = 1 if rng.random() < 0.1 else None
            events.append(VllmEvent("BlockStored", tuple(_h(i) for i in keys), None, tuple(range(16 * len(keys))), 16,
                                    medium=medium, group_idx=group))
            held[medium].extend(keys)
        for medium in ("GPU", "CPU"):
            if len(held[medium]) > 6 and rng.random() < 0.8:
                n = rng.randint(1, 5)
                out = [held[medium].pop(rng.randrange(len(held[medium]))) for _ in range(n)]
                extra = [10**7 + f] if rng.random() < 0.2 else []  # never stored
                group = 1 if rng.random() < 0.15 else None
                events.append(VllmEvent("BlockRemoved", tuple(_h(i) for i in out + extra), medium=medium,
                                        group_idx=group))
                gone.extend((medium, i) for i in out)
        if f % 97 == 96:
            events.append(VllmEvent("AllBlocksCleared", medium="CPU"))
            gone.extend(("CPU", i) for i in held["CPU"])
            held["CPU"] = []
        frames.append(encode_batch(1.0 + f, events, 0))
    return frames


def _check(frames: list[bytes], max_removed: int) -> ColumnarPool:
    ref = RemotePool("t", max_removed=max_removed)
    for seq, p in enumerate(frames):
        ref.apply(fastwire.decode_batch(seq, p))
    cols = [fastwire.decode_columns(seq, p) for seq, p in enumerate(frames)]
    one, many = ColumnarPool("t", max_removed=max_removed), ColumnarPool("t", max_removed=max_removed)
    for c in cols:
        one.apply(c)
    for i in range(0, len(cols), 16):
        many.apply_many(cols[i:i + 16])
    want = state(ref)
    for pool in (one, many):
        assert state(pool) == want
        assert list(pool.removed_at.items()) == list(ref.removed_at.items())
        assert list(pool.departed.items()) == list(ref.departed.items())
        for h in list(ref.departed)[::3]:
            assert pool.departed_map.get(*pool._key(h)) == tuple(ref.departed[h])
            assert pool.removal_of(h) == ref.removed_at.get(h)
    return many


def test_maps_that_hold_different_keys_are_the_reference_maps():
    frames = _frames(1_200, 3)
    ref = RemotePool("t", max_removed=60)
    union = only_ra = only_dp = 0
    for seq, p in enumerate(frames):
        ref.apply(fastwire.decode_batch(seq, p))
        ra, dp = set(ref.removed_at), set(ref.departed)
        union, only_ra, only_dp = max(union, len(ra | dp)), max(only_ra, len(ra - dp)), max(only_dp, len(dp - ra))
    # the maps diverge: keys stored again left removed_at only, and departed dropped keys
    # removed_at still holds (their first departure was older than their last removal)
    assert only_ra and only_dp and union > 60
    pool = _check(frames, 60)
    assert len(pool.maps) <= 120  # one entry for a key in either map, or both


def test_unbounded_maps_are_the_reference_maps():
    pool = _check(_frames(400, 5), 200_000)
    assert len(pool.departed_map) > len(pool.removed) > 0
