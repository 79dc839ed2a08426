"""Prompt-shape demos: how the way a client builds its prompt decides what the cache keeps.

Tool definitions reordered ahead of the system prompt, a setting rendered into the prompt
and A/B-tested, context compaction by summary against truncating a tool output in place,
and a hosted-API cache breakpoint put on the changing user message. Inputs are bundled in
resources/demos/prompt_shapes.json; numbers come from the engine (a `ModelRunner` on the
real model, a token-level `PrefixCacheManager`, or `engine.analysis.billing`).
"""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace
from typing import Any, Sequence

from engine.core.manager import Request
from engine.demos.env import RESOURCES, Demo, DemoEnv, load_resource, token_diff
from engine.model.chat import message_ends, render_chat, render_turns, template_renders_tools

MODEL = frozenset({"model"})
TOKENIZER = frozenset({"tokenizer"})
_ROW_KEYS = ("request_id", "prompt_tokens", "cached_tokens", "computed_tokens", "miss_reason", "first_miss_block",
             "ttft_ms")


def _spec(name: str) -> dict[str, Any]:
    return load_resource("prompt_shapes.json")[name]


def _row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in _ROW_KEYS if k in row}


# ---------------------------------------------------------------------------- 4. tool order
def _with_tools(messages: list[dict[str, str]], tools: list[Any]) -> list[dict[str, str]]:
    """The messages as the model sees them when `tools` lead the system text (the layout
    `engine.model.chat.render_turns` uses for templates without a tool slot)."""
    tool_text = "Tools:\n" + json.dumps(tools, ensure_ascii=False, sort_keys=True)
    out = [dict(m) for m in messages]
    out[0] = {"role": "system", "content": tool_text + "\n\n" + out[0]["content"]}
    return out


def _turn_prompt(tok: Any, messages: list[dict[str, str]], tools: list[Any]) -> list[int]:
    """The prompt of the last request of `messages`, through the engine's tool rendering:
    the template's own tool slot when it has one, else the tools ahead of the system text."""
    turns = render_turns([SimpleNamespace(**m) for m in messages], tok, tools)
    prompt = list(turns[-1].prompt_token_ids)
    if template_renders_tools(tok):
        expected, where = render_chat(tok, messages, tools=tools), "into the template's tool slot"
    else:
        expected, where = render_chat(tok, _with_tools(messages, tools)), "at the front of the system text"
    if prompt != expected:
        raise RuntimeError(f"render_turns no longer puts the tools {where}")
    return prompt


def tools_rendering(tok: Any) -> str:
    """Which path the tool definitions take for this tokenizer, as one sentence."""
    if template_renders_tools(tok):
        return ("by the chat template's own tool slot (transformers' apply_chat_template tools=), where the "
                "template puts them ahead of the system prompt")
    return ("into the system text ahead of the system prompt: the chat template has no tool slot (it drops "
            "tools= silently), so the engine puts them where hosted APIs render them, first")


def _tool_order(env: DemoEnv) -> dict[str, Any]:
    from engine.analysis.diff import DiffRequest, diff_requests  # msgspec with it: not when the demos are listed

    spec = _spec("tool_order")
    runner = env.runner()
    tok, bs = env.tokenizer, runner.block_size
    tools = spec["tools"]
    swapped = [tools[1], tools[0], *tools[2:]]
    names = [t["function"]["name"] for t in tools]
    first = [{"role": "system", "content": spec["system"]}, {"role": "user", "content": spec["turns"][0]}]
    p1 = _turn_prompt(tok, first, tools)
    r1 = env.generate(runner, "turn-1", p1, f"turn 1 with the tools in the order {names[0]}, {names[1]}",
                      max_new_tokens=spec["max_new_tokens"])
    second = first + [{"role": "assistant", "content": r1["output_text"].strip()},
                      {"role": "user", "content": spec["turns"][1]}]
    p2 = _turn_prompt(tok, second, swapped)
    r2 = env.generate(runner, "turn-2-reordered", p2, f"turn 2: the client rebuilt its tool list as "
                      f"{names[1]}, {names[0]}", max_new_tokens=spec["max_new_tokens"])
    p3 = _turn_prompt(tok, second, tools)
    r3 = env.generate(runner, "turn-2-same-order", p3, "turn 2 again with the tools in their first order",
                      max_new_tokens=spec["max_new_tokens"])
    diff = token_diff(tok, p1, p2, block_size=bs)
    moved = list(diff_requests(tok, DiffRequest(tuple(p1)), DiffRequest(tuple(p2)), bs).moved)  # the tools that moved
    # Where the tool text and the system prompt end in the rendered turn.
    slot = template_renders_tools(tok)
    system_end = (message_ends(tok, first, tools) if slot else message_ends(tok, _with_tools(first, tools)))[0]
    reusable = (len(p1) // bs) * bs
    env.step(f"token diff of turn 1 against the reordered turn 2: {diff['cause']}",
             first_divergent_token=diff["first_divergent_token"], moved=moved)
    return {"tools_rendered": tools_rendering(tok), "tools_in_template_slot": slot,
            "tool_names": names, "block_size": bs, "turn_1_prompt_tokens": len(p1),
            "tools_and_system_tokens": system_end, "token_diff": diff,
            "first_divergent_token": diff["first_divergent_token"], "first_divergent_block": diff["first_divergent_token"] // bs,
            "reordered": _row(r2), "same_order": _row(r3),
            "cached_tokens_reordered": r2["cached_tokens"], "cached_tokens_same_order": r3["cached_tokens"],
            "reusable_tokens_of_turn_1": reusable,
            "blocks_invalidated_by_reordering": len(p2) // bs - r2["cached_tokens"] // bs,
            "diff_cause": diff["cause"], "moved_tools": moved,
            "diff_messages": {"a": _with_tools(first, tools), "b": _with_tools(second, swapped)}}


TOOL_ORDER = Demo(
    "tool-order", "Reordering two tool definitions invalidates everything after them",
    "turn 2 lists the same two tools in the other order: the prompt diverges inside the tool text and every block after it misses",
    "Tool definitions are rendered ahead of the system prompt (by the chat template's tool slot when it has "
    "one; the bundled SmolLM2 template has none, so the engine puts them at the front of the system text, and "
    "the findings' tools_rendered says which path ran), so they sit at the very front of every request. A client that rebuilds its tool list from an unordered map can send the same tools in another "
    "order, and the prompt then diverges inside the first tool definition. Every block after that point, the "
    "system prompt and the whole conversation, is computed again; the token diff finds the spot and names the "
    "cause a reorder of the same tools, not new content, and a stable "
    "order keeps all of turn one cached.",
    MODEL, _tool_order)


# ---------------------------------------------------------------------------- 5. A/B setting
def arm_of(request_id: str) -> str:
    """A per-request A/B bucket, "A" or "B", from a stable hash of the request id (as
    experiment frameworks bucket requests): the same id always lands in the same arm."""
    return "AB"[hashlib.blake2b(request_id.encode(), digest_size=8).digest()[0] & 1]


def _serve(manager: Any, request_id: str, prompt: Sequence[int]) -> Any:
    """One request through a token-level manager: look up, allocate (stores its full blocks), finish."""
    request = Request(request_id, list(prompt))
    allocation = manager.allocate(request, manager.lookup(request))
    manager.finish(request_id)
    return allocation


def _ab_traffic(tok: Any, spec: dict[str, Any], arms: dict[str, str] | None) -> list[tuple[str, str, list[int]]]:
    """(request id, arm, prompt) of every request: all first turns, then all follow-ups, as
    concurrent users send them. With `arms` None every request gets setting A."""
    out = []
    for turn in (1, 2):
        for s, (question, answer, follow_up) in enumerate(spec["sessions"], 1):
            rid = f"s{s}-t{turn}"
            arm = "A" if arms is None else arms[rid]
            msgs = [{"role": "system", "content": spec["values"][arm] + "\n\n" + spec["system"]},
                    {"role": "user", "content": question}]
            if turn == 2:
                msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
            out.append((rid, arm, render_chat(tok, msgs)))
    return out


def _ab_setting(env: DemoEnv) -> dict[str, Any]:
    from engine.core.trace import common_prefix_length  # msgspec with it: not when the demos are listed

    spec = _spec("ab_setting")
    tok = env.tokenizer
    ids = [f"s{s}-t{t}" for t in (1, 2) for s in range(1, len(spec["sessions"]) + 1)]
    arms = {rid: arm_of(rid) for rid in ids}
    out: dict[str, Any] = {"setting": spec["setting"], "values": spec["values"], "sessions": len(spec["sessions"])}
    chains: dict[str, set[bytes]] = {"A": set(), "B": set()}
    for label, assignment in (("one_value", None), ("ab_test", arms)):
        manager = env.manager()
        rows, cached, total = [], 0, 0
        for rid, arm, prompt in _ab_traffic(tok, spec, assignment):
            a = _serve(manager, f"{label}/{rid}", prompt)
            if label == "ab_test":
                chains[arm].update(manager.hash_request(Request(rid, prompt)))
            rows.append({"request_id": rid, "arm": arm, "prompt_tokens": len(prompt),
                         "cached_tokens": a.num_cached_tokens, "computed_tokens": len(prompt) - a.num_cached_tokens,
                         "miss_reason": a.miss.reason if a.miss is not None else None})
            cached, total = cached + a.num_cached_tokens, total + len(prompt)
        env.step(f"{'every request with setting A' if assignment is None else 'the same traffic split 50/50 per request'}: "
                 f"{len(rows)} requests", cached_tokens=cached, prompt_tokens=total, hit_rate=round(cached / total, 4))
        out[label] = {"requests": rows, "cached_tokens": cached, "prompt_tokens": total,
                      "hit_rate": round(cached / total, 4)}
    # What a follow-up reuses of its own conversation: cached tokens past its arm's system
    # prompt (whole blocks), which every request of the arm shares anyway.
    bs = manager.block_size
    system_tokens = {}
    for arm in spec["values"]:
        prompts = [p for _, _, p in _ab_traffic(tok, spec, {rid: arm for rid in ids})]
        shared = min(common_prefix_length(prompts[0], p) for p in prompts[1:])
        system_tokens[arm] = shared // bs * bs
    for label in ("one_value", "ab_test"):
        for r in out[label]["requests"]:
            r["conversation_reuse_tokens"] = max(0, r["cached_tokens"] - system_tokens[r["arm"]])
        out[label]["conversation_reuse_tokens"] = sum(r["conversation_reuse_tokens"] for r in out[label]["requests"])
    follow = [r for r in out["ab_test"]["requests"] if r["request_id"].endswith("-t2")]
    switched = [r for r in follow if arms[r["request_id"].replace("-t2", "-t1")] != r["arm"]]
    reuse = {k: out[k]["conversation_reuse_tokens"] for k in ("one_value", "ab_test")}
    return {**out, "hit_rate_one_value": out["one_value"]["hit_rate"], "hit_rate_ab_test": out["ab_test"]["hit_rate"],
            "hit_rate_ratio": round(out["ab_test"]["hit_rate"] / out["one_value"]["hit_rate"], 3),
            "conversation_reuse_tokens_one_value": reuse["one_value"],
            "conversation_reuse_tokens_ab_test": reuse["ab_test"],
            "conversation_reuse_ratio": round(reuse["ab_test"] / reuse["one_value"], 3),
            "system_prompt_block_tokens": system_tokens,
            "switched_follow_ups_reused_their_conversation": sum(r["conversation_reuse_tokens"] > 0 for r in switched),
            "requests_in_arm": {k: sum(1 for a in arms.values() if a == k) for k in "AB"},
            "follow_ups_in_other_arm": len(switched), "follow_ups": len(follow),
            "blocks_shared_by_the_arms": len(chains["A"] & chains["B"]),
            "chain_blocks": {k: len(v) for k, v in chains.items()},
            "token_diff_a_b": token_diff(tok, _ab_traffic(tok, spec, None)[0][2],
                                         _ab_traffic(tok, spec, {rid: "B" for rid in ids})[0][2])}


AB_SETTING = Demo(
    "ab-setting-splits-cache", "A setting rendered into the prompt splits the cache",
    "two values of 'extended thinking' A/B-tested per request on the same traffic: two hash chains, and conversations reuse half as much",
    "A setting the app renders into the prompt, here extended thinking on or off as the first line of the "
    "system prompt, gives each value its own hash chain from the first block on. Split per request 50/50, a "
    "follow-up lands in the other arm about half the time and finds nothing of its own conversation there, "
    "so what conversations reuse of their earlier turns halves; the overall hit rate falls less, because each "
    "arm still shares its own system prompt. The hash view shows the two chains side by side.",
    TOKENIZER, _ab_setting)


# ---------------------------------------------------------------------------- 6. compaction
def _compaction(env: DemoEnv) -> dict[str, Any]:
    spec = _spec("compaction")
    runner = env.runner()
    tok, bs = env.tokenizer, runner.block_size
    system = {"role": "system", "content": spec["system"]}
    history = [system] + spec["history"]
    prev = render_chat(tok, history[:-1])  # the request that produced the last reply
    env.generate(runner, "previous-turn", prev, "the turn before: the whole history, served and cached",
                 max_new_tokens=spec["max_new_tokens"])
    nxt = {"role": "user", "content": spec["next_user"]}
    t = spec["truncate_tool_message"] + 1  # position in `history` (after the system message)
    if history[t]["role"] != "tool":
        raise RuntimeError(f"message {t} of the compaction scenario is not a tool output")
    tool = history[t]["content"].split("\n")
    kept = spec["truncate_keep_lines"]
    # Keep the head and the last lines (where a build log says what failed), drop the middle.
    truncated = dict(history[t], content="\n".join(tool[:kept] + [f"[... {len(tool) - 2 * kept} lines truncated ...]"]
                                                    + tool[-kept:]))
    variants = {"keep_everything": history + [nxt],
                "summarize_history": [system, {"role": "user", "content": spec["summary"] + "\n\n" + spec["next_user"]}],
                "truncate_tool_output": history[:t] + [truncated] + history[t + 1:] + [nxt]}
    actions = {"keep_everything": "next turn, history kept as it was",
               "summarize_history": "next turn after summarizing the history into one message",
               "truncate_tool_output": f"next turn after truncating the latest tool output in place to its first and last {kept} lines"}
    out: dict[str, Any] = {"block_size": bs, "previous_prompt_tokens": len(prev)}
    for name, msgs in variants.items():
        prompt = render_chat(tok, msgs)
        row = env.generate(runner, name.replace("_", "-"), prompt, actions[name], max_new_tokens=spec["max_new_tokens"])
        d = token_diff(tok, prev, prompt, block_size=bs)
        out[name] = {**_row(row), "cold_tokens": row["computed_tokens"],
                     "diverges_from_previous_at_token": d["first_divergent_token"]}
    starts = [0] + message_ends(tok, history)[:-1]
    return {**out, "cold_tokens": {k: out[k]["cold_tokens"] for k in variants},
            "cached_tokens": {k: out[k]["cached_tokens"] for k in variants},
            "tool_output_tokens": {"before": len(render_chat(tok, [history[t]], False)),
                                   "after": len(render_chat(tok, [truncated], False))},
            "tool_message_starts_at_token": starts[t], "summary_starts_at_token": message_ends(tok, [system])[0],
            "diff_messages": {"a": variants["summarize_history"], "b": variants["truncate_tool_output"]}}


COMPACTION = Demo(
    "summarize-vs-truncate", "Summarizing history rewrites the prefix; truncating a tool output keeps it",
    "the next turn's cold tokens after summarizing the history against after truncating a tool output in place",
    "Agents compact their context when it grows. Replacing the history with a summary rewrites everything after "
    "the system prompt, so the next turn is computed almost from scratch. Truncating one tool output in place "
    "changes the prompt only from that tool message on: every block before it stays cached. The demo serves "
    "the same next turn after each and counts its cold tokens.",
    MODEL, _compaction)


# ---------------------------------------------------------------------------- 8. breakpoint placement
def _breakpoint(env: DemoEnv) -> dict[str, Any]:
    from engine.analysis.billing import bill, provider_rules, requests_from_conversations
    from engine.analysis.conversations import load_conversation_file

    spec = _spec("breakpoint")
    path = RESOURCES / spec["file"]
    rules = provider_rules(spec["provider"], spec["model"])
    requests = requests_from_conversations(load_conversation_file(path), env.tokenizer, turn_gap_s=spec["gap_s"])
    out: dict[str, Any] = {"provider": rules.label, "model": rules.model, "file": f"resources/demos/{spec['file']}",
                           "requests": len(requests), "min_cacheable_tokens": rules.min_cacheable_tokens,
                           "write_multiplier": rules.write_multiplier, "read_multiplier": rules.read_multiplier}
    for label, where, bps in (("on_user_message", "the last block, the user message", (-1,)),
                              ("on_system_block", "the last system block", (0,))):
        result = bill(requests, rules, bps)
        t = result["totals"]
        for i, row in enumerate(result["requests"], 1):
            u = row["usage"]
            env.step(f"cache_control on {where}: request {i}", request_id=row["id"], prompt_tokens=row["prompt_tokens"],
                     cache_creation_input_tokens=u.get("cache_creation_input_tokens"),
                     cache_read_input_tokens=u.get("cache_read_input_tokens"), input_tokens=u.get("input_tokens"))
        out[label] = {"breakpoints": list(bps), "read_tokens": t["read_tokens"], "write_tokens": t["write_tokens"],
                      "uncached_tokens": t["uncached_tokens"], "cost_usd": t["cost_usd"],
                      "cost_without_cache_usd": t["cost_without_cache_usd"], "savings_fraction": t["savings_fraction"]}
    system_tokens = requests[0].segments[0].num_tokens
    return {**out, "system_prompt_tokens": system_tokens,
            "read_tokens_on_user_message": out["on_user_message"]["read_tokens"],
            "read_tokens_on_system_block": out["on_system_block"]["read_tokens"],
            "bill_ratio_user_to_system": round(out["on_user_message"]["cost_usd"] / out["on_system_block"]["cost_usd"], 3)}


BREAKPOINT_ON_USER_MESSAGE = Demo(
    "breakpoint-on-user-message", "A cache breakpoint on the changing user message reads nothing",
    "the same requests billed with cache_control on the user message (every request writes, none reads) against on the last system block",
    "A hosted cache stores a prefix only where a cache_control breakpoint marks it, and a later request reads it "
    "only if its own breakpoint's prefix matches. Put on the user message, which changes with every request, "
    "the breakpoint writes a new entry each time at 1.25 times the price and no request ever reads one. Put on "
    "the last system block, the shared system prompt is written once and read at a tenth of the price by every "
    "request after it.",
    TOKENIZER, _breakpoint)
