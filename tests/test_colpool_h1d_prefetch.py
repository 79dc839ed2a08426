"""The columnar pool's prefetches change nothing (a freed slot's token range, asked for as
`_remove` frees it, and the table entries, rows and removal-map entries `_pretouch` asks
for): runs of 64 frames decoded at once, as an attachment applies them, give the reference
pool, and a journalled pool the rows of one frame at a time, on streams where they act
(evictions of slots with token ids and without, stores into the freed slots, parents on
the store's tier and on another, removal maps at their bound with holes and without)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire, wire
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import state
from tests.test_colpool_p2_fifo import _restoring_frames


def _h(i: int) -> bytes:
    return (i | 1 << 63).to_bytes(8, "big")


def _mixed_frames(num_frames: int, seed: int) -> list[bytes]:
    """Stores (some without token ids, some on CPU, most naming a held parent, GPU or CPU)
    and removals of held GPU hashes once more than 40 are held: freed slots, with token ids
    and without, that the next stores take."""
    rng = random.Random(seed)
    gpu: list[int] = []
    cpu: list[int] = []
    fresh = 1
    frames = []
    for f in range(num_frames):
        events = []
        for _ in range(rng.randint(1, 5)):
            k = rng.randint(1, 4)
            keys = list(range(fresh, fresh + k))
            fresh += k
            on_cpu = rng.random() < 0.2
            pool_of_parents = gpu + cpu
            parent = _h(rng.choice(pool_of_parents)) if pool_of_parents and rng.random() < 0.8 else None
            tokens = () if rng.random() < 0.25 else tuple(rng.randrange(1 << 15) for _ in range(16 * k))
            events.append(VllmEvent("BlockStored", tuple(_h(i) for i in keys), parent, tokens, 16,
                                    medium="CPU" if on_cpu else None))
            (cpu if on_cpu else gpu).extend(keys)
            if len(gpu) > 40:
                out = [gpu.pop(rng.randrange(len(gpu))) for _ in range(rng.randint(1, 6))]
                events.append(VllmEvent("BlockRemoved", tuple(_h(i) for i in out)))
        frames.append(encode_batch(1.0 + f, events, 0))
    return frames


def _streams() -> dict[str, list[bytes]]:
    return {"recorded": recorded_stream(8_000, gpu_blocks=300, seed=11)[0],
            "mixed": _mixed_frames(600, seed=3),
            "restoring": _restoring_frames(1_500, 0.3, seed=4)}


def _runs_of_64(payloads: list[bytes], pool: colpool.ColumnarPool) -> list[np.ndarray]:
    rows = []
    for i in range(0, len(payloads), 64):
        pool.apply_many(fastwire.decode_columns_many(i, payloads[i:i + 64]))
        if pool.journal:
            rows.append(_rows(pool.take_journal()))
    return rows


def _rows(j: colpool.JournalRows) -> np.ndarray:
    return np.column_stack([j.op, j.tier, j.slot, j.seq, j.store, j.key.view(np.int64), j.width])


@pytest.mark.parametrize("max_removed", [200_000, 60, 0])
@pytest.mark.parametrize("name", ["recorded", "mixed", "restoring"])
def test_runs_of_64_frames_give_the_reference_pool(name, max_removed):
    payloads = _streams()[name]
    ref = RemotePool("t", max_removed=max_removed)
    for seq, p in enumerate(payloads):
        ref.apply(wire.decode_batch(seq, p))
    pool = colpool.ColumnarPool("t", max_removed=max_removed)
    _runs_of_64(payloads, pool)
    assert pool.num_removed > 0 and pool.num_stored > pool.num_cached  # slots were freed and taken again
    assert state(pool) == state(ref)


@pytest.mark.parametrize("name", ["recorded", "mixed", "restoring"])
def test_a_journalled_pool_gives_the_rows_and_store_rows_of_one_frame_at_a_time(name):
    payloads = _streams()[name]
    one = colpool.ColumnarPool("t", journal=True, max_removed=60)
    want = []
    for seq, p in enumerate(payloads):
        one.apply(fastwire.decode_columns(seq, p))
        want.append(_rows(one.take_journal()))
    many = colpool.ColumnarPool("t", journal=True, max_removed=60)
    got, want = np.concatenate(_runs_of_64(payloads, many)), np.concatenate(want)
    # every column but the slot (which slot a block takes depends on when the arrays grew:
    # once a call, not once a frame), and the slot a removal names is the one its store took
    others = [c for c in range(colpool.NUM_J) if c != colpool.J_SLOT]
    assert len(got) == len(want) and np.array_equal(got[:, others], want[:, others])
    for rows in (got, want):
        stored = rows[rows[:, colpool.J_OP] == colpool.OP_STORED]
        slot_of = dict(zip(stored[:, colpool.J_STORE].tolist(), stored[:, colpool.J_SLOT].tolist()))
        removed = rows[(rows[:, colpool.J_OP] == colpool.OP_REMOVED) & (rows[:, colpool.J_STORE] >= 0)]
        assert len(removed) > 100
        assert [slot_of[o] for o in removed[:, colpool.J_STORE].tolist()] == removed[:, colpool.J_SLOT].tolist()
    n = int(one.S[colpool.S_JSTORES])
    assert n == int(many.S[colpool.S_JSTORES]) and one.JS[:n].tobytes() == many.JS[:n].tobytes()
    assert state(many) == state(one)


def test_the_mixed_stream_frees_slots_with_and_without_token_ids_and_names_parents_on_both_tiers():
    """The stream above does what the prefetches are for (else the tests would pass without them)."""
    payloads = _streams()["mixed"]
    pool = colpool.ColumnarPool("t")
    no_tokens = freed_with_tokens = 0
    parents_on_cpu = 0
    cpu = set()
    for seq, p in enumerate(payloads):
        for e in wire.decode_batch(seq, p).events:
            if e.kind == "BlockStored":
                no_tokens += not e.token_ids and not e.token_bytes
                parents_on_cpu += e.parent_block_hash in cpu
                if e.medium == "CPU":
                    cpu.update(e.block_hashes)
        pool.apply(fastwire.decode_columns(seq, p))
        freed_with_tokens = max(freed_with_tokens, int(pool.S[colpool.S_LIFE_N]))
    assert no_tokens > 50 and parents_on_cpu > 50 and freed_with_tokens > 500


def _tenant_frames(num_frames: int, seed: int) -> list[bytes]:
    """Stores with a cache salt (a tenant, in block 0's extra keys: events the pool's Python applies) and without
    (common ones, applied by the compiled loop), most naming a held parent with a tenant or
    without, and removals: a store without a salt takes its parent's tenant."""
    rng = random.Random(seed)
    held: list[int] = []
    fresh = 1
    frames = []
    for f in range(num_frames):
        events = []
        for _ in range(rng.randint(1, 4)):
            keys = list(range(fresh, fresh + rng.randint(1, 3)))
            fresh += len(keys)
            parent = _h(rng.choice(held)) if held and rng.random() < 0.8 else None
            salt = rng.choice(["a", "b"]) if rng.random() < 0.15 else None
            extra = None if salt is None else ((salt,),) + (None,) * (len(keys) - 1)  # vLLM's: on block 0
            events.append(VllmEvent("BlockStored", tuple(_h(i) for i in keys), parent,
                                    tuple(range(16 * len(keys))), 16, extra_keys=extra))
            held.extend(keys)
            if len(held) > 400:
                out = [held.pop(rng.randrange(len(held))) for _ in range(rng.randint(1, 4))]
                events.append(VllmEvent("BlockRemoved", tuple(_h(i) for i in out)))
        frames.append(encode_batch(1.0 + f, events, 0))
    return frames


@pytest.mark.parametrize("journal", [False, True])
def test_a_store_takes_its_parents_tenant_as_the_reference_does(journal):
    """A slot's F_PW notes whether its store named a tenant; a store naming it as its parent
    reads the tenant only then. Every block's tenant is the reference's, in runs of 64 and one
    frame at a time, and a block's parent hash keeps its width code whole."""
    payloads = _tenant_frames(800, seed=6)
    ref = RemotePool("t")
    for seq, p in enumerate(payloads):
        ref.apply(wire.decode_batch(seq, p))
    want = state(ref)
    tenants = [b[5] for blocks in want["tiers"].values() for b in blocks]
    assert tenants.count(None) > 50 and tenants.count("a") > 50 and tenants.count("b") > 50
    many = colpool.ColumnarPool("t", journal=journal)
    _runs_of_64(payloads, many)
    one = colpool.ColumnarPool("t", journal=journal)
    for seq, p in enumerate(payloads):
        one.apply(fastwire.decode_columns(seq, p))
    assert state(many) == want and state(one) == want
    held = many.F[:, colpool.F_TIER] > 0
    flagged = (many.F[held, colpool.F_PW] & colpool.F_PW_TENANT) > 0
    named = (np.asarray(many.per_store().tenant[many.SO[held]]) if journal
             else many.C[held, colpool.C_TENANT]) > 0
    assert np.array_equal(flagged, named) and flagged.any() and not flagged.all()
