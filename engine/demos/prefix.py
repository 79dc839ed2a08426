"""Prefix-cache demos on the real model: multi-turn reuse, an edit, a timestamp, a partial
block, tenant salts, eviction under pressure and reordered RAG chunks.

Each scenario runs greedy requests through a fresh `ModelRunner` (real KV in the paged
pool) and reports the engine's own numbers: cached and computed tokens, miss reasons.
"""

from __future__ import annotations

import json
from typing import Any

from engine.demos.env import RESOURCES, Demo, DemoEnv, load_resource, token_diff
from engine.core.manager import Request
from engine.core.blocks import cdiv
from engine.model.chat import message_ends, render_chat, request_positions, requests_after_edit

MODEL = frozenset({"model"})


def _scenarios() -> dict[str, Any]:
    return load_resource("prefix_scenarios.json")


def _diff(env: DemoEnv, a: list[int], b: list[int], salt_a: str | None = None, salt_b: str | None = None,
          block_size: int = 16) -> dict[str, Any]:
    return token_diff(env.tokenizer, a, b, salt_a, salt_b, block_size)


# ---------------------------------------------------------------------------- multi-turn
def _multi_turn(env: DemoEnv) -> dict[str, Any]:
    spec = _scenarios()["multi_turn"]
    questions = {}
    with (RESOURCES.parent / "traces" / "mt_bench_question.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            q = json.loads(line)
            questions[q["question_id"]] = q["turns"]
    user_turns = [t for qid in spec["mt_bench_question_ids"] for t in questions[qid]]
    runner = env.runner()
    tok = env.tokenizer
    messages = [{"role": "system", "content": spec["system"]}]
    turns = []
    prev_prompt = 0
    for i, text in enumerate(user_turns, 1):
        messages.append({"role": "user", "content": text})
        prompt = render_chat(tok, messages)
        row = env.generate(runner, f"turn-{i}", prompt, f"turn {i}: send the whole conversation so far",
                           max_new_tokens=spec["max_new_tokens"])
        # The same prompt without the prefix cache: what this turn would cost with no reuse.
        cold = runner.generate(prompt, max_new_tokens=1, use_cache=False)
        row["cold_ttft_ms"] = round(cold.ttft_ms, 2)
        env.timings[-1]["cold_ttft_ms"] = row["cold_ttft_ms"]
        reply = row["output_text"].strip()
        messages.append({"role": "assistant", "content": reply})
        turns.append({"turn": i, "prompt_tokens": row["prompt_tokens"], "cached_tokens": row["cached_tokens"],
                      "computed_tokens": row["computed_tokens"],
                      "previous_prompt_blocks": prev_prompt // runner.block_size,
                      "reused_previous_prompt": (row["cached_tokens"] >= (prev_prompt // runner.block_size) * runner.block_size
                                                 if i > 1 else None),
                      "miss_reason": row["miss_reason"], "ttft_ms": row["ttft_ms"],
                      "cold_ttft_ms": row["cold_ttft_ms"]})
        prev_prompt = row["prompt_tokens"]
    total = sum(t["prompt_tokens"] for t in turns)
    cached = sum(t["cached_tokens"] for t in turns)
    return {"turns": turns, "cached_tokens_per_turn": [t["cached_tokens"] for t in turns],
            "computed_tokens_per_turn": [t["computed_tokens"] for t in turns],
            "ttft_ms_per_turn": [t["ttft_ms"] for t in turns],
            "cold_ttft_ms_per_turn": [t["cold_ttft_ms"] for t in turns],
            "hit_rate": round(cached / total, 4) if total else 0.0,
            "source": f"MT-bench questions {spec['mt_bench_question_ids']} (two turns each)"}


MULTI_TURN_REUSE = Demo(
    "multi-turn-reuse", "Multi-turn chat reuses earlier turns",
    "a 4-turn chat on the real model: each turn reuses the blocks of the turns before it",
    "A chat resends the whole conversation on every turn. The prefix cache keeps the key/value blocks of "
    "earlier turns, so each new turn only computes its new message and the reply before it. Watch the "
    "cached tokens grow turn by turn while the computed tokens stay small, and compare the time to first "
    "token with and without reuse.",
    MODEL, _multi_turn)


# ---------------------------------------------------------------------------- edit
def _edit(env: DemoEnv) -> dict[str, Any]:
    spec = _scenarios()["edit"]
    runner = env.runner()
    tok, bs = env.tokenizer, runner.block_size
    messages = spec["messages"]
    roles = [m["role"] for m in messages]
    for k, p in enumerate(request_positions(roles), 1):
        env.generate(runner, f"turn-{k}", render_chat(tok, messages[:p + 1]), f"turn {k}: the original conversation")
    pos = spec["edit_position"]
    # The requests the edit invalidates, as the CLI's `sessions edit` and the app's edit pick them.
    rerun = requests_after_edit(roles, pos, keep_replies=True)
    old_prompt = render_chat(tok, messages[:rerun[0] + 1])
    before = runner.manager.lookup(Request("resend", old_prompt))
    env.step("look up the first request the edit touches, unedited (no change)", request_id="resend",
             prompt_tokens=before.num_prompt_tokens, cached_tokens=before.num_cached_tokens,
             computed_tokens=before.num_computed_tokens, miss_reason=before.miss.reason)
    edited = [dict(m) for m in messages]
    edited[pos]["content"] = spec["edited_content"]
    new_prompt = render_chat(tok, edited[:rerun[0] + 1])
    after = env.generate(runner, "edited", new_prompt, f"edit message {pos} ({messages[pos]['role']}) and re-run "
                         f"the first request that holds it")
    for k, p in enumerate(rerun[1:], 2):
        env.generate(runner, f"edited-{k}", render_chat(tok, edited[:p + 1]),
                     f"re-run request {k} of the edited conversation: it reuses the edited prefix")
    diff = _diff(env, old_prompt, new_prompt, block_size=bs)
    # The edited message starts where the conversation up to it ends.
    message_start = message_ends(tok, messages[:pos])[-1] if pos else 0
    invalidated = after["first_miss_block"]
    return {"edited_message": pos, "edited_message_starts_at_token": message_start,
            "edited_message_block": message_start // bs,
            "invalidated_from_block": invalidated, "divergence_token": after["divergence_token"],
            "miss_reason": after["miss_reason"], "token_diff": diff,
            "blocks_invalidated": len(new_prompt) // bs - invalidated,
            "cached_tokens_before": before.num_cached_tokens, "cached_tokens_after": after["cached_tokens"],
            "computed_tokens_before": before.num_computed_tokens, "computed_tokens_after": after["computed_tokens"],
            "edit_cost_tokens": after["computed_tokens"] - before.num_computed_tokens}


EDIT_INVALIDATES = Demo(
    "edit-invalidates", "Editing an early message invalidates everything after it",
    "edit the first user message and re-run: every block from the edit onward misses (new_content)",
    "Each block's hash covers every token before it, so changing one early word changes the hash of its "
    "block and of every block after it. Re-running the conversation after the edit reuses only the blocks "
    "before the edited message; everything from there on is computed again, and the engine reports the "
    "first missing block with the reason new_content.",
    MODEL, _edit)


# ---------------------------------------------------------------------------- timestamp
def _timestamp(env: DemoEnv) -> dict[str, Any]:
    spec = _scenarios()["timestamp"]
    runner = env.runner()
    tok, bs = env.tokenizer, runner.block_size
    date = spec["date"]
    front, end, prompts, chats = [], [], [], []
    for i, (time, question) in enumerate(zip(spec["times"], spec["questions"]), 1):
        system = spec["system_front"].format(time=time, date=date)
        chats.append([{"role": "system", "content": system}, {"role": "user", "content": question}])
        prompt = render_chat(tok, chats[-1])
        prompts.append(prompt)
        row = env.generate(runner, f"front-{i}", prompt, f"timestamp at the front, request {i} at {time}")
        front.append({k: row[k] for k in ("request_id", "prompt_tokens", "cached_tokens", "computed_tokens",
                                          "miss_reason", "first_miss_block")})
    static_blocks = len(render_chat(tok, [{"role": "system", "content": spec["system_static"]}],
                               add_generation_prompt=False)) // bs
    for i, (time, question) in enumerate(zip(spec["times"], spec["questions"]), 1):
        user = question + spec["user_suffix"].format(time=time, date=date)
        prompt = render_chat(tok, [{"role": "system", "content": spec["system_static"]}, {"role": "user", "content": user}])
        row = env.generate(runner, f"end-{i}", prompt, f"timestamp at the end, request {i} at {time}")
        end.append({k: row[k] for k in ("request_id", "prompt_tokens", "cached_tokens", "computed_tokens",
                                        "miss_reason", "first_miss_block")})
    return {"front": front, "end": end, "token_diff_front": _diff(env, prompts[0], prompts[1], block_size=bs),
            "cached_tokens_front": [r["cached_tokens"] for r in front],
            "cached_tokens_end": [r["cached_tokens"] for r in end],
            "system_prompt_blocks": static_blocks,
            "tokens_saved_by_moving": sum(r["cached_tokens"] for r in end) - sum(r["cached_tokens"] for r in front),
            "diff_messages": {"a": chats[0], "b": chats[1]}}


TIMESTAMP_AT_FRONT = Demo(
    "timestamp-at-front", "A timestamp at the front defeats the cache",
    "a system prompt that starts with the current time misses from block 0; moving the time to the end restores reuse",
    "Many apps put the current time at the top of the system prompt. Because the time changes on every "
    "request, the very first block differs and nothing after it can be reused, even though the rest of the "
    "prompt is identical. Moving the timestamp to the end of the last message keeps the long system prompt "
    "cacheable.",
    MODEL, _timestamp)


# ---------------------------------------------------------------------------- partial block
def _aligned_prompt(tok: Any, system: str, question: str, padding: list[str], bs: int, aligned: bool) -> list[int]:
    """A prompt whose length is (or is not) a multiple of the block size, by adding words."""
    text = question
    for i in range(8 * bs):
        prompt = render_chat(tok, [{"role": "system", "content": system}, {"role": "user", "content": text}])
        rem = len(prompt) % bs
        if (aligned and rem == 0) or (not aligned and 2 <= rem <= bs - 2):
            return prompt
        text += padding[i % len(padding)]
    raise RuntimeError("could not pad the demo prompt to the wanted length")


def _partial(env: DemoEnv) -> dict[str, Any]:
    spec = _scenarios()["partial"]
    runner = env.runner()
    tok, bs = env.tokenizer, runner.block_size
    out: dict[str, Any] = {"block_size": bs}
    for label, aligned in (("unaligned", False), ("aligned", True)):
        # A different system prompt for each, so the first run of each starts cold.
        system = spec["system_aligned"] if aligned else spec["system"]
        prompt = _aligned_prompt(tok, system, spec["question"], spec["padding"], bs, aligned)
        first = env.generate(runner, f"{label}-1", prompt, f"{label} prompt ({len(prompt)} tokens), first time")
        second = env.generate(runner, f"{label}-2", prompt, f"the same {label} prompt again")
        out[label] = {"prompt_tokens": len(prompt), "tail_tokens": len(prompt) % bs,
                      "first": {k: first[k] for k in ("cached_tokens", "computed_tokens", "miss_reason")},
                      "second": {k: second[k] for k in ("cached_tokens", "computed_tokens", "miss_reason")}}
    return out


PARTIAL_BLOCK = Demo(
    "partial-block", "Partial blocks and the last token are always computed",
    "a prompt's partial tail block is recomputed every time; a block-aligned prompt recomputes its last block",
    "Only full blocks get a hash, so the tokens of a prompt's last, partial block are computed on every "
    "request, even when the same prompt is sent twice. And the model needs logits for the last prompt "
    "token, so a prompt that ends exactly on a block boundary recomputes its whole last block; the engine "
    "names these misses partial_block and last_token.",
    MODEL, _partial)


# ---------------------------------------------------------------------------- tenant salt
def _tenant(env: DemoEnv) -> dict[str, Any]:
    spec = _scenarios()["tenant"]
    runner = env.runner()
    tok, bs = env.tokenizer, runner.block_size
    prompt = render_chat(tok, [{"role": "system", "content": spec["system"]}, {"role": "user", "content": spec["question"]}])
    a, b = spec["tenants"]
    rows = [env.generate(runner, f"{a}-1", prompt, f"tenant {a} asks", salt=a),
            env.generate(runner, f"{b}-1", prompt, f"tenant {b} asks the identical question", salt=b),
            env.generate(runner, f"{a}-2", prompt, f"tenant {a} asks again", salt=a)]
    keys = ("request_id", "salt", "prompt_tokens", "cached_tokens", "computed_tokens", "miss_reason", "other_salt")
    return {"requests": [{k: r[k] for k in keys} for r in rows],
            "cross_tenant_cached_tokens": rows[1]["cached_tokens"], "cross_tenant_miss_reason": rows[1]["miss_reason"],
            "same_tenant_cached_tokens": rows[2]["cached_tokens"],
            "token_diff": _diff(env, prompt, prompt, a, b, bs)}


TENANT_SALT = Demo(
    "tenant-salt", "Tenants never share cache blocks",
    "identical prompts under two tenants share nothing (reason salt); the same tenant hits",
    "A cache salt per tenant is mixed into the first block's hash, so two customers sending the very same "
    "prompt get different hash chains and never read each other's key/value data. That closes a timing "
    "side channel between tenants; the price is that identical prompts are computed once per tenant.",
    MODEL, _tenant)


# ---------------------------------------------------------------------------- eviction
def _eviction(env: DemoEnv) -> dict[str, Any]:
    from engine.core.trace import common_prefix_length  # msgspec with it: not when the demos are listed

    spec = _scenarios()["eviction"]
    tok = env.tokenizer
    bs = 16
    prompts = {k: render_chat(tok, [{"role": "system", "content": spec["system"]}, {"role": "user", "content": doc}])
               for k, doc in spec["documents"].items()}
    a, b, c = (cdiv(len(prompts[k]), bs) for k in ("A", "B", "C"))
    # Blocks shared through the common chat-template prefix are hits, not new allocations.
    shared_ab = common_prefix_length(prompts["A"], prompts["B"]) // bs
    shared_c = max(common_prefix_length(prompts["A"], prompts["C"]), common_prefix_length(prompts["B"], prompts["C"])) // bs
    # Pool just big enough that C must take about half of A's freed blocks but none of B's.
    num_evict = min((a - shared_ab) // 2 + 1, c - shared_c)
    num_blocks = a + (b - shared_ab) + (c - shared_c - num_evict)
    runner = env.runner(num_blocks=num_blocks, block_size=bs)
    tables: dict[str, tuple[int, ...]] = {}
    rows = []
    for i, key in enumerate(spec["order"]):
        rid = f"doc-{key}" if key not in tables else f"doc-{key}-again"
        seen = len(env.events)
        again = " again" if key in tables else ""
        rows.append(env.generate(runner, rid, prompts[key], f"summarise document {key}{again} ({len(prompts[key])} tokens)",
                                 max_new_tokens=1))
        for e in env.events[seen:]:
            if e.kind == "blocks_allocated" and e.request_id == rid and key not in tables:
                tables[key] = e.block_ids
    evictions = [e for e in env.events if e.kind == "block_evicted" and e.by_request_id == "doc-C"]
    a_table = tables["A"]
    evicted_positions = [a_table.index(e.block_id) for e in evictions if e.block_id in a_table]
    again = rows[-1]
    named = next((e for e in env.events if e.seq == again["evicted_by_seq"]), None)
    return {"num_blocks": num_blocks, "block_size": bs, "blocks_per_document": {"A": a, "B": b, "C": c},
            "evictions_by_C": len(evictions), "evicted_positions_in_A": evicted_positions,
            "tail_first": evicted_positions == sorted(evicted_positions, reverse=True),
            "A_again": {k: again[k] for k in ("cached_tokens", "computed_tokens", "hit_blocks", "miss_reason",
                                              "first_miss_block", "evicted_by_seq")},
            "eviction_event": named.to_dict() if named is not None else None}


EVICTION_UNDER_PRESSURE = Demo(
    "eviction-under-pressure", "A full pool evicts the least recently used blocks, tail first",
    "a small pool: new requests evict older prefixes (LRU, tail first); a later request misses with reason evicted",
    "Finished requests leave their blocks cached but free, in a least-recently-used queue. When the pool is "
    "full, a new request takes the oldest free blocks and their cached content is evicted, and because a "
    "request frees its tail first, the end of an old prompt goes before its shared beginning. When the old "
    "prompt comes back it still hits its first blocks and misses where eviction began, with the reason "
    "evicted and the eviction event named.",
    MODEL, _eviction)


# ---------------------------------------------------------------------------- reordered RAG chunks
def _rag_messages(spec: dict[str, Any], order: list[str], question: str) -> list[dict[str, str]]:
    docs = "\n\n".join(f"{d}: {spec['documents'][d]}" for d in order)
    user = f"Documents:\n\n{docs}\n\nQuestion: {question}"
    return [{"role": "system", "content": spec["system"]}, {"role": "user", "content": user}]


def _rag_prompt(tok: Any, spec: dict[str, Any], order: list[str], question: str) -> list[int]:
    return render_chat(tok, _rag_messages(spec, order, question))


def _rag(env: DemoEnv) -> dict[str, Any]:
    spec = _scenarios()["rag"]
    runner = env.runner()
    tok, bs = env.tokenizer, runner.block_size
    r1, r2 = spec["requests"]
    p1 = _rag_prompt(tok, spec, r1["retrieved"], r1["question"])
    p2 = _rag_prompt(tok, spec, r2["retrieved"], r2["question"])
    first = env.generate(runner, "retrieved-1", p1, f"question 1 with chunks in retrieval order {r1['retrieved']}")
    second = env.generate(runner, "retrieved-2", p2, f"question 2: the same chunks in order {r2['retrieved']}")
    s1 = _rag_prompt(tok, spec, sorted(r1["retrieved"]), r1["question"])
    s2 = _rag_prompt(tok, spec, sorted(r2["retrieved"]), r2["question"])
    third = env.generate(runner, "sorted-1", s1, "question 1 with chunks sorted by id")
    fourth = env.generate(runner, "sorted-2", s2, "question 2 with chunks sorted by id")
    keys = ("request_id", "prompt_tokens", "cached_tokens", "computed_tokens", "miss_reason", "first_miss_block")
    # Where the shared document section ends: the question is the only difference left.
    docs_end = next(i for i, (x, y) in enumerate(zip(s1, s2)) if x != y)
    return {"retrieval_order": {k: [r[k] for r in (first, second, third, fourth)] for k in keys},
            "token_diff_retrieval_order": _diff(env, p1, p2, block_size=bs),
            "token_diff_sorted": _diff(env, s1, s2, block_size=bs),
            "cached_tokens_reordered": second["cached_tokens"], "cached_tokens_sorted": fourth["cached_tokens"],
            "shared_document_tokens_sorted": docs_end,
            "diff_messages": {"a": _rag_messages(spec, r1["retrieved"], r1["question"]),
                              "b": _rag_messages(spec, r2["retrieved"], r2["question"])}}


REORDERED_RAG_CHUNKS = Demo(
    "reordered-rag-chunks", "Reordered RAG chunks break the prefix",
    "the same retrieved documents in another order break the prefix at the first moved chunk; sorting restores reuse",
    "Retrieval returns documents ranked by score, so two questions that retrieve the very same documents "
    "often get them in a different order. The prompt then diverges at the first moved chunk and every "
    "block after it misses. Sorting the chunks by a stable id before building the prompt makes the document "
    "section identical, so the second question reuses all of it.",
    MODEL, _rag)
