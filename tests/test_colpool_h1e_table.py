"""The removal maps' table under collisions: hashes crafted to share one home at the table's
end, so their run wraps around it, stored, removed, stored again and dropped at the bound
in an order that deletes from the middle of the run, and a deletion whose hole waits behind
entries at their own homes; the pool and both maps stay the reference's, in runs and one
frame at a time, and every key is found through the table. The homes are computed here (a
numpy copy of `_om_hash`, checked against it): a new table format changes `_om_home` and
`_table_entries`, not the streams."""

from __future__ import annotations

import numpy as np

from engine.remote import colpool, fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import state

TABLE = 2048  # the maps' table at their first 1,024 entries (a load of at most 1/2)
MAX_REMOVED = 200


def _om_home(keys: np.ndarray, mask: int) -> np.ndarray:
    """`colpool._om_hash(k, W_U64) & mask` for many keys at once (numpy's uint64 wraps as the
    compiled code does)."""
    with np.errstate(over="ignore"):
        x = keys ^ (np.uint64(colpool.W_U64) << np.uint64(56))  # (t + 1 = 0: no tier term)
        for m in (colpool._M1, colpool._M2):
            x ^= x >> np.uint64(33)
            x *= m
        x ^= x >> np.uint64(33)
    return (x & np.uint64(0x7FFFFFFF) & np.uint64(mask)).astype(np.int64)


def test_the_homes_here_are_the_maps_own():
    keys = np.arange(1, 50, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    want = [colpool._om_hash(k, np.uint8(colpool.W_U64)) & (TABLE - 1) for k in keys]
    assert _om_home(keys, TABLE - 1).tolist() == want


def _table_entries(pool: ColumnarPool) -> tuple[np.ndarray, np.ndarray]:
    """Where the maps' table holds an entry, and the entry (its row) there."""
    tab = pool.maps.tab
    at = np.flatnonzero(tab >= 0)
    return at, tab[at] & 0xFFFFFFFF


def _crafted() -> tuple[list[bytes], list[bytes]]:
    """60 hashes whose home is the table's fourth entry from its end, and 400 others."""
    keys = np.arange(1, 3_000_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    homes = _om_home(keys, TABLE - 1)
    same = keys[homes == TABLE - 4][:60]
    others = keys[homes < TABLE - 64][:400]
    assert len(same) == 60
    as_bytes = lambda a: [int(k).to_bytes(8, "big") for k in a]
    return as_bytes(same), as_bytes(others)


def _frames() -> list[bytes]:
    same, others = _crafted()
    frames = []

    def frame(*events: VllmEvent) -> None:
        frames.append(encode_batch(1.0 + len(frames), list(events), 0))

    # the colliding hashes leave GPU without ever being stored (both maps), then a few others
    frame(VllmEvent("BlockRemoved", tuple(same[:40])))
    frame(VllmEvent("BlockRemoved", tuple(others[:20])))
    # some of them stored again (out of removed_at, from the middle of the run), then removed
    frame(VllmEvent("BlockStored", tuple(same[5:25:2]), None, tuple(range(10 * 16)), 16))
    frame(VllmEvent("BlockRemoved", tuple(same[9:25:4])), VllmEvent("BlockRemoved", tuple(same[40:])))
    # the bound: the oldest (the run's first entries) dropped while the others come in
    for i in range(20, 400, 30):
        frame(VllmEvent("BlockRemoved", tuple(others[i:i + 30])))
        if i == 200:
            frame(VllmEvent("BlockStored", tuple(same[40:50]), None, tuple(range(10 * 16)), 16, medium="CPU"),
                  VllmEvent("BlockRemoved", tuple(same[40:50]), medium="CPU"))
    frame(VllmEvent("BlockRemoved", tuple(same[::3])))
    return frames


def _longest_displacement(pool: ColumnarPool) -> int:
    at, e = _table_entries(pool)
    homes = _om_home(pool.maps.k[e, colpool.K_KEY], TABLE - 1)
    return int(((at - homes) % TABLE).max())


def test_a_run_of_colliding_hashes_past_the_displacement_bits_gives_the_reference_maps():
    frames = _frames()
    ref = RemotePool("t", max_removed=MAX_REMOVED)
    for seq, p in enumerate(frames):
        ref.apply(fastwire.decode_batch(seq, p))
    one, many = ColumnarPool("t", max_removed=MAX_REMOVED), ColumnarPool("t", max_removed=MAX_REMOVED)
    seen = 0
    for seq, p in enumerate(frames):
        one.apply(fastwire.decode_columns(seq, p))
        if seq == 3:  # every colliding hash in the table: the run wraps, far past 15 entries
            assert len(one.maps.tab) == TABLE
            seen = _longest_displacement(one)
    assert seen >= 50
    cols = [fastwire.decode_columns(seq, p) for seq, p in enumerate(frames)]
    for i in range(0, len(cols), 5):
        many.apply_many(cols[i:i + 5])
    want = state(ref)
    assert len(ref.removed_at) == MAX_REMOVED and len(ref.departed) == MAX_REMOVED
    assert state(one) == want
    assert state(many) == want
    for pool in (one, many):
        assert len(pool.maps) == len(set(ref.removed_at) | set(ref.departed))
        assert len(_table_entries(pool)[0]) == len(pool.maps)
        for h, v in ref.departed.items():
            assert pool.departed_map.get(*pool._key(h)) == tuple(v)
        for h, v in ref.removed_at.items():
            assert pool.removed.get(*pool._key(h)) == (v[1], 0)
        same, _ = _crafted()
        gone = [h for h in same if h not in ref.departed and h not in ref.removed_at]
        assert gone and all(pool.departed_map.get(*pool._key(h)) is None for h in gone)


def _held_apart_frames() -> tuple[list[bytes], bytes]:
    """A hash at its home H, one hash at each of the next 16 entries' homes, then a second
    hash of home H (17 past it: past 4 bits of displacement); the first leaves the maps at
    the bound, so the deletion's hole waits behind 16 entries that cannot move and the last
    must move 17 back. Then the maps keep going past the bound."""
    keys = np.arange(1, 3_000_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    homes = _om_home(keys, TABLE - 1)
    home = TABLE - 8  # (the run wraps around the table's end)
    run = [keys[homes == (home + i) % TABLE][0] for i in range(17)] + [keys[homes == home][1]]
    others = keys[(homes > 64) & (homes < TABLE - 64)][:MAX_REMOVED + 100]
    as_bytes = lambda a: [int(k).to_bytes(8, "big") for k in a]
    run, others = as_bytes(run), as_bytes(others)
    events = [VllmEvent("BlockRemoved", tuple(run)), VllmEvent("BlockRemoved", tuple(others[:MAX_REMOVED - 17])),
              VllmEvent("BlockRemoved", tuple(others[MAX_REMOVED - 17:MAX_REMOVED - 7]))]
    return [encode_batch(1.0 + i, [e], 0) for i, e in enumerate(events)], run[-1]


def test_a_saturated_entry_moves_back_past_entries_that_stay_at_their_homes():
    frames, last = _held_apart_frames()
    ref = RemotePool("t", max_removed=MAX_REMOVED)
    for seq, p in enumerate(frames):
        ref.apply(fastwire.decode_batch(seq, p))
    assert last in ref.departed and last in ref.removed_at
    one, many = ColumnarPool("t", max_removed=MAX_REMOVED), ColumnarPool("t", max_removed=MAX_REMOVED)
    for seq, p in enumerate(frames):
        one.apply(fastwire.decode_columns(seq, p))
        if seq == 0:
            assert len(one.maps.tab) == TABLE and _longest_displacement(one) == 17
    many.apply_many([fastwire.decode_columns(seq, p) for seq, p in enumerate(frames)])
    want = state(ref)
    for pool in (one, many):
        assert state(pool) == want
        for h, v in ref.departed.items():
            assert pool.departed_map.get(*pool._key(h)) == tuple(v)
        assert pool.removed.get(*pool._key(last)) == (ref.removed_at[last][1], 0)
