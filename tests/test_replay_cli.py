"""`cachescope replay --no-model`: the JSON contract, real Mooncake traces and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "resources" / "traces"
MOONCAKE_CONV = DATA / "mooncake_conversation_trace.jsonl"
MOONCAKE_SYN = DATA / "mooncake_synthetic_trace.jsonl"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def chat_trace(tmp_path: Path) -> Path:
    system = list(range(1, 33))  # two blocks of 16
    return write_jsonl(tmp_path / "t.jsonl", [
        {"id": "t1", "tokens": system + [40, 41, 42], "output_tokens": [50, 51, 52, 53]},
        {"id": "t2", "tokens": system + [40, 41, 42, 50, 51, 52, 53, 60], "output_tokens": [70, 71]},
        {"id": "t3", "tokens": system + [99], "tenant": "other"},
    ])


def test_replay_json_contract(capsys, chat_trace):
    code, out, err = cli(capsys, "replay", str(chat_trace), "--no-model", "--block-size", "16",
                         "--capacity-blocks", "64", "--seed", "3", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"config", "totals", "requests"}
    assert set(data["totals"]) == {"requests", "prompt_tokens", "cached_tokens", "computed_tokens", "hit_rate",
                                   "stored_blocks", "evicted_blocks", "refused_requests"}
    rows = data["requests"]
    assert [r["id"] for r in rows] == ["t1", "t2", "t3"]
    for r in rows:
        assert {"index", "id", "tenant", "prompt_tokens", "cached_tokens", "computed_tokens", "output_tokens",
                "miss_reason", "first_miss_block", "divergence_token"} <= set(r)
    assert rows[0]["cached_tokens"] == 0 and rows[0]["miss_reason"] == "new_content"
    assert rows[1]["cached_tokens"] == 32 and rows[1]["miss_reason"] == "partial_block"
    assert rows[2]["cached_tokens"] == 0 and rows[2]["miss_reason"] == "salt"
    t = data["totals"]
    assert t["prompt_tokens"] == 35 + 40 + 33
    assert t["hit_rate"] == pytest.approx(32 / 108, abs=1e-6)
    assert t["computed_tokens"] == t["prompt_tokens"] - t["cached_tokens"]


def test_totals_only_and_human_output(capsys, chat_trace):
    code, out, _ = cli(capsys, "replay", str(chat_trace), "--no-model", "--capacity-tokens", "1024",
                       "--totals-only", "--json")
    assert code == 0 and "requests" not in json.loads(out)
    code, out, _ = cli(capsys, "replay", str(chat_trace), "--no-model", "--capacity-blocks", "64")
    assert code == 0 and "hit rate" in out


def test_concurrency_shows_shared_ref_counts(chat_trace, tmp_path):
    from engine.core.events import EventBus, RefCountsChanged

    shared = list(range(64))
    trace = write_jsonl(tmp_path / "fan.jsonl",
                        [{"tokens": shared + [100 + i], "output_tokens": [1, 2, 3, 4]} for i in range(4)])
    bus = EventBus()
    seen: list = []
    bus.subscribe(seen.append)
    replay(load_trace(trace), ReplayConfig(block_size=16, capacity_blocks=64, concurrency=4), events=bus)
    max_ref = max(max(e.ref_counts) for e in seen if isinstance(e, RefCountsChanged))
    assert max_ref == 4
    alone = EventBus()
    seen1: list = []
    alone.subscribe(seen1.append)
    replay(load_trace(trace), ReplayConfig(block_size=16, capacity_blocks=64, concurrency=1), events=alone)
    assert max(max(e.ref_counts) for e in seen1 if isinstance(e, RefCountsChanged)) == 1


def test_replay_is_deterministic_with_a_seed(chat_trace):
    def run():
        from engine.core.events import EventBus

        bus = EventBus(clock=lambda: 0.0)
        out: list = []
        bus.subscribe(lambda e: out.append(e.to_dict()))
        replay(load_trace(chat_trace), ReplayConfig(block_size=4, capacity_blocks=16, seed=5), events=bus)
        return out

    assert run() == run()


@pytest.mark.parametrize("path,capacity", [(MOONCAKE_CONV, 20000), (MOONCAKE_SYN, 4000)])
def test_mooncake_traces_replay_completely(path, capacity):
    result = replay(load_trace(path, 512), ReplayConfig(block_size=512, capacity_blocks=capacity)).to_dict()
    t = result["totals"]
    n_lines = sum(1 for line in path.open() if line.strip())
    assert t["requests"] == n_lines
    # Mooncake requests share system prompts and conversation history: real reuse
    assert 0.15 < t["hit_rate"] < 0.9
    assert t["evicted_blocks"] > 0 and t["refused_requests"] == 0
    # every cached token is a whole 512-token block that had been stored before
    assert all(r["cached_tokens"] % 512 == 0 for r in result["requests"])
    assert t["cached_tokens"] == sum(r["cached_tokens"] for r in result["requests"])


def test_mooncake_hit_rate_grows_with_capacity():
    rows = load_trace(MOONCAKE_CONV, 512)[:3000]
    small = replay(rows, ReplayConfig(block_size=512, capacity_blocks=500)).totals.hit_rate
    large = replay(rows, ReplayConfig(block_size=512, capacity_blocks=50000)).totals.hit_rate
    assert large > small


@pytest.mark.parametrize("content,needle", [
    ("not json\n", "line 1: not valid JSON"),
    ('{"tokens": [1, "x"]}\n', "line 1, field 'tokens': item 1 is 'x'"),
    ('{"tokens": [1, 2]}\n{"tokens": [1, -3]}\n', "line 2, field 'tokens': item 1 is -3"),
    ('{"tokens": []}\n', "field 'tokens': the prompt is empty"),
    ("", "holds no requests"),
    ('{"hash_ids": [1], "input_length": "9"}\n', "field 'input_length'"),
    ('{"tokens": [1], "tenant": 5}\n', "field 'tenant'"),
    ('[1, 2]\n', "expected a JSON object"),
    ('{"prompt": "hi"}\n', "needs 'tokens'"),
])
def test_bad_trace_is_one_line_and_status_2(capsys, tmp_path, content, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    code, out, err = cli(capsys, "replay", str(bad), "--no-model", "--capacity-blocks", "8", "--json")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and needle in err and str(bad) in err


def test_invalid_utf8_is_reported(capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"tokens": [1]}\n\xff\xfe\n')
    code, _, err = cli(capsys, "replay", str(bad), "--no-model", "--capacity-blocks", "8")
    assert code == 2 and "line 2: not valid UTF-8" in err


@pytest.mark.parametrize("argv,needle", [
    (["replay", "x.jsonl", "--no-model", "--bogus"], "unrecognized arguments"),
    (["replay", "missing.jsonl", "--no-model", "--capacity-blocks", "8"], "no such file"),
    (["replay", "{trace}", "--no-model", "--capacity-blocks", "0"], "must be at least 1"),
    (["replay", "{trace}", "--no-model", "--block-size", "abc", "--capacity-blocks", "8"], "not a whole number"),
    (["replay", "{trace}", "--no-model"], "give the pool size"),
    (["replay", "{trace}", "--no-model", "--hash", "md5", "--capacity-blocks", "8"], "invalid choice"),
])
def test_bad_arguments_exit_2(capsys, chat_trace, argv, needle):
    argv = [a.replace("{trace}", str(chat_trace)) for a in argv]
    with pytest.raises(SystemExit) as info:
        code = main(argv)
        raise SystemExit(code)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and err.strip().count("\n") == 0


def test_console_script_runs_in_a_subprocess(chat_trace):
    out = subprocess.run([sys.executable, "-m", "app", "replay", str(chat_trace), "--no-model",
                          "--capacity-blocks", "32", "--json", "--totals-only"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["totals"]["requests"] == 3
