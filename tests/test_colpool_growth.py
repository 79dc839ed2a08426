"""engine.remote.colpool's arrays grow by a fraction, not by doubling: they grow with every
block a pool holds (the journal's tables and token ids never shrink), and doubling left up
to half of each unused right after a growth. Sizes are read from the arrays (nbytes), not
the process; the pools grown a little at a time still equal the reference's."""

from __future__ import annotations

import numpy as np

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.colpool import J_SLOT, NUM_J, S_JROWS, S_JSTORES, S_LIVE, S_TOKUSED, ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import decode_batch
from tests.test_colpool import _journal_events, _reference_events, _run, _synthetic, state

# what growth may leave idle: half again what is needed, plus the 1024 of slack each keeps
SLACK = 1024


def _room(have: int, need: int, first: int) -> bool:
    """`have` no more than half again `need` plus the slack, or the size it started at."""
    return have <= max(first, 1.5 * need + SLACK)


def _check(pool: ColumnarPool, batch_blocks: int, batch_tokens: int) -> None:
    """Every array that grows with the blocks held has at most half again the room needed
    (what it holds plus what the last batch reserved)."""
    new = ColumnarPool("t", journal=pool.journal, max_removed=pool.max_removed)
    live = int(pool.S[S_LIVE])
    assert _room(len(pool.F), live + batch_blocks, len(new.F))
    for name in ("L", "C", "F", "SO") if pool.journal else ("K", "L", "C", "F"):
        arr = getattr(pool, name)
        assert arr.nbytes == len(pool.F) * arr.nbytes // len(arr)  # one row a slot
    assert _room(len(pool.tok), int(pool.S[S_TOKUSED]) + batch_tokens, len(new.tok))
    if pool.journal:
        assert _room(len(pool.J), int(pool.S[S_JROWS]) + batch_blocks, len(new.J))
        assert _room(len(pool.JS), int(pool.S[S_JSTORES]) + batch_blocks, len(new.JS))
        assert _room(len(pool.K), int(pool.S[S_JSTORES]) + batch_blocks, len(new.K))  # one row a store
    for m, m0 in ((pool.removed, new.removed), (pool.departed_map, new.departed_map)):
        assert _room(len(m.k), len(m) + batch_blocks, len(m0.k))


def _grow(journal: bool, payloads: list[bytes]) -> ColumnarPool:
    pool = ColumnarPool("t", journal=journal)
    for seq, p in enumerate(payloads):
        cols = fastwire.decode_columns(seq, p)
        pool.apply(cols)
        _check(pool, int(cols.rows[:, fastwire.R_NHASH].sum()) if len(cols.rows) else 0, len(cols.tokens))
    return pool


def test_a_held_pool_has_at_most_half_again_the_room_it_needs():
    """A server that never evicts (every block held, the journal's tables and token ids
    growing with it), a frame at a time: past a few thousand blocks, a doubling would leave
    more than half again the room needed right after it."""
    payloads, _, _ = recorded_stream(6_000, gpu_blocks=1 << 22, seed=3)
    for journal in (False, True):
        pool = _grow(journal, payloads)
        assert pool.num_cached > 20_000
        if journal:
            assert int(pool.S[S_JROWS]) > 20_000 and len(pool.J) > 8 * SLACK


def test_an_evicting_pool_has_at_most_half_again_the_room_it_needs():
    """Evictions fill the removal and departure maps; their arrays grow by a fraction too."""
    payloads, _, _ = recorded_stream(12_000, gpu_blocks=2_000, seed=4)
    pool = _grow(True, payloads)
    assert len(pool.removed) > 8 * SLACK


def test_growth_a_little_at_a_time_gives_the_reference_pool_and_journal():
    """Many small batches (every array grown many times, a fraction each) against the
    reference's pool and emitted events; and against the same frames at once."""
    frames = _synthetic(600, 11)
    ref_events, _ = _reference_events(frames, 200_000, 0)
    for many in (1, 3):
        got, pool = _journal_events(frames, 200_000, 0, many, take_every=7)
        assert got == ref_events
        assert state(pool) == _run(frames, False)[0]
    payloads, _, _ = recorded_stream(3_000, gpu_blocks=1 << 20, seed=6)
    one = _grow(True, payloads)
    at_once = ColumnarPool("t", journal=True)
    at_once.apply_many([fastwire.decode_columns(seq, p) for seq, p in enumerate(payloads)])
    assert state(one) == state(at_once)
    r = int(one.S[S_JROWS])
    cols = [c for c in range(NUM_J) if c != J_SLOT]  # slot numbers follow when the slots grew
    assert np.array_equal(one.J[:r, cols], at_once.J[:r, cols])
    assert np.array_equal(one.JS[:int(one.S[S_JSTORES])], at_once.JS[:int(at_once.S[S_JSTORES])])
    assert np.array_equal(one.tok[:int(one.S[S_TOKUSED])], at_once.tok[:int(at_once.S[S_TOKUSED])])


def test_the_removal_maps_grow_by_half_up_to_their_bound(monkeypatch):
    """The removal and departure maps (bounded by `max_removed`) grow by half again, not an
    eighth: each growth rehashes every key (an eighth made 29 on the way to 200,000 keys, a
    quarter of a new pool's apply), and at the bound the room is one batch's keys, no more."""
    from engine.remote import colpool

    grown = []

    def counted(otab, OK, OW, OV, n):
        grown.append(len(OK))
        return rehash(otab, OK, OW, OV, n)

    rehash = colpool._om_rehash
    monkeypatch.setattr(colpool, "_om_rehash", counted)
    payloads, _, _ = recorded_stream(30_000, gpu_blocks=2_000, seed=5)
    pool = ColumnarPool("t", max_removed=40_000)
    most = 0
    for i in range(0, len(payloads), 64):
        batches = [fastwire.decode_columns(seq, payloads[seq]) for seq in range(i, min(i + 64, len(payloads)))]
        most = max(most, sum(int(b.rows[:, fastwire.R_NHASH].sum()) for b in batches if len(b.rows)))
        pool.apply_many(batches)
    assert len(pool.removed) == len(pool.departed_map) == 40_000
    assert len(grown) <= 2 * 10  # 1024 to 40,000 keys: 10 growths of a half each map, 32 of an eighth
    for m in (pool.removed, pool.departed_map):
        assert len(m.k) <= 40_000 + most + 1024
    # grown with their entries where they were (the FIFO kept): the same keys, values and order
    ref = RemotePool("t", max_removed=40_000)
    for seq, p in enumerate(payloads):
        ref.apply(decode_batch(seq, p))
    assert pool.removed_at == ref.removed_at and pool.departed == ref.departed
