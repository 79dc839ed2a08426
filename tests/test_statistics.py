"""Statistics against values worked out by hand on two small traces (block size 4).

Trace "shared" (a pool that never evicts): r0 = 1..8 + [9]; r1 = 1..8 + [10];
r2 = 1..4 + 20..23 + [24]; r3 = 1..8 + [11]. Full blocks: h1 = 1..4, h2 = 5..8, h5 = 20..23.
Accesses h1 h2 | h1 h2 | h1 h5 | h1 h2: reuse distances 1, 1, 1, 1, 2 and 3 first accesses.
Hit chains: r1 [h1 h2], r2 [h1], r3 [h1 h2] -> h1 h2 reached by 2 requests (16 tokens saved),
h1 alone by 3 (12). r0 and r2 miss new content at tokens 0 and 4.

Trace "evicting" (2 blocks, block-aligned prompts, no output): r0 = 1..8 (tenant a),
r1 = 1..4 + 30..33 (a), r2 = 11..18 (b), r3 = 1..8 (a). r0 frees h2 then h1 to the queue's
tail, so r1 (hit h1) evicts h2 (lived 1 request); r2 evicts r1's 30..33 block (1) and h1 (2);
r3 finds nothing (h1 was evicted) and evicts r2's 15..18 then 11..14 (1, 1); r3's two
blocks stay. Accesses h1 h2 | h1 h5 | h3 h4 | h1 h2: distances 1, 3, 4; 5 first accesses.
Tenant a: 24 prompt tokens, 4 cached; tenant b: 8, 0.
"""

from __future__ import annotations

import csv
import io

import pytest

from engine.analysis.statistics import Histogram, compute, reuse_distances
from engine.core.events import EventBus
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import TraceRequest


def trace(rows: list[tuple[str, list[int], str | None]]) -> list[TraceRequest]:
    return [TraceRequest(i, i + 1, rid, tenant, tuple(toks), (), None, len(toks), 0)
            for i, (rid, toks, tenant) in enumerate(rows)]


def events_of(reqs: list[TraceRequest], capacity: int) -> list[dict]:
    bus = EventBus()
    out: list[dict] = []
    bus.subscribe(lambda e: out.append(e.to_dict()))
    replay(reqs, ReplayConfig(block_size=4, capacity_blocks=capacity, seed=0), bus)
    return out


def decode(ids) -> str:
    return "".join(chr(ord("a") + (t - 1) % 26) for t in ids)


B1, B2 = list(range(1, 5)), list(range(5, 9))
SHARED = trace([("r0", B1 + B2 + [9], None), ("r1", B1 + B2 + [10], None), ("r2", B1 + [20, 21, 22, 23, 24], None),
                ("r3", B1 + B2 + [11], None)])
EVICTING = trace([("r0", B1 + B2, "a"), ("r1", B1 + [30, 31, 32, 33], "a"), ("r2", list(range(11, 19)), "b"),
                  ("r3", B1 + B2, "a")])


def prompts(reqs):
    return {r.id: r.tokens for r in reqs}


def test_reuse_distance_by_hand():
    assert reuse_distances(list("abab")) == ([1, 1], 2)
    assert reuse_distances(list("aaa")) == ([0, 0], 1)
    assert reuse_distances(list("abcba")) == ([1, 2], 3)


def test_histogram_bins():
    h = Histogram.of([0, 1, 1, 2, 3, 4, 9], "blocks", 5)
    assert h.edges == (0, 1, 2, 4, 8, 16) and h.counts == (1, 2, 2, 1, 1) and h.num_unbounded == 5
    header, rows = h.table("first access")
    assert rows[-1] == ("first access", "", 5) and rows[2] == (2, 4, 2)


def test_shared_trace():
    s = compute(events_of(SHARED, 64), prompts(SHARED), decode)
    assert sorted(s.reuse_distance.values) == [1, 1, 1, 1, 2] and s.reuse_distance.num_unbounded == 3
    assert s.lifetime.counts == (0,) and s.lifetime.num_unbounded == 3  # h1, h2, h5 stay cached
    top = [(p.num_blocks, p.num_requests, p.tokens_saved, p.text) for p in s.shared_prefixes]
    assert top == [(2, 2, 16, "abcdefgh"), (1, 3, 12, "abcd")]
    kill = [(k.position, k.num_requests, k.share, k.text, k.examples) for k in s.killers]
    assert kill == [(0, 1, 0.5, "abcd", ("r0",)), (4, 1, 0.5, decode([20, 21, 22, 23]), ("r2",))]
    (none,) = s.hit_rates["tenant"]
    assert (none.group, none.requests, none.prompt_tokens, none.cached_tokens) == ("(none)", 4, 36, 20)
    assert s.hit_rates["server"][0].group == "local"


def test_evicting_trace():
    s = compute(events_of(EVICTING, 2), prompts(EVICTING), decode)
    assert sorted(s.reuse_distance.values) == [1, 3, 4] and s.reuse_distance.num_unbounded == 5
    assert sorted(s.lifetime.values) == [1, 1, 1, 1, 2] and s.lifetime.num_unbounded == 2
    assert s.lifetime.unit == "requests"
    rates = {g.group: (g.requests, g.prompt_tokens, g.cached_tokens, g.hit_rate) for g in s.hit_rates["tenant"]}
    assert rates == {"a": (3, 24, 4, round(4 / 24, 6)), "b": (1, 8, 0, 0.0)}
    assert [(p.num_blocks, p.num_requests, p.text) for p in s.shared_prefixes] == [(1, 1, "abcd")]
    # r3 misses because h1 was evicted: an eviction, not a killer
    assert [(k.position, k.num_requests) for k in s.killers] == [(0, 2), (4, 1)]
    assert s.killers[0].examples == ("r0", "r2")


def test_every_table_exports_as_csv():
    s = compute(events_of(EVICTING, 2), prompts(EVICTING), decode)
    names = set(s.tables())
    assert names == {"reuse_distance", "block_lifetime", "hit_rate_by_tenant", "hit_rate_by_model",
                     "hit_rate_by_server", "shared_prefixes", "cache_killers"}
    rows = list(csv.reader(io.StringIO(s.to_csv("hit_rate_by_tenant"))))
    assert rows == [["tenant", "requests", "prompt tokens", "cached tokens", "hit rate"],
                    ["a", "3", "24", "4", str(round(4 / 24, 6))], ["b", "1", "8", "0", "0.0"]]
    lifetimes = list(csv.reader(io.StringIO(s.to_csv("block_lifetime"))))
    assert lifetimes[0] == ["from (requests)", "below (requests)", "count"]
    assert lifetimes[1:] == [["0", "1", "0"], ["1", "2", "4"], ["2", "4", "1"], ["still cached", "", "2"]]
    with pytest.raises(ValueError, match="no statistics table"):
        s.to_csv("nope")


def test_without_prompts_or_decoder_the_tables_show_ids():
    s = compute(events_of(SHARED, 64))
    assert s.shared_prefixes[0].text is None and s.tables()["shared_prefixes"][1][0][-1] == "1 2 3 4 5 6 7 8"
    assert s.killers[0].text == "1 2 3 4"  # read back from the blocks r0 stored


def test_prompts_are_read_back_from_the_stored_blocks():
    s = compute(events_of(SHARED, 64), decode=decode)
    assert [(k.position, k.text) for k in s.killers] == [(0, "abcd"), (4, decode([20, 21, 22, 23]))]


# ---- the columnar path: the same statistics from an opened trace's columns -------------

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from engine.analysis.filter_language import parse  # noqa: E402
from engine.analysis.statistics_columnar import compute_columnar  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def columnar_of(reqs: list[TraceRequest], block_size: int, capacity: int):
    """The kernel's columnar log of `reqs`, as an opened trace has it."""
    from engine.core.columnar_log import ColumnarEventLog
    from engine.kernel.replay import prepare, replay_kernel

    run = replay_kernel(prepare(reqs, block_size), ReplayConfig(block_size=block_size, capacity_blocks=capacity,
                                                                 seed=0), record=True)
    return ColumnarEventLog(run.log)


def same(got, want) -> None:
    assert got.tables() == want.tables()
    assert sorted(got.reuse_distance.values.tolist()) == sorted(want.reuse_distance.values)
    assert sorted(got.lifetime.values.tolist()) == sorted(want.lifetime.values)
    assert got.lifetime.unit == want.lifetime.unit and got.num_events == want.num_events
    assert got.notes == want.notes


@pytest.mark.parametrize("reqs, capacity", [(SHARED, 64), (EVICTING, 2)], ids=["shared", "evicting"])
def test_the_columnar_path_gives_the_hand_computed_values(reqs, capacity):
    log = columnar_of(reqs, 4, capacity)
    got = compute_columnar(log, prompts=prompts(reqs), decode=decode)
    same(got, compute(events_of(reqs, capacity), prompts(reqs), decode))
    if reqs is EVICTING:
        assert sorted(got.lifetime.values.tolist()) == [1, 1, 1, 1, 2] and got.lifetime.num_unbounded == 2
        assert sorted(got.reuse_distance.values.tolist()) == [1, 3, 4] and got.reuse_distance.num_unbounded == 5
        assert {g.group: g.prompt_tokens for g in got.hit_rates["tenant"]} == {"a": 24, "b": 8}
        assert got.killers[0].examples == ("r0", "r2")
    else:
        assert [(p.num_blocks, p.num_requests, p.tokens_saved, p.text) for p in got.shared_prefixes] == \
            [(2, 2, 16, "abcdefgh"), (1, 3, 12, "abcd")]
        # without prompts, the killers' text is read back from the stored blocks here too
        assert [(k.position, k.text) for k in compute_columnar(log, decode=decode).killers] == \
            [(0, "abcd"), (4, decode([20, 21, 22, 23]))]


TRACES = {  # file, pool size (small enough that each evicts), requests read (None: all)
    "mooncake": ("resources/traces/mooncake_conversation_trace.jsonl", 400, 300),
    "demo_tokens": ("resources/traces/demo_tokens.jsonl", 60, None),
    "twin_evict": ("tests/data/vllm_twin/evict_pool64_c4.trace.jsonl", 64, None),
    "twin_tenants": ("tests/data/vllm_twin/tenants_c2.trace.jsonl", 64, None),
    "twin_retries": ("tests/data/vllm_twin/chat_retries_c4.trace.jsonl", 64, None),
}


@pytest.mark.parametrize("name", list(TRACES))
@pytest.mark.parametrize("text, middle", [("", False), ("", True), ("kind:stored or kind:lookup", False),
                                          ("not kind:started", True), ("kind:evicted or kind:lookup", False)])
def test_the_columnar_path_equals_compute_on_real_traces(name, text, middle):
    """Every table, histogram value and count of `compute_columnar` over a mask equals
    `compute` over the dicts of the events the mask keeps (the filter language's own
    predicate, inside a range of the middle half)."""
    from app.runtime.jobs import trace_block_size
    from engine.core.trace import read_trace

    rel, capacity, limit = TRACES[name]
    path = ROOT / rel
    bs = trace_block_size(path)
    reqs = list(read_trace(path, bs))[:limit]
    log = columnar_of(reqs, bs, capacity)
    dicts = [e.to_dict() for e in log.events]
    keep = np.ones(len(dicts), bool)
    if text:
        chosen = {d["seq"] for d in parse(text).select(dicts)}
        keep &= np.array([d["seq"] in chosen for d in dicts])
    if middle:
        keep[:len(dicts) // 4] = False
        keep[3 * len(dicts) // 4:] = False
    assert 0 < keep.sum() <= len(dicts)
    kept = [d for d, k in zip(dicts, keep) if k]
    dec = (lambda ids: "<" + ",".join(map(str, ids)) + ">")
    want = compute(kept, decode=dec, block_size=bs)
    got = compute_columnar(log, None if keep.all() else keep, decode=dec, block_size=bs)
    same(got, want)
    if not text and not middle:  # the tables these traces exercise are not empty
        assert want.reuse_distance.values and want.shared_prefixes
        if name in ("mooncake", "twin_evict", "demo_tokens"):
            assert want.lifetime.values


def replayed_events(name: str) -> tuple[list, int, int]:
    """The events of the Python engine's replay of trace `name` (TRACES), its block size and pool."""
    from app.runtime.jobs import trace_block_size
    from engine.core.trace import read_trace

    rel, capacity, _ = TRACES[name]
    bs = trace_block_size(ROOT / rel)
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    replay(list(read_trace(ROOT / rel, bs)), ReplayConfig(block_size=bs, capacity_blocks=capacity, seed=0), bus)
    return events, bs, capacity


@pytest.mark.parametrize("name", ["demo_tokens", "twin_tenants", "twin_retries"])
def test_the_columnar_path_equals_compute_on_a_live_appended_log(name):
    """A columnar log filled by `append_events` (a live source's route: digests and salts
    per event, not the kernel's tables) gives `compute`'s statistics too, whole and under a
    mask of about half the events."""
    from engine.core.columnar import ColumnarLog
    from engine.core.columnar_log import ColumnarEventLog

    events, bs, capacity = replayed_events(name)
    col = ColumnarLog(capacity, bs)
    col.append_events(events)
    log = ColumnarEventLog(col)
    dicts = [e.to_dict() for e in events]
    dec = (lambda ids: "<" + ",".join(map(str, ids)) + ">")
    keep = np.random.default_rng(1).random(len(dicts)) < 0.6
    same(compute_columnar(log, decode=dec, block_size=bs), compute(dicts, decode=dec, block_size=bs))
    same(compute_columnar(log, keep, decode=dec, block_size=bs),
         compute([d for d, k in zip(dicts, keep) if k], decode=dec, block_size=bs))
