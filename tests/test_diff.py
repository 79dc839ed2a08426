"""Token diff on the real SmolLM2 tokenizer: one test per cause class, and the command."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.analysis.diff import DiffRequest, default_system_prompt, diff_requests, request_from_messages

DOCS = "You are a support agent for Acme. Answer from the documents below.\n\n"


def msgs(system: str | None, user: str = "Where is my order?") -> list[dict[str, str]]:
    out = [] if system is None else [{"role": "system", "content": system}]
    return out + [{"role": "user", "content": user}]


def diff(tok, a, b, **kw):
    return diff_requests(tok, request_from_messages(tok, a), request_from_messages(tok, b), **kw)


def test_template_default_system_prompt_is_found(default_tokenizer):
    assert default_system_prompt(default_tokenizer) == \
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_identical_requests(default_tokenizer):
    r = diff(default_tokenizer, msgs(DOCS), msgs(DOCS))
    assert r.first_divergent_token is None and r.cause == "identical"
    n = len(request_from_messages(default_tokenizer, msgs(DOCS)).token_ids)
    assert r.matching_blocks == n // 16
    assert r.to_dict()["a"]["tokens"] == r.to_dict()["b"]["tokens"]


def test_default_system_prompt(default_tokenizer):
    # Turn one had no system message, so the template rendered its default; turn two has one.
    r = diff(default_tokenizer, msgs(None), msgs("You are concise."))
    assert r.cause == "default_system_prompt"
    assert r.first_divergent_token < 16 and r.matching_blocks == 0
    assert "SmolLM" in r.a["text"] and "concise" in r.b["text"]


def test_trailing_newline_is_whitespace(default_tokenizer):
    r = diff(default_tokenizer, msgs(DOCS + "Be brief."), msgs(DOCS + "Be brief.\n"))
    assert r.cause == "whitespace"
    a_ids = request_from_messages(default_tokenizer, msgs(DOCS + "Be brief.")).token_ids
    b_ids = request_from_messages(default_tokenizer, msgs(DOCS + "Be brief.\n")).token_ids
    d = r.first_divergent_token
    assert a_ids[:d] == b_ids[:d] and a_ids[d] != b_ids[d]
    assert r.matching_blocks == d // 16
    assert r.b["divergent"]["text"] == "\n"


def test_double_space_is_whitespace(default_tokenizer):
    r = diff(default_tokenizer, msgs(DOCS + "Be  brief. Use lists."), msgs(DOCS + "Be brief. Use lists."))
    assert r.cause == "whitespace"


def test_timestamp_at_front(default_tokenizer):
    a = msgs("Current time: 2025-05-17 10:31:07. " + DOCS)
    b = msgs("Current time: 2025-05-17 10:32:44. " + DOCS)
    r = diff(default_tokenizer, a, b)
    assert r.cause == "timestamp_or_id"
    assert r.matching_blocks <= 1  # the timestamp sits in the first blocks: almost nothing is reused


def test_uuid(default_tokenizer):
    r = diff(default_tokenizer, msgs("session 3f2a9c1e-7b4d-4c2a-9e1f-0a1b2c3d4e5f\n" + DOCS),
             msgs("session 8d1b2e3f-1a2b-4c3d-8e9f-112233445566\n" + DOCS))
    assert r.cause == "timestamp_or_id"


def test_reordered_rag_chunks(default_tokenizer):
    chunks = ["Doc A: refunds take 5 days.", "Doc B: shipping is free over $50.", "Doc C: returns within 30 days."]
    a = msgs(DOCS + "\n\n".join(chunks))
    b = msgs(DOCS + "\n\n".join([chunks[1], chunks[0], chunks[2]]))
    r = diff(default_tokenizer, a, b)
    assert r.cause == "reordered"
    assert r.first_divergent_token > 16 and r.matching_blocks >= 1


def test_new_content(default_tokenizer):
    r = diff(default_tokenizer, msgs(DOCS + "Refunds take 5 days."), msgs(DOCS + "Refunds take 7 days."))
    assert r.cause == "new_content"
    assert r.a["divergent"]["text"].strip() == "5" and r.b["divergent"]["text"].strip() == "7"


def test_next_turn_only_adds_content(default_tokenizer):
    first = msgs(DOCS)
    second = first + [{"role": "assistant", "content": "Let me check."}, {"role": "user", "content": "Thanks"}]
    r = diff(default_tokenizer, first, second)
    n = len(request_from_messages(default_tokenizer, first).token_ids)
    assert r.cause == "new_content" and r.first_divergent_token == n
    assert r.a["divergent"] is None


def test_bos_and_special_tokens(default_tokenizer):
    tok = default_tokenizer
    ids = request_from_messages(tok, msgs(DOCS)).token_ids
    bos = tok.convert_tokens_to_ids("<|im_start|>")
    r = diff_requests(tok, DiffRequest(ids), DiffRequest((bos,) + ids))  # a doubled BOS
    assert r.cause == "bos_or_special_token" and r.first_divergent_token == 1
    end = tok.convert_tokens_to_ids("<|endoftext|>")
    r = diff_requests(tok, DiffRequest(ids), DiffRequest(ids[:20] + (end,) + ids[20:]))
    assert r.cause == "bos_or_special_token" and r.first_divergent_token == 20


def test_tenant_salt(default_tokenizer):
    ids = request_from_messages(default_tokenizer, msgs(DOCS)).token_ids
    r = diff_requests(default_tokenizer, DiffRequest(ids, "acme"), DiffRequest(ids, "globex"))
    assert r.cause == "tenant_salt"
    assert r.first_divergent_token is None and r.matching_blocks == 0


def test_diff_command_json(default_tokenizer, tmp_path, capsys):
    a, b = tmp_path / "a.txt", tmp_path / "b.json"
    a.write_text("Summarise the meeting notes below.\n")
    b.write_text(json.dumps({"messages": [{"role": "user", "content": "Summarise the meeting notes below."}]}))
    assert main(["diff", str(a), str(b), "--json", "--block-size", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"first_divergent_token", "matching_blocks", "cause", "a", "b"}
    assert set(out["a"]) >= {"tokens", "text"}
    assert out["cause"] == "whitespace"
    assert out["matching_blocks"] == out["first_divergent_token"] // 8
    assert main(["diff", str(a), str(tmp_path / "none.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err


def test_diff_command_tenant(tmp_path, capsys):
    a = tmp_path / "a.txt"
    a.write_text("Hello there")
    assert main(["diff", str(a), str(a), "--salt-a", "t1", "--salt-b", "t2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cause"] == "tenant_salt" and out["first_divergent_token"] is None


@pytest.mark.parametrize("bad", ["0", "x"])
def test_bad_block_size(tmp_path, bad):
    a = tmp_path / "a.txt"
    a.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["diff", str(a), str(a), "--block-size", bad])
    assert exc.value.code == 2


def test_diff_stored_requests(default_tokenizer, tmp_path, capsys):
    from engine.store.database import Store

    ids = request_from_messages(default_tokenizer, msgs(DOCS)).token_ids
    db = tmp_path / "s.db"
    with Store(db) as store:
        sid = store.create_session("diff")
        run = store.create_run(sid)
        store.record_request(run, 0, request_id="r0", prompt_token_ids=ids, tenant="acme")
        store.record_request(run, 1, request_id="r1", prompt_token_ids=ids[:30] + (2,) + ids[30:], tenant="acme")
    assert main(["diff", f"session:{sid}:r0", f"session:{sid}:1", "--db", str(db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["first_divergent_token"] == 30 and out["cause"] == "bos_or_special_token"
    assert main(["diff", f"session:{sid}:r9", f"session:{sid}:r0", "--db", str(db)]) == 2


# ---------------------------------------------------------------- reordered units (issue 23, tool order)
def _tool_order_prompts(tok, swap=True, edit=None):
    """Turn 1 and turn 2 of the tool-order demo, rendered as the demo renders them."""
    from engine.demos.prompts import _spec, _turn_prompt

    spec = _spec("tool_order")
    tools = spec["tools"]
    later = [tools[1], tools[0], *tools[2:]] if swap else [dict(t) for t in tools]
    if edit is not None:
        later = edit(json.loads(json.dumps(later)))
    first = [{"role": "system", "content": spec["system"]}, {"role": "user", "content": spec["turns"][0]}]
    second = first + [{"role": "assistant", "content": "The weather in May is mild."},
                      {"role": "user", "content": spec["turns"][1]}]
    return _turn_prompt(tok, first, tools), _turn_prompt(tok, second, later)


def test_reordered_tools_of_the_demo(default_tokenizer):
    tok = default_tokenizer
    p1, p2 = _tool_order_prompts(tok)
    r = diff_requests(tok, DiffRequest(tuple(p1)), DiffRequest(tuple(p2)), 16)
    assert r.cause == "reordered"
    assert r.moved == ("get_weather", "search_flights")
    assert "get_weather, search_flights in A" in r.explanation and "search_flights, get_weather in B" in r.explanation
    # The first divergent token is still the first token where the ids differ.
    d = next(i for i, (x, y) in enumerate(zip(p1, p2)) if x != y)
    assert r.first_divergent_token == d and r.matching_blocks == d // 16
    assert r.to_dict()["moved"] == ("get_weather", "search_flights")


def test_edited_or_added_tool_is_not_a_reorder(default_tokenizer):
    tok = default_tokenizer

    def edit_description(tools):
        tools[0]["function"]["description"] = "Current weather only."
        return tools

    def add_tool(tools):
        return [{"type": "function", "function": {"name": "book_hotel", "description": "Book a hotel room.",
                                                  "parameters": {"type": "object", "properties": {}}}}] + tools

    for edit in (edit_description, add_tool):
        p1, p2 = _tool_order_prompts(tok, swap=False, edit=edit)
        r = diff_requests(tok, DiffRequest(tuple(p1)), DiffRequest(tuple(p2)))
        assert r.cause == "new_content" and r.moved == ()
        assert r.explanation == "the text itself differs: new or edited content"


def test_swapped_lines_are_reordered_and_an_edited_line_is_not(default_tokenizer):
    rules = ["- Refunds take 5 days.", "- Shipping is free over $50.", "- Returns within 30 days."]
    a = msgs(DOCS + "\n".join(rules))
    b = msgs(DOCS + "\n".join([rules[0], rules[2], rules[1]]))
    r = diff(default_tokenizer, a, b)
    assert r.cause == "reordered" and r.moved == (rules[1], rules[2])
    edited = msgs(DOCS + "\n".join([rules[0], "- Shipping is free over $80.", rules[2]]))
    r = diff(default_tokenizer, a, edited)
    assert r.cause == "new_content" and r.moved == ()
    # A line repeated instead of moved: the units differ, so no reorder either.
    r = diff(default_tokenizer, a, msgs(DOCS + "\n".join([rules[0], rules[2], rules[2]])))
    assert r.cause == "new_content"


def test_reordered_rag_chunks_name_the_moved_chunks(default_tokenizer):
    chunks = ["Doc A: refunds take 5 days.", "Doc B: shipping is free over $50.", "Doc C: returns within 30 days."]
    r = diff(default_tokenizer, msgs(DOCS + "\n\n".join(chunks)),
             msgs(DOCS + "\n\n".join([chunks[1], chunks[0], chunks[2]])))
    assert r.cause == "reordered" and r.moved == (chunks[0], chunks[1])
