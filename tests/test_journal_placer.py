"""The journal route's compiled placer (`engine.core.live_journal._CompiledPlacer`) against
its Python reference (`_place`): hashes whose codes differ only in their top bits stay apart
(a parent's holder gives a store its tenant), and its table of hashes grows past its first
size with every holder still found."""

from __future__ import annotations

import numpy as np

from engine.core.live_journal import OP_REMOVED, OP_STORED, _CompiledPlacer, _compiled, _place, _Placer


def _both(ops, slots, codes, parents, tenants):
    n = len(ops)
    keys = list(range(n))
    stores = [0] * n
    ref = _place(_Placer(), 0, list(ops), list(slots), keys, 3, stores, 0, [(c, 1) for c in codes],
                 [(p, 1) if p is not None else None for p in parents], list(tenants))
    got = _CompiledPlacer().place(
        0, np.array(ops, np.int64), np.array(slots, np.int64), np.array(keys, np.int64),
        np.array(codes, np.uint64).view(np.int64), np.ones(n, np.int64),
        np.array([p or 0 for p in parents], np.uint64).view(np.int64),
        np.array([1 if p is not None else 0 for p in parents], np.int64), np.array(tenants, np.int64),
        np.array(stores, np.int64), 3, 0)
    return ref, got


COLS = [0, 1, 2, 3, 4, 7]  # kind, event, event, block, hash id, flag (the rest the commit fills)


def test_codes_that_differ_in_their_top_bits_are_other_hashes():
    assert _compiled()
    a = 0x0123456789ABCDEF
    b = a ^ (1 << 60)  # a * 256 and b * 256 wrap to one 64-bit key
    ref, got = _both([OP_STORED, OP_STORED, OP_STORED], [0, 1, 2], [a, b, 77], [None, None, b], [5, 7, 9])
    assert list(ref[1]) == [5, 7, 7]  # the store under b takes b's holder's tenant
    assert got[1].tolist() == list(ref[1])
    assert got[0][:, COLS].tolist() == ref[0][:, COLS].tolist()


def test_the_table_grows_and_finds_every_holder():
    rng = np.random.default_rng(3)
    n = 5000  # past the first table's 1,024 entries several times
    codes = [int(c) for c in rng.integers(1, 1 << 63, n, dtype=np.int64)]
    parents = [codes[int(rng.integers(0, i))] if i and rng.random() < 0.7 else None for i in range(n)]
    tenants = rng.integers(0, 4, n).tolist()
    ops = [OP_STORED] * n + [OP_REMOVED] * (n // 2)
    slots = list(range(n)) + rng.permutation(n)[:n // 2].tolist()
    ref, got = _both(ops, slots, codes + codes[:n // 2], parents + [None] * (n // 2), tenants + [0] * (n // 2))
    assert got[1].tolist() == list(ref[1])
    assert got[0][:, COLS].tolist() == ref[0][:, COLS].tolist() and got[3] == ref[3]


def test_arrays_stay_int32_and_widen_once_a_number_would_not_fit(monkeypatch):
    # the placer's arrays are int32 (a block's record 24 B, not 48) and each is widened to
    # int64 before a block, list or hash id past int32 would be written: here int32's top is
    # lowered to 1,250 (past the slots, below the later hash ids), so the stream's later ticks
    # place into widened arrays, as the reference
    import engine.core.live_journal as lj

    rng = np.random.default_rng(11)
    n = 1200
    codes = [int(c) for c in rng.integers(1, 1 << 63, n // 2, dtype=np.int64)] * 2  # each hash stored twice
    parents = [codes[int(rng.integers(0, i))] if i and rng.random() < 0.5 else None for i in range(n)]
    ops = [OP_STORED] * n + [OP_REMOVED] * (n // 3)
    slots = rng.permutation(n).tolist() + rng.permutation(n)[:n // 3].tolist()
    tenants = rng.integers(0, 3, n).tolist() + [0] * (n // 3)
    codes += codes[:n // 3]
    parents += [None] * (n // 3)
    placer, ref_placer, nb, nb_ref, r0, kinds = _CompiledPlacer(), _Placer(), 0, 0, 0, set()
    monkeypatch.setattr(lj, "_I32_TOP", 1250)
    for lo in range(0, len(ops), 100):  # ticks of 100 rows
        hi = min(lo + 100, len(ops))
        keys = list(range(lo, hi))
        ref = _place(ref_placer, nb_ref, ops[lo:hi], slots[lo:hi], keys, 3, [0] * (hi - lo), r0,
                     [(c, 1) for c in codes[lo:hi]], [(p, 1) if p is not None else None for p in parents[lo:hi]],
                     tenants[lo:hi])
        got = placer.place(
            nb, np.array(ops[lo:hi], np.int64), np.array(slots[lo:hi], np.int64), np.array(keys, np.int64),
            np.array(codes[lo:hi], np.uint64).view(np.int64), np.ones(hi - lo, np.int64),
            np.array([p or 0 for p in parents[lo:hi]], np.uint64).view(np.int64),
            np.array([1 if p is not None else 0 for p in parents[lo:hi]], np.int64),
            np.array(tenants[lo:hi], np.int64), np.zeros(hi - lo, np.int64), 3, r0)
        assert got[1].tolist() == list(ref[1]) and got[2].tolist() == list(ref[2])
        assert got[0][:, COLS].tolist() == ref[0][:, COLS].tolist() and got[3] == ref[3]
        nb, nb_ref, r0 = got[3], ref[3], r0 + len(got[0])
        kinds.add(placer.blocks.dtype.name)
    assert kinds == {"int32", "int64"}


def _tick_both(placer, ref_placer, state, ops, slots):
    """One tick of rows through the compiled placer and the reference; their rows, tenants,
    births and blocks must agree (state: [nb, nb_ref, r0, first key])."""
    nb, nb_ref, r0, k0 = state
    n = len(ops)
    keys = list(range(k0, k0 + n))
    codes = [1000 + k for k in keys]
    ref = _place(ref_placer, nb_ref, list(ops), list(slots), keys, 3, [0] * n, r0, [(c, 1) for c in codes],
                 [None] * n, [0] * n)
    got = placer.place(nb, np.array(ops, np.int64), np.array(slots, np.int64), np.array(keys, np.int64),
                       np.array(codes, np.int64), np.ones(n, np.int64), np.zeros(n, np.int64),
                       np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64), 3, r0)
    assert got[1].tolist() == list(ref[1]) and got[2].tolist() == list(ref[2])
    assert got[0][:, COLS].tolist() == ref[0][:, COLS].tolist() and got[3] == ref[3]
    state[:] = [got[3], ref[3], r0 + len(got[0]), k0 + n]


def test_a_slot_s_next_copy_is_kept_from_the_first_copy_on():
    # a record keeps no next copy of its slot (8 bytes, not 12): the copies' table has it for
    # the records that have one, made by a store to a slot that holds a copy, not by a removal
    # and a store of one slot in a tick (an evicting pool's usual reuse)
    rng = np.random.default_rng(17)
    placer, ref_placer, state = _CompiledPlacer(), _Placer(), [0, 0, 0, 0]
    held: set[int] = set()
    for _ in range(40):  # no copy: stores to free slots, removals of held ones, a slot freed and taken again
        ops, slots = [], []
        for _ in range(30):
            if held and (rng.random() < 0.45 or len(held) == 48):
                s = int(rng.choice(sorted(held)))
                held.discard(s)
                ops.append(OP_REMOVED)
            else:
                free = sorted(set(range(48)) - held)
                s = int(rng.choice(free))
                held.add(s)
                ops.append(OP_STORED)
            slots.append(s)
        _tick_both(placer, ref_placer, state, ops, slots)
        assert int(placer.state[9]) == 0
    s = int(rng.choice(sorted(held)))
    _tick_both(placer, ref_placer, state, [OP_REMOVED, OP_STORED], [s, s])  # freed and taken again: no copy
    assert int(placer.state[9]) == 0
    _tick_both(placer, ref_placer, state, [OP_STORED, OP_REMOVED, OP_STORED], [s, s, s])  # the first copy
    assert int(placer.state[9]) == 1  # its next copy, until the last removal took the oldest: one entry
    for t in range(40):  # copies, removals of the oldest, clears
        ops = [int(o) for o in rng.choice([OP_STORED, OP_STORED, OP_REMOVED], 30)]
        if t % 9 == 8:
            ops[15] = 2  # a clear of this stream's held blocks
        _tick_both(placer, ref_placer, state, ops, rng.integers(0, 48, 30).tolist())
    assert 0 < int(placer.state[9]) and len(placer.cp) <= 4 * 1024  # entries for the copies held


def test_a_call_s_copies_are_counted_ahead_from_the_fifos_then_put_back():
    # a call of more stores than the copies' table has room for counts the copies it may make
    # first (`_copies_ahead`): a store to a held slot, or to one a store of the call took; a
    # removal of a slot's one copy frees it, while no slot holds more than one (`exact`)
    copies_ahead = _compiled()[7]
    S, R = OP_STORED, OP_REMOVED
    cases = [  # (ops, slots, exact, count): slot 0 held by record 5, the others empty
        ([S], [0], True, 1),
        ([R, S], [0, 0], True, 0),  # freed and taken again
        ([R, S], [0, 0], False, 1),  # a slot may hold more than one: its removal frees nothing for sure
        ([S, S], [1, 1], True, 1),
        ([S, S, R, S], [1, 1, 1, 1], True, 2),  # two copies made: a removal leaves one
        ([S, R, S, 2, S], [2, 2, 2, 0, 3], True, 0),  # a clear's row names no slot
        ([R, R, S], [0, 0, 0], True, 0),
    ]
    for ops, slots, exact, count in cases:
        fifo = np.array([5, -1, -1, -1], np.int32)
        got = copies_ahead(np.array(ops, np.int64), np.array(slots, np.int64), fifo,
                           np.empty(2 * len(ops), np.int64), exact)
        assert got == count, (ops, slots, exact)
        assert fifo.tolist() == [5, -1, -1, -1]  # put back as it was


def test_records_take_an_owner_field_when_a_second_owner_comes():
    """While every record has one owner (rank, width of its hash: no tenant), a record keeps
    its hash id alone and the owner once; a second rank's store, or a hash of another width,
    gives each record its owner field. Ticks of rank 0, then of ranks 0 and 1 with clears of
    one rank, then hashes of another width: the same rows, blocks and tenants as the Python
    placer, through each change of layout."""
    from engine.core.live_journal import OP_CLEARED

    rng = np.random.default_rng(23)
    placer, ref_placer = _CompiledPlacer(), _Placer()
    nb = nb_ref = r0 = k0 = 0
    held: dict[int, set[int]] = {0: set(), 1: set()}
    shapes = []
    for tick in range(60):
        rank = 0 if tick < 20 or tick % 2 else 1
        wide = 2 if tick >= 45 and tick % 3 == 0 else 1
        ops, slots = [], []
        for _ in range(25):
            mine = held[rank]
            if tick % 9 == 8 and not ops:
                ops.append(OP_CLEARED)
                slots.append(-1)
                mine.clear()
            elif mine and rng.random() < 0.4:
                s = int(rng.choice(sorted(mine)))
                mine.discard(s)
                ops.append(OP_REMOVED)
                slots.append(s)
            else:
                s = int(rng.integers(0, 400)) + 1000 * rank  # a placer slot is one pool's (slot_ids)
                mine.add(s)
                ops.append(OP_STORED)
                slots.append(s)
        n = len(ops)
        keys = list(range(k0, k0 + n))
        codes = [5000 + k for k in keys]
        ref = _place(ref_placer, nb_ref, ops, slots, keys, rank, [0] * n, r0, [(c, wide) for c in codes],
                     [None] * n, [0] * n)
        got = placer.place(nb, np.array(ops, np.int64), np.array(slots, np.int64), np.array(keys, np.int64),
                           np.array(codes, np.int64), np.full(n, wide, np.int64), np.zeros(n, np.int64),
                           np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64), rank, r0)
        assert got[1].tolist() == list(ref[1]) and got[2].tolist() == list(ref[2]), tick
        assert got[0][:, COLS].tolist() == ref[0][:, COLS].tolist() and got[3] == ref[3], tick
        nb, nb_ref, r0, k0 = got[3], ref[3], r0 + len(got[0]), k0 + n
        shapes.append(placer.blocks.shape[1])
    assert shapes[:20] == [1] * 20 and set(shapes[21:]) == {2}  # rank 1's first store: owners of their own
    owners = placer.blocks[:nb, 1][placer.blocks[:nb, 0] >= 0]
    assert {int(o) >> 2 & 15 for o in owners} == {0, 1} and {int(o) & 3 for o in owners} == {1, 2}
