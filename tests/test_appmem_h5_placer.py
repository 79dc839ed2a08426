"""The journal route's compiled placer keeps no table of hashes (nor a record's next holder
of its hash) while no store has named a tenant (the table finds a parent's holder for its
tenant, and every holder's is none then), and makes it at the first store that names one:
held to its Python reference (`_place`), which keeps its holders by hash all along, before,
at and after that store."""

from __future__ import annotations

import numpy as np

from engine.core.live_journal import OP_STORED, TABLE_LOAD, _CompiledPlacer, _compiled, _place, _Placer
from tests.test_heldmem_h2_placer import COLS, RANKS, _tick


def _placed(placer, nb, ops, slots, keys, codes, widths, parents, tenants, stores, rank, r0):
    return placer.place(
        nb, np.array(ops, np.int64), np.array(slots, np.int64), np.array(keys, np.int64),
        np.array(codes, np.uint64).view(np.int64), np.array(widths, np.int64),
        np.array([p[0] if p else 0 for p in parents], np.uint64).view(np.int64),
        np.array([p[1] if p else 0 for p in parents], np.int64), np.array(tenants, np.int64),
        np.array(stores, np.int64), rank, r0)


def test_a_stream_that_names_no_tenant_keeps_no_table_of_hashes():
    assert _compiled()
    placer = _CompiledPlacer()
    rng = np.random.default_rng(5)
    n, tick = 200_000, 4096
    codes = rng.integers(1, 1 << 63, n, dtype=np.int64)
    nb = 0
    for lo in range(0, n, tick):  # every block stored once under the one before, as bench held does
        k = min(tick, n - lo)
        ones, zeros = np.ones(k, np.int64), np.zeros(k, np.int64)
        got = placer.place(nb, zeros, np.arange(lo, lo + k), np.arange(lo, lo + k), codes[lo:lo + k], ones,
                           np.roll(codes[lo:lo + k], 1), (np.arange(k) > 0).astype(np.int64), zeros, zeros, 3, nb)
        assert (got[1] == 0).all()
        nb = got[3]
    assert nb == n
    assert placer.table.nbytes <= 8 * 1024  # was n / TABLE_LOAD entries of 8 bytes: 16 to 18 a hash held
    assert int(placer.state[8]) == 0
    # a record without its hash's next holder (B_LNEXT) or its hash's code (B_CODE_LO/HI,
    # read only by the table; e45e70e), nor its slot's next copy (the copies' table's), nor
    # its owner while every record's is one (one rank, 8-byte hashes, no tenant): 4 bytes,
    # grown by an eighth at most
    assert placer.blocks.dtype == np.int32 and placer.blocks.shape[1] == 1 and int(placer.state[10]) == 3 << 2 | 1
    assert int(placer.state[9]) == 0 and placer.cp.nbytes <= 32 * 1024  # the copies' table: no copy came
    assert placer.blocks.nbytes <= 4 * n * 9 // 8
    # a first tenant: the table of the hashes held is made, each parent's holder found from then on
    k = 3
    more = rng.integers(1, 1 << 63, k, dtype=np.int64)
    got = placer.place(nb, np.zeros(k, np.int64), np.arange(n, n + k), np.arange(n, n + k), more,
                       np.ones(k, np.int64), codes[[5, 7, 9]], np.ones(k, np.int64), np.array([2, 0, 0]),
                       np.zeros(k, np.int64), 3, nb)
    assert got[1].tolist() == [0, 0, 0]  # each parent's holder has no tenant: its own named none
    assert int(placer.state[8]) == 1 and int(placer.state[5]) == n + k
    assert placer.blocks.shape[1] == 5 and (placer.blocks[:n + k, 4] == -1).all()  # one holder a hash
    assert n / TABLE_LOAD < len(placer.table) <= (n + k) / TABLE_LOAD * 9 / 8 + 1


def test_tenants_that_come_mid_stream_place_as_the_reference_does():
    """Ticks of three ranks that store (new hashes, held ones, under held parents), remove
    and clear, naming no tenant for 150 ticks, then tenants 0 to 4: every tick's rows, each
    store's tenant, the blocks born and held equal the reference's."""
    rng = np.random.default_rng(21)
    held = {rank: {} for rank in RANKS}
    placer, ref_placer = _CompiledPlacer(), _Placer()
    nb, r0, key = 0, 0, 0
    made_at = None
    num_named_parents = 0
    for tick in range(300):
        rank = int(rng.choice(list(RANKS)))
        ops, slots, codes, widths, parents, tenants = _tick(rng, rank, held, int(rng.integers(1, 120)))
        if tick < 150:
            tenants = [0] * len(tenants)
        n = len(ops)
        keys = list(range(key, key + n))
        stores = [7] * n
        ref = _place(ref_placer, nb, ops, slots, keys, rank, stores, r0, list(zip(codes, widths)), parents, tenants)
        got = _placed(placer, nb, ops, slots, keys, codes, widths, parents, tenants, stores, rank, r0)
        assert got[0][:, COLS].tolist() == ref[0][:, COLS].tolist(), tick
        assert got[1].tolist() == list(ref[1]) and got[2].tolist() == list(ref[2]) and got[3] == ref[3], tick
        if made_at is None and len(placer.state) > 8 and int(placer.state[8]):
            made_at = tick
        if tick >= 150:
            num_named_parents += sum(1 for o, p, t in zip(ops, parents, tenants) if o == OP_STORED and p and not t)
        nb, r0, key = got[3], r0 + len(got[0]), key + n
    assert made_at is not None and made_at >= 150  # no table before the first tenant
    assert num_named_parents > 100
    assert int(placer.state[5]) == len({c for r in held.values() for cs in r.values() for c in cs})
    tenants_held = {int(t) for t in ref_placer.block_tenant}
    assert len(tenants_held - {0}) >= 3  # tenants were taken from parents' holders too
