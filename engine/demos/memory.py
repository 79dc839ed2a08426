"""KV-memory demos: the cache growing token by token on the real model (measured tensors
against the formula), and what Llama 3.1 70B needs at 128K tokens in several dtypes.
"""

from __future__ import annotations

import inspect
from typing import Any

from engine.demos.env import Demo, DemoEnv, load_resource
from engine.model.chat import render_chat
from engine.model.kv_memory import kv_bytes

GROW_PROMPT = "Explain in three sentences why the sky is blue."
GROW_STEPS = 24
LONG_CONTEXT = 131_072  # "128K" as the model card means it: 128 * 1024 tokens
BATCH_SIZES = (1, 8, 32)
GIB = 1024 ** 3


# ---------------------------------------------------------------------------- grows per step
def _kv_grows(env: DemoEnv) -> dict[str, Any]:
    import torch
    from transformers import DynamicCache

    loaded = env.model
    runner = env.runner(num_blocks=64)
    tok, bs, pool = env.tokenizer, runner.block_size, runner.kv_pool
    prompt = render_chat(tok, [{"role": "user", "content": GROW_PROMPT}])
    rid = "decode"
    # Measured from the pool tensor itself: what one block holds in each layer.
    block_layer_bytes = [b // pool.num_blocks for b in pool.per_layer_bytes()]
    pool_steps: list[dict[str, Any]] = []

    def on_token(token: int, text: str) -> None:
        # Called once per sampled token, before its own KV is computed.
        blocks = runner.manager.block_table(rid)
        pool_steps.append({"tokens_with_kv": runner.manager.num_tokens(rid), "blocks": len(blocks),
                           "pool_bytes": len(blocks) * sum(block_layer_bytes)})

    env.step(f"serve {len(prompt)} prompt tokens on the paged pool and decode {GROW_STEPS} tokens", request_id=rid)
    res = runner.generate(prompt, max_new_tokens=GROW_STEPS, request_id=rid, on_token=on_token)
    env.timings.append({"request_id": rid, "ttft_ms": round(res.ttft_ms, 2), "cold_ttft_ms": None})

    # The same greedy decode on a plain DynamicCache, measuring its real tensors at every step.
    model = loaded.model
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache(config=model.config)
    value_bytes = torch.empty((), dtype=loaded.dtype).element_size()
    per_token_layer = kv_bytes(1, loaded.num_kv_heads, loaded.head_dim, value_bytes, 1)
    tokens, steps = [], []
    with torch.inference_mode():
        feed, position = list(prompt), 0
        for k in range(len(res.output_token_ids)):
            positions = torch.arange(position, position + len(feed)).unsqueeze(0)
            out = model(input_ids=torch.tensor([feed]), position_ids=positions, use_cache=True, **{kwarg: cache})
            position += len(feed)
            measured = [layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
                        for layer in cache.layers]
            n = position
            row = {"decode_step": k + 1, "tokens_with_kv": n, "per_layer_bytes": measured,
                   "total_bytes": sum(measured), "formula_per_layer_bytes": per_token_layer * n,
                   "formula_total_bytes": kv_bytes(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim,
                                                   value_bytes, n),
                   "pool_blocks": pool_steps[k]["blocks"] if k < len(pool_steps) else None,
                   "pool_bytes": pool_steps[k]["pool_bytes"] if k < len(pool_steps) else None}
            row["matches_formula"] = all(b == row["formula_per_layer_bytes"] for b in measured)
            steps.append(row)
            token = int(torch.argmax(out.logits[0, -1]))
            tokens.append(token)
            feed = [token]
    for row in steps:
        env.step(f"decode step {row['decode_step']}: KV for {row['tokens_with_kv']} tokens",
                 tokens_with_kv=row["tokens_with_kv"], bytes_per_layer=row["per_layer_bytes"][0],
                 total_bytes=row["total_bytes"], formula_total_bytes=row["formula_total_bytes"],
                 pool_blocks=row["pool_blocks"], pool_bytes=row["pool_bytes"])
    growth = [b["total_bytes"] - a["total_bytes"] for a, b in zip(steps, steps[1:])]
    return {"prompt_tokens": len(prompt), "num_layers": loaded.num_layers, "kv_heads": loaded.num_kv_heads,
            "head_dim": loaded.head_dim, "bytes_per_value": value_bytes, "block_size": bs,
            "bytes_per_token": per_token_layer * loaded.num_layers, "bytes_per_token_per_layer": per_token_layer,
            "formula": "2 * layers * kv_heads * head_dim * bytes_per_value * tokens",
            "per_step": steps, "growth_per_step_bytes": growth,
            "all_steps_match_formula": all(r["matches_formula"] for r in steps),
            "same_tokens_as_paged_runner": tokens == list(res.output_token_ids),
            "pool_bytes_per_block": sum(block_layer_bytes), "output_text": res.output_text}


KV_GROWS_PER_STEP = Demo(
    "kv-grows-per-step", "KV memory grows with every token",
    "decode on the real model: per-layer key/value bytes at every step, measured tensors against the formula",
    "Every token the model reads or writes leaves a key and a value vector in every layer, so the KV cache "
    "grows by the same amount at each decoding step. This demo decodes on the real model and measures the "
    "tensors after each step: they equal 2 x layers x KV heads x head size x bytes per value x tokens. The "
    "paged pool grows in whole blocks instead, one block every block-size tokens.",
    frozenset({"model"}), _kv_grows)


# ---------------------------------------------------------------------------- 70B at 128K
def _kv_70b(env: DemoEnv) -> dict[str, Any]:
    from engine.model.kv_memory import KVMemoryShape, kv_memory_report, preset, shape_from_config
    from engine.model.kv_pool import measure_loaded_model

    shape = preset("llama-3.1-70b")
    cfg = load_resource("llama-3.1-70b-config.json")
    from_config = shape_from_config(cfg, "Llama-3.1-70B-Instruct")
    same = (from_config.layers, from_config.kv_heads, from_config.head_dim) == (shape.layers, shape.kv_heads, shape.head_dim)
    env.step("Llama 3.1 70B's KV shape: the engine preset checked against Meta's config.json",
             layers=shape.layers, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
             query_heads=cfg["num_attention_heads"], preset_matches_config=same)
    rows = []
    for dtype in ("bf16", "fp8", "int4"):
        report = kv_memory_report(shape, LONG_CONTEXT, dtype)
        total = report["total_bytes"]
        row = {"dtype": dtype, "bytes_per_token": report["bytes_per_token"], "per_request_bytes": total,
               "per_request_gib": round(total / GIB, 2), "per_layer_per_request_bytes": report["per_layer_bytes"][0],
               "per_batch_gib": {str(b): round(b * total / GIB, 1) for b in BATCH_SIZES},
               "formula_values": report["formula_values"]}
        rows.append(row)
        env.step(f"Llama 3.1 70B, {LONG_CONTEXT} tokens, {dtype}", **row)
    loaded = env.model
    small = KVMemoryShape(loaded.name, loaded.num_layers, loaded.num_kv_heads, loaded.head_dim)
    small_report = kv_memory_report(small, LONG_CONTEXT, "bf16")
    # Real tensors: a KV pool of the default model in bf16 and its own DynamicCache (float32).
    measured = measure_loaded_model(loaded, LONG_CONTEXT, "bf16")
    default = {"model": loaded.name, "layers": small.layers, "kv_heads": small.kv_heads, "head_dim": small.head_dim,
               "bytes_per_token_bf16": small_report["bytes_per_token"],
               "pool_bytes_per_token_bf16_measured": measured.get("pool_bytes_per_token"),
               "per_request_bytes_bf16": small_report["total_bytes"],
               "per_request_bytes_bf16_measured": measured.get("total_bytes"),
               "per_request_gib_bf16": round(small_report["total_bytes"] / GIB, 2),
               "model_dtype": measured["model_dtype"],
               "dynamic_cache_bytes_per_token_measured": measured["dynamic_cache_bytes_per_token"],
               "per_batch_gib_bf16": {str(b): round(b * small_report["total_bytes"] / GIB, 1) for b in BATCH_SIZES}}
    env.step(f"the default model at {LONG_CONTEXT} tokens, measured on real tensors", **default)
    bf16 = rows[0]
    return {"model": "Llama 3.1 70B", "tokens": LONG_CONTEXT, "layers": shape.layers, "kv_heads": shape.kv_heads,
            "head_dim": shape.head_dim, "formula": "2 * layers * kv_heads * head_dim * bytes_per_value * tokens",
            "preset_matches_config": same, "per_dtype": rows, "default_model": default,
            "ratio_70b_to_default_bf16": round(bf16["per_request_bytes"] / small_report["total_bytes"], 1),
            "gqa_saving": f"{cfg['num_attention_heads']} query heads share {shape.kv_heads} KV heads: "
                          f"{cfg['num_attention_heads'] // shape.kv_heads}x less KV than full multi-head attention"}


KV_MEMORY_70B_128K = Demo(
    "kv-memory-70b-128k", "KV memory of a 70B model at 128K tokens",
    "Llama 3.1 70B at 128K tokens in bf16, fp8 and int4, per request and per batch, against the default model",
    "The KV cache, not the weights, is what limits long contexts. One 128K-token request to Llama 3.1 70B "
    "needs about 40 GiB of keys and values in bf16, so a batch of eight no longer fits on a single "
    "accelerator; fp8 halves that and int4 halves it again. The bundled 135M model, measured on its real "
    "pool tensors, needs about fourteen times less at the same length and precision.",
    frozenset({"model"}), _kv_70b)
