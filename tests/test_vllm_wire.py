"""vLLM's KV-event wire format, frame by frame, against the frames recorded from vLLM 0.33.0;
and the probe (simulated against observed) on a pool rebuilt from them. No sockets here."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgpack
import pytest

from engine.core.events import EventBus, event_from_dict
from engine.core.hashing import BlockHasher
from engine.remote.pool import RemotePool
from engine.remote.probe import PromptProbe
from engine.remote.wire import (
    MalformedFrame, VllmEvent, canonical_hash, decode_batch, encode_batch, parse_pub, parse_replay,
)

ROWS = [json.loads(line) for line in
        (Path(__file__).resolve().parent / "data" / "vllm" / "vllm_zmq_frames.jsonl").read_text().splitlines()]


def frames_of(row):
    return [base64.b64decode(f) for f in row["frames"]]


def payloads(rank: int = 0, sock: str = "replay") -> list[tuple[int, bytes]]:
    out = []
    for row in ROWS:
        if row["rank"] == rank and row["socket"] == sock:
            parsed = parse_pub(frames_of(row))[1:] if sock == "pub" else parse_replay(frames_of(row))
            if parsed is not None:
                out.append(parsed)
    return out


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['rank']}-{r['socket']}-{i}" for i, r in enumerate(ROWS)])
def test_every_recorded_frame_decodes_and_re_encodes_byte_for_byte(row):
    frames = frames_of(row)
    if row["socket"] == "pub":
        topic, seq, payload = parse_pub(frames)
        assert topic == (b"kv-events" if row["rank"] == 0 else b"")
    else:
        parsed = parse_replay(frames)
        if parsed is None:
            assert frames[2] == b"\xff" * 8
            return
        seq, payload = parsed
        # the older three-frame layout carries the same batch
        assert parse_replay([frames[0], frames[2], frames[3]]) == (seq, payload)
    batch = decode_batch(seq, payload)
    assert batch.data_parallel_rank == row["rank"]
    assert encode_batch(batch.ts, batch.events, batch.data_parallel_rank) == payload
    # the older tagged-array events decode to the same events
    assert decode_batch(seq, encode_batch(batch.ts, batch.events, batch.data_parallel_rank, array_events=True)) == batch


def test_hashes_have_one_canonical_form():
    big = 14725353451287653808  # above 2**63
    assert canonical_hash(big).hex() == "cc5af6f21812adb0" and len(canonical_hash(big).hex()) == 16
    assert canonical_hash(big - 2**64) == canonical_hash(big)  # an older release's signed int
    assert canonical_hash(5).hex() == "0000000000000005"
    digest = bytes(range(32))
    assert canonical_hash(digest).hex() == digest.hex() and len(digest.hex()) == 64
    for bad in (2**64, -(2**63) - 1, 1.5, "ab", b""):
        with pytest.raises(MalformedFrame):
            canonical_hash(bad)
    # the same form in JSON and back
    batch = decode_batch(2, dict(payloads())[2])
    bus = EventBus()
    seen = []
    bus.subscribe(seen.append)
    RemotePool("x", events=bus).apply(batch)
    d = json.loads(json.dumps(seen[0].to_dict()))
    assert d["block_hash"] == "cc5af6f21812adb0" and d["remote"]["medium"] == "GPU"
    assert event_from_dict(d) == seen[0]


def test_unknown_fields_are_ignored_and_defaults_may_be_absent():
    raw = msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [7], "token_ids": [1, 2],
                                "future_field": {"x": 1}},
                               {"type": "BlockRemoved", "block_hashes": [7]}, {"type": "AllBlocksCleared"}]])
    batch = decode_batch(0, raw)
    assert batch.data_parallel_rank is None
    stored, removed, cleared = batch.events
    assert stored.parent_block_hash is None and stored.block_size == 0 and stored.medium is None
    pool = RemotePool("x")
    pool.apply(batch)
    assert pool.num_stored == 1 and pool.num_removed == 1 and pool.num_cleared == 1
    # older tagged arrays, shorter than today's field list
    old = msgpack.packb([2.0, [["BlockStored", [-7], None, [1, 2, 3, 4], 4, None], ["BlockRemoved", [-7]]]])
    b = decode_batch(0, old)
    assert b.events[0].block_hashes == (canonical_hash(2**64 - 7),) and b.events[1].kind == "BlockRemoved"


@pytest.mark.parametrize("payload", [
    b"\xc1", b"", msgpack.packb("x"), msgpack.packb([1.0, "no list"]), msgpack.packb([float("nan"), []]),
    msgpack.packb([0.0, [[7]]]), msgpack.packb([0.0, [{"type": "BlockStored", "block_hashes": [1.5]}]]),
    msgpack.packb([0.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": b"\x01\x00\x00\x00"}]]),
    msgpack.packb([0.0, [{"type": "BlockStored", "block_hashes": [1], "extra_keys": [float("nan")]}]]),

    msgpack.packb([0.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [-1]}]]),
    msgpack.packb([0.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [2**32]}]]),
    msgpack.packb([0.0, [{"type": "BlockStored", "block_hashes": [1], "group_idx": "a"}]]),
    msgpack.packb([0.0, [], -1]),
])
def test_bad_payloads_are_malformed_frames(payload):
    with pytest.raises(MalformedFrame):
        decode_batch(0, payload)


def test_extra_keys_nested_a_thousand_deep_are_malformed_not_an_error():
    deep: list = ["salt"]
    for _ in range(1000):
        deep = [deep]
    packer = msgpack.Packer()
    payload = packer.pack([0.0, [{"type": "BlockStored", "block_hashes": [1], "extra_keys": [deep]}], 0])
    with pytest.raises(MalformedFrame, match="nested"):
        decode_batch(0, payload)


def test_an_unknown_event_type_is_kept_and_counted_never_fatal():
    from engine.remote.pool import RemotePool

    batch = decode_batch(3, msgpack.packb([0.0, [["BlockMoved", 1, 2], {"type": "BlockStored", "block_hashes": [9],
                                                                           "token_ids": list(range(16))}], 0]))
    assert [e.kind for e in batch.events] == ["BlockMoved", "BlockStored"]
    pool = RemotePool("s")
    pool.apply(batch)
    assert pool.num_unknown_events == {"BlockMoved": 1} and pool.num_cached == 1


def test_bad_frames_are_malformed():
    for frames in ([b"t", b"\x00" * 7, b""], [b"t"], [b"t", b"\xff" * 8, b""]):
        with pytest.raises(MalformedFrame):
            parse_pub(frames)
    for frames in ([b"x", b"\x00" * 8, b""], [b"", b"t", b"\x00" * 9, b""], [b""]):
        with pytest.raises(MalformedFrame):
            parse_replay(frames)
    assert parse_replay([b"", b"\xff" * 8, b""]) is None  # the older end marker


def pool_from_fixture(upto: int) -> tuple[RemotePool, list]:
    bus = EventBus()
    seen: list = []
    bus.subscribe(seen.append)
    pool = RemotePool("vllm", events=bus)
    for seq, payload in payloads()[:upto]:
        pool.apply(decode_batch(seq, payload))
    return pool, seen


def test_the_probe_says_how_much_is_cached_and_why_not_more():
    hasher = BlockHasher("vllm-sha256")
    pool, seen = pool_from_fixture(4)  # blocks 1..16, 17..32 (now on CPU), and the salted pair
    probe = PromptProbe(tuple(range(1, 41)), hasher)
    assert probe.check([pool]).to_dict() == {
        "prompt_tokens": 40, "cached_tokens": 32, "first_missing_block": 2,
        "reason": "partial last block: the last 8 token(s) do not fill a block of 16, and only full blocks are cached"}
    full = PromptProbe(tuple(range(1, 33)), hasher).check([pool])
    assert (full.cached_tokens, full.first_missing_block) == (32, None)
    other = PromptProbe(tuple(range(1, 33)), hasher, salt="tenant-b").check([pool])
    assert (other.cached_tokens, other.first_missing_block) == (0, 0)
    assert other.reason == "held under another salt: block 0 is cached under the salt 'tenant-a'"
    salted = PromptProbe(tuple(range(1, 33)), hasher, salt="tenant-a").check([pool])
    assert salted.cached_tokens == 32
    never = PromptProbe(tuple(range(100, 132)), hasher).check([pool])
    assert (never.cached_tokens, never.reason) == (0, "never stored")
    pool.apply(decode_batch(*payloads()[4]))  # AllBlocksCleared
    reset = next(e for e in seen if e.kind == "cache_reset")
    gone = PromptProbe(tuple(range(1, 33)), hasher).check([pool])
    assert gone.reason == f"stored, then removed at event {reset.seq} (vLLM batch 4)"
    # the cbor scheme computes other hashes: nothing of the sha256 server matches
    assert PromptProbe(tuple(range(1, 33)), BlockHasher("vllm-sha256-cbor")).check(
        [pool_from_fixture(4)[0]]).cached_tokens == 0


def test_a_removed_block_names_its_event():
    pool, seen = pool_from_fixture(3)
    pool.apply(decode_batch(5, encode_batch(1796032258.0, [VllmEvent("BlockRemoved", (canonical_hash(1403909460543360175),),
                                                            medium="GPU")])))
    evicted = [e for e in seen if e.kind == "block_evicted"][-1]
    result = PromptProbe(tuple(range(1, 17)), BlockHasher("vllm-sha256")).check([pool])
    assert result.reason == f"stored, then removed at event {evicted.seq} (vLLM batch 5)"
    assert pool.lifetimes.num == 1 and pool.lifetimes.max_s == pytest.approx(10.0)


def test_the_bench_stream_is_vllm_shaped_and_its_pool_is_counted():
    from engine.bench.attach import memory_per_block, recorded_stream

    payloads, num_events, num_ops = recorded_stream(300, gpu_blocks=100)
    pool = RemotePool("bench")
    seen = 0
    for seq, p in enumerate(payloads):
        batch = decode_batch(seq, p)
        seen += len(batch.events)
        pool.apply(batch)
        assert encode_batch(batch.ts, batch.events, 0) == p
    assert seen == num_events and pool.num_stored + pool.num_removed == num_ops
    assert pool.num_removed > 0 and pool.num_cached_in("GPU") <= 100 and pool.num_cached_in("CPU") > 0
    mem = memory_per_block(2000)
    assert mem["blocks"] >= 2000 and 64 < mem["bytes_per_block"] < 2000  # 16 token ids are 64 bytes alone
