"""Conversation replay on a model: each user turn is a request; reuse comes from the engine."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.store.formats import load_conversations
from engine.analysis.model_replay import ModelReplayConfig, replay_conversations
from engine.model.runner import ModelRunner

CHAT = {"messages": [
    {"role": "system", "content": "You are terse. Answer in a few words."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4, of course."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6."},
    {"role": "user", "content": "Thanks."},
]}


@pytest.fixture()
def chat_file(tmp_path):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(CHAT))
    return path


@pytest.mark.model
def test_cli_replay_verify_on_default_model(chat_file, capsys):
    code = main(["replay", str(chat_file), "--max-new-tokens", "3", "--verify", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    rows = out["requests"]
    assert [r["id"] for r in rows] == ["0:0", "0:1", "0:2"]
    for r in rows:
        assert r["outputs_identical"] is True and r["max_logit_diff"] <= 1e-4
        assert r["computed_tokens"] == r["prompt_tokens"] - r["cached_tokens"]
        assert r["ttft_ms"] > 0 and r["prefill_ms"] > 0 and r["decode_ms"] >= 0 and r["output_text"]
    assert rows[1]["cached_tokens"] >= 16 and rows[2]["cached_tokens"] >= rows[1]["cached_tokens"]
    assert out["totals"]["outputs_identical"] is True
    assert out["totals"]["cached_tokens"] == sum(r["cached_tokens"] for r in rows)
    assert out["config"]["model"] == "SmolLM2-135M-Instruct" and out["config"]["capacity_blocks"] == 4096


def test_generated_replies_replace_recorded_ones_unless_teacher_forced(tiny_model, chat_file):
    convs = load_conversations(chat_file)
    free = replay_conversations(convs, tiny_model, ModelReplayConfig(block_size=4, max_new_tokens=3))
    forced = replay_conversations(convs, tiny_model, ModelReplayConfig(block_size=4, max_new_tokens=3,
                                                                       teacher_forced=True))
    runner = ModelRunner(tiny_model, num_blocks=8, block_size=4)
    recorded = CHAT["messages"][:4]
    assert forced["requests"][1]["prompt_tokens"] == len(runner.render_chat(recorded))
    generated = CHAT["messages"][:2] + [{"role": "assistant", "content": free["requests"][0]["output_text"]},
                                        CHAT["messages"][3]]
    assert free["requests"][1]["prompt_tokens"] == len(runner.render_chat(generated))
    # the second turn reuses the first turn's blocks in both modes
    assert forced["requests"][1]["cached_tokens"] > 0 and free["requests"][1]["cached_tokens"] > 0


def test_several_conversations_share_the_system_prompt(tiny_model, tmp_path):
    system = {"role": "system", "content": "You answer questions about the solar system, briefly and exactly."}
    path = tmp_path / "many.json"
    path.write_text(json.dumps([{"messages": [system, {"role": "user", "content": q}]}
                                for q in ("How far is Mars?", "How big is Jupiter?")]))
    out = replay_conversations(load_conversations(path), tiny_model, ModelReplayConfig(max_new_tokens=2))
    first, second = out["requests"]
    assert first["cached_tokens"] == 0 and second["cached_tokens"] >= 16
    assert second["miss_reason"] in ("new_content", "partial_block")


def test_too_small_a_pool_refuses_turns(tiny_model, chat_file):
    out = replay_conversations(load_conversations(chat_file), tiny_model,
                               ModelReplayConfig(block_size=16, capacity_blocks=2, max_new_tokens=2))
    assert out["totals"]["refused_requests"] == 3
    assert all(r["refused"] and "refused" in r["error"] for r in out["requests"])


def test_bad_conversation_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}))
    assert main(["replay", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "role" in err
