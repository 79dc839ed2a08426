"""The journal route's compiled placer (`engine.core.live_journal._CompiledPlacer`) in fewer
bytes a held block: its record without the block's slot (a clear mends the slots' FIFOs
instead) and with its tenant, rank and width in one field, a slot's oldest copy only (a
store walks to its last), a table of hashes of any length at most TABLE_LOAD full. Held to
its Python reference (`_place`) on streams of three ranks (one past the first rank bits)
that store copies into slots that hold some, remove, and clear, and its bytes counted."""

from __future__ import annotations

import numpy as np

from engine.core.live_journal import (
    OP_CLEARED, OP_REMOVED, OP_STORED, TABLE_LOAD, _CompiledPlacer, _compiled, _place, _Placer,
)

COLS = [0, 1, 2, 3, 4, 7]  # kind, event, event, block, hash id, flag (the rest the commit fills)
RANKS = {3: 0, 5: 1000, 37: 2000}  # rank -> its first placer slot (each pool's slots are its own)


def _tick(rng, rank, held, n):
    """`n` journal rows of `rank`: stores (into new slots, slots that hold copies, emptied
    ones; new hashes and held ones, under held parents), removals (of held slots, of some
    that hold nothing) and, now and then, a clear. `held`: rank -> slot -> codes, oldest first."""
    ops, slots, codes, widths, parents, tenants = [], [], [], [], [], []
    mine = held[rank]
    every = [(c, w) for r in held.values() for cs in r.values() for c, w in cs]
    for _ in range(n):
        u = rng.random()
        if u < 0.01:
            ops.append(OP_CLEARED), slots.append(-1), codes.append(0), widths.append(1)
            parents.append(None), tenants.append(0)
            others = any(cs for r, s in held.items() if r != rank for cs in s.values())
            for r in ([rank] if others else list(held)):
                held[r].clear()
            every = [(c, w) for r in held.values() for cs in r.values() for c, w in cs]
        elif u < 0.35 and mine:
            s = int(rng.choice(list(mine))) if rng.random() < 0.9 else RANKS[rank] + 999  # one never stored
            ops.append(OP_REMOVED), slots.append(s)
            if mine.get(s):
                c, w = mine[s].pop(0)
                if not mine[s]:
                    del mine[s]
            else:
                c, w = int(rng.integers(1, 1 << 63)), 1
            codes.append(c), widths.append(w), parents.append(None), tenants.append(0)
        else:
            v = rng.random()
            if v < 0.3 and mine:
                s = int(rng.choice(list(mine)))  # a slot that holds copies: one more, at its end
            else:
                s = RANKS[rank] + int(rng.integers(0, 400))
            c, w = every[int(rng.integers(0, len(every)))] if every and rng.random() < 0.2 else (
                int(rng.integers(1, 1 << 63)), int(rng.integers(1, 3)))
            p = every[int(rng.integers(0, len(every)))] if every and rng.random() < 0.7 else None
            ops.append(OP_STORED), slots.append(s), codes.append(c), widths.append(w), parents.append(p)
            tenants.append(int(rng.integers(0, 5)))
            mine.setdefault(s, []).append((c, w))
            every.append((c, w))
    return ops, slots, codes, widths, parents, tenants


def test_copies_in_one_slot_removals_and_clears_place_as_the_reference():
    assert _compiled()
    rng = np.random.default_rng(20)
    held = {rank: {} for rank in RANKS}
    placer, ref_placer = _CompiledPlacer(), _Placer()
    nb, r0, key, num_cleared, num_many = 0, 0, 0, 0, 0
    for tick in range(300):
        rank = int(rng.choice([3, 5] if tick < 100 else list(RANKS)))  # 37: past the first rank bits, later
        ops, slots, codes, widths, parents, tenants = _tick(rng, rank, held, int(rng.integers(1, 120)))
        n = len(ops)
        keys = list(range(key, key + n))
        stores = [7] * n
        ref = _place(ref_placer, nb, ops, slots, keys, rank, stores, r0, list(zip(codes, widths)), parents, tenants)
        got = placer.place(
            nb, np.array(ops, np.int64), np.array(slots, np.int64), np.array(keys, np.int64),
            np.array(codes, np.uint64).view(np.int64), np.array(widths, np.int64),
            np.array([p[0] if p else 0 for p in parents], np.uint64).view(np.int64),
            np.array([p[1] if p else 0 for p in parents], np.int64), np.array(tenants, np.int64),
            np.array(stores, np.int64), rank, r0)
        assert got[0][:, COLS].tolist() == ref[0][:, COLS].tolist(), tick
        assert got[1].tolist() == list(ref[1]) and got[2].tolist() == list(ref[2]) and got[3] == ref[3], tick
        nb, r0, key = got[3], r0 + len(got[0]), key + n
        num_cleared += ops.count(OP_CLEARED)
        num_many += sum(len(cs) > 1 for r in held.values() for cs in r.values())
    assert num_cleared >= 20 and num_many > 1000  # the paths this file is for were taken
    assert int(placer.state[7]) == 6  # rank 37 came after 100 ticks: every record's tenant moved up
    assert int(placer.state[5]) == len({c for r in held.values() for cs in r.values() for c in cs})


def test_a_held_block_takes_24_bytes_a_slot_4_and_a_hash_at_most_12_and_a_bit():
    placer = _CompiledPlacer()
    rng = np.random.default_rng(4)
    n, tick = 200_000, 4096
    codes = rng.integers(1, 1 << 63, n, dtype=np.int64)
    nb = 0
    for lo in range(0, n, tick):  # every block stored once, into its own slot, as bench held does
        k = min(tick, n - lo)
        ones, zeros = np.ones(k, np.int64), np.zeros(k, np.int64)
        got = placer.place(nb, zeros, np.arange(lo, lo + k), np.arange(lo, lo + k), codes[lo:lo + k], ones,
                           np.roll(codes[lo:lo + k], 1), (np.arange(k) > 0).astype(np.int64), ones, zeros, 3, nb)
        assert (got[1] == 1).all()  # each store's parent (the one before) found, and its tenant
        nb = got[3]
    assert nb == n and int(placer.state[5]) == n
    assert placer.blocks.dtype == np.int32 and placer.blocks.shape[1] == 5 and int(placer.state[9]) == 0
    assert placer.blocks.nbytes <= 20 * n * 9 // 8  # grown by an eighth at most past what it holds
    assert placer.fifo.ndim == 1 and placer.fifo.nbytes <= 4 * n * 9 // 8
    assert placer.vacant.nbytes == 0  # no room made for what removals free: none came (was a row's each)
    # a power of two at most half full: 262,144 or 524,288 entries for 200,000 hashes
    assert n / TABLE_LOAD < len(placer.table) <= n / TABLE_LOAD * 9 / 8 + 1
