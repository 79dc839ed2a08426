"""The compiled placer's table of hashes keeps a 32-bit tag per entry and reads the rest of
the key from the holder's record (`engine.core.live_journal._ht_slot`): hashes whose tags are
equal stay apart, against the Python reference (`_place`), through stores, parents and removals."""

from __future__ import annotations

import numpy as np

from engine.core.live_journal import OP_REMOVED, OP_STORED, _CompiledPlacer, _compiled, _place, _Placer

MIX = 0x9E3779B97F4A7C15  # _ht_tag's multiplier
MASK64 = (1 << 64) - 1


def _tag(code: int, wide: int) -> int:
    """`_ht_tag` in Python (unsigned arithmetic; the compiled one wraps int64 alike)."""
    h = (code * MIX + wide) & MASK64
    h -= (h >> 63) << 64  # as int64, for the arithmetic shift
    return (h ^ (h >> 29)) & 0xFFFFFFFF


def _same_tag(code: int) -> int:
    """Another code whose mixed value differs only in bit 61: the same tag, the same home."""
    return (code + (1 << 61) * (pow(MIX, -1, 1 << 64) % 8)) & MASK64


def test_hashes_with_one_tag_stay_apart():
    assert _compiled()
    a = 0x0123456789ABCDEF
    b, c = _same_tag(a), _same_tag(_same_tag(a))
    assert len({a, b, c}) == 3 and _tag(a, 1) == _tag(b, 1) == _tag(c, 1)
    # stores of a, b, c (tenants 1, 2, 3), stores under each of them, a removal of a's copy,
    # then stores under a (no holder now: its own tenant), b and c again
    ops = [OP_STORED] * 6 + [OP_REMOVED] + [OP_STORED] * 3
    slots = [0, 1, 2, 3, 4, 5, 0, 6, 7, 8]
    codes = [a, b, c, 11, 12, 13, a, 14, 15, 16]
    parents = [None, None, None, a, b, c, None, a, b, c]
    tenants = [1, 2, 3, 7, 7, 7, 0, 9, 9, 9]
    n = len(ops)
    ref = _place(_Placer(), 0, ops, slots, list(range(n)), 3, [0] * n, 0, [(k, 1) for k in codes],
                 [(p, 1) if p is not None else None for p in parents], tenants)
    placer = _CompiledPlacer()
    got = placer.place(
        0, np.array(ops, np.int64), np.array(slots, np.int64), np.arange(n, dtype=np.int64),
        np.array(codes, np.uint64).view(np.int64), np.ones(n, np.int64),
        np.array([p or 0 for p in parents], np.uint64).view(np.int64),
        np.array([1 if p is not None else 0 for p in parents], np.int64), np.array(tenants, np.int64),
        np.zeros(n, np.int64), 3, 0)
    assert list(ref[1]) == [1, 2, 3, 1, 2, 3, 9, 2, 3]  # the reference's tenants, each parent's own
    assert got[1].tolist() == list(ref[1])
    cols = [0, 1, 2, 3, 4, 7]
    assert got[0][:, cols].tolist() == ref[0][:, cols].tolist() and got[3] == ref[3]
    assert int(placer.state[5]) == 8  # b, c and the six stores under them held; a's copy gone
