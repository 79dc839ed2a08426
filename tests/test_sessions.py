"""Sessions on real data: Mooncake and MT-bench imports, replays that repeat exactly,
edit-to-invalidate on a real multi-turn chat (default tokenizer), exact session-file
round trips, and the `cachescope sessions` command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from engine.core.events import EventBus
from engine.model.loader import load_tokenizer
from engine.core.replay import ReplayConfig, replay
from engine.model.chat import render_turns
from engine.store.edit import edit_and_rerun
from engine.store.sessions import (export_session, import_file, replay_session,
                             session_file)
from engine.store.database import Store
from engine.core.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "resources" / "sessions").glob("*.cachescope.json"))
REASONING = ROOT / "resources" / "sessions" / "mt_bench_101_reasoning.cachescope.json"
DATA = Path(__file__).resolve().parents[1] / "resources" / "traces"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture()
def store(tmp_path):
    s = Store(tmp_path / "sessions.db")
    yield s
    s.close()


def without_time(dicts):
    return [{k: v for k, v in d.items() if k != "time"} for d in dicts]


# ---------------------------------------------------------------------------- traces
def test_trace_session_replays_exactly_like_the_engine_replay(store, tmp_path):
    part = tmp_path / "mooncake_300.jsonl"
    with (DATA / "mooncake_conversation_trace.jsonl").open() as src:
        part.write_text("".join(next(src) for _ in range(300)))
    [sid] = import_file(store, part, capacity_blocks=500)
    info = store.get_session(sid)
    assert (info.kind, info.block_size, info.source_format) == ("trace", 512, "mooncake")
    result = replay_session(store, sid).to_dict()
    expected = replay(load_trace(part, 512), ReplayConfig(block_size=512, capacity_blocks=500, seed=0)).to_dict()
    assert result["totals"] == expected["totals"] and result["totals"]["cached_tokens"] > 0
    assert result["requests"] == expected["requests"]
    run_id = result["config"]["run_id"]
    assert [r.cached_tokens for r in store.requests(run_id)] == [r["cached_tokens"] for r in expected["requests"]]
    # a second replay from the store repeats the stored event stream exactly
    bus, seen = EventBus(), []
    bus.subscribe(seen.append)
    replay_session(store, sid, persist=False, events=bus)
    assert without_time(store.event_dicts(run_id)) == without_time(e.to_dict() for e in seen)
    assert store.runs(sid)[0].status == "done"


def test_mt_bench_import_and_replay_with_the_chat_template(store, tokenizer):
    ids = import_file(store, DATA / "mt_bench_question.jsonl")
    assert len(ids) == 80 and store.get_session(ids[0]).title == "MT-bench 81 (writing)"
    result = replay_session(store, ids[0], tokenizer=tokenizer).to_dict()
    first, second = result["requests"]
    chat = [{"role": m.role, "content": m.content} for m in store.messages(ids[0])]
    rendered = tokenizer.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True)
    assert first["prompt_tokens"] == len(tokenizer.encode(rendered, add_special_tokens=False))
    # the second question repeats the first one's rendered prefix: its full blocks hit
    assert second["cached_tokens"] == (first["prompt_tokens"] // 16) * 16 > 0


# ---------------------------------------------------------------------------- chats
def test_chat_turns_keep_the_recorded_replies(store, tokenizer):
    [sid] = import_file(store, REASONING)
    messages = store.messages(sid)
    assert [m.role for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    t0, t1 = render_turns(messages, tokenizer)
    assert (t0.message_position, t0.reply_end, t1.message_position, t1.reply_end) == (1, 2, 3, 4)
    assert tokenizer.decode(t0.output_token_ids).startswith(messages[2].content)
    assert t0.output_token_ids[-1] == tokenizer.eos_token_id
    # the next prompt continues the previous prompt and reply token for token
    assert t1.prompt_token_ids[:len(t0.prompt_token_ids) + len(t0.output_token_ids)] == \
        t0.prompt_token_ids + t0.output_token_ids
    rows = replay_session(store, sid, tokenizer=tokenizer).to_dict()["requests"]
    kv_tokens = len(t0.prompt_token_ids) + len(t0.output_token_ids) - 1  # the last sampled token has no KV
    assert rows[1]["cached_tokens"] == kv_tokens // 16 * 16


def test_replays_of_a_chat_repeat_hashes_and_events_exactly(store, tokenizer):
    [sid] = import_file(store, REASONING)
    a = replay_session(store, sid, tokenizer=tokenizer).to_dict()
    b = replay_session(store, sid, tokenizer=tokenizer).to_dict()
    ea, eb = (store.event_dicts(r["config"]["run_id"]) for r in (a, b))
    assert ea and without_time(ea) == without_time(eb)
    hashes = [e["block_hash"] for e in ea if e["kind"] == "block_stored"]
    assert len(hashes) > 5
    [other] = import_file(store, REASONING, seed=1)
    c = replay_session(store, other, tokenizer=tokenizer).to_dict()
    other_hashes = [e["block_hash"] for e in store.event_dicts(c["config"]["run_id"]) if e["kind"] == "block_stored"]
    assert len(other_hashes) == len(hashes) and not set(other_hashes) & set(hashes)


def test_editing_a_user_message_invalidates_every_block_from_it(store, tokenizer):
    [sid] = import_file(store, REASONING)
    original = replay_session(store, sid, tokenizer=tokenizer).to_dict()
    stored_before = {e["block_hash"] for e in store.event_dicts(original["config"]["run_id"])
                     if e["kind"] == "block_stored"}
    new_text = 'If the "second person" is changed to "third person" in the above question, what would the answer be?'
    result = edit_and_rerun(store, sid, 3, new_text, tokenizer=tokenizer).to_dict()
    first = result["requests"][0]
    turn = render_turns(store.messages(sid), tokenizer)[1]
    assert first["index"] == 1 and first["message_position"] == 3
    assert first["miss_reason"] == "new_content" and first["miss_message"] == 3
    start, end = turn.message_starts[3], turn.message_starts[4]
    assert start <= first["divergence_token"] < end  # the divergence is inside the edited message
    k = first["first_miss_block"]
    assert k == first["divergence_token"] // 16 == result["invalidated_from_block"]
    assert first["cached_tokens"] == k * 16
    # every block before the edit is reused, none from it onward was ever stored
    lookup = next(e for e in store.event_dicts(result["run_id"]) if e["kind"] == "lookup")
    assert set(lookup["block_hashes"][:k]) <= stored_before
    assert not set(lookup["block_hashes"][k:]) & stored_before and len(lookup["block_hashes"]) > k
    assert result["cached_tokens_after"] < result["cached_tokens_before"]
    assert result["edit_cost_tokens"] == result["computed_tokens_after"] - result["computed_tokens_before"] > 0
    history = store.messages(sid, include_history=True)
    assert [(m.position, m.version) for m in history if m.position == 3] == [(3, 1), (3, 2)]
    assert store.messages(sid)[3].content == new_text
    edit_run = store.runs(sid)[-1]
    assert edit_run.kind == "edit" and [r.miss_reason for r in store.requests(edit_run.id)][0] == "new_content"


def test_editing_the_system_message_invalidates_from_block_zero(store, tokenizer):
    [sid] = import_file(store, REASONING)
    result = edit_and_rerun(store, sid, 0, "You are a pirate. Answer in pirate speak.", tokenizer=tokenizer).to_dict()
    assert result["invalidated_from_block"] == 0
    assert [r["index"] for r in result["requests"]] == [0, 1]
    assert result["requests"][0]["cached_tokens"] == 0 and result["requests"][0]["miss_message"] == 0
    with pytest.raises(Exception, match="no message 9"):
        edit_and_rerun(store, sid, 9, "x", tokenizer=tokenizer)


def test_session_files_round_trip_exactly(store, tmp_path, tokenizer):
    ids = [import_file(store, p)[0] for p in SAMPLES]
    assert len(ids) == 3
    store.edit_message(ids[0], 1, "Write a short travel blog post about Kyoto.")
    for sid in ids:
        doc = session_file(store, sid)
        path = tmp_path / f"{sid}.cachescope.json"
        export_session(store, sid, path)
        [again] = import_file(store, path)
        assert session_file(store, again) == doc
    assert len(session_file(store, ids[0])["messages"]) == 6  # five positions, one edited twice over
    # OpenAI export carries the current messages only
    path = tmp_path / "openai.json"
    export_session(store, ids[0], path, "openai")
    [plain] = import_file(store, path)
    assert [(m.role, m.content) for m in store.messages(plain)] == [(m.role, m.content) for m in store.messages(ids[0])]


def test_trace_session_file_round_trips(store, tmp_path):
    lines = [{"tokens": [1, 2, 3, 4, 5], "output_tokens": [6], "tenant": "a"}, {"tokens": [1, 2, 3, 9]}]
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    [sid] = import_file(store, src, block_size=2, capacity_blocks=16, seed=7)
    export_session(store, sid, tmp_path / "t.cachescope.json")
    [again] = import_file(store, tmp_path / "t.cachescope.json")
    assert session_file(store, again) == session_file(store, sid)
    assert replay_session(store, again).to_dict()["totals"] == replay_session(store, sid).to_dict()["totals"]


# ---------------------------------------------------------------------------- command line
def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_sessions_command_line(tmp_path, capsys):
    db = str(tmp_path / "cli.db")
    code, out, _ = cli(capsys, "sessions", "import", str(REASONING), "--db", db, "--json")
    assert code == 0 and json.loads(out) == {"session_ids": [1]}
    code, out, _ = cli(capsys, "sessions", "list", "--db", db, "--json")
    assert [s["title"] for s in json.loads(out)["sessions"]] == ["MT-bench 101 (reasoning)"]
    code, out, _ = cli(capsys, "sessions", "replay", "1", "--db", db, "--json")
    result = json.loads(out)
    assert code == 0 and set(result) == {"config", "totals", "requests"} and result["totals"]["requests"] == 2
    code, out, _ = cli(capsys, "sessions", "edit", "1", "--message", "1", "--content",
                       "Imagine a race. You overtake the last person. What is your position?", "--db", db, "--json")
    edit = json.loads(out)
    assert code == 0 and {"invalidated_from_block", "cached_tokens_before", "cached_tokens_after",
                          "requests"} <= set(edit)
    assert edit["requests"][0]["miss_reason"] == "new_content"
    code, out, _ = cli(capsys, "sessions", "show", "1", "--history", "--db", db, "--json")
    shown = json.loads(out)
    assert [m["version"] for m in shown["messages"] if m["position"] == 1] == [1, 2]
    assert [r["kind"] for r in shown["runs"]] == ["replay", "edit"]
    exported = tmp_path / "out.cachescope.json"
    assert cli(capsys, "sessions", "export", "1", "--db", db, "-o", str(exported))[0] == 0
    code, out, _ = cli(capsys, "sessions", "import", str(exported), "--db", db, "--json")
    assert json.loads(out) == {"session_ids": [2]}
    assert cli(capsys, "sessions", "delete", "1", "--db", db, "--json")[1].strip() == '{"deleted":1}'
    # bad input: exit 2, one line on stderr, nothing imported
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "ok"}]}\n{"messages": [{"role": "robot"}]}\n')
    code, out, err = cli(capsys, "sessions", "import", str(bad), "--db", db)
    assert code == 2 and err.count("\n") == 1 and "line 2" in err and "messages[0].role" in err
    code, out, err = cli(capsys, "sessions", "show", "7", "--db", db)
    assert code == 2 and "no session 7" in err
    code, out, _ = cli(capsys, "sessions", "list", "--db", db, "--json")
    assert [s["id"] for s in json.loads(out)["sessions"]] == [2]


@pytest.mark.model
@pytest.mark.slow
def test_edit_with_generate_runs_the_real_model_and_stores_new_replies(store, tokenizer):
    [sid] = import_file(store, REASONING)
    new_text = 'If the "second person" is changed to "first person", what would the answer be?'
    result = edit_and_rerun(store, sid, 3, new_text, tokenizer=tokenizer, generate=True, max_new_tokens=6).to_dict()
    [row] = result["requests"]
    assert row["miss_reason"] == "new_content" and row["miss_message"] == 3
    assert row["cached_tokens"] == row["first_miss_block"] * 16 == result["invalidated_from_block"] * 16
    assert 0 < row["output_tokens"] <= 6 and row["prefill_ms"] > 0
    reply = store.messages(sid)[4]
    assert reply.version == 2 and reply.content == row["output_text"].strip()
    assert store.requests(result["run_id"])[0].output_text == row["output_text"]
