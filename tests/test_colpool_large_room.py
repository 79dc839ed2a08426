"""A large columnar pool keeps at most a sixteenth of its slots and token ids idle (an eighth
was up to 105 bytes a held block, past the 100 of issue 20), its table is made again at
every other growth, not each, and arrays grown where they lie (resized) or copied (when
something still refers to them) give the reference's pool. The sizes that count as large
are class attributes, made small here so that a few thousand blocks cross them."""

from __future__ import annotations

import numpy as np

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire
from engine.remote.colpool import S_LIVE, S_TOKUSED, ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import decode_batch
from tests.test_colpool import state


class SmallPool(ColumnarPool):
    # large (a sixteenth a growth) from 8 times these: 2,048 slots, 32,768 token ids
    _slots_small = 256
    _tokens_small = 4096


def _held_stream(num_events: int, seed: int) -> list[bytes]:
    payloads, _, _ = recorded_stream(num_events, gpu_blocks=1 << 22, seed=seed)  # no evictions
    return payloads


def _reference(payloads: list[bytes]) -> RemotePool:
    ref = RemotePool("t")
    for seq, p in enumerate(payloads):
        ref.apply(decode_batch(seq, p))
    return ref


def test_a_large_pool_keeps_at_most_a_sixteenth_idle(monkeypatch):
    """After every frame past the large sizes, the slots and token ids have at most a
    sixteenth more room than what they hold and the frame reserved (an eighth more, right
    after each growth, before), and the table is made again at most at every other growth
    of the slots while its load stays at most 0.7 with every slot used."""
    rehashes = []

    def counted(tab, K, SO, F, n):
        rehashes.append(len(F))
        return rehash(tab, K, SO, F, n)

    rehash = colpool._rehash
    monkeypatch.setattr(colpool, "_rehash", counted)
    payloads = _held_stream(12_000, seed=7)
    pool = SmallPool("t")
    growths = checked = 0
    for seq, p in enumerate(payloads):
        cols = fastwire.decode_columns(seq, p)
        before = len(pool.F)
        pool.apply(cols)
        growths += len(pool.F) != before and before > 16 * 1024
        blocks = int(cols.rows[:, fastwire.R_NHASH].sum()) if len(cols.rows) else 0
        assert len(pool.tab) - 1 >= ColumnarPool._table_size(len(pool.F))  # load <= 0.7, all slots used
        if len(pool.F) > 16 * 1024:  # past the 1024 of slack a growth keeps
            checked += 1
            assert len(pool.F) <= (int(pool.S[S_LIVE]) + blocks) * 17 // 16 + 1
        if len(pool.tok) > 16 * 1024 * 16:
            assert len(pool.tok) <= (int(pool.S[S_TOKUSED]) + len(cols.tokens)) * 17 // 16 + 1
    assert pool.num_cached > 40_000 and checked > 1_000
    large_rehashes = sum(1 for n in rehashes if n > 16 * 1024)  # past the slack: a sixteenth a growth
    assert growths >= 10 and large_rehashes <= growths // 2 + 1
    assert state(pool) == state(_reference(payloads))


def test_arrays_grown_in_place_or_copied_give_the_reference():
    """A view of the slot columns and the token ids held across the growths: those arrays
    are copied (the view keeps reading what it read), the rest resized where they lie;
    either way, the pool reads back as the reference's, frame at a time and 64 at once."""
    payloads = _held_stream(3_000, seed=8)
    pool = SmallPool("t")
    held = None
    for seq, p in enumerate(payloads):
        pool.apply(fastwire.decode_columns(seq, p))
        if seq == 200:
            held = (pool.K[:100], pool.tok[:1600], pool.K[:100].copy(), pool.tok[:1600].copy())
            k_before, tok_before = pool.K, pool.tok
    assert pool.K is not k_before and pool.tok is not tok_before  # grown since, by a copy
    assert np.array_equal(held[0], held[2]) and np.array_equal(held[1], held[3])
    ref = state(_reference(payloads))
    assert state(pool) == ref
    many = SmallPool("t")
    decoded = [fastwire.decode_columns(seq, p) for seq, p in enumerate(payloads)]
    for i in range(0, len(decoded), 64):
        many.apply_many(decoded[i:i + 64])
    assert state(many) == ref
