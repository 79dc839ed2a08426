"""`cachescope usage`: logs with usage read in the providers' shapes, predicted beside
observed (exactly, for a vLLM log recorded from vLLM 0.33.0's own KVCacheManager), each
unexpected miss explained, and the hostile cases."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from engine.core.errors import TraceError
from engine.store.usage_logs import read_usage_log

DATA = Path(__file__).resolve().parent / "data" / "usage"
VLLM_LOG = DATA / "vllm_chat_usage.jsonl"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=300)


def usage_json(*args: str) -> dict:
    # In-process: a `python -m app usage` imports torch and transformers again for each of
    # these seven runs (4.5-6 s CPU apiece); the refusals below stay in a subprocess.
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["usage", *args, "--json"])
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


def test_vllm_log_is_vllms_own_response_shape():
    first = json.loads(VLLM_LOG.read_text().splitlines()[0])
    resp = first["response"]
    assert resp["object"] == "chat.completion" and "prompt_logprobs" in resp and "kv_transfer_params" in resp
    assert set(resp["usage"]["prompt_tokens_details"]) >= {"cached_tokens"}
    meta = json.loads((DATA / "vllm_chat_usage.meta.json").read_text())
    assert meta["vllm"] == "0.33.0" and meta["block_size"] == 16 and meta["num_gpu_blocks"] == 16
    entries = read_usage_log(VLLM_LOG)
    assert [e.api for e in entries] == ["vllm"] * 9
    assert [e.cached_tokens for e in entries] == [0, 32, 96, 32, 80, 96, 48, 32, 112]


def test_vllm_served_one_at_a_time_is_predicted_exactly():
    out = usage_json(str(VLLM_LOG), "--block-size", "16", "--num-gpu-blocks", "16")
    rows = out["requests"]
    assert len(rows) == 9 and out["notes"] == []  # the tokenizer agrees with the server's counts
    for r in rows:
        assert r["predicted"]["cached_tokens"] == r["observed"]["cached_tokens"], r["id"]
        assert r["difference"] == 0
    assert out["totals"]["matching_requests"] == 9 and out["totals"]["difference"] == 0
    causes = {r["id"]: r["cause"] for r in rows if r["cause"]}
    assert causes["chatcmpl-usage-05"]["cause"] == "evicted"
    assert causes["chatcmpl-usage-06"]["cause"] == "edited history"
    assert causes["chatcmpl-usage-07"]["cause"] == "changed setting"
    assert "chatcmpl-usage-08" not in causes and "chatcmpl-usage-01" not in causes


def test_a_bigger_pool_would_have_predicted_more():
    # the pool size matters: with an unbounded pool the eviction of request 05 disappears,
    # so the prediction no longer equals what the 15-block server did
    out = usage_json(str(VLLM_LOG), "--block-size", "16")
    r5 = next(r for r in out["requests"] if r["id"] == "chatcmpl-usage-05")
    assert r5["predicted"]["cached_tokens"] > r5["observed"]["cached_tokens"]
    assert r5["difference"] < 0


def test_openai_pairs_expired_ttl_and_model_switch():
    out = usage_json(str(DATA / "openai_chat_pairs.jsonl"))
    rows = out["requests"]
    assert [r["observed"]["cached_tokens"] for r in rows] == [0, 2816, 0, 0]
    assert [r["predicted"]["cached_tokens"] for r in rows] == [0, 2816, 0, 0]
    assert rows[2]["cause"]["cause"] == "expired TTL" and rows[3]["cause"]["cause"] == "model switch"
    assert rows[1]["cause"] is None
    assert any("stands in" in n for n in out["notes"])  # the stand-in tokenizer is named


def test_openai_batch_matched_by_custom_id_in_either_order():
    a = usage_json(str(DATA / "openai_batch_input.jsonl"), str(DATA / "openai_batch_output.jsonl"))
    b = usage_json(str(DATA / "openai_batch_output.jsonl"), str(DATA / "openai_batch_input.jsonl"))
    assert [r["id"] for r in a["requests"]] == ["request-1", "request-2", "request-3"] == [r["id"] for r in b["requests"]]
    assert [r["observed"]["cached_tokens"] for r in a["requests"]] == [0, 2816, 2816]
    assert all(r["difference"] == 0 for r in a["requests"])


def test_anthropic_batch_reordered_tools_edited_history_changed_setting():
    out = usage_json(str(DATA / "anthropic_batch_requests.jsonl"), str(DATA / "anthropic_batch_results.jsonl"))
    causes = {r["id"]: (r["cause"] or {}).get("cause") for r in out["requests"]}
    assert causes == {"turn-1": None, "turn-2": None, "turn-2-tools-reordered": "reordered tools",
                      "turn-3-edited": "edited history", "turn-3-tool-choice": "changed setting"}
    turn2 = next(r for r in out["requests"] if r["id"] == "turn-2")
    assert turn2["observed"]["written_tokens"] == 47 - 4 and turn2["observed"]["cached_tokens"] == 2953
    assert out["failed"] == [{"id": "turn-4-errored", "error": "errored: max_tokens: Field required"}]


def test_one_batch_file_alone_says_what_is_missing(tmp_path):
    p = cli("usage", str(DATA / "openai_batch_input.jsonl"))
    assert p.returncode == 2 and "give its output file too" in p.stderr


@pytest.mark.parametrize("line,fld", [
    ({"request": {"model": "m", "messages": []}, "response": {"usage": {"prompt_tokens": 1}}}, "request.messages"),
    ({"request": {"messages": [{"role": "user", "content": "hi"}]}, "response": {}}, "response.usage"),
    ({"request": {"messages": [{"role": "user", "content": "hi"}]}, "response": {"usage": {"prompt_tokens": -1}}},
     "response.usage.prompt_tokens"),
    ({"request": {"messages": [{"role": "user", "content": "hi"}]},
      "response": {"usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 9}}}},
     "response.usage.prompt_tokens_details.cached_tokens"),
    ({"request": {"messages": [{"role": 5, "content": "hi"}]}, "response": {"usage": {"prompt_tokens": 3}}},
     "request.messages[0].role"),
    ({"request": {"messages": [{"role": "user", "content": [{"type": "weird"}]}]},
      "response": {"usage": {"prompt_tokens": 3}}}, "request.messages[0].content[0].type"),
    ({"request": {"messages": [{"role": "user", "content": "hi"}]},
      "response": {"type": "message", "usage": {"input_tokens": "3"}}}, "response.usage.input_tokens"),
    ({"response": {}}, "request"),
])
def test_each_malformed_field_is_named(tmp_path, line, fld):
    p = tmp_path / "bad.jsonl"
    good = {"request": {"messages": [{"role": "user", "content": "hi"}]}, "response": {"usage": {"prompt_tokens": 3}}}
    p.write_text(json.dumps(good) + "\n" + json.dumps(line) + "\n")  # the second line is the broken one
    with pytest.raises(TraceError) as e:
        read_usage_log(p)
    assert e.value.field == fld and e.value.line == 2 and "\n" not in str(e.value)


def test_batch_mismatches_are_named(tmp_path):
    inp = tmp_path / "in.jsonl"
    out = tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}}) + "\n")
    out.write_text(json.dumps({"id": "x", "custom_id": "b", "response": {"status_code": 200, "body": {}},
                               "error": None}) + "\n")
    with pytest.raises(TraceError, match="'a' has no result"):
        read_usage_log(inp, out)


@pytest.mark.parametrize("content", [b"", b"\xff\xfe", b"{", b"[" * 100000, b'{"request": 1, "response": 2}\n'])
def test_hostile_logs_get_one_sentence_and_exit_2(tmp_path, content):
    p = tmp_path / "hostile.jsonl"
    p.write_bytes(content)
    r = cli("usage", str(p))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_huge_log_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import engine.store.usage_logs as logs

    monkeypatch.setattr(logs, "MAX_FILE_BYTES", 100)
    with pytest.raises(TraceError, match="at most 100"):
        logs.read_usage_log(VLLM_LOG)
