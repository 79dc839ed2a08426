"""A removal map's FIFO is a ring (`_OrderedMap.fifo_room`): at the bound the head moves on
and the tail wraps round, no key's position rewritten; positions are int32 in an entry's
32-byte row, counted again from 0 near their limit. The maps must stay the reference's,
key for key, in order and value for value."""

from __future__ import annotations

import numpy as np

from engine.bench.attach import recorded_stream
from engine.remote import colpool
from tests.test_colpool_p2_fifo import _apply, _reference, _restoring_frames, _same_maps


def test_a_map_at_its_bound_wraps_round_its_ring_and_moves_no_key(monkeypatch):
    payloads, _, _ = recorded_stream(20_000, gpu_blocks=1_500, seed=8)
    pool, _, num_moved = _apply(payloads, 3_000, monkeypatch)
    assert len(pool.removed) == len(pool.departed_map) == 3_000
    for m in (pool.removed, pool.departed_map):
        assert len(m.fifo) & (len(m.fifo) - 1) == 0  # a power of two
        assert int(m.os[colpool.O_TAIL]) > 2 * len(m.fifo)  # wrapped round, more than once
    assert num_moved == 0  # (a FIFO of its own length moved the keys at its end: >= 2 here)
    _same_maps(pool, _reference(payloads, 3_000))


def test_an_entry_is_one_row_of_32_bytes_and_its_counts_are_read_whole(monkeypatch):
    payloads, _, _ = recorded_stream(6_000, gpu_blocks=800, seed=5)
    pool, _, _ = _apply(payloads, 1_000_000, monkeypatch)
    maps = pool.maps
    assert maps.k.dtype == np.uint64 and maps.k.shape[1] * 8 == 32
    assert maps.v.base is maps.k or maps.v.base is maps.k.base  # the same rows, as int32
    ref = _reference(payloads, 1_000_000)
    _same_maps(pool, ref)
    # a count past int32's range reads as the unsigned count it is, and removed_at's seq whole
    e = pool.departed_map.ordered()[0]
    maps.v[e, colpool.V_ANN] = np.int32(-2)  # 2**32 - 2 as uint32
    key = next(iter(pool.departed))
    assert pool.departed[key][0] == 2**32 - 2
    e = pool.removed.ordered()[0]
    maps.k[e, colpool.K_SEQ] = np.uint64(1 << 40)
    assert next(iter(pool.removed_at.values())) == (None, 1 << 40)


def test_positions_near_their_limit_are_counted_again_from_0(monkeypatch):
    """With a small limit the keys are moved to the start of a ring whenever the tail nears
    it: the maps stay the reference's, through holes and the bound."""
    monkeypatch.setattr(colpool, "POS_LIMIT", 5_000)
    payloads = _restoring_frames(4_000, 0.2, 11)
    pool, _, num_moved = _apply(payloads, 700, monkeypatch)
    assert num_moved >= 2 and all(int(m.os[colpool.O_TAIL]) < 5_000 for m in (pool.removed, pool.departed_map))
    _same_maps(pool, _reference(payloads, 700))


def test_holes_in_a_ring_at_its_bound_keep_the_maps_in_order(monkeypatch):
    """Keys stored again leave removed_at (holes in its ring) while the ring wraps round at
    the bound; a window grown past the ring's length with holes in it moves the keys."""
    for restore, bound in ((0.05, 400), (0.4, 400), (0.4, 1_000_000)):
        payloads = _restoring_frames(5_000, restore, 4)
        pool, _, _ = _apply(payloads, bound, monkeypatch)
        _same_maps(pool, _reference(payloads, bound))
