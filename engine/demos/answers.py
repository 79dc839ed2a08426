"""Demos beyond the KV pool: a semantic cache serving wrong answers, a hosted prompt-caching
bill, and the chat template's default system prompt found by token diff.
"""

from __future__ import annotations

from typing import Any

from engine.demos.env import RESOURCES, Demo, DemoEnv, load_resource, token_diff
from engine.model.chat import render_chat


# ---------------------------------------------------------------------------- semantic cache
def _semantic(env: DemoEnv) -> dict[str, Any]:
    from engine.semantic.cache import SemanticCache

    spec = load_resource("semantic_false_positive.json")
    cache = SemanticCache(env.embedder, threshold=spec["threshold"], guard=False, events=env.bus())
    env.shown["semantic_cache"] = cache
    for entry in spec["cached"]:
        entry_id = cache.add(entry["prompt"], entry["response"])
        env.step(f"cache the answer to: {entry['prompt']}", entry_id=entry_id, prompt=entry["prompt"])
    rows = []
    for query in spec["queries"]:
        cache.set_guard(False)
        plain = cache.lookup(query["prompt"])
        cache.set_guard(True)
        guarded = cache.lookup(query["prompt"], embedding=plain.embedding)
        best = plain.neighbours[0] if plain.neighbours else None
        wrong = plain.hit and not query["same_answer"]
        row = {"prompt": query["prompt"], "category": query["category"], "same_answer": query["same_answer"],
               "nearest_prompt": best.prompt if best else None, "score": round(best.score, 4) if best else None,
               "decision": plain.decision, "served_response": plain.response, "right_answer": query["right_answer"],
               "served_wrong_answer": wrong, "flags": [str(f) for f in best.flags] if best else [],
               "guarded_decision": guarded.decision,
               "guard_caught": wrong and not guarded.hit,
               "guard_blocked_a_right_answer": query["same_answer"] and plain.hit and not guarded.hit}
        rows.append(row)
        env.step(f"ask: {query['prompt']}", score=row["score"], decision=row["decision"],
                 served_wrong_answer=wrong, flags=row["flags"], guarded_decision=row["guarded_decision"])
    wrong_rows = [r for r in rows if r["served_wrong_answer"]]
    return {"embedding_model": env.embedder.name, "threshold": spec["threshold"], "queries": rows,
            "num_wrong_answers_served": len(wrong_rows),
            "num_caught_by_guard": sum(r["guard_caught"] for r in rows),
            "num_right_answers_blocked_by_guard": sum(r["guard_blocked_a_right_answer"] for r in rows),
            "max_wrong_score": max((r["score"] for r in wrong_rows), default=None),
            "paraphrase_still_served_in_guarded_mode": all(r["guarded_decision"] == "hit" for r in rows if r["same_answer"])}


SEMANTIC_FALSE_POSITIVE = Demo(
    "semantic-false-positive", "A semantic cache serves wrong answers",
    "negated and changed-number questions score above 0.9 with all-MiniLM-L6-v2 and get the cached wrong answer; guarded mode catches them",
    "A semantic cache answers a new question with the stored answer of a similar one, judged by the cosine "
    "similarity of their embeddings. Embeddings barely notice a 'not' or a changed number, so 'not thread "
    "safe' scores 0.99 against 'thread safe' and gets the opposite answer. Guarded mode checks every hit "
    "for risk flags (negation, numbers, names) and computes a fresh answer instead, while a true paraphrase "
    "is still served from the cache.",
    frozenset({"embedder"}), _semantic)


# ---------------------------------------------------------------------------- billing
def _billing(env: DemoEnv) -> dict[str, Any]:
    from engine.analysis.billing import bill, provider_rules, requests_from_conversations
    from engine.analysis.conversations import load_conversation_file

    rules = provider_rules("anthropic", "claude-sonnet-4-5")
    out: dict[str, Any] = {"provider": rules.label, "model": rules.model, "rules_checked": rules.checked,
                           "write_multiplier": rules.write_multiplier, "read_multiplier": rules.read_multiplier,
                           "min_cacheable_tokens": rules.min_cacheable_tokens,
                           "price_per_mtok_usd": rules.price_per_mtok, "turn_gap_s": 60}
    for label, name in (("long_system_prompt", "billing_long_session.json"),
                        ("short_system_prompt", "billing_short_session.json")):
        path = RESOURCES / name
        requests = requests_from_conversations(load_conversation_file(path), env.tokenizer, turn_gap_s=60)
        result = bill(requests, rules, (-1,))
        rows = []
        for turn, row in enumerate(result["requests"], 1):
            u = row["usage"]
            rows.append({"turn": turn, "request": row["id"], "prompt_tokens": row["prompt_tokens"], **u,
                         "weighted_tokens": row["weighted_tokens"], "cost_usd": row["cost_usd"],
                         "cost_without_cache_usd": row["cost_without_cache_usd"], "notes": row["notes"]})
            env.step(f"{label.replace('_', ' ')}: turn {turn}", **rows[-1])
        t = result["totals"]
        out[label] = {"file": f"resources/demos/{name}", "requests": rows, "cost_usd": t["cost_usd"],
                      "cost_without_cache_usd": t["cost_without_cache_usd"], "savings_usd": t["savings_usd"],
                      "savings_fraction": t["savings_fraction"], "usage": t["usage"],
                      "silently_uncached_requests": sum(1 for r in rows if any("silently not cached" in n for n in r["notes"]))}
    return out


PROMPT_CACHING_BILL = Demo(
    "prompt-caching-bill", "What hosted prompt caching bills",
    "a multi-turn session billed by Anthropic's rules: 1.25x to write, 0.1x to read, and a short prefix silently not cached",
    "Hosted APIs cache a prompt prefix for you and bill it: writing a prefix into the cache costs 1.25 times "
    "the normal input price, reading it back costs a tenth. A chat with a long system prompt pays the write "
    "once and then reads it on every turn, so it costs far less than without caching. A prefix below the "
    "model's minimum, 1024 tokens here, is silently not cached at all: the API does not say so.",
    frozenset({"tokenizer"}), _billing)


# ---------------------------------------------------------------------------- default system prompt
def _default_system(env: DemoEnv) -> dict[str, Any]:
    from engine.model.chat import default_system_prompt

    runner = env.runner()
    tok, bs = env.tokenizer, runner.block_size
    question, follow_up = "Who are you?", "Can you help me plan a trip to Lisbon?"
    system = {"role": "system", "content": "You are a helpful travel assistant."}
    user1, user2 = {"role": "user", "content": question}, {"role": "user", "content": follow_up}
    first = render_chat(tok, [user1])
    r1 = env.generate(runner, "turn-1-no-system", first, "turn 1 without a system message")
    reply = {"role": "assistant", "content": r1["output_text"].strip()}
    second = render_chat(tok, [system, user1, reply, user2])
    r2 = env.generate(runner, "turn-2-with-system", second, "turn 2 adds an explicit system message")
    diff = token_diff(tok, first, second, block_size=bs)
    env.step("token diff of turn 1 and turn 2", **{k: diff[k] for k in ("first_divergent_token", "matching_blocks", "cause")})
    # The fix: send the same explicit system message from turn one on.
    fixed1 = render_chat(tok, [system, user1])
    f1 = env.generate(runner, "fixed-turn-1", fixed1, "fixed: turn 1 with the explicit system message")
    fixed2 = render_chat(tok, [system, user1, {"role": "assistant", "content": f1["output_text"].strip()}, user2])
    f2 = env.generate(runner, "fixed-turn-2", fixed2, "fixed: turn 2 with the same system message")
    keys = ("request_id", "prompt_tokens", "cached_tokens", "computed_tokens", "miss_reason", "first_miss_block")
    return {"default_system_prompt": default_system_prompt(tok), "token_diff": diff,
            "turn_2": {k: r2[k] for k in keys}, "fixed_turn_2": {k: f2[k] for k in keys},
            "cached_tokens_turn_2": r2["cached_tokens"], "cached_tokens_fixed_turn_2": f2["cached_tokens"],
            "diff_messages": {"a": [user1], "b": [system, user1, reply, user2]},
            "turn_1_text": tok.decode(first), "turn_2_text_start": tok.decode(second[:diff["first_divergent_token"] + 12])}


DEFAULT_SYSTEM_PROMPT_DIFF = Demo(
    "default-system-prompt-diff", "The chat template's hidden default system prompt",
    "turn one without a system message gets the template's default; turn two adds one and diverges in block 0, found by token diff",
    "When a chat has no system message, many chat templates quietly insert a default one, here 'You are a "
    "helpful AI assistant named SmolLM'. If the app adds its own system message on the next turn, the two "
    "prompts differ within the first block and nothing of turn one is reused. A token diff finds the "
    "divergence and names its cause; sending the same system message from the first turn fixes it.",
    frozenset({"model"}), _default_system)
