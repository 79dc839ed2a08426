"""The columnar pool writes a new block's token ids over the range its slot held before it
was freed: the pool still equals the reference, and an evicting stream leaves no garbage."""

from __future__ import annotations

import random

import numpy as np

from engine.remote import colpool, fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import state


def _churn(num_frames: int, live: int, seed: int, empty_every: int = 0, partial: bool = True
           ) -> list[tuple[int, bytes]]:
    """Frames that evict blocks and store as many: full blocks of 16 token ids and (with
    `partial`) partial last blocks and blocks without token ids, so a freed slot is taken
    by a block of the same or of another size; with `empty_every`, every block goes now
    and then."""
    rng = random.Random(seed)
    held: list[int] = []
    next_hash = 1 << 63
    frames = []
    for seq in range(num_frames):
        events = []
        if empty_every and seq and seq % empty_every == 0 and held:
            events.append(VllmEvent("BlockRemoved", tuple(h.to_bytes(8, "big") for h in held)))
            held = []
        for _ in range(rng.randint(1, 5)):
            k = rng.randint(1, 6)
            if len(held) + k > live:
                victims = [held.pop(rng.randrange(len(held))) for _ in range(k)]
                events.append(VllmEvent("BlockRemoved", tuple(h.to_bytes(8, "big") for h in victims),
                                        medium=rng.choice([None, "GPU"])))
            hashes = list(range(next_hash, next_hash + k))
            next_hash += k
            r = rng.random() if partial else 0.0
            num_tokens = 16 * k if r < 0.8 else (16 * (k - 1) + rng.randint(1, 15) if r < 0.95 else 0)
            events.append(VllmEvent("BlockStored", tuple(h.to_bytes(8, "big") for h in hashes), None,
                                    tuple(rng.randrange(49_152) for _ in range(num_tokens)), 16))
            held.extend(hashes)
        frames.append((seq, encode_batch(1_796_000_000.0 + seq, events, 0)))
    return frames


def _apply(pool, frames, many: int) -> None:
    batches = [fastwire.decode_columns(seq, p) for seq, p in frames]
    if many:
        for i in range(0, len(batches), many):
            pool.apply_many(batches[i:i + many])
    else:
        for b in batches:
            pool.apply(b)


def _reference(frames) -> RemotePool:
    ref = RemotePool("t", max_removed=1000)
    for seq, p in frames:
        ref.apply(fastwire.decode_batch(seq, p))
    return ref


def test_reused_token_ranges_give_the_reference_pool():
    for seed, empty_every in ((0, 0), (1, 0), (2, 23), (3, 7)):
        frames = _churn(300, live=60, seed=seed, empty_every=empty_every)
        ref = state(_reference(frames))
        for many in (0, 1, 64):
            pool = ColumnarPool("t", max_removed=1000, capacity=16)  # small: grown and compacted on the way
            _apply(pool, frames, many)
            assert state(pool) == ref, (seed, empty_every, many)


def test_an_evicting_stream_leaves_no_token_garbage():
    """Every block a full one: each store takes a freed slot's range or a slot never used,
    so the token array's used part stays at the most slots ever held. Without the reuse
    every store appended its token ids (16 * thousands, until a compaction)."""
    frames = _churn(600, live=60, seed=4, partial=False)
    pool = ColumnarPool("t", max_removed=1000)
    _apply(pool, frames, 64)
    used = int(pool.S[colpool.S_TOKUSED])
    assert pool.num_stored > 20 * 60
    assert used <= 16 * (60 + 6), used
    assert state(pool) == state(_reference(frames))


def test_the_journal_keeps_every_stores_token_ids():
    """A journalled pool never writes over a freed range: its rows read them later."""
    frames = _churn(200, live=30, seed=5)
    pool = ColumnarPool("t", max_removed=1000, journal=True)
    _apply(pool, frames, 64)
    j = pool.journal_since(0)
    stores = j.store[j.op == colpool.OP_STORED]
    assert len(stores) == pool.num_stored
    assert int(pool.S[colpool.S_TOKUSED]) == int(np.asarray(j.token_count).sum())
