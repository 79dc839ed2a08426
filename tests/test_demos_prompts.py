"""The prompt-shape demos (engine.demos.prompts): tool order, an A/B-tested setting,
summarize against truncate, and a cache breakpoint on the changing user message."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.demos import DemoEnv, run_demo
from engine.demos.prompts import arm_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # shared cores: see tests/test_demos.py
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_env(default_model):
    return DemoEnv(model=default_model)


def _check(result: dict, name: str) -> dict:
    assert result["name"] == name and result["steps"] and result["findings"]
    assert all(s["step"] == i for i, s in enumerate(result["steps"], 1))
    json.dumps(result)
    return result["findings"]


def test_tool_order(model_env):
    f = _check(run_demo("tool-order", model_env), "tool-order")
    bs = f["block_size"]
    # The reordered tools diverge inside the tool text, ahead of the system prompt...
    assert f["first_divergent_token"] < f["tools_and_system_tokens"]
    assert f["token_diff"]["first_divergent_token"] == f["first_divergent_token"]
    # ...so turn 2 reuses only the blocks before that token, and none after it.
    r = f["reordered"]
    assert r["cached_tokens"] == (f["first_divergent_token"] // bs) * bs
    assert r["first_miss_block"] == f["first_divergent_block"] and r["miss_reason"] == "new_content"
    assert f["blocks_invalidated_by_reordering"] == r["prompt_tokens"] // bs - r["cached_tokens"] // bs > 0
    # The same tools in the same order reuse every full block of turn 1.
    assert f["cached_tokens_same_order"] == f["reusable_tokens_of_turn_1"] > r["cached_tokens"]
    a, b = f["diff_messages"]["a"], f["diff_messages"]["b"]
    assert a[0]["content"].startswith("Tools:\n") and b[0]["content"].startswith("Tools:\n")
    assert a[0]["content"] != b[0]["content"] and a[1] == b[1]
    # The diff names the cause a reorder of the two tools, not new content.
    assert f["diff_cause"] == f["token_diff"]["cause"] == "reordered"
    assert f["moved_tools"] == f["tool_names"][:2]
    # SmolLM2's template has no tool slot: the demo says it took the system-text path.
    assert f["tools_in_template_slot"] is False and "no tool slot" in f["tools_rendered"]


# A Qwen2.5-style template: the tools go in a <tools> block of the system turn, one JSON line each.
TOOL_SLOT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% else %}You are helpful.{% endif %}\n\n<tools>{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools><|im_end|>{{ '\\n' }}{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n"
    "{{ messages[0]['content'] }}<|im_end|>{{ '\\n' }}{%- endif %}"
    "{% for message in messages %}{% if not (loop.first and message['role'] == 'system') %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tool_slot_tokenizer(default_tokenizer):
    import copy

    tok = copy.deepcopy(default_tokenizer)
    tok.chat_template = TOOL_SLOT_TEMPLATE
    return tok


def _tool_chat():
    from engine.demos.prompts import _spec

    spec = _spec("tool_order")
    return spec["tools"], [{"role": "system", "content": spec["system"]}, {"role": "user", "content": spec["turns"][0]}]


def test_smollm2_template_has_no_tool_slot(default_tokenizer):
    from engine.demos.prompts import tools_rendering
    from engine.model.chat import render_chat, template_renders_tools

    tools, chat = _tool_chat()
    assert template_renders_tools(default_tokenizer) is False
    # It drops tools= silently, which is why the engine renders them into the system text.
    assert render_chat(default_tokenizer, chat, tools=tools) == render_chat(default_tokenizer, chat)
    assert "no tool slot" in tools_rendering(default_tokenizer)


def test_a_template_with_a_tool_slot_gets_the_tools(tool_slot_tokenizer, default_tokenizer):
    from types import SimpleNamespace

    from engine.analysis.diff import DiffRequest, diff_requests
    from engine.demos.prompts import _turn_prompt, tools_rendering
    from engine.model.chat import render_chat, render_turns, template_renders_tools

    tok = tool_slot_tokenizer
    tools, chat = _tool_chat()
    assert template_renders_tools(tok) is True and template_renders_tools(default_tokenizer) is False
    turn = render_turns([SimpleNamespace(**m) for m in chat], tok, tools)[-1]
    slot = render_chat(tok, chat, tools=tools)
    assert list(turn.prompt_token_ids) == slot != render_chat(tok, chat)
    text = tok.decode(slot)
    assert "<tools>" in text and "Tools:\n" not in text and text.count('"name": "get_weather"') == 1
    assert "tool slot" in tools_rendering(tok) and "no tool slot" not in tools_rendering(tok)
    # The demo's own prompts take that path, and the reorder is found line by line there.
    p1 = _turn_prompt(tok, chat, tools)
    p2 = _turn_prompt(tok, chat, [tools[1], tools[0]])
    r = diff_requests(tok, DiffRequest(tuple(p1)), DiffRequest(tuple(p2)))
    assert r.cause == "reordered" and r.moved == ("get_weather", "search_flights")
    assert r.explanation.startswith("the same tool definitions appear in another order")


@pytest.mark.parametrize("value,ok", [("1", 1), ("4", 4), ("0", None), ("-2", None), ("two", None),
                                      ("1.5", None), ("257", None)])
def test_demo_threads_option(value, ok, capsys):
    import argparse

    from app.commands import demo

    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    assert p.parse_args(["tool-order"]).threads is None  # default: torch's own thread count
    if ok is not None:
        assert p.parse_args(["tool-order", "--threads", value]).threads == ok
    else:
        with pytest.raises(SystemExit) as exc:
            main(["demo", "breakpoint-on-user-message", "--threads", value])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--threads" in err


def test_demo_threads_are_set_for_the_run_and_restored(capsys, monkeypatch):
    import torch

    import engine.demos as demos

    seen = []
    real = demos.run_demo
    monkeypatch.setattr(demos, "run_demo", lambda name, env=None: (seen.append(torch.get_num_threads()),
                                                                   real(name, env))[1])
    before = torch.get_num_threads()
    assert main(["demo", "breakpoint-on-user-message", "--json", "--threads", "2"]) == 0
    assert seen == [2] and torch.get_num_threads() == before
    json.loads(capsys.readouterr().out)


def test_ab_arms_are_stable_per_request():
    assert arm_of("s1-t1") == arm_of("s1-t1")
    arms = [arm_of(f"s{i}-t{t}") for i in range(1, 200) for t in (1, 2)]
    assert set(arms) == {"A", "B"} and 0.4 < arms.count("A") / len(arms) < 0.6


def test_ab_setting_splits_the_cache():
    r = run_demo("ab-setting-splits-cache", DemoEnv())  # token ids only: no model loaded
    f = _check(r, "ab-setting-splits-cache")
    assert r["model"] is None
    # Two chains from the first block: the arms share no block at all.
    assert f["blocks_shared_by_the_arms"] == 0 and min(f["chain_blocks"].values()) > 0
    assert f["token_diff_a_b"]["first_divergent_token"] < 16 and f["token_diff_a_b"]["matching_blocks"] == 0
    assert f["hit_rate_ab_test"] < f["hit_rate_one_value"]
    # A follow-up in the other arm finds nothing of its own conversation; in its own arm it
    # reuses exactly what it reuses with one value.
    one = {x["request_id"]: x for x in f["one_value"]["requests"]}
    switched = 0
    for x in f["ab_test"]["requests"]:
        if not x["request_id"].endswith("-t2"):
            continue
        first_arm = arm_of(x["request_id"].replace("-t2", "-t1"))
        if first_arm == x["arm"] == "A":
            assert x["cached_tokens"] == one[x["request_id"]]["cached_tokens"]
        if first_arm != x["arm"]:
            switched += 1
            assert x["conversation_reuse_tokens"] == 0
            assert x["cached_tokens"] <= f["system_prompt_block_tokens"][x["arm"]]
    assert switched == f["follow_ups_in_other_arm"] > 0
    assert f["conversation_reuse_tokens_ab_test"] < f["conversation_reuse_tokens_one_value"]
    # The hit rate lost is the switched follow-ups' conversation reuse, no more.
    lost = f["one_value"]["cached_tokens"] - f["ab_test"]["cached_tokens"]
    assert lost > 0
    assert r["events"]["request_started"] == 4 * f["sessions"]


def test_summarize_vs_truncate(model_env):
    f = _check(run_demo("summarize-vs-truncate", model_env), "summarize-vs-truncate")
    keep, summ, trunc = f["keep_everything"], f["summarize_history"], f["truncate_tool_output"]
    # A summary rewrites everything after the system prompt: only blocks before it are kept.
    assert summ["diverges_from_previous_at_token"] >= f["summary_starts_at_token"]
    assert summ["cached_tokens"] <= (f["summary_starts_at_token"] // 16 + 1) * 16
    # Truncating the tool output in place keeps every block before the tool message.
    assert trunc["diverges_from_previous_at_token"] >= f["tool_message_starts_at_token"]
    assert trunc["cached_tokens"] >= (f["tool_message_starts_at_token"] // 16) * 16 > summ["cached_tokens"]
    assert f["tool_output_tokens"]["after"] < f["tool_output_tokens"]["before"]
    # Cold tokens of the next turn: keeping the history < truncating in place < summarizing.
    assert keep["cold_tokens"] < trunc["cold_tokens"] < summ["cold_tokens"]
    for row in (keep, summ, trunc):
        assert row["cold_tokens"] == row["prompt_tokens"] - row["cached_tokens"]


def test_breakpoint_on_the_user_message_reads_nothing():
    r = run_demo("breakpoint-on-user-message", DemoEnv())  # the tokenizer only
    f = _check(r, "breakpoint-on-user-message")
    user, system = f["on_user_message"], f["on_system_block"]
    assert f["system_prompt_tokens"] >= f["min_cacheable_tokens"]
    # On the changing user message: every request writes its whole prompt, none reads.
    assert user["read_tokens"] == 0 and user["uncached_tokens"] == 0
    assert user["savings_fraction"] < 0 and user["cost_usd"] > user["cost_without_cache_usd"]
    # On the last system block: written once, read by every later request.
    assert system["write_tokens"] == f["system_prompt_tokens"]
    assert system["read_tokens"] == (f["requests"] - 1) * f["system_prompt_tokens"]
    assert system["cost_usd"] < system["cost_without_cache_usd"] < user["cost_usd"]
    assert f["bill_ratio_user_to_system"] > 1
    reads = [s["cache_read_input_tokens"] for s in r["steps"] if "user message" in s["action"]]
    assert reads == [0] * f["requests"]


def test_cli_json(capsys):
    assert main(["demo", "breakpoint-on-user-message", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["name"] == "breakpoint-on-user-message" and out["findings"]["read_tokens_on_user_message"] == 0


# ---------------------------------------------------------------------------- in the app
def _run_from_menu(qtbot, window, name):
    from app.demos.runner import install_demos
    from engine.demos import get_demo

    runner = install_demos(window)
    action = next(a for a in window.demos_menu.actions() if a.text() == get_demo(name).title)
    with qtbot.waitSignal(runner.sigFinished, timeout=120_000) as blocker:
        action.trigger()
    return runner, blocker.args[0]


def test_breakpoint_demo_bills_in_the_billing_panel(qtbot, window):
    pytest.importorskip("pytestqt")
    _, result = _run_from_menu(qtbot, window, "breakpoint-on-user-message")
    assert window.ctx.subject.kind == "demo" and window.ctx.subject.source == "breakpoint-on-user-message"
    billing = window.panels["billing"]
    assert billing.source.text().endswith("billing_breakpoint_requests.jsonl")
    assert billing.breakpoints.text() == "-1"
    qtbot.waitUntil(lambda: billing.result is not None, timeout=60_000)
    totals = billing.result["totals"]
    # The panel bills what the demo reported: nothing read, every prompt written.
    assert totals["read_tokens"] == result["findings"]["read_tokens_on_user_message"] == 0
    assert totals["write_tokens"] == result["findings"]["on_user_message"]["write_tokens"]
    assert window.ctx.errors == []


def test_ab_demo_shows_two_chains(qtbot, window):
    pytest.importorskip("pytestqt")
    _, result = _run_from_menu(qtbot, window, "ab-setting-splits-cache")
    qtbot.waitUntil(lambda: window.ctx.bridge.num_pending == 0)
    state = window.ctx.state
    records = state.projection.request_records()
    # The views follow the A/B engine: its 24 requests, half of them in each arm.
    ab = result["findings"]["ab_test"]["requests"]
    assert {r.request_id for r in records} == {f"ab_test/{x['request_id']}" for x in ab}
    assert sum(r.num_cached_tokens for r in records) == result["findings"]["ab_test"]["cached_tokens"]
    assert window.ctx.errors == []
