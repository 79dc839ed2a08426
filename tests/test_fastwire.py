"""engine.remote.fastwire against the reference reader (engine.remote.wire) on every recorded
frame and on hostile ones: the same batches, the same pools and counters once applied, and
the same MalformedFrame (counted, never a crash) for a bad payload."""

from __future__ import annotations

import base64
import dataclasses
import json
import lzma
import random
from pathlib import Path
from typing import Any

import msgpack
import pytest

from engine.remote import fastwire, wire
from engine.remote.pool import RemotePool
from engine.remote.wire import MalformedFrame, VllmEvent, encode_batch

DATA = Path(__file__).parent / "data"


def _frames_file(path: Path) -> list[tuple[int, bytes]]:
    """(seq, payload) of every PUB or replay frame in a recorded JSONL file."""
    out = []
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt") as f:
        for line in f:
            row = json.loads(line)
            if "payload" in row and row.get("seq") is not None:
                out.append((row["seq"], base64.b64decode(row["payload"])))
            frames = [base64.b64decode(x) for x in row.get("frames", ())]
            if len(frames) == 3 and frames[0] != b"":
                out.append((int.from_bytes(frames[1], "big", signed=True), frames[2]))
            elif len(frames) in (3, 4) and frames[0] == b"":
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq >= 0:
                    out.append((seq, frames[-1]))
    return out


def _twin_frames(path: Path) -> list[tuple[int, bytes]]:
    """A vLLM twin's recorded events, written as vLLM 0.33 writes them, three events a batch."""
    events = []
    for e in json.loads(path.read_text())["events"]:
        h = lambda x: bytes.fromhex(x) if isinstance(x, str) else wire.canonical_hash(x)  # noqa: E731
        if e["type"] == "BlockStored":
            events.append(VllmEvent("BlockStored", tuple(map(h, e["block_hashes"])),
                                    h(e["parent_block_hash"]) if e.get("parent_block_hash") is not None else None,
                                    tuple(e.get("token_ids") or ()), e.get("block_size") or 0, e.get("lora_id"),
                                    e.get("medium"), e.get("lora_name"),
                                    wire._tupled(e["extra_keys"]) if e.get("extra_keys") is not None else None))
        elif e["type"] == "BlockRemoved":
            events.append(VllmEvent("BlockRemoved", tuple(map(h, e["block_hashes"])), medium=e.get("medium")))
        else:
            events.append(VllmEvent("AllBlocksCleared"))
    return [(i, encode_batch(1_796_000_000.0 + i, events[3 * i:3 * i + 3], 0)) for i in range((len(events) + 2) // 3)]


FIXTURES: dict[str, list[tuple[int, bytes]]] = {}
for _p in sorted((DATA / "vllm_twin").glob("*.vllm.json")):
    FIXTURES[f"vllm_twin/{_p.name}"] = _twin_frames(_p)
for _p in [DATA / "vllm_copies" / "vllm_copies_events.jsonl", DATA / "vllm_copies" / "vllm_connector_one_server.jsonl",
           DATA / "vllm_late_join" / "replay_answers.jsonl.xz", DATA / "sglang" / "sglang_zmq_frames.jsonl",
           DATA / "vllm_connector" / "vllm_connector_frames.jsonl"]:
    FIXTURES[f"{_p.parent.name}/{_p.name}"] = _frames_file(_p)


def _norm(batch: Any) -> Any:
    return dataclasses.replace(batch, events=tuple(dataclasses.replace(e, token_ids=fastwire.same_tokens(e))
                                                   for e in batch.events))


def _outcome(decode: Any, seq: int, payload: bytes) -> Any:
    try:
        return _norm(decode(seq, payload))
    except MalformedFrame as exc:
        return ("malformed", str(exc))


def pool_state(pool: RemotePool) -> dict[str, Any]:
    """Everything a pool knows, as plain values."""
    tiers = {m: {h: (b.parent_hash, b.tokens, b.stored_seq, b.stored_time, b.tenant, b.num_announced, b.num_removed)
                 for h, b in t.items()} for m, t in pool.tiers.items()}
    skip = {"events", "tiers", "lifetimes"}
    plain = {f.name: getattr(pool, f.name) for f in dataclasses.fields(pool) if f.name not in skip}
    life = pool.lifetimes
    return {"tiers": tiers, "lifetimes": (life.num, life.total_s, life.max_s), **plain}


def _apply_all(decode: Any, frames: list[tuple[int, bytes]]) -> tuple[dict[str, Any], int]:
    pool = RemotePool("t")
    malformed = 0
    for seq, payload in frames:
        try:
            pool.apply(decode(seq, payload))
        except MalformedFrame:
            malformed += 1
    return pool_state(pool), malformed


def test_every_fixture_file_is_read():
    assert len(FIXTURES) == len(list((DATA / "vllm_twin").glob("*.vllm.json"))) + 5
    for name, frames in FIXTURES.items():
        assert frames, name


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_frames_decode_and_apply_as_the_reference(name):
    frames = FIXTURES[name]
    for seq, payload in frames:
        assert _outcome(fastwire.decode_batch, seq, payload) == _outcome(wire.decode_batch, seq, payload)
    fast, ref = _apply_all(fastwire.decode_batch, frames), _apply_all(wire.decode_batch, frames)
    assert fast == ref
    assert fast[0]["num_batches"] == len(frames)


def test_the_fast_path_is_taken_on_vllm_and_sglang_frames():
    # Not the reference in disguise: vLLM 0.33's and SGLang's frames go through msgspec.
    for name in ("vllm_connector/vllm_connector_frames.jsonl", "sglang/sglang_zmq_frames.jsonl",
                 "vllm_twin/tenants_c2.vllm.json"):
        for seq, payload in FIXTURES[name]:
            batch = fastwire._fast(seq, payload)
            stores = [e for e in batch.events if e.kind == "BlockStored" and e.token_bytes]
            assert all(not e.token_ids for e in stores)


def test_the_pool_comparison_can_fail():
    frames = FIXTURES["vllm_copies/vllm_copies_events.jsonl"]
    a, _ = _apply_all(fastwire.decode_batch, frames)
    b, _ = _apply_all(fastwire.decode_batch, frames[:-1])
    assert a != b


def _stored(**fields: Any) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [77], "parent_block_hash": None, "token_ids": list(range(16)),
            "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, **fields}


def _batch(*events: Any, ts: Any = 1.0, rank: Any = 0) -> bytes:
    return msgpack.packb([ts, list(events), rank], use_bin_type=True)


_DEEP: list = ["x"]
for _ in range(1000):
    _DEEP = [_DEEP]

HOSTILE = {
    # test_attach_hostile.py's cases
    "binary token ids": _batch(_stored(token_ids=b"\x00" * 64)),
    "deep extra keys": _batch(_stored(extra_keys=[_DEEP])),
    "nan extra key": _batch(_stored(extra_keys=[float("nan")])),
    "inf extra key": _batch(_stored(extra_keys=[[float("inf")]])),
    # more
    "not msgpack": b"\xc1\xc1",
    "empty": b"",
    "truncated": _batch(_stored())[:-7],
    "a string": msgpack.packb("hello"),
    "map batch": msgpack.packb({"ts": 1.0, "events": [_stored()], "data_parallel_rank": 0}),
    "nan ts": _batch(_stored(), ts=float("nan")),
    "bool ts": _batch(_stored(), ts=True),
    "negative rank": _batch(_stored(), rank=-1),
    "bool rank": _batch(_stored(), rank=True),
    "negative token": _batch(_stored(token_ids=[1, -2, 3])),
    "token 2**32": _batch(_stored(token_ids=[2 ** 32])),
    "token 2**32-1": _batch(_stored(token_ids=[2 ** 32 - 1, 0, 127, 128, 255, 256, 65535, 65536])),
    "float token": _batch(_stored(token_ids=[1.5])),
    "string token": _batch(_stored(token_ids=["a"])),
    "token ids a map": _batch(_stored(token_ids={"a": 1})),
    "token ids nil": _batch(_stored(token_ids=None)),
    "hashes nil": _batch(_stored(block_hashes=None)),
    "hashes empty": _batch(_stored(block_hashes=[])),
    "signed hash": _batch(_stored(block_hashes=[-5, 2 ** 63 - 1, 7, 300])),
    "digest hashes": _batch(_stored(block_hashes=[b"\x01" * 32, b"\x02" * 32], token_ids=list(range(32)))),
    "9-byte hash": _batch(_stored(block_hashes=[b"\x01" * 9])),
    "65-byte hash": _batch(_stored(block_hashes=[b"\x01" * 65])),
    "hash a string": _batch(_stored(block_hashes=["ab"])),
    "hash a bool": _batch(_stored(block_hashes=[True])),
    "parent a bool": _batch(_stored(parent_block_hash=True)),
    "parent a float": _batch(_stored(parent_block_hash=1.0)),
    "negative block size": _batch(_stored(block_size=-1)),
    "bool block size": _batch(_stored(block_size=True)),
    "medium as bytes": _batch(_stored(medium=b"CPU")),
    "medium an int": _batch(_stored(medium=3)),
    "group a string": _batch(_stored(group_idx="0")),
    "unknown type": _batch({"type": "BlockPinned", "block_hashes": [1]}),
    "no type": _batch({"block_hashes": [1]}),
    "long type": _batch({"type": "x" * 101}),
    "event an int": _batch(5),
    "array events": _batch(["BlockStored", [9, 10], None, list(range(32)), 16, None, "GPU"],
                           ["BlockRemoved", [9], "GPU"], ["AllBlocksCleared"]),
    "events not a list": msgpack.packb([1.0, 5, 0]),
    "invalid utf-8": _batch(_stored(medium=msgpack.ExtType(1, b"x"))).replace(b"\xa3GPU", b"\xa3\xff\xfe\xfd"),
    "extra fields": _batch(_stored(some_new_field=[1, 2], lookahead_token_ids=[1, 2], locality="local")),
    "extra keys a string": _batch(_stored(extra_keys="salt")),
    "extra keys a map": _batch(_stored(extra_keys=[{"a": 1}])),
    "cleared": _batch(_stored(), {"type": "AllBlocksCleared", "medium": "GPU"}, _stored(block_hashes=[78])),
    "removed": _batch(_stored(block_hashes=[1, 2]), {"type": "BlockRemoved", "block_hashes": [1, 3], "medium": "GPU"}),
    "sixteen-bit array": _batch(_stored(block_hashes=list(range(2 ** 63, 2 ** 63 + 20)), token_ids=list(range(320)))),
    # an events array that claims 2**32 - 1 events in a few bytes: no arrays are made for them
    "forged event count": b"\x93\xcb" + msgpack.packb(1.0)[1:] + b"\xdd\xff\xff\xff\xff"
                          + msgpack.packb(_stored())[:12],
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_frames_end_as_the_reference_ends_them(name):
    payload = HOSTILE[name]
    assert _outcome(fastwire.decode_batch, 1, payload) == _outcome(wire.decode_batch, 1, payload)
    assert _apply_all(fastwire.decode_batch, [(1, payload)]) == _apply_all(wire.decode_batch, [(1, payload)])


def test_the_attach_hostile_cases_are_malformed():
    for name in ("binary token ids", "deep extra keys", "nan extra key", "inf extra key"):
        with pytest.raises(MalformedFrame):
            fastwire.decode_batch(1, HOSTILE[name])


def test_corrupted_fixture_frames_end_as_the_reference_ends_them():
    """Bytes flipped, cut and inserted at random in real frames: the same batch or the same
    MalformedFrame, never another exception."""
    rng = random.Random(20)
    frames = [p for name in ("vllm_connector/vllm_connector_frames.jsonl", "sglang/sglang_zmq_frames.jsonl",
                             "vllm_copies/vllm_copies_events.jsonl") for _, p in FIXTURES[name]]
    num_malformed = 0
    for i in range(3000):
        p = bytearray(rng.choice(frames))
        how = rng.randrange(3)
        at = rng.randrange(len(p))
        if how == 0:
            p[at] = rng.randrange(256)
        elif how == 1:
            del p[at:]
        else:
            p[at:at] = bytes([rng.randrange(256)])
        ref = _outcome(wire.decode_batch, i, bytes(p))
        assert _outcome(fastwire.decode_batch, i, bytes(p)) == ref
        num_malformed += isinstance(ref, tuple)
    assert 100 < num_malformed < 3000  # both kinds were exercised


# ---- the one-pass reader of common frames (fastwire.common_columns) ----------------------

def _same_columns(seq: int, payload: bytes) -> bool | None:
    """None: the one pass declined the frame; True: it gave exactly `_columns`' columns
    (and `_columns` took the frame itself, with no event kept whole); anything else fails."""
    got = fastwire.common_columns(seq, payload)
    if got is None:
        return None
    ref = fastwire._columns(seq, payload)  # raises _Slow if it would not take the frame
    assert not ref.events and not got.events
    assert (got.seq, got.ts, got.data_parallel_rank) == (ref.seq, ref.ts, ref.data_parallel_rank)
    assert got.rows.tolist() == ref.rows.tolist()
    assert got.parents.tolist() == ref.parents.tolist()
    assert got.keys.tolist() == ref.keys.tolist()
    assert got.tokens.tolist() == ref.tokens.tolist()
    return True


def _bench_frames(n: int = 3_000) -> list[bytes]:
    from engine.bench.attach import recorded_stream

    return recorded_stream(n, gpu_blocks=500, seed=4)[0]


def test_the_one_pass_reads_common_frames_as_the_columns_reader_does():
    """Every fixture frame it takes, and bench attach's whole stream (which it must take:
    vLLM's usual frame), give `_columns`' columns; what it declines still decodes as before."""
    taken = declined = 0
    for name, frames in FIXTURES.items():
        for seq, p in frames:
            if _same_columns(seq, p) is None:
                declined += 1
            else:
                taken += 1
    bench = _bench_frames()
    assert all(_same_columns(seq, p) for seq, p in enumerate(bench))
    assert taken > 0 and declined > 0  # both outcomes are exercised on real frames


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_one_pass_takes_no_hostile_frame_it_should_not(name):
    payload = HOSTILE[name]
    if _same_columns(1, payload):
        wire.decode_batch(1, payload)  # what it takes the reference takes too


def test_the_one_pass_declines_what_it_does_not_know():
    good = _bench_frames(50)[3]
    assert _same_columns(0, good)
    obj = msgpack.unpackb(good)
    variants = {
        "trailing byte": good + b"\x00",
        "cut": good[:-1],
        "unknown field": msgpack.packb([obj[0], [{**obj[1][0], "new_field": None}], 0]),
        "a salt": msgpack.packb([obj[0], [{**obj[1][0], "cache_salt": "t"}], 0]),
        "another medium": msgpack.packb([obj[0], [{**obj[1][0], "medium": "cpu"}], 0]),
        "a clear": msgpack.packb([obj[0], [{"type": "AllBlocksCleared", "medium": None}], 0]),
        "token ids on a removal": msgpack.packb([obj[0], [{"type": "BlockRemoved", "block_hashes": [2 ** 63],
                                                           "token_ids": [1]}], 0]),
        "small hash": msgpack.packb([obj[0], [{**obj[1][0], "block_hashes": [5]}], 0]),
        "negative block size": msgpack.packb([obj[0], [{**obj[1][0], "block_size": -1}], 0]),
        "integer timestamp": msgpack.packb([1, obj[1], 0]),
        "no type": msgpack.packb([obj[0], [{k: v for k, v in obj[1][0].items() if k != "type"}], 0]),
        "negative rank": msgpack.packb([obj[0], obj[1], -1]),
        "four items": msgpack.packb([obj[0], obj[1], 0, 0]),
    }
    for name, payload in variants.items():
        assert fastwire.common_columns(0, payload) is None, name
    # and a map event with its fields in another order is still common
    shuffled = msgpack.packb([obj[0], [dict(reversed(list(e.items()))) for e in obj[1]], obj[2]])
    assert _same_columns(0, shuffled)


def test_corrupted_frames_are_taken_only_as_the_columns_reader_takes_them():
    rng = random.Random(23)
    frames = _bench_frames(400) + [p for _, p in FIXTURES["vllm_copies/vllm_copies_events.jsonl"]]
    taken = 0
    for i in range(3000):
        p = bytearray(rng.choice(frames))
        at = rng.randrange(len(p))
        how = rng.randrange(3)
        if how == 0:
            p[at] = rng.randrange(256)
        elif how == 1:
            del p[at:]
        else:
            p[at:at] = bytes([rng.randrange(256)])
        taken += bool(_same_columns(i, bytes(p)))
    assert taken > 100  # flips inside token ids and hashes keep a frame common
