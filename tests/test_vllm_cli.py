"""`cachescope attach` and `cachescope hash` on the command line: a real process against the
recorded vLLM frames on loopback, the probe, --record, and the refusals (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.cli import main
from test_vllm_attach import FixtureServer  # the recorded-frame server (tests/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
HASHES = [json.loads(line) for line in (ROOT / "tests" / "data" / "vllm" / "vllm_block_hashes.jsonl").read_text()
          .splitlines()]


def test_attach_prints_events_probe_answers_and_records(tmp_path):
    prompt = tmp_path / "prompt.jsonl"
    prompt.write_text(json.dumps({"tokens": list(range(1, 41)), "output_length": 1}) + "\n")
    db = tmp_path / "capture.db"
    server = FixtureServer()
    proc = subprocess.Popen([sys.executable, "-m", "app", "attach", server.endpoint, "--replay", server.replay_endpoint,
                             "--topic", "kv-events", "--probe", str(prompt), "--record", "--db", str(db),
                             "--max-batches", "5", "--seconds", "120", "--json"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        server.wait_joined(timeout=90)
        for frames in server.pub_frames:  # seq 1..4; seq 0 only the replay socket has
            server.send(frames)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    events = [x["event"] for x in lines if "event" in x]
    assert [e["kind"] for e in events] == ["block_stored"] * 4 + ["block_evicted", "block_stored", "cache_reset"]
    assert {e["remote"]["medium"] for e in events if "remote" in e} == {"GPU", "CPU"}
    assert any(e.get("salt") == "tenant-a" for e in events)
    assert all(len(e["block_hash"]) == 16 for e in events if "block_hash" in e)
    probes = [x["probe"] for x in lines if "probe" in x]
    cached = [p["cached_tokens"] for p in probes]
    assert cached[0] in (0, 16) and cached[-2:] == [32, 0]
    assert probes[-1]["reason"].startswith("stored, then removed at event")
    assert all(set(p) == {"prompt_tokens", "cached_tokens", "first_missing_block", "reason"} for p in probes)
    result = lines[-1]
    summary = result["summary"][0]
    assert (summary["batches"], summary["missed_batches"], summary["malformed"], summary["cached"]) == (5, 0, 0, 0)
    assert summary["refilled"] >= 1
    from engine.store.database import Store

    from engine.analysis.remote_capture import recorded_events

    with Store(db) as store:
        run = store.runs(result["recorded"]["session"])[0]
        # the capture keeps the frames as sent: the reference pools make the events above of them
        assert run.kind == "attach" and store.num_frames(run.id) == result["recorded"]["frames"] == 5
        stored = recorded_events(store, run.id)
        assert [e.to_dict() | {"time": 0} for e in stored] == [e | {"time": 0} for e in events]
        assert (run.totals["stored_blocks"], run.totals["evicted_blocks"]) == (5, 1)
        assert store.get_session(result["recorded"]["session"]).hash == "vllm-sha256"
        cpu = next(e for e in stored if e.kind == "block_stored" and e.remote.medium == "CPU")
        assert cpu.remote.locality == "LOCAL" and cpu.token_ids == tuple(range(17, 33))


def test_an_endless_replay_socket_does_not_stretch_seconds():
    server = FixtureServer(endless_replay=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "app", "attach", server.endpoint, "--replay",
                               server.replay_endpoint, "--seconds", "1", "--refill-timeout", "1", "--json"],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])["summary"][0]
    assert summary["batches"] == 1  # batch 0, once, however often it came back
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("argv, message", [
    (["attach", "tcp://127.0.0.1:999999", "--seconds", "1"], "65535"),
    (["attach", "tcp://127.0.0.1:5557", "--seconds", "nan"], "finite"),
    (["attach", "tcp://127.0.0.1:5557", "--seconds", "inf"], "finite"),
    (["attach", "localhost:5557", "--seconds", "0"], "not a ZMQ endpoint"),
    (["attach", "tcp://*:5557", "--seconds", "0"], "wildcard"),
    (["attach", "tcp://127.0.0.1:5557", "--salt", "x", "--seconds", "0"], "--probe"),
    (["hash", "--text", "x", "--block-size", "0"], "at least 1"),
    (["hash", "--tokens", "missing.json", "--block-size", "16"], "no such file"),
    (["hash", "--tokens", "{bad}", "--block-size", "16", "--hash-seed", "1", "--hash", "sha256"], "vllm"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses before the command runs
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("row", HASHES, ids=[f"{r['algo']}-{r['case']}" for r in HASHES])
def test_hash_tokens_match_vllm(row, tmp_path, capsys):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(row["tokens"]))
    argv = ["hash", "--tokens", str(path), "--block-size", str(row["block_size"]), "--json",
            "--hash", {"sha256": "vllm-sha256", "sha256_cbor": "vllm-sha256-cbor"}[row["algo"]]]
    if row["cache_salt"]:
        argv += ["--salt", row["cache_salt"]]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["block_size"] == row["block_size"]
    assert [b["hash"] for b in out["blocks"]] == row["block_hashes"]
    assert [b["event_hash"] for b in out["blocks"]] == row["event_int_hashes"]
    assert [b["index"] for b in out["blocks"]] == list(range(len(row["block_hashes"])))
    assert out["blocks"][0]["tokens"] == row["tokens"][:row["block_size"]]


def test_hash_messages_through_the_chat_template(tmp_path, capsys, default_tokenizer):
    from engine.model.chat import render_chat

    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three primes."}]
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"messages": messages}))
    assert main(["hash", "--messages", str(path), "--block-size", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    tokens = render_chat(default_tokenizer, messages)
    assert [t for b in out["blocks"] for t in b["tokens"]] == tokens[:len(tokens) // 8 * 8]
    assert main(["hash", "--text", "Name three primes.", "--block-size", "8", "--json"]) == 0
    text = json.loads(capsys.readouterr().out)
    assert text["hash"] == "vllm-sha256" and text["blocks"][0]["hash"] != out["blocks"][0]["hash"]
