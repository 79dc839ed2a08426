"""A store looks for its parent's slot only for the parent's tenant, so the columnar pool
skips that search (and its prefetch) while no block was stored with a tenant
(`S_TENANTED`). The flag is set by the first store naming one, inside a compiled run, and
the stores after it (in the same run of 64 frames, and in the same frame) take their
parents' tenants as the reference does; a stream that names none never sets it."""

from __future__ import annotations

import random

import pytest

from engine.bench.attach import recorded_stream
from engine.remote import colpool, fastwire, wire
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import state


def _h(i: int) -> bytes:
    return (i | 1 << 63).to_bytes(8, "big")


def _late_tenant_frames(num_frames: int, first_salted: int, seed: int) -> list[bytes]:
    """Stores naming a held parent (GPU and CPU) and removals; from frame `first_salted` on,
    some stores carry a cache salt (a tenant, which the pool's Python applies), each followed
    in its frame by a common store naming its last block as the parent."""
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
            salt = rng.choice(["a", "b"]) if f >= first_salted and rng.random() < 0.2 else None
            extra = None if salt is None else ((salt,),) + (None,) * (len(keys) - 1)  # vLLM's: on block 0
            medium = "CPU" if rng.random() < 0.1 else None
            events.append(VllmEvent("BlockStored", tuple(_h(i) for i in keys), parent,
                                    tuple(range(16 * len(keys))), 16, medium=medium, extra_keys=extra))
            held.extend(keys)
            if salt is not None:  # a child of the salted block, in the same frame: a common event
                child = [fresh]
                fresh += 1
                events.append(VllmEvent("BlockStored", (_h(child[0]),), _h(keys[-1]), tuple(range(16)), 16,
                                        medium=medium))
                held.extend(child)
            if len(held) > 300:
                out = [held.pop(rng.randrange(len(held))) for _ in range(rng.randint(1, 4))]
                events.append(VllmEvent("BlockRemoved", tuple(_h(i) for i in out)))
        frames.append(encode_batch(1.0 + f, events, 0))
    return frames


def _reference(payloads: list[bytes]) -> dict:
    ref = RemotePool("t")
    for seq, p in enumerate(payloads):
        ref.apply(wire.decode_batch(seq, p))
    return state(ref)


def _runs_of_64(payloads: list[bytes], pool: colpool.ColumnarPool, forget_tenants: bool = False) -> None:
    for i in range(0, len(payloads), 64):
        pool.apply_many(fastwire.decode_columns_many(i, payloads[i:i + 64]))
        if forget_tenants:  # the seeded mutant: a pool that never notes a tenant was stored
            pool.S[colpool.S_TENANTED] = 0


def test_a_stream_without_tenants_never_sets_the_flag_and_equals_the_reference():
    payloads, _, _ = recorded_stream(4_000, gpu_blocks=600)
    pool = colpool.ColumnarPool("t")
    _runs_of_64(payloads, pool)
    assert int(pool.S[colpool.S_TENANTED]) == 0
    assert state(pool) == _reference(payloads)


@pytest.mark.parametrize("journal", [False, True])
def test_the_first_tenant_mid_run_sets_the_flag_and_children_take_it(journal):
    payloads = _late_tenant_frames(700, first_salted=300, seed=11)
    want = _reference(payloads)
    tenants = [b[5] for blocks in want["tiers"].values() for b in blocks]
    assert tenants.count("a") > 20 and tenants.count("b") > 20 and tenants.count(None) > 100
    # before the first salted frame the flag is 0; the run holding it (frames 256..319) sets it
    early = colpool.ColumnarPool("t", journal=journal)
    _runs_of_64(payloads[:256], early)
    assert int(early.S[colpool.S_TENANTED]) == 0
    many = colpool.ColumnarPool("t", journal=journal)
    _runs_of_64(payloads, many)
    assert int(many.S[colpool.S_TENANTED]) == 1
    one = colpool.ColumnarPool("t", journal=journal)
    for seq, p in enumerate(payloads):
        one.apply(fastwire.decode_columns(seq, p))
    assert state(many) == want and state(one) == want


def test_a_pool_that_forgets_its_tenants_differs_from_the_reference():
    """The test above can fail: with the flag cleared after every run (a pool that never sets
    it, so that no store looks for its parent), children lose their parents' tenants."""
    payloads = _late_tenant_frames(700, first_salted=300, seed=11)
    mutant = colpool.ColumnarPool("t")
    _runs_of_64(payloads, mutant, forget_tenants=True)
    assert state(mutant)["tiers"] != _reference(payloads)["tiers"]
