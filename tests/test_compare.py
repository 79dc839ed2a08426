"""`cachescope compare A B`: per-request deltas on two known runs and the CI exit codes.

Block size 16 against 64 on the real Mooncake conversation trace is checked against an
oracle written apart from the engine (a trie of the stored chains); a timestamp at the
front of the system prompt against one at the end is the bundled demo's scenario, written
as two conversation files and rendered with the real tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from engine.analysis.compare import SideOptions, compare, compare_runs, hit_rate_curve, load_side, refine_block_ids
from engine.core.errors import InputError
from engine.core.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
SCENARIOS = ROOT / "resources" / "demos" / "prefix_scenarios.json"
N = 300


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def oracle_cached(block_size: int) -> list[int]:
    """Cached tokens per request of the first N Mooncake requests at `block_size`, with a
    pool that never evicts: the longest chain of full blocks an earlier prompt stored,
    at most (prompt - 1) // block_size blocks. Sub-block k of 512-token id h is (h, k)."""
    per = 512 // block_size
    trie: dict[tuple[int, tuple[int, int]], int] = {}
    out = []
    for tr in load_trace(MOONCAKE)[:N]:
        ids = [(h, k) for h in tr.hash_ids for k in range(per)]
        node, hit = 0, 0
        for i in range((tr.input_length - 1) // block_size):
            node = trie.get((node, ids[i]), -1)
            if node < 0:
                break
            hit += 1
        out.append(hit * block_size)
        node = 0
        for i in range(tr.input_length // block_size):
            node = trie.setdefault((node, ids[i]), len(trie) + 1)
    return out


@pytest.fixture(scope="module")
def mooncake_16_64():
    return compare(str(MOONCAKE), str(MOONCAKE), SideOptions(block_size=16, limit=N),
                   SideOptions(block_size=64, limit=N)).to_dict()


def test_mooncake_16_against_64_matches_the_oracle(mooncake_16_64):
    r = mooncake_16_64
    rows = r["requests"]
    assert r["aligned_by"] == "id" and len(rows) == N
    assert [x["cached_tokens_a"] for x in rows] == oracle_cached(16)
    assert [x["cached_tokens_b"] for x in rows] == oracle_cached(64)
    # 64 is a multiple of 16, so 64-token blocks never reuse more and lose less than a block
    assert all(-64 < x["cached_delta"] <= 0 for x in rows)
    less = [x for x in rows if x["b_reuses"] == "less"]
    assert less and r["summary"]["b_reuses_less"] == len(less)
    assert r["summary"]["b_reuses_more"] == 0
    assert r["summary"]["same"] == N - len(less)
    assert r["delta"]["cached_tokens"] == sum(x["cached_delta"] for x in rows) < 0
    assert r["delta"]["prompt_tokens"] == 0
    ta, tb = r["a"]["totals"], r["b"]["totals"]
    assert ta["hit_rate"] == round(ta["cached_tokens"] / ta["prompt_tokens"], 6)
    assert r["delta"]["hit_rate"] == round(tb["hit_rate"] - ta["hit_rate"], 6) < 0
    assert ta["evicted_blocks"] == tb["evicted_blocks"] == 0  # the default pool holds the whole run
    for x in less:
        assert x["computed_delta"] == -x["cached_delta"]
        assert x["hit_rate_delta"] == round((x["cached_tokens_b"] - x["cached_tokens_a"]) / x["prompt_tokens_a"], 6)


def test_a_pool_in_tokens_is_the_same_memory_at_both_sizes():
    opts = dict(capacity_tokens=200_000, limit=N)
    c = compare(str(MOONCAKE), str(MOONCAKE), SideOptions(block_size=16, **opts), SideOptions(block_size=64, **opts))
    assert c.a.config["capacity_blocks"] == 12_500 and c.b.config["capacity_blocks"] == 3_125
    d = c.to_dict()
    assert d["a"]["totals"]["evicted_blocks"] > 0 and d["b"]["totals"]["evicted_blocks"] > 0
    assert [x["cached_tokens_a"] for x in d["requests"]] != oracle_cached(16)  # evictions cost reuse


def test_mooncake_refines_only_to_divisors_of_512():
    reqs = load_trace(MOONCAKE)[:2]
    fine = refine_block_ids(reqs, 128)
    assert fine[0].hash_ids[:5] == (0, 1, 2, 3, 4) and len(fine[0].hash_ids) == -(-6758 // 128)
    assert fine[1].hash_ids[:5] == (0, 1, 2, 3, 14 * 4)
    with pytest.raises(InputError, match="divides 512"):
        refine_block_ids(reqs, 48)


def _timestamp_files(tmp_path: Path) -> tuple[Path, Path]:
    """The timestamp demo's requests as two conversation files (one conversation per request)."""
    spec = json.loads(SCENARIOS.read_text())["timestamp"]
    front, end = [], []
    for time, question in zip(spec["times"], spec["questions"]):
        front.append({"messages": [{"role": "system", "content": spec["system_front"].format(time=time, date=spec["date"])},
                                   {"role": "user", "content": question}]})
        end.append({"messages": [{"role": "system", "content": spec["system_static"]},
                                 {"role": "user", "content": question + spec["user_suffix"].format(time=time, date=spec["date"])}]})
    a, b = tmp_path / "front.jsonl", tmp_path / "end.jsonl"
    a.write_text("".join(json.dumps(c) + "\n" for c in front))
    b.write_text("".join(json.dumps(c) + "\n" for c in end))
    return a, b


def test_timestamp_at_the_front_against_at_the_end(tmp_path, default_tokenizer):
    from engine.model.chat import render_chat

    a, b = _timestamp_files(tmp_path)
    c = compare(str(a), str(b), SideOptions(block_size=16), tokenizer_loader=lambda: default_tokenizer)
    r = c.to_dict()
    rows = r["requests"]
    assert r["aligned_by"] == "id" and [x["id_a"] for x in rows] == ["0/1", "1/1", "2/1"]
    spec = json.loads(SCENARIOS.read_text())["timestamp"]
    static = render_chat(default_tokenizer, [{"role": "system", "content": spec["system_static"]}],
                         add_generation_prompt=False)
    shared_blocks = len(static) // 16
    assert shared_blocks >= 2
    # the first request of each side finds an empty pool; later ones reuse the static system prompt on B only
    assert rows[0]["cached_tokens_a"] == rows[0]["cached_tokens_b"] == 0 and rows[0]["b_reuses"] == "same"
    for x in rows[1:]:
        assert x["cached_tokens_a"] < 16 * 2  # the time sits in block 0 or 1: nothing after it is reused
        assert x["cached_tokens_b"] >= shared_blocks * 16
        assert x["b_reuses"] == "more" and x["cached_delta"] == x["cached_tokens_b"] - x["cached_tokens_a"] > 0
        assert x["miss_reason_a"] == "new_content"
    assert r["summary"]["b_reuses_more"] == 2 and r["delta"]["cached_tokens"] > 0
    assert hit_rate_curve(c.b)[-1] == pytest.approx(r["b"]["totals"]["cached_tokens"] / r["b"]["totals"]["prompt_tokens"])


def test_the_ci_gate_exit_codes(tmp_path, capsys, monkeypatch, default_tokenizer):
    import engine.model.loader as loader

    monkeypatch.setattr(loader, "load_tokenizer", lambda *a, **k: default_tokenizer)
    front, end = _timestamp_files(tmp_path)
    code, out, err = cli(capsys, str(end), str(front), "--json", "--fail-if-hit-rate-drops", "0.05")
    doc = json.loads(out)
    assert code == 1 and doc["gate"]["failed"] is True and doc["gate"]["hit_rate_drop"] > 0.05
    assert err.count("\n") == 1 and "below A's" in err
    code, out, err = cli(capsys, str(front), str(end), "--json", "--fail-if-hit-rate-drops", "0.05")
    assert code == 0 and json.loads(out)["gate"]["failed"] is False and err == ""
    drop = doc["gate"]["hit_rate_drop"]
    code, _, _ = cli(capsys, str(end), str(front), "--json", "--fail-if-hit-rate-drops", f"{drop + 0.001:.6f}")
    assert code == 0  # within the allowance
    code, out, err = cli(capsys, str(end), str(front))  # no gate: always 0
    assert code == 0 and "B - A:" in out


@pytest.mark.parametrize("argv, words", [
    (["nope.jsonl", str(MOONCAKE)], "no such file"),
    ([str(MOONCAKE), str(MOONCAKE), "--block-size-b", "48"], "divides 512"),
    ([str(MOONCAKE), str(MOONCAKE), "--fail-if-hit-rate-drops", "5"], "fraction"),
    ([str(MOONCAKE), str(MOONCAKE), "--capacity-tokens", "8"], "holds no block"),
    ([str(MOONCAKE), str(MOONCAKE), "--block-size", "0"], "at least 1"),
    ([str(MOONCAKE), "run:999999", "--db", "/nonexistent-dir/x.db"], "no run 999999"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    with pytest.raises(SystemExit) as info:  # argparse refusals exit from inside
        code = main(["compare", *argv])
        raise SystemExit(code)
    _, err = capsys.readouterr()
    assert info.value.code == 2 and words in err and err.count("\n") == 1


def test_a_recorded_run_compares_as_recorded(tmp_path):
    from engine.store.database import Store
    from engine.store.sessions import import_file, replay_session

    db = tmp_path / "s.db"
    trace = tmp_path / "t.jsonl"
    system = list(range(1, 49))
    trace.write_text("".join(json.dumps({"id": f"r{i}", "tokens": system + [100 + i] * 5}) + "\n" for i in range(4)))
    with Store(db) as store:
        (sid,) = import_file(store, trace)
        run_id = replay_session(store, sid).config["run_id"]
    recorded = load_side(f"run:{run_id}", SideOptions(), str(db))
    replayed = load_side(f"session:{sid}", SideOptions(block_size=32), str(db))
    c = compare_runs(recorded, replayed).to_dict()
    assert [x["cached_tokens_a"] for x in c["requests"]] == [0, 48, 48, 48]
    assert [x["cached_tokens_b"] for x in c["requests"]] == [0, 32, 32, 32]
    assert c["a"]["totals"]["stored_blocks"] == 3 + 3 * 0  # the events of the run: one chain of 3 blocks
    assert c["summary"]["b_reuses_less"] == 3


# ---- cost per turn and demo sides -------------------------------------------------------

def billing_costs(capsys, *argv: str) -> dict[str, float]:
    assert main(["billing", *argv, "--json"]) == 0
    return {str(row["id"]): row["cost_usd"] for row in json.loads(capsys.readouterr().out)["requests"]}


def test_cost_per_turn_is_what_billing_says_on_each_side(capsys):
    code, out, _ = cli(capsys, str(MOONCAKE), str(MOONCAKE), "--block-size-b", "64", "--requests", "40",
                       "--cost", "anthropic", "--json")
    doc = json.loads(out)
    billed = billing_costs(capsys, str(MOONCAKE), "--limit", "40")
    assert code == 0 and len(billed) == 40
    for row in doc["requests"]:
        assert row["cost_usd_a"] == billed[row["id_a"]] and row["cost_usd_b"] == billed[row["id_b"]]
        assert row["cost_delta_usd"] == 0  # the hosted bill does not depend on the local block size
    assert doc["cost"]["a"]["cost_usd"] == pytest.approx(sum(billed.values()))
    assert doc["cost"]["cost_delta_usd"] == 0 and doc["cost"]["unknown"] == []


def test_cost_per_turn_differs_where_the_prompts_do(tmp_path, capsys, monkeypatch, default_tokenizer):
    import engine.model.loader as loader

    monkeypatch.setattr(loader, "load_tokenizer", lambda *a, **k: default_tokenizer)
    front, end = _timestamp_files(tmp_path)
    code, out, _ = cli(capsys, str(front), str(end), "--cost", "anthropic", "--json")
    doc = json.loads(out)
    billed_a, billed_b = billing_costs(capsys, str(front)), billing_costs(capsys, str(end))
    assert code == 0 and [r["cost_usd_a"] for r in doc["requests"]] == [billed_a[r["id_a"]] for r in doc["requests"]]
    assert [r["cost_usd_b"] for r in doc["requests"]] == [billed_b[r["id_b"]] for r in doc["requests"]]
    deltas = [r["cost_delta_usd"] for r in doc["requests"]]
    assert deltas == [round(b - a, 8) for a, b in ((r["cost_usd_a"], r["cost_usd_b"]) for r in doc["requests"])]
    assert doc["cost"]["cost_delta_usd"] == round(sum(billed_b.values()) - sum(billed_a.values()), 8)


def test_a_demo_compares_its_two_parts_as_the_demo_reports_them(capsys):
    name = "ab-setting-splits-cache"  # a tokenizer-only demo: two prefix caches fed the same traffic
    assert main(["demo", name, "--json"]) == 0
    findings = json.loads(capsys.readouterr().out)["findings"]
    code, out, err = cli(capsys, f"demo:{name}:one_value", f"demo:{name}:ab_test", "--json")
    doc = json.loads(out)
    assert code == 0 and err == ""
    one, ab = findings["one_value"]["requests"], findings["ab_test"]["requests"]
    rows = doc["requests"]
    assert doc["aligned_by"] == "id" and [r["id_a"] for r in rows] == [r["request_id"] for r in one]
    by_id = {r["request_id"]: r for r in ab}
    for row, a in zip(rows, one):
        b = by_id[row["id_a"]]
        assert (row["cached_tokens_a"], row["cached_tokens_b"]) == (a["cached_tokens"], b["cached_tokens"])
        assert row["cached_delta"] == b["cached_tokens"] - a["cached_tokens"]
        assert row["miss_reason_a"] == a["miss_reason"]
    assert doc["delta"]["cached_tokens"] == findings["ab_test"]["cached_tokens"] - findings["one_value"]["cached_tokens"]
    assert round(doc["a"]["totals"]["hit_rate"], 4) == findings["hit_rate_one_value"]
    assert round(doc["b"]["totals"]["hit_rate"], 4) == findings["hit_rate_ab_test"]
    assert doc["delta"]["cached_tokens"] < 0 and doc["summary"]["b_reuses_more"] == 0  # splitting only loses
    assert doc["a"]["config"]["block_size"] == 16 and doc["a"]["config"]["capacity_blocks"] == 256


def test_a_demo_side_keeps_the_pool_of_its_own_engine():
    from app.views.compare.demo_sides import demo_runs

    name = "ab-setting-splits-cache"
    c = compare(f"demo:{name}:one_value", f"demo:{name}:ab_test", SideOptions(), demos=demo_runs())
    for run in (c.a, c.b):
        assert run.log is not None and set(run.end_seqs) == {r.id for r in run.requests}
        # every request of a side ends in that side's own engine, in the order it was served
        assert list(run.end_seqs) == [r.id for r in run.requests]
    last = c.b.requests[-1].id
    pool = c.b.state_after(last)
    assert pool.num_in_use == 0 and pool.num_cached_free == c.b.stored_blocks - c.b.evicted_blocks


@pytest.mark.parametrize("argv, words", [
    (["demo:no-such-demo", str(MOONCAKE)], "no demo called 'no-such-demo'"),
    (["demo:ab-setting-splits-cache:nope", "demo:ab-setting-splits-cache"], "has no part 'nope'"),
])
def test_a_bad_demo_side_is_one_line_and_exit_2(capsys, argv, words):
    code, _, err = cli(capsys, *argv)
    assert code == 2 and words in err and err.count("\n") == 1


# ---- two servers of a recorded fleet attach ---------------------------------------------

FLEET = ROOT / "tests" / "data" / "vllm_connector" / "vllm_connector_frames.jsonl"


def recorded_fleet(db: Path, frames: bool = False) -> int:
    """vLLM 0.33.0's own frames of three pods (tests/data/vllm_connector, case
    three-pods-one-endpoint) applied as an attach applies them, one RemotePool per pod on
    one bus, and recorded as an attach run (its events, as captures were kept before
    frames; with `frames`, its frames, as `attach --record` keeps them now); the run's id."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from _publishers import recorded_frames

    from engine.core.events import EventBus
    from engine.remote.pool import RemotePool
    from engine.remote.wire import decode_batch, parse_pub
    from engine.store.database import Store

    if frames:
        from types import SimpleNamespace

        from engine.analysis.remote_capture import Recorder
        from engine.remote.attachment import AttachOptions

        rec = Recorder(str(db), AttachOptions(("tcp://*:5557",), bind=True)).start(
            SimpleNamespace(started=False, recorder=None))
        for message in recorded_frames(FLEET, case="three-pods-one-endpoint", socket="pub"):
            _topic, seq, payload = parse_pub(message)
            rec.frames(SimpleNamespace(source=message[0].decode().split("@")[1], server="", rank=0), seq, [payload])
        rec.finish({"streams": []})
        return rec.run_id
    bus, events, pools = EventBus(), [], {}
    bus.subscribe(events.append)
    for message in recorded_frames(FLEET, case="three-pods-one-endpoint", socket="pub"):
        pod = message[0].decode().split("@")[1]
        _topic, seq, payload = parse_pub(message)
        pools.setdefault(pod, RemotePool(source=pod, events=bus)).apply(decode_batch(seq, payload))
    with Store(db) as store:
        sid = store.create_session("fleet", "trace", hash="vllm-sha256")
        run_id = store.create_run(sid, "attach", {"endpoints": sorted(pools)})
        store.record_events(run_id, events)
        store.finish_run(run_id, {})
    return run_id


@pytest.mark.parametrize("frames", [False, True], ids=["events", "frames"])
def test_two_servers_of_a_recorded_fleet_attach(tmp_path, capsys, frames):
    db = tmp_path / "fleet.db"
    run = recorded_fleet(db, frames)
    code, out, err = cli(capsys, f"run:{run}@10.0.0.11:8000", f"run:{run}@tcp://10.0.0.13:8000", "--db", str(db),
                         "--json")
    doc = json.loads(out)
    assert code == 0 and err == ""
    # by hand, from the fixture's README: pod .11 stores A (4 blocks) and removes A's last two;
    # pod .13 stores C, A's first two blocks and two of its own, and removes nothing
    ta, tb = doc["a"]["totals"], doc["b"]["totals"]
    assert (ta["stored_blocks"], ta["evicted_blocks"]) == (4, 2)
    assert (tb["stored_blocks"], tb["evicted_blocks"]) == (4, 0)
    assert doc["delta"]["stored_blocks"] == 0 and doc["delta"]["evicted_blocks"] == -2
    assert doc["blocks"] == {"held_a": 2, "held_b": 4, "held_by_both": 2, "only_a": 0, "only_b": 2, "held_delta": 2}
    assert doc["requests"] == [] and doc["a"]["config"]["server"] == "10.0.0.11:8000"
    # pod .12 holds A's first two blocks on the GPU and again on the CPU: two hashes, four stores
    code, out, _ = cli(capsys, f"run:{run}@10.0.0.12:8000", f"run:{run}@10.0.0.11:8000", "--db", str(db), "--json")
    doc = json.loads(out)
    assert doc["a"]["totals"]["stored_blocks"] == 4 and doc["blocks"]["held_a"] == 2
    assert doc["blocks"]["held_by_both"] == 2 and doc["blocks"]["only_a"] == doc["blocks"]["only_b"] == 0


def test_a_recorded_attach_as_frames_counts_what_it_did_as_events(tmp_path):
    """`run:ID` of a capture that keeps frames counts the blocks its servers stored and removed
    as the capture that kept the events counted them."""
    got = {}
    for frames in (False, True):
        db = tmp_path / f"fleet-{frames}.db"
        side = load_side(f"run:{recorded_fleet(db, frames)}", SideOptions(), str(db))
        got[frames] = (side.stored_blocks, side.evicted_blocks)
    assert got[True] == got[False] == (12, 2)


def test_an_unknown_server_is_one_line_and_exit_2(tmp_path, capsys):
    db = tmp_path / "fleet.db"
    run = recorded_fleet(db)
    code, _, err = cli(capsys, f"run:{run}@10.0.0.99:8000", f"run:{run}@10.0.0.11:8000", "--db", str(db))
    assert code == 2 and err.count("\n") == 1
    assert "has no server '10.0.0.99:8000' (its servers: 10.0.0.12:8000, 10.0.0.13:8000, 10.0.0.11:8000)" in err
    code, _, err = cli(capsys, f"session:1@x", f"run:{run}@10.0.0.11:8000", "--db", str(db))
    assert code == 2 and "run:ID@SERVER" in err and err.count("\n") == 1


@pytest.mark.model
def test_a_model_demo_compares_front_and_end_with_the_cost_per_turn(tmp_path, capsys, default_model):
    """The timestamp demo on the real model, its front part against its end part: the
    cached tokens are the demo's own findings, and each side's cost per turn is what
    `cachescope billing` bills for a token trace of the same prompts, rendered here apart
    from the demo from its scenario file."""
    from app.views.compare.demo_sides import demo_runs
    from engine.analysis.billing import provider_rules
    from engine.analysis.compare import cost_per_turn
    from engine.model.chat import render_chat

    demos = demo_runs(default_model)
    c = compare("demo:timestamp-at-front:front", "demo:timestamp-at-front:end", SideOptions(), demos=demos)
    findings = demos.result("timestamp-at-front")[0]["findings"]
    doc = c.to_dict()
    assert doc["aligned_by"] == "index"  # front-1.. against end-1..: paired by position
    assert [r["cached_tokens_a"] for r in doc["requests"]] == findings["cached_tokens_front"]
    assert [r["cached_tokens_b"] for r in doc["requests"]] == findings["cached_tokens_end"]
    assert doc["delta"]["cached_tokens"] == findings["tokens_saved_by_moving"] > 0
    spec = json.loads(SCENARIOS.read_text())["timestamp"]
    tok = default_model.tokenizer
    files = {}
    for side, prefix in (("a", "front"), ("b", "end")):
        rows = []
        for i, (time, q) in enumerate(zip(spec["times"], spec["questions"]), 1):
            if side == "a":
                msgs = [{"role": "system", "content": spec["system_front"].format(time=time, date=spec["date"])},
                        {"role": "user", "content": q}]
            else:
                msgs = [{"role": "system", "content": spec["system_static"]},
                        {"role": "user", "content": q + spec["user_suffix"].format(time=time, date=spec["date"])}]
            rows.append({"id": f"{prefix}-{i}", "tokens": render_chat(tok, msgs)})
        files[side] = tmp_path / f"{prefix}.jsonl"
        files[side].write_text("".join(json.dumps(r) + "\n" for r in rows))
    cost = cost_per_turn(c, provider_rules("anthropic"))
    for side in ("a", "b"):
        billed = billing_costs(capsys, str(files[side]))
        assert [r[f"cost_usd_{side}"] for r in cost["requests"]] == list(billed.values())
    assert cost["unknown"] == [] and cost["cost_delta_usd"] == round(cost["b"]["cost_usd"] - cost["a"]["cost_usd"], 8)


# ---- the kernel route: the same JSON as the Python engine's, the pool at any size --------

TWIN = ROOT / "tests" / "data" / "vllm_twin"
TRACES = ROOT / "resources" / "traces"


def both_routes(path: Path, oa: SideOptions, ob: SideOptions):
    python = compare(str(path), str(path), oa, ob, keep_logs=True, kernel="python")
    numba = compare(str(path), str(path), oa, ob, keep_logs=True, kernel="numba")
    return python, numba


def assert_same_result(python, numba) -> None:
    from engine.analysis.compare import pool_curves

    assert json.dumps(numba.to_dict(), sort_keys=True) == json.dumps(python.to_dict(), sort_keys=True)
    for p, k in ((python.a, numba.a), (python.b, numba.b)):
        assert getattr(k.log, "columnar_log", False) and not getattr(p.log, "columnar_log", False)
        assert list(k.end_seqs.items()) == list(p.end_seqs.items())
        assert pool_curves(k) == pool_curves(p)
        for r in (p.requests[0], p.requests[len(p.requests) // 2], p.requests[-1]):
            sp, sk = p.state_after(r.id), k.state_after(r.id)
            assert (sk.num_in_use, sk.num_cached_free, sk.max_ref_count) == \
                (sp.num_in_use, sp.num_cached_free, sp.max_ref_count)


@pytest.mark.parametrize("trace, a, b, limit", [
    # block size 16 against 64, the whole run held (600 requests), then a pool of 60K tokens
    # that a few of Mooncake's ~14K-token prompts fill: 250 requests of it evict 155K blocks
    # and refuse 10 (600 were the same eviction again, ~12 s more of the Python engine;
    # test_the_cli_prints_the_same_json_on_either_kernel compares 500 in a pool that evicts)
    ("mooncake_conversation_trace.jsonl", dict(block_size=16), dict(block_size=64), 600),
    ("mooncake_conversation_trace.jsonl", dict(block_size=16, capacity_tokens=60_000),
     dict(block_size=64, capacity_tokens=60_000), 250),
    ("mooncake_synthetic_trace.jsonl", dict(block_size=32, capacity_blocks=400, concurrency=4),
     dict(block_size=128, capacity_blocks=100, concurrency=4), 600),
    ("demo_tokens.jsonl", dict(block_size=16, capacity_blocks=24, hash="xxh3"), dict(block_size=4), 600),
])
def test_the_kernel_gives_the_python_engines_json_on_the_bundled_traces(trace, a, b, limit):
    opts_a, opts_b = SideOptions(**a, limit=limit), SideOptions(**b, limit=limit)
    python, numba = both_routes(TRACES / trace, opts_a, opts_b)
    assert_same_result(python, numba)
    if "capacity_tokens" in a:  # the slice still evicts on both sides, most of its length
        for side in ("a", "b"):
            assert python.to_dict()[side]["totals"]["evicted_blocks"] > 0


@pytest.mark.parametrize("trace", sorted(p.name for p in TWIN.glob("*.trace.jsonl")))
@pytest.mark.parametrize("hash_name", ["sha256", "vllm-sha256"])
def test_the_kernel_gives_the_python_engines_json_on_the_vllm_twin_traces(trace, hash_name):
    recorded = json.loads((TWIN / trace.replace(".trace.jsonl", ".vllm.json")).read_text())
    concurrency = int(trace.split("_c")[-1].split(".")[0])
    blocks = recorded["config"].get("num_gpu_blocks")
    a = SideOptions(block_size=16, capacity_blocks=blocks - 1 if blocks else None, hash=hash_name,
                    concurrency=concurrency)
    b = SideOptions(block_size=8, capacity_blocks=12, hash=hash_name, concurrency=concurrency)
    assert_same_result(*both_routes(TWIN / trace, a, b))


def test_the_kernel_keeps_the_pool_past_the_python_engines_limit(monkeypatch):
    import engine.analysis.compare as cmp

    monkeypatch.setattr(cmp, "MAX_LOGGED_REQUESTS", 50)
    opts = SideOptions(block_size=16, limit=120)
    python = compare(str(MOONCAKE), str(MOONCAKE), opts, keep_logs=True, kernel="python")
    assert python.a.log is None and "up to 50 on the Python engine" in python.a.no_log_reason
    auto = compare(str(MOONCAKE), str(MOONCAKE), opts, keep_logs=True)
    assert auto.a.log is not None and auto.a.no_log_reason is None
    assert set(auto.a.end_seqs) == {r.id for r in auto.a.requests}
    last = auto.a.requests[-1].id
    assert auto.a.state_after(last).num_cached_free == auto.a.stored_blocks - auto.a.evicted_blocks
    assert json.dumps(auto.to_dict()) == json.dumps(python.to_dict())


def test_a_hash_the_kernel_cannot_run_replays_on_the_python_engine(capsys):
    opts = SideOptions(block_size=16, hash="sglang-sha256", limit=40)
    auto = compare(str(MOONCAKE), str(MOONCAKE), opts, keep_logs=True)
    assert auto.a.log is not None and not getattr(auto.a.log, "columnar_log", False)
    code, out, err = cli(capsys, str(MOONCAKE), str(MOONCAKE), "--hash", "sglang-sha256", "--requests", "40",
                         "--kernel", "numba", "--json")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Python engine only" in err


def test_the_cli_prints_the_same_json_on_either_kernel(capsys):
    argv = [str(MOONCAKE), str(MOONCAKE), "--block-size-a", "16", "--block-size-b", "64", "--requests", "500",
            "--capacity-tokens", "200000", "--json"]
    outs = []
    for kernel in ("python", "auto"):
        code, out, err = cli(capsys, *argv, "--kernel", kernel)
        assert code == 0 and err == ""
        outs.append(out)
    assert outs[0] == outs[1] and json.loads(outs[0])["summary"]["paired"] == 500
