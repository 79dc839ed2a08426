"""The compiled placer's table of hashes (`engine.core.live_journal._CompiledPlacer`) holds
the hashes held now: a hash whose last copy goes leaves it (`_ht_delete`, entries after it
moved back), so a long attach's table stays the size of its pool, not of every hash it ever
stored, and every holder is still found (the Python `_place` is the reference)."""

from __future__ import annotations

import numpy as np

from engine.core.live_journal import OP_REMOVED, OP_STORED, _CompiledPlacer, _place, _Placer

COLS = [0, 1, 2, 3, 4, 7]  # kind, event, event, block, hash id, flag (the rest the commit fills)


def test_a_churning_pool_keeps_a_small_table_and_finds_every_holder():
    rng = np.random.default_rng(5)
    ref_placer, placer = _Placer(), _CompiledPlacer()
    held: list[tuple[int, int]] = []  # (pool slot, code) stored and not removed yet
    nb = nb_ref = r0 = key = 0
    next_slot = 0
    stored = 0
    for tick in range(60):
        ops, slots, codes, parents, tenants = [], [], [], [], []
        for _ in range(400):
            if held and (len(held) > 300 or rng.random() < 0.45):  # remove a random held copy
                s, c = held.pop(int(rng.integers(0, len(held))))
                ops.append(OP_REMOVED), slots.append(s), codes.append(c), parents.append(None), tenants.append(0)
                continue
            # a new hash, or now and then another copy of a held one; a parent held or gone
            c = int(rng.integers(1, 1 << 63)) if not held or rng.random() < 0.9 else held[-1][1]
            p = held[int(rng.integers(0, len(held)))][1] if held and rng.random() < 0.7 else None
            ops.append(OP_STORED), slots.append(next_slot), codes.append(c), parents.append(p)
            tenants.append(int(rng.integers(0, 4)))
            held.append((next_slot, c))
            next_slot += 1
            stored += 1
        n = len(ops)
        keys = list(range(key, key + n))
        ref = _place(ref_placer, nb_ref, ops, slots, keys, 3, [0] * n, r0, [(c, 1) for c in codes],
                     [(p, 1) if p is not None else None for p in parents], tenants)
        got = placer.place(
            nb, np.array(ops, np.int64), np.array(slots, np.int64), np.array(keys, np.int64),
            np.array(codes, np.uint64).view(np.int64), np.ones(n, np.int64),
            np.array([p or 0 for p in parents], np.uint64).view(np.int64),
            np.array([1 if p is not None else 0 for p in parents], np.int64), np.array(tenants, np.int64),
            np.zeros(n, np.int64), 3, r0)
        assert got[1].tolist() == list(ref[1]), tick  # tenants: each parent's holder found
        assert got[0][:, COLS].tolist() == ref[0][:, COLS].tolist() and got[3] == ref[3], tick
        nb, nb_ref, r0, key = got[3], ref[3], r0 + len(got[0]), key + n
        assert int(placer.state[5]) == len({c for _, c in held})  # the hashes held now, no more
    assert stored > 10_000 and len(held) <= 400
    assert len(placer.table) <= 2048  # 10,000 hashes stored: the table kept the few hundred held
