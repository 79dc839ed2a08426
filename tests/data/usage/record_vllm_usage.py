"""Record `vllm_chat_usage.jsonl`: chat requests served one at a time by vLLM 0.33.0's own
KVCacheManager, each answered with the response body vLLM's OpenAI server sends
(`ChatCompletionResponse`, `usage.prompt_tokens_details.cached_tokens` as
`--enable-prompt-tokens-details` reports it: the prompt tokens the prefix cache gave).

Run by hand with a Python that has vLLM 0.33.0 (never the project's venv, never CI):

    env -u PYTHONHASHSEED /tmp/vllmenv/bin/python tests/data/usage/record_vllm_usage.py TOKENIZER_DIR

TOKENIZER_DIR is SmolLM2-135M-Instruct's tokenizer (the one Cachescope bundles:
`python -c "from engine.model.loader import load_tokenizer; print(load_tokenizer().name_or_path)"`).
It imports nothing from Cachescope. No model runs: the replies are fixed texts, tokenized
as the model's output would be (its ids, then <|im_end|>), so the cache sees what a
server that generated them would see. Prompts are rendered as vLLM's server renders them
(the tokenizer's chat template as text, then encoded without special tokens).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if os.environ.get("PYTHONHASHSEED") is not None:
    sys.exit("unset PYTHONHASHSEED: the log uses vLLM's default root hash")

import torch  # noqa: E402
import vllm  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import (  # noqa: E402
    ChatCompletionResponse, ChatCompletionResponseChoice, ChatMessage)
from vllm.entrypoints.serve.engine.protocol import PromptTokenUsageInfo, UsageInfo  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 16  # block 0 is vLLM's null block: 15 usable, few enough that chats evict each other
CREATED = 1764590400  # the responses' `created`, one second apart (a fixed clock, so a rerun is identical)

SYSTEM = ("You are a careful senior Python reviewer. Answer briefly, name the line you mean, and never "
          "invent an API. If a question is ambiguous, say which reading you answer.")
SYSTEM_EDITED = SYSTEM + " Today is Tuesday."

# (session, user text, fixed reply): three chats, interleaved as a server sees them
TURNS = [
    ("a", "Why does my dict comprehension {k: v for k, v in pairs if v} drop zero values?",
     "Because 0 is falsy: the filter `if v` keeps only truthy values. Use `if v is not None` to keep zeros."),
    ("b", "Is functools.lru_cache safe to use on a method?",
     "It works, but it keeps `self` alive in the cache. Prefer functools.cached_property or a cache keyed "
     "without self."),
    ("a", "And for a set comprehension, the same rule?",
     "Yes: `{v for v in values if v}` drops 0, '', None and empty containers for the same reason."),
    ("c", "What does `python -X importtime` print?",
     "The import time of every module, self and cumulative, in microseconds, to stderr."),
    ("b", "Can I clear that cache per instance?",
     "Not per instance: `method.cache_clear()` clears the whole cache for every instance."),
    ("a", "Show the fixed line for a list of (name, score) pairs.",
     "`{name: score for name, score in pairs if score is not None}` keeps scores of 0."),
]


def messages_for(history: list[dict], user: str, system: str) -> list[dict]:
    return [{"role": "system", "content": system}, *history, {"role": "user", "content": user}]


def main() -> None:
    tok = AutoTokenizer.from_pretrained(sys.argv[1])
    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=NUM_GPU_BLOCKS, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    mgr = KVCacheManager(config, max_model_len=1 << 14, scheduler_block_size=BLOCK_SIZE,
                         hash_block_size=BLOCK_SIZE, enable_caching=True)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    histories: dict[str, list[dict]] = {}
    plan: list[tuple[str, list[dict], str]] = []
    for session, user, reply in TURNS:
        history = histories.setdefault(session, [])
        plan.append((session, messages_for(history, user, SYSTEM), reply))
        history += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    # an edited history: chat a's third turn again with its first question reworded
    a = histories["a"]
    edited = [{"role": "user", "content": a[0]["content"].replace("drop zero values", "lose my zeros")}, *a[1:4]]
    plan.append(("a-edited", messages_for(edited, TURNS[5][1], SYSTEM), TURNS[5][2]))
    # a changed setting rendered into the prompt: chat b's last turn with a dated system prompt
    plan.append(("b-dated", messages_for(histories["b"][:2], TURNS[4][1], SYSTEM_EDITED), TURNS[4][2]))
    # the same request again, served right after: all but its last block comes from the cache
    plan.append(("b-dated-again", plan[-1][1], TURNS[4][2]))

    lines = []
    for i, (session, messages, reply) in enumerate(plan):
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        output = tok(reply, add_special_tokens=False)["input_ids"] + [eos]
        rid = f"chatcmpl-usage-{i:02d}"
        req = Request(rid, list(prompt), SamplingParams(max_tokens=len(output)), None, block_hasher=hasher)
        hit_blocks, num_hit, _ = mgr.get_computed_blocks(req)
        assert mgr.allocate_slots(req, len(prompt) - num_hit, num_hit, hit_blocks) is not None
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = len(prompt)
        for t in output[:-1]:  # one decode step per token; the last sampled token gets no KV
            req.append_output_token_ids(t)
            assert mgr.allocate_slots(req, 1) is not None
            req.num_computed_tokens += 1
        req.append_output_token_ids(output[-1])
        mgr.free(req)
        usage = UsageInfo(prompt_tokens=len(prompt), completion_tokens=len(output),
                          total_tokens=len(prompt) + len(output),
                          prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=num_hit))
        response = ChatCompletionResponse(
            id=rid, created=CREATED + i, model=MODEL, usage=usage,
            choices=[ChatCompletionResponseChoice(index=0, message=ChatMessage(role="assistant", content=reply),
                                                  finish_reason="stop")])
        request = {"model": MODEL, "messages": messages, "max_tokens": 64, "temperature": 0}
        lines.append({"request": request, "response": response.model_dump(mode="json")})
        print(f"{rid} {session:<14} prompt {len(prompt):>4} cached {num_hit:>4} output {len(output):>3}")
    out = HERE / "vllm_chat_usage.jsonl"
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    meta = {"vllm": vllm.__version__, "torch": torch.__version__, "model": MODEL, "block_size": BLOCK_SIZE,
            "num_gpu_blocks": NUM_GPU_BLOCKS, "hash": "sha256 (vllm.utils.hashing), PYTHONHASHSEED unset",
            "served": "one at a time, in file order", "tokenizer": "SmolLM2-135M-Instruct (bundled with Cachescope)"}
    (HERE / "vllm_chat_usage.meta.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    main()
