"""WEKA kv-cache-tester traces: the reader, the published table reproduced on the six real
files, caches keyed by model, a folder as concurrent users, and the hostile cases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.analysis.weka import published_rates, replay_weka, weka_summary
from engine.core.errors import TraceError
from engine.core.manager import PrefixCacheManager, Request
from engine.core.sniff import document_format, file_kind
from engine.resources import resource_path
from engine.store.weka import load_weka, merged_requests, read_weka, to_trace_requests

WEKA = resource_path("traces", "weka")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "weka"

# callanjfox/kv-cache-tester traces/cache_hit_rates.txt at 1ce84512, as the data README gives it
TABLE = {
    "trace_0009": (51, 98.7, 98.7),
    "trace_0022": (246, 61.5, 95.9),
    "trace_0104": (7, 77.4, 77.4),
    "trace_0189": (291, 96.8, 98.9),
    "trace_0287": (26, 95.5, 95.5),
    "trace_0303": (6, 63.3, 89.5),
}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=300)


def in_process(capsys, *args: str) -> str:
    """`cachescope ARGS` run by `app.cli.main` in this process: its stdout (exit status 0).
    The subprocess runs of `cli` above prove `python -m app`; twelve more of them for the
    per-trace table were each an interpreter start and a second import of the app."""
    from app.cli import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_shipped_files_are_the_shared_ones_unchanged():
    shipped = sorted(p.name for p in WEKA.glob("*.json"))
    assert [f"{n}.json" for n in sorted(TABLE)] == shipped
    if SHARED.is_dir():
        for name in shipped:
            assert (WEKA / name).read_bytes() == (SHARED / name).read_bytes()
    assert "Apache-2.0" in (WEKA / "README.md").read_text() and "1ce84512" in (WEKA / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(TABLE))
def test_published_table_by_definition_and_by_the_engine(name):
    n, same, cumulative = TABLE[name]
    trace = read_weka(WEKA / f"{name}.json")
    rates = published_rates(trace)
    assert (rates.requests, rates.same_model_pct, rates.cumulative_pct) == (n, same, cumulative)
    unbounded = replay_weka([trace])
    counted = [r for r in unbounded.rows if r.counted]
    assert len(counted) == rates.counted_requests
    # the blocks an unbounded, model-keyed engine cache holds are Cumulative%'s hit blocks, exactly
    assert sum(r.held_blocks for r in counted) == rates.cumulative_blocks
    assert sum(r.prompt_blocks for r in counted) == rates.prompt_blocks
    assert unbounded.held_pct() == cumulative
    # the engine's own hit rate counts tokens; it is never above the blocks it holds
    assert unbounded.counted_hit_rate() <= cumulative
    assert not any(r.refused for r in unbounded.rows)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_replay_prints_the_two_numbers(name, capsys):
    n, same, cumulative = TABLE[name]
    stdout = in_process(capsys, "replay", str(WEKA / f"{name}.json"), "--totals-only")
    row = next(line for line in stdout.splitlines() if line.startswith(name)).split()
    assert row[1:5] == [str(n), f"{same:.1f}", f"{cumulative:.1f}", f"{cumulative:.1f}"]
    assert "recomputed" in stdout  # the note on the engine's own hit rate
    j = json.loads(in_process(capsys, "replay", str(WEKA / f"{name}.json"), "--json", "--totals-only"))
    t = j["traces"][0]
    assert (t["requests"], t["same_model_pct"], t["cumulative_pct"], t["unbounded_held_pct"]) == (n, same, cumulative,
                                                                                                    cumulative)


def test_subagents_are_streams_timed_from_their_start():
    trace = read_weka(WEKA / "trace_0287.json")
    subs = [r for r in trace.requests if r.is_subagent]
    assert len(subs) == 14 and {r.stream for r in subs} == {"trace_0287/agent_001"}
    assert trace.subagents[0].time == pytest.approx(112.757)
    assert subs[0].time == pytest.approx(112.757) and subs[-1].time == pytest.approx(112.757 + 73.0)
    assert [r.time for r in trace.requests] == sorted(r.time for r in trace.requests)
    assert {r.model for r in subs} == {"claude-haiku-4-5-20251001"}


def test_a_bounded_pool_pulls_the_hit_rate_down_with_and_without_subagents():
    trace = read_weka(WEKA / "trace_0287.json")
    summary = weka_summary([trace], capacity_blocks=400)
    row = summary["traces"][0]
    assert row["cumulative_pct"] == 95.5
    assert row["bounded_held_pct_with_subagents"] < row["bounded_held_pct_without_subagents"] < 95.5
    assert summary["totals"]["requests"] == 40 and summary["totals"]["subagent_requests"] == 14
    big = weka_summary([trace], capacity_blocks=100_000)["traces"][0]
    assert big["bounded_held_pct_with_subagents"] == big["bounded_held_pct_without_subagents"] == 95.5


def test_the_cache_is_keyed_by_model_and_a_switch_is_its_own_miss():
    # trace_0303: Opus and Haiku send the same 191-192 block prompts; keyed by model they share nothing
    trace = read_weka(WEKA / "trace_0303.json")
    keyed = replay_weka([trace])
    shared = replay_weka([trace], keyed_by_model=False)
    assert sum(r.cached_tokens for r in shared.rows) > sum(r.cached_tokens for r in keyed.rows)
    assert keyed.rows[1].model != keyed.rows[0].model
    assert keyed.rows[1].miss_reason == "model" and keyed.rows[1].held_blocks == 0
    assert shared.rows[1].held_blocks > 0
    # the same in the engine for token-level requests
    mgr = PrefixCacheManager(64, 4)
    mgr.allocate(Request("a", list(range(12)), model="opus"))
    mgr.finish("a")
    other = mgr.lookup(Request("b", list(range(12)), model="haiku"))
    assert other.num_cached_tokens == 0 and other.miss.reason == "model"
    same = mgr.lookup(Request("c", list(range(12)), model="opus"))
    assert same.num_cached_tokens == 8


def test_a_model_less_request_hashes_as_before():
    from engine.core.hashing import BlockHasher

    a = PrefixCacheManager(16, 4, BlockHasher(seed=0))
    assert a.hash_request(Request("x", list(range(9)))) == BlockHasher(seed=0).hash_chain(list(range(9)), 4)
    assert a.hash_request(Request("x", list(range(9)), model="m")) != a.hash_request(Request("x", list(range(9))))


def test_a_folder_is_concurrent_users_in_time_order():
    traces = load_weka(WEKA)
    assert [t.id for t in traces] == sorted(TABLE)
    merged = merged_requests(traces)
    assert len(merged) == sum(len(t.requests) for t in traces) == 641
    assert [r.time for r in merged] == sorted(r.time for r in merged)
    # the command's table is weka_summary(traces, 4096) (one replay of the folder, not a
    # second one in this process): Cumulative% and held% per trace, one decimal each
    p = cli("replay", str(WEKA), "--totals-only", "--capacity-blocks", "4096")
    assert p.returncode == 0, p.stderr
    assert "6 kv-cache-tester trace(s), 641 requests" in p.stdout
    rows = {line.split()[0]: line.split() for line in p.stdout.splitlines() if line.startswith("trace_")}
    assert sorted(rows) == sorted(TABLE)
    assert [rows[n][3] for n in sorted(TABLE)] == [f"{TABLE[n][2]:.1f}" for n in sorted(TABLE)]
    # global scope: ids shared across conversations, so a shared cache can hold more than each alone
    for row in rows.values():
        assert float(row[4]) >= float(row[3])


def test_sweep_over_a_folder():
    p = cli("sweep", str(WEKA), "--capacities", "512,8192", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["kind"] == "weka" and out["block_size"] == 64 and out["requests"] == 641
    rates = [pt["hit_rate"] for pt in out["points"]]
    assert rates[0] < rates[1]
    assert "claude-opus-4-6" in out["models"]


def test_sniffing():
    assert file_kind(WEKA / "trace_0303.json") == "weka"
    assert document_format(json.loads((WEKA / "trace_0303.json").read_text())) == "weka"


def test_sessions_import_keeps_the_models(tmp_path):
    db = tmp_path / "s.db"
    p = cli("sessions", "import", "--db", str(db), str(WEKA / "trace_0287.json"), "--json")
    assert p.returncode == 0, p.stderr
    from engine.store.database import Store
    from engine.store.weka import with_models

    store = Store(str(db))
    try:
        sid = store.list_sessions()[0].id
        info = store.get_session(sid)
        reqs = with_models(store.trace_requests(sid), info.settings)
    finally:
        store.close()
    assert len(reqs) == 40 and reqs[0].model == "claude-opus-4-5-20251101"
    assert sum(1 for r in reqs if r.model == "claude-haiku-4-5-20251001") == 14


# ---------------------------------------------------------------------------- hostile input
GOOD = {"id": "t", "models": ["m"], "block_size": 64, "hash_id_scope": "global",
        "requests": [{"t": 0, "type": "s", "model": "m", "in": 130, "out": 5, "hash_ids": [1, 2]}]}


def broken(path: list, value) -> dict:
    doc = json.loads(json.dumps(GOOD))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if value is KeyError:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc


@pytest.mark.parametrize("path,value,field", [
    (["block_size"], KeyError, "block_size"),
    (["block_size"], 0, "block_size"),
    (["block_size"], "64", "block_size"),
    (["requests"], {}, "requests"),
    (["requests"], [], "requests"),
    (["requests", 0], 5, "requests[0]"),
    (["requests", 0, "model"], KeyError, "requests[0].model"),
    (["requests", 0, "model"], 7, "requests[0].model"),
    (["requests", 0, "in"], -1, "requests[0].in"),
    (["requests", 0, "in"], 2.5, "requests[0].in"),
    (["requests", 0, "t"], "0", "requests[0].t"),
    (["requests", 0, "t"], -3, "requests[0].t"),
    (["requests", 0, "hash_ids"], [1, "x"], "requests[0].hash_ids"),
    (["requests", 0, "hash_ids"], [1, 2, 3], "requests[0].hash_ids"),
    (["requests", 0, "hash_ids"], [-1], "requests[0].hash_ids"),
    (["requests", 0, "type"], "x", "requests[0].type"),
    (["models"], "m", "models"),
    (["hash_id_scope"], 3, "hash_id_scope"),
])
def test_each_malformed_field_is_named(tmp_path, path, value, field):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(broken(path, value)))
    with pytest.raises(TraceError) as e:
        read_weka(p)
    assert e.value.field == field and "\n" not in str(e.value) and str(p) in str(e.value)


def test_malformed_subagents_are_named(tmp_path):
    doc = json.loads(json.dumps(GOOD))
    doc["requests"].append({"t": 1, "type": "subagent", "requests": []})
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as e:
        read_weka(p)
    assert e.value.field == "requests[1].agent_id"
    doc["requests"][1] = {"t": 1, "type": "subagent", "agent_id": "a",
                          "requests": [{"t": 0, "model": "m", "in": 10, "hash_ids": [1]}]}
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as e:
        read_weka(p)
    assert e.value.field == "requests[1].requests[0].hash_ids"


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe{}", b'{"block_size": 64, "hash_id_scope": "global", "requests": 5}',
                                     b"[" * 100000, b'{"block_size": 64, "hash_id_scope": "global", "requests": [' + b"[" * 5000])
def test_hostile_files_get_one_sentence_exit_2_and_store_nothing(tmp_path, content):
    p = tmp_path / "hostile.json"
    p.write_bytes(content)
    db = tmp_path / "s.db"
    for args in (["replay", str(p)], ["sweep", str(p)], ["sessions", "import", "--db", str(db), str(p)]):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    if db.exists():
        from engine.store.database import Store

        store = Store(str(db))
        try:
            assert store.list_sessions() == []
        finally:
            store.close()


def test_a_folder_without_traces_and_mixed_block_sizes(tmp_path):
    r = cli("replay", str(tmp_path))
    assert r.returncode == 2 and "holds no .json" in r.stderr
    for name, size in (("a.json", 64), ("b.json", 32)):
        doc = json.loads(json.dumps(GOOD))
        doc["id"], doc["block_size"] = name, size
        (tmp_path / name).write_text(json.dumps(doc))
    r = cli("replay", str(tmp_path))
    assert r.returncode == 2 and "different block sizes" in r.stderr


def test_a_large_trace_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import engine.store.weka as weka

    p = tmp_path / "big.json"
    p.write_text(json.dumps(GOOD))
    monkeypatch.setattr(weka, "MAX_FILE_BYTES", 100)
    with pytest.raises(TraceError, match="at most 100"):
        weka.read_weka(p)


def test_to_trace_requests_salts_a_local_scope():
    trace = read_weka(WEKA / "trace_0303.json")
    assert {r.tenant for r in to_trace_requests(trace.requests, {trace.id: "global"})} == {None}
    assert {r.tenant for r in to_trace_requests(trace.requests, {trace.id: "conversation"})} == {"trace_0303"}


# ---------------------------------------------------------------------------- kvcache-simulator lines
def _kvsim(tmp_path, sizes):
    p = tmp_path / "sim.jsonl"
    p.write_text("".join(json.dumps({"block_size": s, "hash_ids": list(range(i + 3)), "input_length": 64 * (i + 3) + 10})
                         + "\n" for i, s in enumerate(sizes)))
    return p


def test_kvcache_simulator_lines_replay_at_their_own_block_size(tmp_path):
    from engine.store.block_traces import declared_block_size

    p = _kvsim(tmp_path, [64] * 5)
    assert declared_block_size(p) == 64 and declared_block_size(WEKA / "trace_0303.json") is None
    r = cli("replay", str(p), "--capacity-blocks", "100", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["config"]["block_size"] == 64
    # each line extends the last by one 64-token block: all earlier blocks are hits
    assert [q["cached_tokens"] for q in out["requests"]] == [0, 192, 256, 320, 384]


def test_kvcache_simulator_lines_that_disagree_are_refused(tmp_path):
    p = _kvsim(tmp_path, [64, 64, 32])
    r = cli("replay", str(p), "--capacity-blocks", "100")
    assert r.returncode == 2 and "line 3, field 'block_size'" in r.stderr and len(r.stderr.splitlines()) == 1
    p = _kvsim(tmp_path, [64] * 3)
    r = cli("replay", str(p), "--capacity-blocks", "100", "--block-size", "32")
    assert r.returncode == 2 and "--block-size 64" in r.stderr
    p = _kvsim(tmp_path, [0])
    r = cli("replay", str(p), "--capacity-blocks", "100")
    assert r.returncode == 2 and "line 1, field 'block_size'" in r.stderr


def test_billing_a_weka_trace_keys_blocks_by_model_and_reads_seconds():
    from engine.analysis.billing import bill, load_billing_requests, provider_rules

    reqs, note = load_billing_requests(str(WEKA / "trace_0303.json"))
    assert "64-token blocks" in note and len(reqs) == 6
    # t is seconds: the last request is at 5 s, well inside the 5-minute TTL
    assert max(r.time_s for r in reqs) == 5.0
    out = bill(reqs, provider_rules("anthropic", "claude-opus-4-5"))
    rows = {r["id"]: r for r in out["requests"]}
    # Haiku's first request (same blocks as Opus's first) reads nothing: another model's cache
    assert rows["trace_0303#1"]["read_tokens"] == 0
    assert rows["trace_0303#5"]["read_tokens"] > 0  # Opus again, its own earlier prompt
