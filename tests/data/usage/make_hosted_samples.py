"""Write the hosted-API usage samples: an OpenAI Batch API input + output pair, Anthropic
Message Batches requests + results, and a JSONL of OpenAI {"request", "response"} pairs.

    .venv/bin/python tests/data/usage/make_hosted_samples.py

The shapes follow the providers' API references (see README.md). No request was sent (this
machine has no network), so the usage numbers are constructed: prompt sizes are counted
with the bundled SmolLM2 tokenizer, and the cached counts follow each provider's published
rules, except for the misses each sample is there to show (an expired TTL, a model switch,
reordered tools, an edited message, a changed tool_choice).
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.model.chat import render_chat
from engine.model.loader import load_tokenizer

HERE = Path(__file__).resolve().parent
# A long, realistic system prompt (past the 1024-token caching minimum of both providers).
RULES = [
    "Cite the file and line for every claim about the code.",
    "Prefer the standard library; name a dependency only when it removes real code.",
    "Never invent an API: if a function is not in the project, say so.",
    "Keep answers under ten lines unless the user asks for more.",
    "When a question has two readings, answer the likelier one and name the other.",
    "Flag any change that alters a public interface, a file format or a default.",
    "Explain why before how; the reader can look up the how.",
    "Treat tests as documentation: point at the test that pins a behaviour.",
]
SYSTEM = "You review pull requests for a Python desktop application.\n" + "\n".join(
    f"{i + 1}. {rule} (Rule {i + 1} applies to every file in the repository, including tests, scripts and docs; "
    f"when it conflicts with a later rule, the earlier rule wins, and you say which rule you applied.)"
    for i, rule in enumerate(RULES * 6))
TOOLS_OPENAI = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests", "description": "Run one test file",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
]
TOOLS_ANTHROPIC = [
    {"name": "read_file", "description": "Read a file of the repository",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "run_tests", "description": "Run one test file",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
]
Q = ["Does engine/core/manager.py still cap a hit one token short of the prompt?",
     "And does the cap apply to block-level traces too?",
     "Which test pins that?",
     "Is the model now part of the cache key?"]
A = ["Yes: lookup keeps at most (prompt - 1) // block_size blocks (manager.py, lookup).",
     "Yes, the same cap: a block-level request's prompt length is its input_length.",
     "tests/test_engine_manager.py checks the cap on a block-aligned prompt.",
     "Yes: Request.model is folded into the root of the hash chain."]


def count(tok, messages) -> int:
    return len(render_chat(tok, messages))


def chat(k: int, system: str = SYSTEM, first: str | None = None) -> list[dict]:
    msgs = [{"role": "system", "content": system}]
    for i in range(k):
        msgs += [{"role": "user", "content": first if (i == 0 and first) else Q[i]}, {"role": "assistant", "content": A[i]}]
    return msgs + [{"role": "user", "content": Q[k]}]


def openai_body(model: str, messages: list[dict], tools=None) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": 200}
    if tools:
        body["tools"] = tools
    return body


def openai_completion(i: int, model: str, created: int, prompt: int, cached: int, answer: str) -> dict:
    return {"id": f"chatcmpl-sample{i}", "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer, "refusal": None,
                                                 "annotations": []},
                         "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 24, "total_tokens": prompt + 24,
                      "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
                      "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                                    "accepted_prediction_tokens": 0,
                                                    "rejected_prediction_tokens": 0}},
            "service_tier": "default", "system_fingerprint": "fp_sample"}


def legacy_cached(prefix: int) -> int:
    """OpenAI (gpt-4o era): 1024 tokens, then steps of 128, of the shared prefix."""
    return 0 if prefix < 1024 else 1024 + (prefix - 1024) // 128 * 128


def write_jsonl(name: str, rows: list[dict]) -> None:
    (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    tok = load_tokenizer()
    t0 = 1764590400
    # ---- OpenAI {"request", "response"} pairs: a continuation, an expired TTL, a model switch
    turns = [(chat(0), "gpt-4o", t0), (chat(1), "gpt-4o", t0 + 30), (chat(2), "gpt-4o", t0 + 930),
             (chat(3), "gpt-4o-mini", t0 + 960)]
    pairs, prev = [], None
    for i, (msgs, model, created) in enumerate(turns):
        n = count(tok, msgs)
        if i == 0 or i == 2 or i == 3:  # first; 900 s idle (past the 300 s TTL); another model's cache
            cached = 0
        else:
            cached = legacy_cached(prev)
        pairs.append({"request": openai_body(model, msgs),
                      "response": openai_completion(i, model, created, n, cached, A[i])})
        prev = n
    write_jsonl("openai_chat_pairs.jsonl", pairs)

    # ---- OpenAI Batch API: input and output files, output lines in another order
    inputs, outputs = [], []
    for i, msgs in enumerate([chat(0), chat(1), chat(2)]):
        cid = f"request-{i + 1}"
        inputs.append({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                       "body": openai_body("gpt-4o-mini", msgs, TOOLS_OPENAI)})
        n = count(tok, msgs)
        cached = 0 if i == 0 else legacy_cached(count(tok, chat(i - 1)))
        outputs.append({"id": f"batch_req_sample{i + 1}", "custom_id": cid,
                        "response": {"status_code": 200, "request_id": f"req_sample{i + 1}",
                                     "body": openai_completion(10 + i, "gpt-4o-mini-2024-07-18", t0 + 60 * i, n, cached,
                                                               A[i])},
                        "error": None})
    write_jsonl("openai_batch_input.jsonl", inputs)
    write_jsonl("openai_batch_output.jsonl", [outputs[2], outputs[0], outputs[1]])

    # ---- Anthropic Message Batches: requests and results (results in another order)
    def params(k: int, tools=TOOLS_ANTHROPIC, first=None, tool_choice=None) -> dict:
        msgs = chat(k, first=first)[1:]
        # one breakpoint, on the last block (the newest user turn), as the prompt-caching guide's
        # multi-turn example places it: each turn reads the previous turn's whole prompt
        msgs[-1] = {"role": "user", "content": [{"type": "text", "text": msgs[-1]["content"],
                                                 "cache_control": {"type": "ephemeral"}}]}
        p = {"model": "claude-sonnet-4-5-20250929", "max_tokens": 1024,
             "system": [{"type": "text", "text": SYSTEM}], "tools": tools, "messages": msgs}
        if tool_choice:
            p["tool_choice"] = tool_choice
        return p

    plan = [("turn-1", params(0)), ("turn-2", params(1)),
            ("turn-2-tools-reordered", params(1, tools=TOOLS_ANTHROPIC[::-1])),
            ("turn-3-edited", params(2, first="Does manager.py cap a hit one token short?")),
            ("turn-3-tool-choice", params(2, tool_choice={"type": "tool", "name": "read_file"}))]
    requests, results = [], []
    for cid, p in plan:
        requests.append({"custom_id": cid, "params": p})
    sizes = {cid: count(tok, chat(len(p["messages"]) // 2, first=p["messages"][0]["content"] if
                                  isinstance(p["messages"][0]["content"], str) else None)) + 60 for cid, p in plan}
    for cid, p in plan:
        total = sizes[cid]
        read = 0
        if cid == "turn-2":
            read = sizes["turn-1"]  # the whole previous prompt, at its breakpoint
        elif cid in ("turn-2-tools-reordered", "turn-3-edited", "turn-3-tool-choice"):
            read = 0  # tools reordered / a message edited / tool_choice changed: nothing of the prefix matches
        usage = {"input_tokens": 4 if read else 0, "cache_creation_input_tokens": total - read - (4 if read else 0),
                 "cache_read_input_tokens": read, "output_tokens": 31}
        if not read:
            usage["input_tokens"] = 0
        results.append({"custom_id": cid, "result": {"type": "succeeded", "message": {
            "id": f"msg_sample_{cid}", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
            "content": [{"type": "text", "text": "See manager.py, lookup."}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": usage}}})
    requests.append({"custom_id": "turn-4-errored", "params": params(3)})
    results.append({"custom_id": "turn-4-errored", "result": {"type": "errored", "error": {
        "type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"}}}})
    write_jsonl("anthropic_batch_requests.jsonl", requests)
    write_jsonl("anthropic_batch_results.jsonl", results[::-1])


if __name__ == "__main__":
    main()
