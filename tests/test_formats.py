"""Importers: format detection, real data (Mooncake, MT-bench), and bad input that must
fail with one located sentence and leave nothing half-imported (hypothesis, >1,000 cases)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.errors import InputError, TraceError
from engine.core.trace import MOONCAKE_BLOCK_SIZE
from engine.store.formats import FORMATS, load_conversations
from engine.store.sessions import import_file
from engine.store.database import Store

DATA = Path(__file__).resolve().parents[1] / "resources" / "traces"
MOONCAKE = DATA / "mooncake_conversation_trace.jsonl"
MT_BENCH = DATA / "mt_bench_question.jsonl"


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(content.encode() if isinstance(content, str) else content)
    return p


# ---------------------------------------------------------------------------- real data
def test_mooncake_conversation_trace_is_one_block_level_trace():
    [conv] = load_conversations(MOONCAKE)
    assert conv.format == "mooncake" and conv.kind == "trace"
    assert len(conv.trace) == 12031
    first = json.loads(MOONCAKE.open().readline())
    assert conv.trace[0].hash_ids == tuple(first["hash_ids"])
    assert conv.trace[0].input_length == first["input_length"]
    assert conv.settings["block_size"] == MOONCAKE_BLOCK_SIZE
    # every request's hash ids cover its prompt in 512-token blocks (the data's own rule)
    assert all(len(r.hash_ids) == -(-r.input_length // 512) for r in conv.trace)


def test_mt_bench_questions_become_two_turn_chats():
    convs = load_conversations(MT_BENCH)
    assert len(convs) == 80
    assert all(c.format == "mt-bench" and [m.role for m in c.messages] == ["user", "user"] for c in convs)
    assert convs[0].title == "MT-bench 81 (writing)"
    assert convs[0].messages[1].content.startswith("Rewrite your previous response")


# ---------------------------------------------------------------------------- detection
def test_openai_object_list_jsonl_and_bare_message_list(tmp_path):
    conv = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                                      {"type": "image_url", "image_url": {"url": "x.png"}}]},
                         {"role": "assistant", "content": None,
                          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "42"}],
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    for name, text in (("a.json", json.dumps(conv)), ("b.json", json.dumps([conv, conv], indent=2)),
                       ("c.jsonl", json.dumps(conv) + "\n\n" + json.dumps(conv) + "\n"),
                       ("d.json", json.dumps(conv["messages"]))):
        convs = load_conversations(write(tmp_path, name, text))
        assert {c.format for c in convs} == {"openai"}
        m = convs[0].messages
        assert [x.role for x in m] == ["system", "user", "assistant", "tool"]
        assert m[1].content == "Look:\n[image]" and m[1].extra["parts"][1]["type"] == "image_url"
        assert m[2].content == "" and m[2].extra["tool_calls"][0]["id"] == "c1"
        assert m[3].extra == {"tool_call_id": "c1"}
    assert load_conversations(tmp_path / "a.json")[0].settings["tools"] == conv["tools"]
    starts = [i + 1 for i, text in enumerate((tmp_path / "b.json").read_text().split("\n")) if text == "  {"]
    assert [c.line for c in load_conversations(tmp_path / "b.json")] == starts and len(starts) == 2


def test_sharegpt_roles(tmp_path):
    doc = [{"id": "x1", "conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "hi"},
                                          {"from": "gpt", "value": "hello"}]}]
    [c] = load_conversations(write(tmp_path, "s.json", json.dumps(doc)))
    assert c.format == "sharegpt" and c.title == "x1"
    assert [(m.role, m.content) for m in c.messages] == [("system", "S"), ("user", "hi"), ("assistant", "hello")]


def test_anthropic_body_with_system_blocks_tools_and_tool_results(tmp_path):
    body = {"model": "claude-sonnet-4-5", "max_tokens": 100,
            "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "..."}},
                                                      {"type": "text", "text": "Weather in Paris?"}]},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "weather",
                                                            "input": {"city": "Paris"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                       "content": [{"type": "text", "text": "18C"}]}]}]}
    [c] = load_conversations(write(tmp_path, "a.json", json.dumps(body)))
    assert c.format == "anthropic"
    assert [m.role for m in c.messages] == ["system", "user", "assistant", "user"]
    assert c.messages[0].content == "You are terse."
    assert c.messages[0].extra["blocks"][0]["cache_control"] == {"type": "ephemeral"}
    assert c.messages[1].content == "[image]\nWeather in Paris?"
    assert c.messages[2].content == '[tool_use weather] {"city": "Paris"}'
    assert c.messages[3].content == "[tool_result] 18C"
    assert c.settings == {"tools": body["tools"], "source_model": "claude-sonnet-4-5"}
    # plain string system, plain string content
    [c] = load_conversations(write(tmp_path, "b.json", json.dumps({"system": "S", "messages": [
        {"role": "user", "content": "q"}]})))
    assert c.format == "anthropic" and c.messages[0].content == "S"


def test_token_level_jsonl(tmp_path):
    lines = [{"tokens": [1, 2, 3, 4], "output_tokens": [5, 6], "tenant": "a"}, {"tokens": [1, 2, 9]}]
    [c] = load_conversations(write(tmp_path, "t.jsonl", "\n".join(map(json.dumps, lines))))
    assert c.format == "tokens" and c.kind == "trace"
    assert [r.tokens for r in c.trace] == [(1, 2, 3, 4), (1, 2, 9)]
    assert c.trace[0].tenant == "a" and c.trace[0].output_tokens == (5, 6)


def test_forced_format_reports_the_missing_field(tmp_path):
    p = write(tmp_path, "o.json", json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    with pytest.raises(TraceError) as e:
        load_conversations(p, format="sharegpt")
    assert e.value.field == "conversations" and e.value.line == 1
    with pytest.raises(InputError, match="unknown format"):
        load_conversations(p, format="csv")


# ---------------------------------------------------------------------------- bad input
BAD = [
    ("json", '{"messages": [{"role": "user", "content": "hi"}]}\n', None, None),  # fine: control
    ("json", '{"messages": [\n  {"role": "user", "content": "hi"},\n  {"role": "user" "content": "x"}\n]}', 3, None),
    ("jsonl", '{"messages": [{"role": "user", "content": "a"}]}\n{"messages": [{"role": "user", "content": 7}]}\n',
     2, "messages[0].content"),
    ("json", '{"messages": [{"role": "wizard", "content": "a"}]}', 1, "messages[0].role"),
    ("json", '{"messages": []}', 1, "messages"),
    ("json", '{"messages": [{"role": "system", "content": "only a system prompt"}]}', 1, "messages"),
    ("json", '{"conversations": [{"from": "alien", "value": "a"}]}', 1, "conversations[0].from"),
    ("json", '{"system": "s", "messages": [{"role": "system", "content": "a"}]}', 1, "messages[0].role"),
    ("json", '{"system": "s", "messages": [{"role": "user", "content": [{"type": "video"}]}]}', 1,
     "messages[0].content[0].type"),
    ("jsonl", '{"tokens": [1, 2]}\n{"tokens": [1, -2]}\n', 2, "tokens"),
    ("jsonl", '{"hash_ids": [1], "input_length": 100}\n{"hash_ids": [1, 2]}\n', 2, "input_length"),
    ("jsonl", '{"tokens": [1, 2]}\n{"hash_ids": [1], "input_length": 3}\n', 2, "tokens"),
    ("jsonl", '{"tokens": [1, 4294967296]}\n', 1, "tokens"),
    ("json", '{"messages": [{"role": "user", "content": "a", "n": 1e999}]}', 1, None),
    ("json", "", None, None),
    ("json", "   \n\n", None, None),
    ("json", '[{"messages": [{"role": "user", "content": "a"}]}, 3]', 1, None),
]


@pytest.mark.parametrize("suffix,text,line,field", BAD)
def test_bad_input_names_file_line_and_field(tmp_path, suffix, text, line, field):
    p = write(tmp_path, f"bad.{suffix}", text)
    if text.startswith('{"messages": [{"role": "user", "content": "hi"}]}'):
        assert load_conversations(p)[0].messages[0].content == "hi"
        return
    with pytest.raises(TraceError) as e:
        load_conversations(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)
    assert e.value.line == line and e.value.field == field


def test_invalid_utf8_and_huge_lines(tmp_path):
    p = write(tmp_path, "u.jsonl", b'{"tokens": [1]}\n{"tokens": [2], "tenant": "\xff\xfe"}\n')
    with pytest.raises(TraceError, match="not valid UTF-8") as e:
        load_conversations(p)
    assert e.value.line == 2
    p = write(tmp_path, "h.jsonl", '{"tokens": [1]}\n{"tokens": [' + "1, " * 5000 + '1]}\n')
    with pytest.raises(TraceError, match="longer than 1000 bytes") as e:
        load_conversations(p, max_line_bytes=1000)
    assert e.value.line == 2
    with pytest.raises(TraceError, match="no such file"):
        load_conversations(tmp_path / "missing.json")
    with pytest.raises(TraceError, match="directory"):
        load_conversations(tmp_path)


# ---------------------------------------------------------------------------- hypothesis
VALID = {
    "openai": {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "yo"}]},
    "sharegpt": {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
    "anthropic": {"system": [{"type": "text", "text": "s"}], "tools": [{"name": "t", "input_schema": {}}],
                  "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                               {"role": "assistant", "content": [{"type": "tool_use", "id": "1", "name": "t",
                                                                  "input": {}}]},
                               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1",
                                                             "content": "ok"}]}]},
    "mt-bench": {"question_id": 1, "category": "x", "turns": ["a", "b"]},
    "tokens": {"tokens": [1, 2, 3], "output_tokens": [4], "tenant": "t"},
    "mooncake": {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
    "cachescope": {"format": "cachescope-session", "version": 1,
                   "session": {"title": "t", "kind": "chat", "model": None, "block_size": 16, "capacity_blocks": 64,
                               "seed": 0, "hash": "sha256", "created": "2026-01-01", "source_path": None,
                               "source_format": "openai", "settings": {}},
                   "messages": [{"position": 0, "version": 1, "role": "user", "content": "hi", "extra": None,
                                 "created": "2026-01-01"},
                                {"position": 0, "version": 2, "role": "user", "content": "hey", "extra": None,
                                 "created": "2026-01-02"}]},
    "weka": {"id": "trace_x", "models": ["m"], "block_size": 64, "hash_id_scope": "global",
             "requests": [{"t": 0.0, "type": "s", "model": "m", "in": 130, "out": 5, "hash_ids": [1, 2]},
                          {"t": 1.0, "type": "subagent", "agent_id": "agent_001",
                           "requests": [{"t": 0.0, "type": "n", "model": "m", "in": 64, "out": 1, "hash_ids": [1]}]}]},
}
assert set(VALID) == set(FORMATS)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8) | st.sampled_from(["user", "assistant", "system", "human", "gpt", "text", "tool_use"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


@st.composite
def malformed(draw, fmt):
    """A valid document of `fmt`, broken in one of the ways users break files."""
    doc = json.loads(json.dumps(VALID[fmt]))
    how = draw(st.sampled_from(["replace", "delete", "bytes", "truncate", "utf8", "append_line"]))
    if how in ("replace", "delete"):
        paths = [p for p in _paths(doc) if p]
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if how == "delete":
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
        return json.dumps(doc).encode()
    text = json.dumps(doc).encode()
    if how == "bytes":
        return draw(st.binary(max_size=60))
    if how == "truncate":
        return text[:draw(st.integers(0, len(text) - 1))]
    if how == "utf8":
        i = draw(st.integers(0, len(text)))
        return text[:i] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"])) + text[i:]
    return text + b"\n" + json.dumps(draw(json_values)).encode()


TABLES = ("sessions", "messages", "trace_requests", "runs", "requests", "events")


@pytest.fixture(scope="module")
def fuzz_store():
    store = Store(":memory:")
    yield store
    store.close()


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_malformed_inputs_never_traceback_nor_leave_partial_rows(fmt, data, fuzz_store, tmp_path_factory):
    content = data.draw(malformed(fmt))
    path = tmp_path_factory.getbasetemp() / f"fuzz-{fmt}.json"  # the suffix plays no part in detection
    path.write_bytes(content)
    before = {t: fuzz_store.count(t) for t in TABLES}
    for forced in (fmt, None):
        try:
            ids = import_file(fuzz_store, path, forced)
        except InputError as exc:  # TraceError included: one sentence, no traceback
            assert "\n" not in str(exc) and str(exc)
            assert {t: fuzz_store.count(t) for t in TABLES} == before
        else:
            assert fuzz_store.count("sessions") == before["sessions"] + len(ids) and ids
            before = {t: fuzz_store.count(t) for t in TABLES}


def test_a_failure_while_writing_rolls_back_the_whole_file(tmp_path, monkeypatch):
    docs = [VALID["openai"], VALID["openai"], VALID["openai"]]
    p = write(tmp_path, "three.jsonl", "\n".join(map(json.dumps, docs)))
    store = Store(tmp_path / "db.sqlite")
    calls = {"n": 0}
    real = store.add_message

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 7:  # the first message of the third conversation
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "add_message", failing)
    with pytest.raises(OSError):
        import_file(store, p)
    assert store.count("sessions") == 0 and store.count("messages") == 0
    monkeypatch.undo()
    assert len(import_file(store, p)) == 3 and store.count("messages") == 9
