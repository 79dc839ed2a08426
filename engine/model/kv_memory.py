"""KV memory per token and per layer: the formula (`kv_bytes`), model presets, Hugging Face
configs, and the report behind `cachescope kv-memory`. Pure arithmetic, no torch; measuring
real tensors of a loaded model lives beside the pool in `kv_pool`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from engine.core import validation
from engine.core.errors import InputError, TraceError

# Bytes per stored value; int4 packs two values in a byte.
DTYPE_BYTES: dict[str, Fraction] = {
    "fp32": Fraction(4), "bf16": Fraction(2), "fp16": Fraction(2),
    "fp8": Fraction(1), "int8": Fraction(1), "int4": Fraction(1, 2),
}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                  "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn", "int8": "int8"}

_MHA_FORMULA = "2 * layers * kv_heads * head_dim * bytes_per_value * tokens"
_MLA_FORMULA = "layers * (kv_lora_rank + qk_rope_head_dim) * bytes_per_value * tokens"


def kv_bytes(num_layers: int, num_kv_heads: int, head_dim: int, bytes_per_value: int | Fraction, num_tokens: int,
             kv_factor: int = 2) -> int:
    """THE KV-memory formula, used by the pool, the report, the demos and the app:
    kv_factor (2: K and V; 1: one latent) * layers * kv_heads * head_dim * bytes_per_value
    * tokens, rounded up to whole bytes (int4 packs two values in one)."""
    return math.ceil(kv_factor * num_layers * num_kv_heads * head_dim * bytes_per_value * num_tokens)


@dataclass(slots=True, frozen=True)
class KVMemoryShape:
    """What one token's KV cache holds in each layer.

    Multi-head / grouped-query attention stores K and V per KV head (`kv_factor` 2).
    Multi-head latent attention (DeepSeek-V2/V3) stores one compressed latent of
    `kv_lora_rank` values plus one shared RoPE key of `qk_rope_head_dim` values per
    token and layer: `kv_heads` 1, `head_dim` = their sum, `kv_factor` 1.
    """

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    kv_factor: int = 2
    attention: str = "gqa"  # "mha" | "gqa" | "mla"
    note: str = ""

    @property
    def num_layers(self) -> int:
        return self.layers

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads

    def bytes_per_token(self, dtype: str = "bf16") -> int:
        return kv_bytes(self.layers, self.kv_heads, self.head_dim, DTYPE_BYTES[normalise_dtype(dtype)], 1, self.kv_factor)


def _mla_note(layers: int, heads: int, nope: int, rope: int, v: int, latent: int) -> str:
    naive = heads * (nope + rope) + heads * v
    return (f"multi-head latent attention: each token caches one compressed latent ({latent} values) plus "
            f"one decoupled RoPE key ({rope} values) per layer, shared by all {heads} heads, so "
            f"{latent + rope} values per layer instead of 2 * kv_heads * head_dim; full K and V for "
            f"{heads} heads would be {naive} values ({naive / (latent + rope):.0f}x more)")


PRESETS: dict[str, KVMemoryShape] = {
    "smollm2-135m": KVMemoryShape("smollm2-135m", 30, 3, 64, note="the default model, SmolLM2-135M-Instruct"),
    "smollm2-360m": KVMemoryShape("smollm2-360m", 32, 5, 64),
    "llama-3.1-8b": KVMemoryShape("llama-3.1-8b", 32, 8, 128),
    "llama-3.1-70b": KVMemoryShape("llama-3.1-70b", 80, 8, 128),
    "qwen2.5-7b": KVMemoryShape("qwen2.5-7b", 28, 4, 128),
    "mistral-7b": KVMemoryShape("mistral-7b", 32, 8, 128),
    "deepseek-v3": KVMemoryShape("deepseek-v3", 61, 1, 512 + 64, kv_factor=1, attention="mla",
                                 note=_mla_note(61, 128, 128, 64, 128, 512)),
}


def normalise_dtype(dtype: str) -> str:
    key = str(dtype).lower().replace("torch.", "")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise InputError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    return key


def preset(name: str) -> KVMemoryShape:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise InputError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None


# Real models have at most a few hundred layers and heads; ten million is far beyond any
# and still small enough that the per-layer list of the report fits in memory.
MAX_CONFIG_COUNT = 10**7


def shape_from_config(config: dict[str, Any], name: str = "config", path: str | None = None) -> KVMemoryShape:
    """The KV shape of a Hugging Face `config.json` (text config of multimodal models too).

    Counts must be whole positive numbers (not 2.7, `true` or "8"); `path` names the file in errors.
    """
    where = path or name
    text_config = config.get("text_config")
    cfg = text_config if isinstance(text_config, dict) and text_config else config
    prefix = "text_config." if cfg is not config else ""

    def count(key: str, default: Any = None, lo: int = 1) -> int:
        value = cfg.get(key, default)
        if value is None:
            raise TraceError(where, None, prefix + key, "missing, so the KV shape is unknown")
        return validation.integer(value, where, None, prefix + key, lo, MAX_CONFIG_COUNT)

    layers = count("num_hidden_layers")
    if cfg.get("kv_lora_rank"):
        latent, rope = count("kv_lora_rank"), count("qk_rope_head_dim", 0, lo=0)
        heads = count("num_attention_heads", 1)
        note = _mla_note(layers, heads, count("qk_nope_head_dim", 0, lo=0), rope, count("v_head_dim", 0, lo=0), latent)
        return KVMemoryShape(name, layers, 1, latent + rope, kv_factor=1, attention="mla", note=note)
    heads = count("num_attention_heads")
    kv_heads = count("num_key_value_heads") if cfg.get("num_key_value_heads") is not None else heads
    if cfg.get("head_dim") is not None:
        head_dim = count("head_dim")
    else:
        hidden = count("hidden_size")
        if hidden % heads:
            raise TraceError(where, None, prefix + "hidden_size",
                             f"{hidden} is not a multiple of num_attention_heads ({heads}); give head_dim")
        head_dim = hidden // heads
    return KVMemoryShape(name, layers, kv_heads, head_dim, attention="mha" if kv_heads == heads else "gqa")


def shape_from_config_file(path: str | Path) -> KVMemoryShape:
    p = Path(path)
    config = validation.load_json_file(p, "config")
    if not isinstance(config, dict):
        raise TraceError(str(path), None, None, "a config.json must hold a JSON object")
    return shape_from_config(config, name=p.parent.name or p.name, path=str(path))


def kv_memory_report(shape: KVMemoryShape, tokens: int, dtype: str = "bf16") -> dict[str, Any]:
    """The kv-memory JSON: bytes per token, per layer and in total for `tokens` tokens."""
    if tokens < 0:
        raise InputError(f"tokens must not be negative, not {tokens}")
    key = normalise_dtype(dtype)
    per_value = DTYPE_BYTES[key]
    validation.check_memory(shape.layers * 8, f"a report of {shape.layers:,} layers")
    per_layer = kv_bytes(1, shape.kv_heads, shape.head_dim, per_value, tokens, shape.kv_factor)
    report: dict[str, Any] = {
        "name": shape.name,
        "attention": shape.attention,
        "dtype": key,
        "bytes_per_value": float(per_value),
        "tokens": tokens,
        "layers": shape.layers,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "bytes_per_token": shape.bytes_per_token(key),
        "per_layer_bytes": [per_layer] * shape.layers,
        "total_bytes": per_layer * shape.layers,
        "formula": _MLA_FORMULA if shape.attention == "mla" else _MHA_FORMULA,
    }
    if shape.attention == "mla":
        report["formula_values"] = (f"{shape.layers} * {shape.head_dim} * {per_value} * {tokens} = "
                                    f"{report['total_bytes']}")
    else:
        report["formula_values"] = (f"2 * {shape.layers} * {shape.kv_heads} * {shape.head_dim} * {per_value} * "
                                    f"{tokens} = {report['total_bytes']}")
    if shape.note:
        report["note"] = shape.note
    return report


# ---------------------------------------------------------------------------- quantized KV
QUANTIZED_BITS = (2, 4)


def check_group_size(head_dim: int, group_size: int) -> None:
    """Refuse a quantization group size that does not divide `head_dim`: its groups would
    straddle two heads' vectors (or two tokens'), so one scale would cover values of
    unrelated channels. Raises InputError with one sentence naming the divisors."""
    if group_size < 1 or head_dim % group_size:
        divisors = ", ".join(str(d) for d in range(1, head_dim + 1) if head_dim % d == 0 and d >= 8) or str(head_dim)
        raise InputError(f"a quantization group of {group_size} values does not divide the head dimension "
                         f"{head_dim}, so groups would straddle two heads; choose one of {divisors}")


def quantized_kv_bytes(num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int, nbits: int = 4,
                       group_size: int = 64, scale_bytes: int = 4, residual_tokens: int = 0,
                       residual_bytes_per_value: int = 4) -> int:
    """Bytes of a group-quantized KV cache (transformers' QuantizedCache layout): `nbits`
    per value packed into bytes, plus one scale and one zero point of `scale_bytes` each per
    group of `group_size` values, for the quantized tokens, and the last `residual_tokens`
    kept unquantized at `residual_bytes_per_value`. Refuses a group that does not divide
    `head_dim` (`check_group_size`) and bit widths other than 2 and 4."""
    if nbits not in QUANTIZED_BITS:
        raise InputError(f"a quantized KV cache stores 2 or 4 bits per value, not {nbits}")
    check_group_size(head_dim, group_size)
    if num_tokens < 0 or residual_tokens < 0:
        raise InputError("token counts must not be negative")
    values = 2 * num_layers * num_kv_heads * head_dim * num_tokens
    packed = math.ceil(values * nbits / 8)
    groups = values // group_size
    residual = 2 * num_layers * num_kv_heads * head_dim * residual_tokens * residual_bytes_per_value
    return packed + groups * 2 * scale_bytes + residual
