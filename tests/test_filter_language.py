"""The filter language: every field, every operator, every error with its position, on
events the engine and a recorded vLLM offloading stream really produce; the vectorized
mask must agree with the per-event predicate."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from engine.analysis.filter_language import (FIELDS, EventContext, FilterError, check, event_columns,
                                             field_values, parse)
from engine.core.events import EventBus
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace
from engine.remote import RemotePool
from engine.remote.wire import decode_batch, parse_pub

ROOT = Path(__file__).resolve().parents[1]
FRAMES = ROOT / "tests" / "data" / "vllm_connector" / "vllm_connector_frames.jsonl"  # copied from ../shared/data/vllm


@pytest.fixture(scope="module")
def local_events() -> list[dict]:
    """The bundled demo trace (tenants bob, alice, ...) on a pool small enough to evict."""
    bus = EventBus()
    out: list[dict] = []
    bus.subscribe(lambda e: out.append(e.to_dict()))
    replay(load_trace(ROOT / "resources" / "traces" / "demo_tokens.jsonl"),
           ReplayConfig(block_size=16, capacity_blocks=40, seed=0), bus)
    return out


@pytest.fixture(scope="module")
def remote_events() -> list[dict]:
    """vLLM 0.33.0's offloading connector, one server (GPU, CPU, STORAGE, cpu, cuda:0 tiers)."""
    bus = EventBus()
    out: list[dict] = []
    bus.subscribe(lambda e: out.append(e.to_dict()))
    pool = RemotePool("tcp://10.0.0.5:5557", 0, bus)
    for row in map(json.loads, FRAMES.read_text().splitlines()):
        if row["case"] == "one-server":
            _, seq, payload = parse_pub([base64.b64decode(f) for f in row["frames"]])
            pool.apply(decode_batch(seq, payload))
    return out


def select(text: str, events: list[dict]) -> list[dict]:
    return parse(text).select(events)


def test_kind_by_word_or_whole_name(local_events):
    evicted = [e for e in local_events if e["kind"] == "block_evicted"]
    assert evicted, "the small pool must evict"
    assert select("kind:evicted", local_events) == evicted
    assert select("kind=block_evicted", local_events) == evicted
    assert select("kind=evicted", local_events) == []  # = is the whole name
    stored = select("kind:stored", local_events)
    assert {e["kind"] for e in stored} == {"block_stored"}
    assert len(select("kind!=evicted", local_events)) == len(local_events) - len(evicted)


def test_tier_server_rank_on_a_vllm_stream(remote_events):
    kinds = [e["remote"]["medium"] for e in remote_events]
    assert select("tier:CPU", remote_events) == [e for e, m in zip(remote_events, kinds) if m.lower() == "cpu"]
    assert len(select("tier:cpu", remote_events)) == kinds.count("CPU") + kinds.count("cpu") == 4
    assert len(select("tier:storage and kind:evicted", remote_events)) == 4
    # a medium with a colon is quoted (vLLM's raw "cuda:0"; the pool may also name it GPU)
    assert len(select("tier:\"cuda:0\"", remote_events)) == kinds.count("cuda:0")
    assert len(select("tier:gpu", remote_events)) == sum(m.lower() == "gpu" for m in kinds)
    assert len(select("server:'tcp://10.0.0.5:5557'", remote_events)) == len(remote_events)
    assert select("server:other", remote_events) == []
    assert len(select("rank=0", remote_events)) == len(remote_events)  # the batches say dp rank 0
    assert select("rank>0", remote_events) == [] and select("rank<0", remote_events) == []
    assert len(select("rank>=0 and rank<=0", remote_events)) == len(remote_events)


def test_embedded_block_events_are_on_the_gpu(local_events):
    blocks = [e for e in local_events if "block_id" in e or "block_ids" in e or e["kind"] == "cache_reset"]
    assert select("tier:GPU", local_events) == blocks
    assert all(e["kind"] not in ("request_started", "lookup") for e in select("tier:gpu", local_events))


def test_tenant_of_an_eviction_is_its_requests(local_events):
    ctx = EventContext.from_events(local_events)
    evicted = [e for e in local_events if e["kind"] == "block_evicted"]
    by_bob = [e for e in evicted if ctx.tenants.get(e["by_request_id"]) == "bob"]
    assert by_bob and len(by_bob) < len(evicted)
    assert select("kind:evicted and tenant:bob", local_events) == by_bob
    assert select("kind:evicted and tenant:BOB", local_events) == by_bob  # text ignores case
    assert select("kind:evicted and not tenant:bob", local_events) == [e for e in evicted if e not in by_bob]


def test_request_reason_block_hash(local_events):
    first = next(e for e in local_events if e["kind"] == "request_started")
    rid = first["request_id"]
    assert {e.get("request_id", e.get("by_request_id")) for e in select(f"request:{rid}", local_events)} == {rid}
    lookups = [e for e in local_events if e["kind"] == "lookup"]
    reasons = {e["miss"]["reason"] for e in lookups}
    assert "new_content" in reasons
    assert select("reason:new_content", local_events) == [e for e in lookups if e["miss"]["reason"] == "new_content"]
    stored = next(e for e in local_events if e["kind"] == "block_stored")
    bid, digest = stored["block_id"], stored["block_hash"]
    with_block = select(f"block={bid}", local_events)
    assert stored in with_block
    assert all(bid == e.get("block_id") or bid in e.get("block_ids", ()) for e in with_block)
    assert select(f"block>{10**6}", local_events) == []
    by_hash = select(f"hash:{digest[:6]}", local_events)
    assert stored in by_hash and any(e["kind"] == "lookup" for e in by_hash)  # lookups list their hashes
    assert stored in select(f"hash={digest}", local_events)
    assert stored not in select(f"hash={digest[:6]}", local_events)  # = is the whole digest
    assert stored in select(f"hash:0x{digest[:6].upper()}", local_events)


def test_session_and_model_fields():
    e = {"kind": "block_stored", "block_id": 3, "block_hash": "ab", "request_id": "r",
         "remote": {"source": "s", "rank": 0, "medium": "GPU", "session_id": "sess-9", "lora_name": "adapter-x"}}
    assert parse("session:sess-9").matches(e) and not parse("session:sess-1").matches(e)
    assert parse("model:adapter-x").matches(e)
    ctx = EventContext({"r": "t"}, {"r": "llama"})
    plain = {"kind": "blocks_freed", "block_ids": [1, 2], "request_id": "r"}
    assert parse("model:llama and tenant:t").matches(plain, ctx)
    assert not parse("model:llama").matches(plain)  # nothing says which model without the log
    assert parse("model!=llama").matches(plain)  # an absent field matches only !=


def test_precedence_and_parentheses(local_events):
    a = select("kind:evicted or kind:stored and tenant:bob", local_events)
    b = select("kind:evicted or (kind:stored and tenant:bob)", local_events)
    c = select("(kind:evicted or kind:stored) and tenant:bob", local_events)
    assert a == b and a != c
    assert select("not not kind:evicted", local_events) == select("kind:evicted", local_events)
    assert select("NOT kind:evicted AND kind:freed", local_events) == select("kind:freed", local_events)
    assert select("", local_events) == local_events


@pytest.mark.parametrize("text, position, words", [
    ("kind:", 5, "expected a value after kind:"),
    ("knd:evicted", 0, "unknown field 'knd'"),
    ("kind evicted", 5, "expected an operator"),
    ("kind:evictd", 5, "no event kind is called 'evictd'"),
    ("tier<CPU", 4, "tier is text"),
    ("rank:two", 5, "rank is a number"),
    ("block>=x1", 7, "block is a number"),
    ("hash:xyz", 5, "a hash is hexadecimal"),
    ("(kind:evicted", 13, "the '(' at 1 is never closed"),
    ("kind:evicted)", 12, "')' with no '('"),
    ("kind:evicted tier:CPU", 13, "expected 'and', 'or' or the end"),
    ("kind:evicted and", 16, "the filter ends where a comparison"),
    ("tenant:'bob", 7, "no closing '"),
    ("tier!CPU", 4, "'!' stands alone"),
    ("and kind:stored", 0, "expected a field"),
    ("kind:stored or ()", 16, "expected a field"),
])
def test_errors_name_their_position(text, position, words):
    with pytest.raises(FilterError) as info:
        parse(text)
    assert info.value.position == position
    assert words in info.value.message
    assert str(info.value).startswith(f"at {position + 1}: ") and "\n" not in str(info.value)
    assert check(text) == str(info.value)


def test_every_field_parses_with_every_operator_it_takes():
    for name in FIELDS:
        value = {"rank": "1", "block": "7", "hash": "ab12", "kind": "stored"}.get(name, "x")
        ops = ("=", ":", "!=", "<", "<=", ">", ">=") if name in ("rank", "block") else ("=", ":", "!=")
        for op in ops:
            assert check(f"{name}{op}{value}") is None, (name, op)
            assert check(f" {name.upper()} {op} {value} ") is None


@pytest.mark.parametrize("text", [
    "kind:evicted", "kind:stored and tenant:bob", "tier:GPU and not kind:lookup", "block<5 or block>=30",
    "block!=3", "rank=0", "hash:0", "request:q81-t1 or reason:evicted", "kind=blocks_freed", "model:x",
    "tenant!=alice and (kind:allocated or kind:stored)", "session:z", "server:z", "tier!=gpu",
])
def test_mask_agrees_with_the_predicate(text, local_events, remote_events):
    f = parse(text)
    for events in (local_events, remote_events):
        # the columnar form keeps one block and one hash per row: compare on such rows
        rows = [e for e in events if len(field_values(e, "block")) <= 1 and len(field_values(e, "hash")) <= 1]
        expected = np.array([f.matches(e, EventContext.from_events(events)) for e in rows], dtype=bool)
        got = f.mask(event_columns(rows, EventContext.from_events(events)))
        assert got.dtype == bool and np.array_equal(got, expected), text
