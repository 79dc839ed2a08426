"""engine.remote.colpool (the columnar pool, compiled) against engine.remote.pool (the
reference, Python): on every recorded fixture, on hostile and corrupted frames, with
restarts and short removal memories, both pools answer every question the same way."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from engine.remote import fastwire, wire
from engine.remote.colpool import ColumnarPool
from engine.remote.fleet import Fleet, fleet_of
from engine.remote.pool import RemotePool
from engine.remote.wire import MalformedFrame, VllmEvent, encode_batch
from tests.test_fastwire import FIXTURES, HOSTILE


# The per-hash questions (find, tiers_holding, num_copies...) are asked of every hash a pool
# knows up to this many; past it, of an even spread of that many and of every hash held more
# than once. Every block, copy count, removal and departure is still compared whole; the
# questions of all 50K hashes of a 20K-frame stream cost 6 s a pool, most of the colpool files' time.
MAX_PROBES = 4_000


def state(pool: Any) -> dict[str, Any]:
    """Everything the rest of Cachescope reads of a pool, as plain values."""
    tiers = {m: [(h, b.parent_hash, b.tokens, b.stored_seq, b.stored_time, b.tenant, b.num_announced, b.num_removed)
                 for h, b in t.items()] for m, t in pool.tiers.items()}
    copies = sorted(pool.copies.items())
    hashes = sorted(set(pool.cached_hashes()) | set(pool.departed) | set(pool.removed_at))
    if len(hashes) > MAX_PROBES:
        hashes = sorted(set(hashes[::-(-len(hashes) // MAX_PROBES)]) | {h for (_, h), _ in copies})
    probes = hashes + [b"\x00" * 8, b"\x07" * 32]
    life = pool.lifetimes
    return {
        "tiers": tiers, "tier_lengths": {m: len(t) for m, t in pool.tiers.items()},
        "mediums": pool.mediums(), "num_cached": pool.num_cached,
        "num_cached_in": {m: pool.num_cached_in(m) for m in ("GPU", "cpu", "CPU_PINNED", "STORAGE", "DISK", "x")},
        "by_group": {m: pool.num_cached_by_group(m) for m in pool.mediums()},
        "without_tokens": {m: pool.num_without_tokens(m) for m in pool.mediums()},
        "copies": copies, "extra": dict(pool.num_extra_copies),
        "held": list(pool.held()), "media": pool.media, "hits": pool.hits_by_session,
        "unknown_events": pool.num_unknown_events, "groups": pool.groups, "details": pool.details,
        "tenants": pool.tenants, "block_size": pool.block_size,
        "counters": (pool.num_batches, pool.num_stored, pool.num_removed, pool.num_cleared,
                     pool.num_unknown_removed, pool.num_restored, pool.num_reported, pool.last_batch_seq,
                     pool.last_batch_time),
        "lifetimes": (life.num, life.total_s, life.max_s),
        "removed_at": [(h, v[1]) for h, v in pool.removed_at.items()],
        "departed": [(h, tuple(v)) for h, v in pool.departed.items()],
        "find": [(lambda hit: None if hit is None else (hit[0], hit[1].block_hash, hit[1].parent_hash,
                                                        hit[1].token_ids, hit[1].tenant))(pool.find(h))
                 for h in probes],
        "tiers_holding": [pool.tiers_holding(h) for h in probes],
        "num_copies": [(pool.num_copies(h, m), pool.num_copies(h, m, 0), pool.num_copies(h, m, 1))
                       for h in probes for m in ("GPU", "CPU", "STORAGE")],
        "details_of": [pool.details_of(h) for h in probes],
        "removal_of": [None if (r := pool.removal_of(h)) is None else r[1] for h in probes],
        "blocks": [(m, b.block_hash) for m, b in pool.blocks()],
    }


def _run(frames: list[tuple[int, bytes]], columnar: bool, max_removed: int = 200_000,
         reset_every: int = 0, via_reference: bool = False, many: int = 0) -> tuple[dict[str, Any], int]:
    """Apply `frames` to a fresh pool; with `many`, the columnar pool takes runs of up to
    `many` decoded frames at once (`apply_many`, a run cut at every reset), as an
    attachment applies what it held."""
    pool = ColumnarPool("t", max_removed=max_removed) if columnar else RemotePool("t", max_removed=max_removed)
    malformed = 0
    held: list[Any] = []
    rng = random.Random(many)
    for i, (seq, payload) in enumerate(frames):
        if reset_every and i and i % reset_every == 0:
            pool.apply_many(held) if held else None
            held = []
            pool.reset(seq)
        try:
            if columnar and not via_reference:
                batch = fastwire.decode_columns(seq, payload)
            else:
                batch = (wire.decode_batch if via_reference else fastwire.decode_batch)(seq, payload)
        except MalformedFrame:
            malformed += 1
            continue
        if many:
            held.append(batch)
            if len(held) >= rng.randint(1, many):
                pool.apply_many(held)
                held = []
        else:
            pool.apply(batch)
    if held:
        pool.apply_many(held)
    return state(pool), malformed


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_fixture_gives_the_reference_pool(name):
    frames = FIXTURES[name]
    ref = _run(frames, False)
    assert _run(frames, True) == ref
    assert _run(frames, True, via_reference=True) == ref
    assert ref[0]["counters"][0] == len(frames)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_short_memories_and_restarts_give_the_reference_pool(name):
    frames = FIXTURES[name]
    for max_removed, reset_every in ((3, 0), (0, 0), (50, 7)):
        assert _run(frames, True, max_removed, reset_every) == _run(frames, False, max_removed, reset_every)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_many_frames_at_once_give_the_pool_of_one_at_a_time(name):
    """`apply_many` (runs of common frames in one compiled call) against `apply` per frame
    and against the reference, with restarts and short removal memories."""
    frames = FIXTURES[name]
    for max_removed, reset_every in ((200_000, 0), (3, 0), (50, 7)):
        one = _run(frames, True, max_removed, reset_every)
        assert _run(frames, True, max_removed, reset_every, many=64) == one
        assert one == _run(frames, False, max_removed, reset_every)


@pytest.mark.parametrize("seed", range(3))
def test_many_synthetic_frames_at_once_give_the_reference_pool(seed):
    frames = _synthetic(300, seed)
    ref = _run(frames, False)
    assert _run(frames, True, many=16) == ref
    assert _run(frames, True, 30, 97, many=64) == _run(frames, False, 30, 97)


def test_many_bench_frames_at_once_give_the_pool_of_one_at_a_time():
    """The common case `bench attach` times (GPU and CPU stores, evictions), where every
    frame is common and whole runs go to the compiled loop."""
    from engine.bench.attach import recorded_stream

    payloads, _, _ = recorded_stream(3_000, gpu_blocks=400, seed=5)
    frames = list(enumerate(payloads))
    batches = [fastwire.decode_columns(seq, p) for seq, p in frames]
    assert all(not b.events for b in batches)
    ref = _run(frames, False, 500)
    assert _run(frames, True, 500, many=64) == ref
    assert _run(frames, True, 500, many=1) == ref
    whole = ColumnarPool("t", max_removed=500)
    whole.apply_many(batches)
    assert state(whole) == ref[0]


def test_the_comparison_can_fail():
    frames = FIXTURES["vllm_copies/vllm_copies_events.jsonl"]
    assert _run(frames, True) != _run(frames[:-1], False)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_frames_give_the_reference_pool(name):
    payload = HOSTILE[name]
    frames = [(0, encode_batch(1.0, [VllmEvent("BlockStored", (b"\x00" * 7 + b"\x4d",), None, tuple(range(16)), 16)])),
              (1, payload)]
    assert _run(frames, True) == _run(frames, False)


def test_corrupted_fixture_frames_give_the_reference_pool():
    """Bytes flipped, cut and inserted at random in real frames, applied in sequence."""
    rng = random.Random(21)
    names = ("vllm_connector/vllm_connector_frames.jsonl", "sglang/sglang_zmq_frames.jsonl",
             "vllm_copies/vllm_copies_events.jsonl", "vllm_copies/vllm_connector_one_server.jsonl")
    for name in names:
        frames = []
        for seq, p in FIXTURES[name] * 3:
            p = bytearray(p)
            if rng.random() < 0.3:
                at = rng.randrange(len(p))
                how = rng.randrange(3)
                if how == 0:
                    p[at] = rng.randrange(256)
                elif how == 1:
                    del p[at:]
                else:
                    p[at:at] = bytes([rng.randrange(256)])
            frames.append((seq, bytes(p)))
        col, ref = _run(frames, True, 40), _run(frames, False, 40)
        assert col == ref
        assert ref[1] > 0  # some frames were malformed


def _synthetic(num_batches: int, seed: int) -> list[tuple[int, bytes]]:
    """Stores, copies, removals of held and unknown hashes, groups, tenants, tiers and clears."""
    rng = random.Random(seed)
    held: list[int] = []
    frames = []
    for seq in range(num_batches):
        events = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.5 or not held:
                k = rng.randint(1, 5)
                hashes = [rng.choice(held) if held and rng.random() < 0.2 else rng.randrange(1, 1 << 64)
                          for _ in range(k)]
                parent = rng.choice(held) if held and rng.random() < 0.6 else None
                medium = rng.choice(["GPU", "GPU", "GPU", "CPU", None, "cpu", "STORAGE"])
                group = rng.choice([None, None, None, 0, 1, 2])
                extra = None
                if rng.random() < 0.2:
                    extra = tuple(("salt-%d" % rng.randrange(3),) if rng.random() < 0.5 else None for _ in hashes)
                salt = f"tenant-{rng.randrange(3)}" if rng.random() < 0.1 else None
                events.append(VllmEvent("BlockStored", tuple(h.to_bytes(8, "big") for h in hashes),
                                        parent.to_bytes(8, "big") if parent is not None else None,
                                        tuple(rng.randrange(50_000) for _ in range(16 * k)) if rng.random() < 0.9
                                        else (), 16 if rng.random() < 0.9 else 0, medium=medium,
                                        extra_keys=extra, group_idx=group, cache_salt=salt,
                                        session_id=rng.choice([None, "s1"])))
                held.extend(hashes)
            elif r < 0.93:
                k = rng.randint(1, 4)
                victims = [held.pop(rng.randrange(len(held))) if rng.random() < 0.9 else rng.randrange(1 << 64)
                           for _ in range(min(k, len(held)))]
                events.append(VllmEvent("BlockRemoved", tuple(h.to_bytes(8, "big") for h in victims),
                                        medium=rng.choice(["GPU", "GPU", "CPU", None]),
                                        group_idx=rng.choice([None, None, 0, 1])))
            else:
                events.append(VllmEvent("AllBlocksCleared", medium=rng.choice([None, "CPU", "GPU"])))
        frames.append((seq, encode_batch(1_796_000_000.0 + seq * 0.5, events, 0)))
    return frames


@pytest.mark.parametrize("seed", range(6))
def test_synthetic_streams_give_the_reference_pool(seed):
    frames = _synthetic(300, seed)
    assert _run(frames, True) == _run(frames, False)
    assert _run(frames, True, 30, 97) == _run(frames, False, 30, 97)


def test_the_fleet_reads_the_columnar_pools_as_the_reference_ones():
    a, b = _synthetic(200, 7), _synthetic(200, 8)
    fleets = []
    for cls in (RemotePool, ColumnarPool):
        pools = []
        for name, frames in (("pod-a", a), ("pod-b", b), ("pod-b", a[:120])):
            pool = cls(name, rank=len(pools), server=name)
            for seq, p in frames:
                pool.apply(fastwire.decode_columns(seq, p) if cls is ColumnarPool else fastwire.decode_batch(seq, p))
            pools.append(pool)
        fleets.append(fleet_of(pools))
    ref, col = fleets
    assert isinstance(ref, Fleet)
    keys = [k for _m, k, _n in list(ref.pools()[2].held())[:40]]
    for f in (ref, col):
        assert f.summaries()
    assert [s.to_dict() for s in col.summaries()] == [s.to_dict() for s in ref.summaries()]
    assert [r.to_dict() for r in col.pool_rows()] == [r.to_dict() for r in ref.pool_rows()]
    assert [s.to_dict() for s in col.shared_blocks()] == [s.to_dict() for s in ref.shared_blocks()]
    assert [loc.to_dict() for loc in col.locate(keys)] == [loc.to_dict() for loc in ref.locate(keys)]
    assert col.route(keys, 16).to_dict() == ref.route(keys, 16).to_dict()


def test_no_python_object_per_block():
    """The pool's blocks live in numpy arrays: a million-block stream adds no Python objects."""
    import gc

    from engine.bench.attach import recorded_stream

    payloads, _, _ = recorded_stream(4_000, gpu_blocks=100_000, seed=2)
    warm = ColumnarPool("warm")  # every compiled path (growth, rehash) loaded once
    for seq, p in enumerate(payloads):
        warm.apply(fastwire.decode_columns(seq, p))
    pool = ColumnarPool("t")
    gc.collect()
    before = len(gc.get_objects())
    for seq, p in enumerate(payloads):
        pool.apply(fastwire.decode_columns(seq, p))
    gc.collect()
    assert pool.num_cached > 15_000
    assert len(gc.get_objects()) - before < 300  # a few per array grown, none per block
    assert isinstance(pool.K, np.ndarray)


def test_the_columnar_pool_holds_a_block_in_fewer_bytes_than_the_reference():
    """Traced memory (bench attach's measure, every array at its capacity), not a speed."""
    from engine.bench.attach import memory_per_block

    ref = memory_per_block(20_000)
    col = memory_per_block(20_000, fastwire.decode_columns, ColumnarPool)
    assert col["blocks"] == ref["blocks"] >= 20_000
    # 16 token ids below 2**16 are 32 bytes alone (uint16), the hash and its parent's 16
    assert 48 < col["bytes_per_block"] < ref["bytes_per_block"]


def test_an_attachment_with_columnar_pools_holds_what_the_reference_holds():
    """Through real ZMQ sockets (a late join refilled from the replay socket, then live
    frames): `AttachOptions(columnar=True)` gives pools equal to the reference's."""
    from test_vllm_attach import FixtureServer, attach, wait_for

    results = []
    for columnar in (False, True):
        server = FixtureServer()
        att, got = attach(server, server.replay_endpoint, columnar=columnar)
        try:
            server.wait_joined()
            for frames in server.pub_frames[:3]:
                server.send(frames)
            wait_for(lambda: len(got.batches) == 4)
            with att.lock:
                assert isinstance(att.pools[0], ColumnarPool) == columnar
                results.append(state(att.pools[0]))
                summaries = [{**s.to_dict(), "server": ""} for s in att.fleet().summaries()]  # ports differ
            results.append(summaries)
        finally:
            att.stop()
            server.close()
    assert results[2:] == results[:2]
    assert results[0]["tenants"] == {"tenant-a"} and results[0]["num_cached"] > 0


# ---- the journal (ColumnarPool(journal=True)) against the reference's emitted events ------

def _reference_events(frames: list[tuple[int, bytes]], max_removed: int, reset_every: int) -> tuple[list, Any]:
    from engine.core.events import BlockEvicted, BlockStored, CacheReset, EventBus

    bus = EventBus()
    bus.subscribe(lambda event: None)  # someone listens: the reference emits
    pool = RemotePool("t", events=bus, max_removed=max_removed)
    out: list[tuple] = []
    for i, (seq, payload) in enumerate(frames):
        events = []
        if reset_every and i and i % reset_every == 0:
            events += pool.reset(seq)
        try:
            batch = fastwire.decode_batch(seq, payload)
        except MalformedFrame:
            batch = None
        if batch is not None:
            events += pool.apply(batch)
        for e in events:
            if isinstance(e, BlockStored):
                out.append(("stored", e.remote.medium, e.block_hash, e.parent_hash, tuple(e.token_ids), e.salt,
                            e.remote.batch_seq))
            elif isinstance(e, BlockEvicted):
                out.append(("removed", e.remote.medium, e.block_hash, e.remote.batch_seq))
            elif isinstance(e, CacheReset):
                out.append(("cleared", e.num_blocks_cleared, e.remote.batch_seq))
            else:
                raise AssertionError(e)
    return out, pool


def _journal_events(frames: list[tuple[int, bytes]], max_removed: int, reset_every: int, many: int,
                    take_every: int = 0, release_min: int = 0) -> tuple[list, ColumnarPool]:
    """The journal's rows as the reference's events; with `release_min`, each take is
    released at once (rows dropped once that many are released) and read afterwards."""
    from engine.remote.colpool import OP_CLEARED, OP_REMOVED, OP_STORED

    pool = ColumnarPool("t", max_removed=max_removed, journal=True)
    if release_min:
        pool._release_min_rows = release_min
    parts = []
    held: list[Any] = []
    for i, (seq, payload) in enumerate(frames):
        if reset_every and i and i % reset_every == 0:
            pool.apply_many(held)
            held = []
            pool.reset(seq)
        try:
            held.append(fastwire.decode_columns(seq, payload))
        except MalformedFrame:
            pass
        if len(held) >= max(many, 1):
            pool.apply_many(held)
            held = []
        if take_every and i % take_every == 0:
            parts.append(pool.take_journal())
            if release_min:
                pool.release_journal(parts[-1].stop)
    pool.apply_many(held)
    parts.append(pool.take_journal())
    out: list[tuple] = []
    stores: list[tuple] = []
    for j in parts:
        names = j.tier_names
        for r in range(len(j)):
            op, tier, seq = int(j.op[r]), int(j.tier[r]), int(j.seq[r])
            h = pool.hash_of(j.key[r], j.width[r]) if op != OP_CLEARED else None
            if op == OP_STORED:
                o = int(j.store[r])
                assert o == len(stores)  # store rows are numbered in order
                pw = int(j.parent_width[o])
                parent = pool.hash_of(j.parent[o], pw) if pw else None
                ten = int(j.tenant[o])
                row = ("stored", names[tier], h, parent, tuple(j.token_ids(o).tolist()),
                       pool.tenant_names[ten - 1] if ten else None, seq)
                stores.append(row)
                out.append(row)
            elif op == OP_REMOVED:
                o = int(j.store[r])
                if o >= 0:  # the store that made the slot it took: same hash, same tier
                    assert stores[o][1:3] == (names[tier], h)
                out.append(("removed", names[tier], h, seq))
            else:
                assert op == OP_CLEARED
                out.append(("cleared", int(j.store[r]), seq))
    return out, pool


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_journal_says_what_the_reference_emits(name):
    """Every fixture: the same blocks, parents, token ids, tenants, tiers and order as the
    reference's BlockStored / BlockEvicted / CacheReset, frame by frame or many at once,
    and the journalling pool is still the reference's pool."""
    frames = FIXTURES[name]
    for max_removed, reset_every in ((200_000, 0), (5, 4)):
        ref_events, _ = _reference_events(frames, max_removed, reset_every)
        assert ref_events
        # (an emitting reference dates a clear's removals by the batch, a quiet one by the
        # last batch before it: the journalling pool is the quiet reference's pool)
        quiet = _run(frames, False, max_removed, reset_every)[0]
        for many in (1, 64):
            got, pool = _journal_events(frames, max_removed, reset_every, many, take_every=3)
            assert got == ref_events
            assert state(pool) == quiet


@pytest.mark.parametrize("seed", range(4))
def test_the_journal_of_synthetic_streams_says_what_the_reference_emits(seed):
    """Copies, groups, salts, unknown removals and clears; the pool's token array grows
    under the rows already taken (earlier views must still read their tokens)."""
    frames = _synthetic(250, seed)
    ref_events, _ = _reference_events(frames, 30, 61)
    assert any(e[0] == "cleared" for e in ref_events) and any(e[0] == "removed" for e in ref_events)
    got, pool = _journal_events(frames, 30, 61, 16, take_every=5)
    assert got == ref_events
    assert state(pool) == _run(frames, False, 30, 61)[0]


def test_the_journal_keeps_a_removed_blocks_hash_and_tokens_after_its_slot_is_reused():
    from engine.remote.colpool import OP_REMOVED, OP_STORED

    h = [bytes(7) + bytes([i]) for i in range(4)]
    frames = [(0, encode_batch(1.0, [VllmEvent("BlockStored", (h[0],), None, tuple(range(16)), 16)])),
              (1, encode_batch(2.0, [VllmEvent("BlockRemoved", (h[0],))])),
              (2, encode_batch(3.0, [VllmEvent("BlockStored", (h[1],), None, tuple(range(100, 116)), 16)]))]
    pool = ColumnarPool("t", journal=True)
    for seq, p in frames:
        pool.apply(fastwire.decode_columns(seq, p))
    j = pool.take_journal()
    assert j.op.tolist() == [OP_STORED, OP_REMOVED, OP_STORED]
    assert j.slot[0] == j.slot[1] == j.slot[2]  # the slot was reused
    assert pool.hash_of(j.key[1], j.width[1]) == h[0] and j.store[1] == 0
    assert j.token_ids(0).tolist() == list(range(16))
    assert j.token_ids(1).tolist() == list(range(100, 116))
    assert len(pool.take_journal()) == 0
    assert len(pool.journal_since(1)) == 2
    with pytest.raises(ValueError):
        ColumnarPool("t").take_journal()


def test_the_journal_comparison_can_fail():
    frames = FIXTURES["vllm_copies/vllm_copies_events.jsonl"]
    ref_events, _ = _reference_events(frames, 200_000, 0)
    got, _ = _journal_events(frames[:-1], 200_000, 0, 1)
    assert got != ref_events


def test_a_columnar_attachment_holds_frames_and_applies_them_many_at_once():
    """Nobody listening per batch: a columnar stream holds what arrives and applies runs
    of it at once (at idle, or every HOLD_FRAMES); through a real ZMQ socket, 400 frames
    published as fast as they go give the pool of applying them one by one."""
    import zmq
    from test_vllm_attach import free_ports, wait_for, wait_for_subscriber

    from engine.bench.attach import recorded_stream
    from engine.remote import AttachOptions, Attachment
    from engine.remote.attachment import HOLD_FRAMES

    payloads, _, _ = recorded_stream(4_000, gpu_blocks=600, seed=9)
    payloads = payloads[:400]
    one = ColumnarPool("t")
    for seq, p in enumerate(payloads):
        one.apply(fastwire.decode_columns(seq, p))
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = free_ports()
    pub.bind(f"tcp://127.0.0.1:{port}")
    att = Attachment(AttachOptions((f"tcp://127.0.0.1:{port}",), columnar=True, max_removed=200_000))
    runs: list[int] = []
    try:
        att.start()
        pool = att.pools[0]
        real = pool.apply_many
        pool.apply_many = lambda batches: (runs.append(len(batches)), real(batches))[1]
        wait_for_subscriber(pub)
        for seq, p in enumerate(payloads):
            pub.send_multipart([b"", seq.to_bytes(8, "big"), p])
        wait_for(lambda: att.pools[0].num_batches == len(payloads), timeout=30)
        with att.lock:
            got = state(att.pools[0])
            health = att.health()[0]
    finally:
        att.stop()
        pub.close(linger=0)
    assert health.batches == len(payloads) and health.missed == 0
    assert sum(runs) == len(payloads) and max(runs) <= HOLD_FRAMES
    assert max(runs) > 1  # frames were applied many at once
    assert got == state(one)


def test_token_ids_are_held_narrow_until_one_needs_32_bits():
    """uint16 while every id is below 2**16 (SmolLM2's vocabulary), widened once on the first
    larger id (Llama 3's): every block reads back its ids, equal to the reference's, and the
    journal's earlier rows still read theirs."""
    def store(i: int, tokens: list[int], parent: int | None = None) -> VllmEvent:
        return VllmEvent("BlockStored", (((1 << 63) + i).to_bytes(8, "big"),),
                         None if parent is None else ((1 << 63) + parent).to_bytes(8, "big"), tuple(tokens), 16)

    small = list(range(49_136, 49_152))
    frames = [(0, encode_batch(1.0, [store(0, small), store(1, [65_535] * 16, 0)])),
              (1, encode_batch(2.0, [store(2, list(range(128_240, 128_256)), 1)])),
              (2, encode_batch(3.0, [VllmEvent("BlockRemoved", (((1 << 63) + 1).to_bytes(8, "big"),)),
                                     store(3, [2 ** 32 - 1] * 16, 2)]))]
    for many in (0, 64):
        pool = ColumnarPool("t", journal=True)
        batches = [fastwire.decode_columns(s, p) for s, p in frames]
        pool.apply(batches[0]) if not many else pool.apply_many(batches[:1])
        assert pool.tok.dtype == np.uint16
        before = pool.take_journal()
        pool.apply_many(batches[1:]) if many else [pool.apply(b) for b in batches[1:]]
        assert pool.tok.dtype == np.uint32
        assert before.token_ids(0).tolist() == small and before.token_ids(1).tolist() == [65_535] * 16
        assert pool.take_journal().token_ids(3).tolist() == [2 ** 32 - 1] * 16
        assert state(pool) == _run(frames, False)[0]
    # the widening happens once, from the first id that needs it, on every path
    assert _run(frames, True) == _run(frames, False) == _run(frames, True, via_reference=True)


# ---- the narrow layout: uint32 L columns and the batch table

def test_store_orders_renumbered_and_l_widened_keep_the_reference_pool():
    """A uint32 L past what it holds: the store orders are renumbered (only their order is
    read), and past the token starts' limit L is widened to int64 once; both keep every
    answer the reference gives, including the tier order and clears."""
    from engine.bench.attach import recorded_stream

    payloads, _, _ = recorded_stream(2_000, gpu_blocks=300, seed=8)
    frames = list(enumerate(payloads)) + FIXTURES["vllm_copies/vllm_copies_events.jsonl"]
    frames = [(i, p) for i, (_, p) in enumerate(frames)]
    ref = _run(frames, False, 300, 50)
    for attr, value, dtype in (("_order_limit", 3_000, np.uint32), ("_narrow_limit", 5_000, np.int64)):
        old = getattr(ColumnarPool, attr)
        setattr(ColumnarPool, attr, value)
        try:
            pool = ColumnarPool("t", max_removed=300)
            for i, (seq, p) in enumerate(frames):
                if i and i % 50 == 0:
                    pool.reset(seq)
                pool.apply(fastwire.decode_columns(seq, p))
            assert pool.L.dtype == dtype and state(pool) == ref[0]
            assert _run(frames, True, 300, 50, many=64) == ref
        finally:
            setattr(ColumnarPool, attr, old)
    pool = ColumnarPool("t")
    pool.apply(fastwire.decode_columns(*frames[0]))
    assert pool.L.dtype == np.uint32 and ColumnarPool("t", journal=True).L.dtype == np.uint32


def test_the_batch_table_keeps_only_the_batches_held_blocks_name():
    """A long stream whose blocks are removed two batches after their store: the table of
    batch seqs and times keeps its first size (rows no held block names are dropped), and
    every block still reads its own batch's seq and time, as the reference does."""
    def h(i: int) -> bytes:
        return ((1 << 63) + i).to_bytes(8, "big")

    frames = []
    for i in range(2_000):
        events = [VllmEvent("BlockStored", tuple(h(4 * i + j) for j in range(4)), h(4 * i - 1) if i else None,
                            tuple(range(64)), 16)]
        if i >= 2:
            events.append(VllmEvent("BlockRemoved", tuple(h(4 * (i - 2) + j) for j in range(4))))
        frames.append((i, encode_batch(1_796_000_000.0 + i / 7, events)))
    ref = _run(frames, False, 100)
    for many in (0, 64):
        pool = ColumnarPool("t", max_removed=100)
        if many:
            for a in range(0, len(frames), many):
                pool.apply_many([fastwire.decode_columns(seq, p) for seq, p in frames[a:a + many]])
        else:
            for seq, p in frames:
                pool.apply(fastwire.decode_columns(seq, p))
        assert len(pool.T) == len(pool.BSEQ) == 256 and pool.num_cached == 8
        assert state(pool) == ref[0]
