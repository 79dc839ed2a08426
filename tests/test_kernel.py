"""The replay kernel (engine.kernel) against the Python engine, the reference.

Every trace in resources/traces, the vLLM twin scenarios (tests/data/vllm_twin, with their
own pool sizes, concurrency and vLLM's hash) and bounded pools that evict: the same
`ReplayResult` and the very same events (seq, kind and every field; the clock fixed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core.columnar import MISS_REASONS
from engine.core.errors import InputError, TraceError
from engine.core.events import EventBus
from engine.core.manager import MISS_REASONS as MANAGER_MISS_REASONS
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import TraceRequest, load_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES

TRACES = RESOURCES / "traces"
TWIN = Path(__file__).parent / "data" / "vllm_twin"


def python_run(requests, config):
    events = []
    bus = EventBus(clock=lambda: 0.0)
    bus.subscribe(events.append)
    return replay(requests, config, bus), events


def assert_same(requests, config):
    """Kernel and Python engine agree on the result and on every event."""
    expected, expected_events = python_run(requests, config)
    got = replay_kernel(requests, config, record=True)
    assert got.result.to_dict() == expected.to_dict()
    assert got.result.requests == expected.requests  # the rows made on demand from the columns
    events = list(got.log.events(time=0.0))
    assert len(events) == len(expected_events)
    for mine, theirs in zip(events, expected_events):
        assert mine == theirs
    # without recording, the same result
    assert replay_kernel(requests, config).result.to_dict() == expected.to_dict()
    return expected, expected_events


def test_miss_reason_codes_are_the_managers():
    assert MISS_REASONS == MANAGER_MISS_REASONS


@pytest.mark.parametrize("capacity,concurrency", [(100000, 1), (2000, 1), (300, 4)])
def test_mooncake_conversation(capacity, concurrency):
    requests = load_trace(TRACES / "mooncake_conversation_trace.jsonl", 512)[:1500]
    expected, events = assert_same(requests, ReplayConfig(block_size=512, capacity_blocks=capacity,
                                                          concurrency=concurrency))
    if capacity < 100000:
        assert expected.totals.evicted_blocks > 0  # the bounded pools do evict


def test_mooncake_synthetic_bounded():
    requests = load_trace(TRACES / "mooncake_synthetic_trace.jsonl", 512)[:800]
    assert_same(requests, ReplayConfig(block_size=512, capacity_blocks=1500, concurrency=2))


def test_whole_mooncake_conversation_result():
    requests = load_trace(TRACES / "mooncake_conversation_trace.jsonl", 512)
    config = ReplayConfig(block_size=512, capacity_blocks=20000)
    assert replay_kernel(requests, config).result.to_dict() == replay(requests, config).to_dict()


@pytest.mark.parametrize("capacity,concurrency,hash_name", [
    (4096, 1, "sha256"), (64, 1, "sha256"), (40, 3, "xxh3"), (48, 2, "vllm-sha256-cbor")])
def test_demo_tokens(capacity, concurrency, hash_name):
    """Token-level: tenants (salts), decode blocks that become cacheable, divergence."""
    requests = load_trace(TRACES / "demo_tokens.jsonl")
    expected, events = assert_same(requests, ReplayConfig(block_size=16, capacity_blocks=capacity,
                                                          concurrency=concurrency, hash=hash_name))
    reasons = {r.miss_reason for r in expected.requests}
    assert "new_content" in reasons


TWINS = sorted(p.name[:-len(".vllm.json")] for p in TWIN.glob("*.vllm.json"))


@pytest.mark.parametrize("name", TWINS)
def test_vllm_twin_scenarios(name):
    recorded = json.loads((TWIN / f"{name}.vllm.json").read_text())
    cfg = recorded["config"]
    config = ReplayConfig(block_size=cfg["block_size"], capacity_blocks=cfg["num_gpu_blocks"] - 1,
                          hash="vllm-sha256", concurrency=cfg["concurrency"])
    assert_same(load_trace(TWIN / cfg["trace"]), config)


def test_salt_and_model_misses():
    """Reasons 'salt' and 'model' (issue 21) come out the same, as does a refusal."""
    toks = list(range(1, 70))
    reqs = [TraceRequest(0, 1, "a", None, tuple(toks), (5, 6, 7), None, len(toks), 3),
            TraceRequest(1, 2, "b", "t1", tuple(toks), (), None, len(toks), 0),
            TraceRequest(2, 3, "c", None, tuple(toks), (), None, len(toks), 0, model="m2"),
            TraceRequest(3, 4, "d", "t1", tuple(toks[:40]) + (9,) * 30, (), None, 70, 0),
            TraceRequest(4, 5, "e", None, tuple(range(500)), (), None, 500, 0)]
    expected, _ = assert_same(reqs, ReplayConfig(block_size=16, capacity_blocks=24, concurrency=2))
    reasons = [r.miss_reason for r in expected.requests]
    assert reasons[1] == "salt" and reasons[2] == "model" and expected.requests[4].refused


def test_duplicate_running_id_is_the_same_error():
    reqs = [TraceRequest(i, i + 1, "same", None, None, None, (i, i + 1), 1024, 4) for i in range(2)]
    config = ReplayConfig(block_size=512, capacity_blocks=64, concurrency=2)
    with pytest.raises(TraceError) as py_err:
        replay(reqs, config)
    with pytest.raises(TraceError) as k_err:
        replay_kernel(reqs, config)
    assert str(k_err.value) == str(py_err.value)


def test_the_comparison_can_fail():
    """A different pool gives different events: the equality above is not vacuous."""
    requests = load_trace(TRACES / "mooncake_conversation_trace.jsonl", 512)[:300]
    _, small = python_run(requests, ReplayConfig(block_size=512, capacity_blocks=200))
    got = replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=201), record=True)
    assert list(got.log.events()) != small


def test_an_empty_salt_under_vllm_hash_is_refused_with_a_sentence():
    reqs = [TraceRequest(0, 1, "a", "", tuple(range(40)), (), None, 40, 0)]
    with pytest.raises(InputError, match="Python engine"):
        replay_kernel(reqs, ReplayConfig(hash="vllm-sha256"))


def test_replay_with_numba_gives_the_events_to_a_bus():
    from engine.kernel.dispatch import replay_with

    requests = load_trace(TRACES / "demo_tokens.jsonl")
    config = ReplayConfig(block_size=16, capacity_blocks=48, concurrency=2)
    expected, expected_events = python_run(requests, config)
    events = []
    bus = EventBus(clock=lambda: 0.0)
    bus.subscribe(events.append)
    assert replay_with("numba", requests, config, bus).to_dict() == expected.to_dict()
    assert events == expected_events


def test_replay_with_auto_falls_back_where_the_kernel_cannot_run():
    from engine.kernel.dispatch import replay_with

    reqs = [TraceRequest(0, 1, "a", "", tuple(range(40)), (), None, 40, 0)]
    config = ReplayConfig(hash="vllm-sha256")
    assert replay_with("auto", reqs, config).to_dict() == replay(reqs, config).to_dict()
    with pytest.raises(InputError):
        replay_with("numba", reqs, config)
    with pytest.raises(InputError, match="unknown kernel"):
        replay_with("fortran", reqs, config)


@pytest.mark.parametrize("capacity,concurrency,chunk", [(300, 3, 7), (2000, 1, 500), (100000, 4, 1000)])
def test_stream_in_chunks_equals_one_run(capacity, concurrency, chunk):
    """Chunks of a stream (requests still running carried to the next) total what one run does."""
    from engine.kernel.stream import chunks_of, replay_stream

    requests = load_trace(TRACES / "mooncake_conversation_trace.jsonl", 512)[:1500]
    config = ReplayConfig(block_size=512, capacity_blocks=capacity, concurrency=concurrency)
    one = replay(requests, config).totals
    got = replay_stream(chunks_of(requests, chunk), config)
    assert (got.requests, got.refused_requests, got.prompt_tokens, got.cached_tokens, got.stored_blocks,
            got.evicted_blocks, got.hit_rate) == (one.requests, one.refused_requests, one.prompt_tokens,
                                                  one.cached_tokens, one.stored_blocks, one.evicted_blocks,
                                                  one.hit_rate)
