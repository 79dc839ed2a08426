"""The quantized KV cache on the real model: transformers' `QuantizedCache` (optimum-quanto
backend, 4 bits, groups of 64) against the model's own float32 `DynamicCache` and a bfloat16
copy of it, at a short and a long context: measured bytes, TTFT, per-token decode time and
the logits it costs, plus the refusal of a group size that does not divide the head size.

Backend choice. optimum-quanto installs from the package index as pure Python and works
offline. Its one native piece, a C++ kernel that unpacks 4-bit values, is not shipped
built: the first call JIT-compiles it with torch.utils.cpp_extension (ninja and a C++
compiler; about 50 s on this machine's two cores, which is the 53 s first `generate`) into
its own site-packages folder. Unpacking is exact integer arithmetic, so the pure-torch
kernel quanto ships beside it gives the same values bit for bit; `use_pure_torch_unpack`
registers that one for the CPU, so the demo never compiles anything or writes into the
environment. HQQ (the other group-wise backend) would need two more packages (hqq,
termcolor) and, measured at the same 4 bits and group size, costs a larger logit error.
"""

from __future__ import annotations

import inspect
import statistics
import threading
import time
from typing import Any

from engine.demos.env import Demo, DemoEnv, load_resource
from engine.model.chat import render_chat
from engine.model.kv_memory import check_group_size, kv_bytes, quantized_kv_bytes
from engine.core.blocks import cdiv
from engine.core.errors import InputError

NBITS = 4
GROUP_SIZE = 64
RESIDUAL_LENGTH = 128  # transformers' default: the newest tokens stay unquantized up to this many
SHORT_TOKENS = 48  # about one chat question
LONG_TOKENS = 256  # a question over a few documents, after two earlier turns
DECODE_STEPS = 8
BAD_GROUP = 48  # does not divide the head size 64 of SmolLM2
ODD_GROUP = 128  # divides neither 64 nor 3 heads x 64; quanto checks it against the whole tensor

_unpack_lock = threading.Lock()
_unpack_installed = False


def use_pure_torch_unpack() -> str:
    """Make quanto unpack 4-bit values with plain torch ops on the CPU instead of its C++
    extension, whose first use compiles it (tens of seconds, a compiler needed). Returns
    what unpacks from now on. Process-wide and idempotent; the values are identical."""
    global _unpack_installed
    import warnings

    import torch
    import optimum.quanto  # noqa: F401  (registers quanto's ops and the C++ CPU kernel)

    with _unpack_lock:
        if not _unpack_installed:
            def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
                # quanto.library.unpack's default kernel: value i of a byte sits in bits [i*b, (i+1)*b).
                per_byte = 8 // bits
                return torch.cat([(packed & (2 ** (bits * (i + 1)) - 1)) >> (bits * i)
                                  for i in range(per_byte)]).to(torch.uint8)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
                torch.library.impl("quanto::unpack", ["CPU"])(unpack)
            _unpack_installed = True
    return "pure torch (quanto's C++ unpack kernel is never compiled)"


def tensor_bytes(obj: Any) -> int:
    """Bytes held by a tensor, a quanto quantized tensor (its packed data, scales and zero
    points, via `__tensor_flatten__`) or a container of them."""
    import torch

    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "__tensor_flatten__"):
            names, _ = obj.__tensor_flatten__()
            return sum(tensor_bytes(getattr(obj, n)) for n in names)
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(o) for o in obj.values())
    return 0


def cache_bytes(cache: Any, dtype: Any = None) -> int:
    """Measured bytes of every layer of a transformers cache; with `dtype`, of a copy of
    its full-precision keys and values in that dtype (the bfloat16 cache)."""
    total = 0
    for layer in cache.layers:
        for name in ("_quantized_keys", "_quantized_values", "keys", "values"):
            value = getattr(layer, name, None)
            if value is not None and dtype is not None and not hasattr(value, "__tensor_flatten__"):
                value = value.to(dtype)
            total += tensor_bytes(value)
    return total


class _Model:
    """The loaded model driven by hand: prefill, then one token at a time on a given cache."""

    def __init__(self, loaded: Any) -> None:
        self.model = loaded.model
        params = inspect.signature(self.model.forward).parameters
        self.kwarg = "cache" if "cache" in params else "past_key_values"

    def run(self, cache: Any, prompt: list[int], steps: int, forced: list[int] | None = None) -> dict[str, Any]:
        """Greedy decode `steps` tokens after `prompt` (or feed `forced` ones): TTFT, per-step
        times, the logits of every step and the tokens chosen."""
        import torch

        logits, tokens, step_ms = [], [], []
        with torch.inference_mode():
            t = time.perf_counter()
            out = self.model(input_ids=torch.tensor([prompt]), use_cache=True, logits_to_keep=1,
                             **{self.kwarg: cache})
            logits.append(out.logits[0, -1].float().clone())
            tokens.append(int(torch.argmax(logits[-1])))
            ttft = (time.perf_counter() - t) * 1000.0
            position = len(prompt)
            for i in range(steps):
                feed = forced[i] if forced is not None else tokens[-1]
                t = time.perf_counter()
                out = self.model(input_ids=torch.tensor([[feed]]), position_ids=torch.tensor([[position]]),
                                 use_cache=True, logits_to_keep=1, **{self.kwarg: cache})
                logits.append(out.logits[0, -1].float().clone())
                tokens.append(int(torch.argmax(logits[-1])))
                step_ms.append((time.perf_counter() - t) * 1000.0)
                position += 1
        return {"ttft_ms": ttft, "decode_ms_per_token": statistics.median(step_ms), "logits": logits,
                "tokens": tokens}


def _quantized_cache(config: Any, group_size: int = GROUP_SIZE) -> Any:
    from transformers import QuantizedCache

    return QuantizedCache("quanto", config, nbits=NBITS, q_group_size=group_size, residual_length=RESIDUAL_LENGTH)


def _prompts(tok: Any) -> dict[str, list[int]]:
    """A short chat question and a long one over the bundled RAG documents, cut to length."""
    rag = load_resource("prefix_scenarios.json")["rag"]
    docs = "\n\n".join(f"{name}: {text}" for name, text in rag["documents"].items())
    question = rag["requests"][0]["question"]
    short = render_chat(tok, [{"role": "user", "content": question}])
    system = f"{rag['system']}\n\n{docs}"
    messages = [{"role": "system", "content": system}]
    long: list[int] = []
    while len(long) < LONG_TOKENS:  # more turns over the same documents until it is long enough
        for request in rag["requests"]:
            messages.append({"role": "user", "content": request["question"]})
            messages.append({"role": "assistant", "content": "It is in the documents: " + docs[:400]})
        long = render_chat(tok, messages + [{"role": "user", "content": question}])
    return {"short": short[-SHORT_TOKENS:], "long": long[-LONG_TOKENS:]}


def _refusals(env: DemoEnv, model: _Model, head_dim: int, kv_heads: int, prompt: list[int]) -> dict[str, Any]:
    """The engine's check refuses a group that does not divide the head size; quanto checks
    the group against the whole flattened tensor, so whether it refuses depends on the prompt."""
    try:
        check_group_size(head_dim, BAD_GROUP)
        engine_refusal = None
    except InputError as exc:
        engine_refusal = str(exc)
    env.step(f"group size {BAD_GROUP} against head dim {head_dim}: the engine's check", group_size=BAD_GROUP,
             refused=engine_refusal is not None, refusal=engine_refusal)

    def quanto_on(group: int, tokens: list[int]) -> str | None:
        try:
            model.run(_quantized_cache(model.model.config, group), tokens, 1)
            return None
        except ValueError as exc:
            return str(exc)

    accepted_bad = quanto_on(BAD_GROUP, prompt)
    odd = prompt[:-1] if len(prompt) % 2 == 0 else prompt
    even = prompt if len(prompt) % 2 == 0 else prompt[:-1]
    rows = []
    for group, tokens in ((BAD_GROUP, prompt), (ODD_GROUP, even), (ODD_GROUP, odd)):
        error = accepted_bad if (group, tokens) == (BAD_GROUP, prompt) else quanto_on(group, tokens)
        rows.append({"group_size": group, "prompt_tokens": len(tokens), "quanto_refused": error is not None,
                     "quanto_error": error})
        env.step(f"quanto with group size {group} on a {len(tokens)}-token prompt", group_size=group,
                 prompt_tokens=len(tokens), refused=error is not None, refusal=error)
    return {"group_size": BAD_GROUP, "head_dim": head_dim, "engine_refusal": engine_refusal,
            "quanto_checks": rows,
            "quanto_rule": f"quanto only needs the group to divide kv_heads x tokens x head_dim "
                           f"({kv_heads} x tokens x {head_dim}) of one layer's keys, so group {BAD_GROUP} passes "
                           f"with groups straddling heads, and group {ODD_GROUP} passes or fails with the "
                           f"prompt's length"}


def _quantized(env: DemoEnv) -> dict[str, Any]:
    import torch
    from transformers import DynamicCache

    loaded = env.model
    # A paged pool as large as the long context's KV, for the KV memory panel to measure
    # and compare with: the demo itself runs on transformers' caches.
    env.runner(num_blocks=cdiv(LONG_TOKENS + DECODE_STEPS, 16))
    unpack = use_pure_torch_unpack()
    model = _Model(loaded)
    config = loaded.model.config
    layers, heads, dim = loaded.num_layers, loaded.num_kv_heads, loaded.head_dim
    prompts = _prompts(env.tokenizer)
    # One untimed pass on each kind of cache: the first forward of a process, and quanto's
    # first quantization, pay one-off costs (kernel choice, page faults) the others do not.
    warm = prompts["short"][:16]
    t = time.perf_counter()
    model.run(_quantized_cache(config), warm, 2)
    first_call_ms = (time.perf_counter() - t) * 1000.0
    model.run(DynamicCache(config=config), warm, 2)
    env.step("quantized cache: transformers QuantizedCache, backend optimum-quanto", nbits=NBITS,
             group_size=GROUP_SIZE, residual_length=RESIDUAL_LENGTH, unpack=unpack,
             first_call_ms=round(first_call_ms, 1))
    contexts = {}
    for name, prompt in prompts.items():
        full = DynamicCache(config=config)
        ref = model.run(full, prompt, DECODE_STEPS)
        quant = _quantized_cache(config)
        # Fed the same tokens as the float32 run, so every step's logits compare like for like.
        q = model.run(quant, prompt, DECODE_STEPS, forced=ref["tokens"][:-1])
        n = len(prompt) + DECODE_STEPS
        fp32_bytes, bf16_bytes, q_bytes = cache_bytes(full), cache_bytes(full, torch.bfloat16), cache_bytes(quant)
        # What QuantizedCache keeps unquantized: the tokens since the last flush of its residual window.
        residual = getattr(quant.layers[0], "keys", None)
        residual_tokens = int(residual.shape[-2]) if residual is not None and residual.dim() == 4 else 0
        formula = quantized_kv_bytes(layers, heads, dim, n - residual_tokens, NBITS, GROUP_SIZE, 4, residual_tokens)
        diffs = [float((a - b).abs().max()) for a, b in zip(ref["logits"], q["logits"])]
        agree = sum(int(torch.argmax(a)) == int(torch.argmax(b)) for a, b in zip(ref["logits"], q["logits"]))
        row = {"context": name, "prompt_tokens": len(prompt), "tokens_with_kv": n,
               "fp32_bytes": fp32_bytes, "bf16_bytes": bf16_bytes, "quantized_bytes": q_bytes,
               "quantized_formula_bytes": formula, "residual_tokens": residual_tokens,
               "fp32_formula_bytes": kv_bytes(layers, heads, dim, 4, n),
               "capacity_vs_bf16": round(bf16_bytes / q_bytes, 2), "capacity_vs_fp32": round(fp32_bytes / q_bytes, 2),
               "fp32_ttft_ms": round(ref["ttft_ms"], 1), "quantized_ttft_ms": round(q["ttft_ms"], 1),
               "fp32_decode_ms_per_token": round(ref["decode_ms_per_token"], 2),
               "quantized_decode_ms_per_token": round(q["decode_ms_per_token"], 2),
               "decode_slowdown": round(q["decode_ms_per_token"] / ref["decode_ms_per_token"], 2),
               "first_token_logit_max_abs_diff": round(diffs[0], 4),
               "decode_logit_max_abs_diff": round(max(diffs[1:]), 4),
               "greedy_agreement": round(agree / len(diffs), 3), "steps_compared": len(diffs)}
        contexts[name] = row
        env.step(f"{name} context: {len(prompt)} prompt tokens, {DECODE_STEPS} decoded, float32 against 4-bit",
                 **{k: v for k, v in row.items() if k != "context"})
    refusal = _refusals(env, model, dim, heads, prompts["short"])
    short, long = contexts["short"], contexts["long"]
    return {"model": loaded.name, "backend": "optimum-quanto", "unpack": unpack, "nbits": NBITS,
            "group_size": GROUP_SIZE, "residual_length": RESIDUAL_LENGTH, "layers": layers, "kv_heads": heads,
            "head_dim": dim, "model_dtype": str(loaded.dtype).replace("torch.", ""),
            "first_call_ms": round(first_call_ms, 1),
            "quantized_bits_per_value": NBITS + 2 * 4 * 8 / GROUP_SIZE,  # the values and their groups' scales
            "formula": "2 * layers * kv_heads * head_dim * tokens * (bits / 8 + 2 * scale_bytes / group_size)"
                       " + the unquantized residual window",
            "contexts": [short, long],
            "capacity_vs_bf16_long": long["capacity_vs_bf16"], "capacity_vs_fp32_long": long["capacity_vs_fp32"],
            "decode_slowdown_short": short["decode_slowdown"], "decode_slowdown_long": long["decode_slowdown"],
            "decode_logit_max_abs_diff": max(short["decode_logit_max_abs_diff"], long["decode_logit_max_abs_diff"]),
            "greedy_agreement": min(short["greedy_agreement"], long["greedy_agreement"]),
            "refusal": refusal,
            "why_this_backend": "optimum-quanto: pinned, pure Python from the package index, offline; its C++ "
                                "unpack kernel is JIT-compiled on first use (about 50 s, the 53 s first generate) "
                                "and gives the same values as its pure-torch one, which the demo uses. HQQ needs "
                                "two more packages and costs a larger logit error at the same bits and group size."}


QUANTIZED_KV_CACHE = Demo(
    "quantized-kv-cache", "A quantized KV cache holds about twice as many tokens",
    "4-bit KV on the real model (transformers QuantizedCache, optimum-quanto): bytes against bf16/fp32, "
    "TTFT and decode time at short and long contexts, the logit cost, and a group size refused",
    "Storing keys and values in 4 bits with a scale and a zero point per group of 64 shrinks the KV cache to "
    "between a half and a third of bfloat16 (the newest tokens stay unquantized), so the same memory holds "
    "roughly twice to three times the tokens. The price is "
    "time and accuracy: every decoding step dequantizes the whole cache, which on short contexts is pure "
    "overhead, and the logits move a little. A group size must divide the head dimension, or groups would mix "
    "two heads; the engine refuses such a configuration, while quanto's own check depends on the prompt length. "
    "The backend is optimum-quanto unpacking in plain torch: its C++ kernel gives the same values but compiles "
    "for about 50 seconds on first use.",
    frozenset({"model"}), _quantized)
