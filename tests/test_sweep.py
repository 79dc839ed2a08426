"""What-if sweeps: exact hit rates on a hand-built trace, the real Mooncake trace, conversations."""

from __future__ import annotations

import json

from pathlib import Path

import pytest

from app.cli import main
from engine.core.errors import InputError
from engine.core.replay import ReplayConfig, replay
from engine.analysis.sweep import conversation_trace, load_sweep_requests, sweep
from engine.core.trace import load_trace

MOONCAKE = str(Path(__file__).resolve().parents[1] / "resources" / "traces" / "mooncake_conversation_trace.jsonl")
MT_BENCH = str(Path(__file__).resolve().parents[1] / "resources" / "traces" / "mt_bench_question.jsonl")


@pytest.fixture
def shared_prefix_trace(tmp_path):
    a = list(range(1000, 1100))  # 100 tokens
    b = a[:70] + list(range(5000, 5030))  # shares 70 tokens with a
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"id": "a", "tokens": a}) + "\n" + json.dumps({"id": "b", "tokens": b}) + "\n")
    return path


def test_block_size_series_exact(shared_prefix_trace):
    reqs = load_trace(shared_prefix_trace)
    out = sweep(reqs, block_sizes=[1, 16, 64, 128], capacities=[])
    by_bs = {p["block_size"]: p for p in out["points"] if p["series"] == "block_size"}
    # b reuses its shared prefix in whole blocks: 70 tokens, 64 (4x16), 64, then nothing.
    assert {bs: p["cached_tokens"] for bs, p in by_bs.items()} == {1: 70, 16: 64, 64: 64, 128: 0}
    assert by_bs[1]["hit_rate"] == pytest.approx(70 / 200)
    assert all(p["prompt_tokens"] == 200 and p["evicted_blocks"] == 0 for p in by_bs.values())


def test_capacity_series_evicts(shared_prefix_trace):
    reqs = load_trace(shared_prefix_trace)
    out = sweep(reqs, block_sizes=[], capacities=[7, 64], block_size=16)
    small, big = [p for p in out["points"] if p["series"] == "capacity"]
    # 7 blocks hold a's 7 blocks; b needs 7 too, so it evicts a's tail but keeps the shared 4.
    assert (small["capacity_blocks"], big["capacity_blocks"]) == (7, 64)
    assert small["cached_tokens"] == big["cached_tokens"] == 64
    assert small["evicted_blocks"] > 0 and big["evicted_blocks"] == 0


def test_points_match_replay(shared_prefix_trace):
    reqs = load_trace(shared_prefix_trace)
    out = sweep(reqs, block_sizes=[8], capacities=[5])
    cap = out["points"][-1]
    direct = replay(reqs, ReplayConfig(block_size=16, capacity_blocks=5)).to_dict()["totals"]
    assert cap["hit_rate"] == direct["hit_rate"] and cap["evicted_blocks"] == direct["evicted_blocks"]


def test_mooncake_only_capacity_varies():
    reqs = load_trace(MOONCAKE)[:1500]
    out = sweep(reqs, capacities=[64, 1024, 16384])
    assert out["kind"] == "mooncake" and out["block_size"] == 512
    assert {p["series"] for p in out["points"]} == {"capacity"}
    assert all(p["block_size"] == 512 for p in out["points"])
    assert any("512" in n for n in out["notes"])
    rates = [p["hit_rate"] for p in out["points"]]
    assert rates[0] < rates[-1]  # a bigger pool keeps more of the shared prefixes
    assert out["points"][-1]["evicted_blocks"] < out["points"][0]["evicted_blocks"]


def test_conversations_with_real_tokenizer(default_tokenizer, tmp_path):
    rows = [json.loads(line) for line in open(MT_BENCH, encoding="utf-8")][:6]
    system = "You are a careful assistant. Answer in full sentences and show your reasoning step by step."
    convs = [[{"role": "system", "content": system}, {"role": "user", "content": r["turns"][0]},
              {"role": "assistant", "content": "Here is a first answer."}, {"role": "user", "content": r["turns"][1]}]
             for r in rows]
    reqs = conversation_trace(convs, default_tokenizer)
    assert len(reqs) == 12
    # The second turn's prompt starts with the first turn's prompt plus its recorded reply.
    first, second = reqs[0], reqs[1]
    assert second.tokens[:len(first.tokens) + len(first.output_tokens)] == first.tokens + first.output_tokens
    out = sweep(reqs, block_sizes=[1, 16, 64], capacities=[])
    rate = {p["block_size"]: p["hit_rate"] for p in out["points"]}
    assert rate[1] >= rate[16] >= rate[64] and rate[16] > 0.3


def test_sweep_command(shared_prefix_trace, capsys):
    assert main(["sweep", str(shared_prefix_trace), "--block-sizes", "1,16", "--capacities", "4,64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trace"] == str(shared_prefix_trace)
    for p in out["points"]:
        assert set(p) >= {"block_size", "capacity_blocks", "hit_rate", "cached_tokens", "prompt_tokens",
                          "evicted_blocks"}
    assert len(out["points"]) == 4
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(shared_prefix_trace), "--block-sizes", "1,x"])
    assert exc.value.code == 2
    assert main(["sweep", str(shared_prefix_trace) + ".missing"]) == 2


def test_conversation_file_is_tokenised(default_tokenizer, tmp_path):
    path = tmp_path / "conv.json"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello!"},
                                             {"role": "user", "content": "How are you?"}]}))
    reqs, kind = load_sweep_requests(path, lambda: default_tokenizer)
    assert kind == "conversation" and len(reqs) == 2
    with pytest.raises(InputError):
        sweep([], capacities=[4])


def _cli_sweep(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main(["sweep", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sweep_file_is_what_the_command_prints(shared_prefix_trace, capsys):
    """engine.analysis.sweep.sweep_file is the command's whole sweep (and the Sweep panel's):
    a token trace with every option, a kv-cache-tester file keyed by model and shared, a
    Mooncake slice at its 512-token blocks."""
    from engine.analysis.sweep import sweep_file
    from engine.resources import resource_path

    weka = str(resource_path("traces", "weka", "trace_0303.json"))
    t = str(shared_prefix_trace)
    cases = [
        ((t,), {}, ()),
        ((t, [1, 16], [4, 64]), dict(block_size=8, capacity_tokens=48, limit=1, seed=7),
         ("--block-sizes", "1,16", "--capacities", "4,64", "--block-size", "8", "--capacity-tokens", "48",
          "--limit", "1", "--seed", "7")),
        ((weka, [64], [64, 4096]), {}, ("--block-sizes", "64", "--capacities", "64,4096")),
        ((weka, [64], [64, 4096]), dict(keyed_by_model=False),
         ("--block-sizes", "64", "--capacities", "64,4096", "--shared-across-models")),
        ((MOONCAKE, [16], [8, 64]), dict(limit=300), ("--block-sizes", "16", "--capacities", "8,64", "--limit", "300")),
    ]
    for args, kwargs, argv in cases:
        got = json.loads(json.dumps(sweep_file(*args, **kwargs)))
        assert got == _cli_sweep(capsys, args[0], *argv), argv
    assert sweep_file(weka, [64], [64], keyed_by_model=False)["keyed_by_model"] is False
    moon = sweep_file(MOONCAKE, [16], [8], limit=50)
    assert (moon["kind"], moon["block_size"], moon["requests"]) == ("mooncake", 512, 50)
    with pytest.raises(InputError, match="no such file"):
        sweep_file(t + ".missing")


def test_sweep_file_reports_each_point_and_stops_when_told(shared_prefix_trace):
    from engine.analysis.sweep import sweep_file

    seen: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        seen.append((done, total))
        if done == 2:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        sweep_file(str(shared_prefix_trace), [1, 16], [4, 64], progress=progress)
    assert seen == [(1, 4), (2, 4)]
