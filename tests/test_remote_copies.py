"""Physical copies of one block hash in a remote pool, against what vLLM 0.33.0 held.

`data/vllm_copies/vllm_copies_events.jsonl` was recorded from vLLM's own KVCacheManager
(two concurrent requests with one block-aligned prompt, the prompt regenerated, a
one-block prompt computed twice, then evictions), with vLLM's own count of the blocks
holding each hash after every batch; `vllm_connector_one_server.jsonl` is the
offloading-connector story of `data/vllm/vllm_connector_frames.jsonl`. The pool, the
projection the views draw and the attach path must hold what vLLM held.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import zmq

from app.commands.attach import _summary
from engine.remote.overlay import RemoteOverlay
from engine.core.events import BlockEvicted, BlockStored, EventBus
from engine.core.hashing import BlockHasher
from engine.core.projection import EventLog, stream_code
from engine.remote import AttachOptions, Attachment, RemotePool, probe_prompt
from engine.remote.wire import VllmBatch, VllmEvent, canonical_hash, decode_batch, parse_pub
from tests.test_vllm_attach import free_ports, wait_for

DATA = Path(__file__).resolve().parent / "data" / "vllm_copies"
P = list(range(1000, 1064))  # the recorded block-aligned prompt (4 blocks)
H = canonical_hash


def rows(scenario: str) -> list[dict]:
    out = [row for row in map(json.loads, (DATA / "vllm_copies_events.jsonl").read_text().splitlines())
           if row["scenario"] == scenario]
    assert out, f"no recorded scenario {scenario!r}"
    return out


def recorded(scenario: str) -> list[tuple[str, VllmBatch | None, dict[bytes, int]]]:
    """(note, batch or None for a step without events, vLLM's blocks per hash in group 0)."""
    return [(row["note"],
             decode_batch(row["seq"], base64.b64decode(row["payload"])) if row["seq"] is not None else None,
             {bytes.fromhex(h): n for h, n in row["held"].get("0", {}).items()})
            for row in rows(scenario)]


def gpu_copies(pool: RemotePool) -> dict[bytes, int]:
    return {h: pool.num_copies(h, "GPU", 0) for h in pool.tiers.get("GPU", {})}


def left_tier(steps) -> int:
    """How many times a hash stopped being held at all (what LifetimeStats counts)."""
    num, before = 0, {}
    for _, _, held in steps:
        num += len(set(before) - set(held))
        before = held
    return num


def slots_per_hash(projection) -> dict[bytes, int]:
    return {h: len(b) for h, b in projection.by_hash.items()}


@pytest.mark.parametrize("listen", [False, True], ids=["fast-path", "with-events"])
@pytest.mark.parametrize("scenario", ["incremental", "full"])
def test_the_pool_holds_every_copy_vllm_holds(scenario, listen):
    bus = EventBus()
    if listen:
        bus.subscribe(lambda e: None)
    pool = RemotePool("vllm", events=bus)
    steps = recorded(scenario)
    for note, batch, held in steps:
        if batch is not None:
            pool.apply(batch)
        assert set(pool.tiers.get("GPU", {})) == set(held), note
        assert pool.num_cached_in("GPU") == pool.num_cached == sum(held.values()), note
        assert gpu_copies(pool) == held, note
    assert pool.num_unknown_removed == 0 and not pool.copies  # every extra copy removed again
    # copies beyond the first: block 3 of P twice (the concurrent request, the regenerated
    # one), the one-block prompt once; the full mode's reuse reports add none
    assert (pool.num_restored, pool.num_reported) == ((3, 0) if scenario == "incremental" else (2, 3 + 3 + 4))
    assert pool.lifetimes.num == left_tier(steps)
    num_removed = sum(len(e.block_hashes) for _, b, _ in steps if b for e in b.events if e.kind == "BlockRemoved")
    assert pool.num_removed == num_removed
    assert pool.num_stored - pool.num_removed == pool.num_cached


def test_a_removed_copy_is_no_removal_of_its_hash():
    pool = RemotePool("vllm")
    hasher = BlockHasher("vllm-sha256")
    steps = recorded("incremental")
    last = hasher.hash_chain(P, 16)[-1][-8:]  # P's block 3, as the server names it
    num_checked = 0
    for note, batch, held in steps:
        if batch is not None:
            pool.apply(batch)
        if note.startswith("a new prompt") and held.get(last):
            # vLLM has just evicted a copy of P's block 3; another still holds it
            assert pool.removal_of(last) is None
            result = probe_prompt([pool], P + [1], hasher, 16)
            assert result.cached_tokens == 64 and result.first_missing_block == 4, note
            num_checked += 1
    assert num_checked == 2 and pool.removal_of(last) is not None  # its last copy went in the end


@pytest.mark.parametrize("scenario", ["incremental", "full"])
def test_the_projection_draws_each_copy_in_a_slot_of_its_own(scenario):
    bus = EventBus()
    log = EventLog(0, 16, checkpoint_every=5)
    overlay = RemoteOverlay()
    batch_events: list = []
    bus.subscribe(batch_events.append)
    pool = RemotePool("vllm", events=bus)
    steps = recorded(scenario)
    seq_after: list[tuple[int, dict[bytes, int]]] = []
    for note, batch, held in steps:
        if batch is not None:
            batch_events.clear()
            pool.apply(batch)
            overlay.before(batch_events, log.live)  # as app.runtime.state.PoolState.apply_events
            log.extend(batch_events)
            overlay.observe(batch_events, log.live)
        p = log.live
        assert slots_per_hash(p) == held, note
        assert p.num_hashed == p.num_cached_free == sum(held.values()), note
        gpu = next(c.num_blocks for c in overlay.tier_counts(p) if c.tier == "GPU")
        assert gpu == sum(held.values()), note
        if log.last_seq is not None:
            seq_after.append((log.last_seq, held))
    removed = [e for e in log.events if isinstance(e, BlockEvicted)]
    assert p.counters.num_evicted_blocks == len(removed) == len(overlay.lifetimes)  # one per copy
    assert sum(isinstance(e, BlockStored) for e in log.events) == pool.num_stored
    for seq, held in seq_after:  # scrubbing rebuilds the same slots from checkpoints
        assert slots_per_hash(log.state_at(seq)) == held


def test_a_removal_frees_a_copy_of_its_own_tier_group_and_rank():
    bus = EventBus()
    log = EventLog(0, 16)
    bus.subscribe(log.append)
    r0, r1 = RemotePool("vllm", 0, bus), RemotePool("vllm rank 1", 1, bus)
    h, g = H(7), H(8)
    stored = VllmEvent("BlockStored", (h,), None, tuple(range(16)), 16, medium="GPU", group_idx=0)
    r0.apply(VllmBatch(0, 1.0, (stored,), 0))
    r0.apply(VllmBatch(1, 1.1, (VllmEvent("BlockStored", (h,), None, (), 0, medium="CPU"),), 0))
    r0.apply(VllmBatch(2, 1.2, (VllmEvent("BlockStored", (h, g), None, tuple(range(32)), 16, medium="GPU",
                                          group_idx=1),), 0))
    r1.apply(VllmBatch(0, 1.3, (stored,), 1))
    assert r0.num_cached == 4 and r0.num_cached_in("GPU") == 3
    assert len(log.live.by_hash[h]) == 4  # GPU group 0 and 1, CPU, and rank 1's GPU copy
    assert [r0.num_copies(h, m, grp) for m, grp in (("GPU", 0), ("GPU", 1), ("CPU", 0))] == [1, 1, 1]
    assert r0.num_copies(h, "GPU") == 2

    # slot_ranks holds each copy's stream (server and rank) as the process numbers it
    # (projection.stream_code: the numbers depend on what ran before in this process)
    streams = {stream_code("vllm", 0): 0, stream_code("vllm rank 1", 1): 1}

    def where(b: int) -> tuple[int, str, int]:
        return (streams[log.live.slot_ranks[b]], *log.live.places[log.live.slot_places[b] - 1])

    # group 1 holds one copy of h: a second removal there is unknown and frees nothing
    r0.apply(VllmBatch(3, 2.0, (VllmEvent("BlockRemoved", (h, h), medium="GPU", group_idx=1),), 0))
    assert r0.num_copies(h, "GPU", 1) == 0 and r0.num_unknown_removed == 1
    assert sorted(where(b) for b in log.live.by_hash[h]) == [(0, "CPU", 0), (0, "GPU", 0), (1, "GPU", 0)]
    # a removal naming no group takes group 0's copy; the CPU and rank 1 keep theirs
    r0.apply(VllmBatch(4, 2.5, (VllmEvent("BlockRemoved", (h,), medium="GPU"),), 0))
    assert h not in r0.tiers["GPU"] and r0.num_copies(h, "CPU") == 1 and r1.num_copies(h) == 1
    assert sorted(where(b) for b in log.live.by_hash[h]) == [(0, "CPU", 0), (1, "GPU", 0)]
    assert r0.removal_of(h) is not None  # it left the GPU tier
    assert r0.lifetimes.num == 1 and r0.lifetimes.max_s == pytest.approx(1.5)  # from its first copy
    # a CPU-only clear keeps the GPU counts; a full one forgets every copy
    r0.apply(VllmBatch(5, 3.0, (VllmEvent("AllBlocksCleared", medium="CPU"),), 0))
    assert r0.num_cached == r0.num_cached_in("GPU") == 1 and r0.num_copies(g, "GPU", 1) == 1
    r0.apply(VllmBatch(6, 3.1, (VllmEvent("AllBlocksCleared"),), 0))
    assert r0.num_cached == 0 and not r0.copies and not r0.num_extra_copies


def connector_batches() -> list[VllmBatch]:
    out = []
    for line in (DATA / "vllm_connector_one_server.jsonl").read_text().splitlines():
        _, seq, payload = parse_pub([base64.b64decode(f) for f in json.loads(line)["frames"]])
        out.append(decode_batch(seq, payload))
    return out


def test_offloaded_chunks_count_their_repeated_announcements():
    bus = EventBus()
    log = EventLog(0, 16)
    overlay = RemoteOverlay()
    events: list = []
    bus.subscribe(events.append)
    pool = RemotePool("vllm", events=bus)
    a = [H(int(x, 16)) for x in ("d1ecdf87c874fd55", "2e94951059393917", "144e9e182eba6c69", "6c7227160ecd624a")]
    c = a[:2] + [H(int(x, 16)) for x in ("f75a7a8ae8906883", "6ef4ef4f48e20601")]
    for batch in connector_batches():
        events.clear()
        pool.apply(batch)
        overlay.before(events, log.live)
        log.extend(events)
        overlay.observe(events, log.live)
        slots = {t.tier: t.num_blocks for t in overlay.tier_counts(log.live)}
        if batch.seq == 1:  # a second GPU copy of A's first two blocks
            assert pool.num_cached_in("GPU") == slots["GPU"] == 6
            assert gpu_copies(pool) == {a[0]: 2, a[1]: 2, a[2]: 1, a[3]: 1}
        elif batch.seq == 2:  # one copy removed: A stays whole
            assert set(pool.tiers["GPU"]) == set(a) and pool.num_cached_in("GPU") == slots["GPU"] == 4
            assert gpu_copies(pool) == {h: 1 for h in a}
        elif batch.seq == 3:  # C's reuse report (full mode) re-announces blocks 0-1: no copies
            assert pool.num_cached_in("GPU") == slots["GPU"] == 6
            assert gpu_copies(pool) == {h: 1 for h in a + c} and pool.num_reported == 2
        elif batch.seq == 5:  # chunks A and C on STORAGE share blocks 0-1, announced twice
            assert pool.num_cached_in("STORAGE") == slots["STORAGE"] == 8
            assert {h: pool.num_copies(h, "STORAGE") for h in a + c[2:]} == {
                a[0]: 2, a[1]: 2, a[2]: 1, a[3]: 1, c[2]: 1, c[3]: 1}
        elif batch.seq == 6:  # chunk A evicted, fanned out: C still holds blocks 0-1
            assert set(pool.tiers["STORAGE"]) == set(c)  # vLLM: 4 blocks on STORAGE
            assert pool.num_cached_in("STORAGE") == slots["STORAGE"] == 4
            assert {h: pool.num_copies(h, "STORAGE") for h in c} == {h: 1 for h in c}
    assert pool.num_unknown_removed == 0
    # the sliding-window group's block is a copy of its own; LMCache's `cuda:0` is one more
    # GPU copy of block 0 (a connector's tier, not a reuse report); the media fold into
    # one tier model with the raw names kept
    assert pool.num_copies(c[3], "GPU", 1) == 1 and pool.num_copies(a[0], "GPU") == 2
    assert {m: pool.num_cached_in(m) for m in pool.tiers} == {"GPU": 8, "CPU": 4, "STORAGE": 4}
    assert pool.media == {"GPU": {"GPU": 9, "cuda:0": 1}, "CPU": {"CPU": 2, "cpu": 2}, "STORAGE": {"STORAGE": 8}}
    assert pool.num_without_tokens("CPU") == 2 and pool.num_without_tokens("GPU") == 0  # the placeholders
    assert pool.hits_by_session == {"sess-c": 2}  # the reuse report, a hit of C's session
    assert log.live.num_hashed == pool.num_cached == 16


def test_what_a_reuse_report_hides():
    """The two cases the wire cannot tell apart (vLLM's BlockStored carries no origin)."""
    pool = RemotePool("vllm")
    steps = recorded("full-first-report")
    diffs = []
    for note, batch, held in steps:
        if batch is not None:
            pool.apply(batch)
            mine = gpu_copies(pool)
            diffs.append({h.hex()[:6]: mine.get(h, 0) - held.get(h, 0)
                          for h in set(mine) | set(held) if mine.get(h, 0) != held.get(h, 0)})
    # Batch 1: the server's first report is one nothing follows (every full block of the
    # prompt hit), so its 4 blocks read as copies, and stay counted.
    assert diffs[0] == {} and diffs[1] == {"659e8e": 1, "ec4f29": 1, "1dcf2e": 1, "aa6d61": 1}
    # Batch 2 continues a report: from then on, stores of that shape are reports...
    assert pool.num_reported >= 3
    # ...so the one-block prompt computed again (batch 4) is missed as a copy.
    assert diffs[4] == {**diffs[1], "ce3ebc": -1}
    # vLLM removes its two copies; the second removal finds none left
    assert pool.num_unknown_removed == 1 and "ce3ebc" not in diffs[-1]
    assert diffs[-1] == {"659e8e": 1, "ec4f29": 1, "1dcf2e": 1, "aa6d61": 1}


def test_the_attach_path_over_zmq_holds_what_vllm_held():
    sent_rows = [row for row in rows("incremental") if row["seq"] is not None]
    held_after = {row["seq"]: {bytes.fromhex(h): n for h, n in row["held"]["0"].items()} for row in sent_rows}
    ctx = zmq.Context.instance()
    port = free_ports()
    pub = ctx.socket(zmq.XPUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    log = EventLog(0, 16)
    batches: list[int] = []
    att = Attachment(AttachOptions((f"tcp://127.0.0.1:{port}",), topic="kv-events"),
                     on_batch=lambda pool, batch, events: batches.append(batch.seq))
    att.events.subscribe(log.append)
    att.start()
    try:
        assert pub.poll(10_000), "no subscriber joined"
        pub.recv_multipart()
        for part in (sent_rows[:5], sent_rows[5:]):  # seq 4: vLLM has evicted one copy of several
            for row in part:  # the frames vLLM's PUB socket sends
                pub.send_multipart([b"kv-events", row["seq"].to_bytes(8, "big"), base64.b64decode(row["payload"])])
            wait_for(lambda: len(batches) == part[-1]["seq"] + 1)
            held = held_after[part[-1]["seq"]]
            with att.lock:
                assert slots_per_hash(log.live) == held
                assert att.combined.num_cached == sum(held.values()) and gpu_copies(att.pools[0]) == held
                row = _summary(att)[0]  # `attach`'s summary counts copies per tier, as its "cached" does
                assert row["tiers"] == {"GPU": sum(held.values())} == {"GPU": row["cached"]}
    finally:
        att.stop()
        pub.close(linger=0)


def test_a_new_stream_met_by_two_threads_at_once_gets_one_number(monkeypatch):
    # an attach's placing thread, its GUI tick and the bridge's engine thread may meet a new
    # stream first at the same moment; two numbers for it left a slot that its removals and
    # clears no longer named. A lookup that misses is made slow here, so both threads miss.
    import threading
    import time

    from engine.core import projection

    class SlowMiss(dict):
        def get(self, key, default=None):
            got = super().get(key, default)
            if got is None:
                time.sleep(0.02)
            return got

    monkeypatch.setattr(projection, "_STREAMS", SlowMiss(projection._STREAMS))
    barrier = threading.Barrier(4)
    codes: list[int] = []

    def meet() -> None:
        barrier.wait()
        codes.append(stream_code("met at once", 3))

    threads = [threading.Thread(target=meet) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(codes)) == 1 and codes[0] == stream_code("met at once", 3)
