"""Demo results put in words and units for the Demo guide: "4,634 ms", "40.0 GiB", "26.7%".

The JSON (`cachescope demo NAME --json`) keeps raw numbers; a reader of the guide should
not meet raw dicts, digests or Unix timestamps. The unit of a value comes from its key's
suffix, the same naming the demos use (`*_ms`, `*_bytes`, `*_gib`, `*_tokens`, `*_rate`).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from engine.core.validation import human_bytes

# Findings that other panels show in full (the Diff panel shows the two message lists).
HIDDEN_FINDINGS = ("diff_messages",)
# What a step line reports, in this order, when the step has it.
STEP_KEYS = ("request_id", "prompt_tokens", "cached_tokens", "computed_tokens", "miss_reason", "first_miss_block",
             "ttft_ms", "cold_ttft_ms", "tokens_with_kv", "total_bytes", "score", "decision", "guarded_decision",
             "cache_creation_input_tokens", "cache_read_input_tokens", "input_tokens", "per_request_gib",
             "decode_ms_per_token", "cold_decode_ms_per_token", "fp32_bytes", "quantized_bytes",
             "quantized_decode_ms_per_token", "decode_logit_max_abs_diff", "on_wall_ms", "off_wall_ms",
             "bookkeeping_ms", "copied_bytes", "copy_ms", "own_bytes", "gather_ms", "refusal",
             "hit_rate", "offline_ms", "chunk_cache_bytes", "full_prefill_ttft_ms", "concat_ttft_ms", "blend_ttft_ms",
             "concat_kl_from_full", "blend_kl_from_full", "concat_greedy_matching_tokens",
             "blend_greedy_matching_tokens")
_WORDS = {"ttft": "TTFT", "ms": "", "gib": "", "kv": "KV", "gqa": "GQA", "bf16": "bf16", "id": "id", "70b": "70B", "kl": "KL"}
_MAX_ITEMS = 8
_MAX_CHARS = 200
_EPOCH_2001 = 978_307_200  # a number after this in a time-like field is a Unix timestamp


def label(key: str) -> str:
    """A key in words: "ttft_ms_per_turn" -> "TTFT per turn"."""
    words = [_WORDS.get(w, w) for w in str(key).split("_")]
    return " ".join(w for w in words if w)




def _unit(key: str) -> str:
    k = key.lower()
    for suffix, unit in (("_ms", "ms"), ("_ms_per_token", "ms"), ("_per_s", "/s"), ("_ms_per_turn", "ms"), ("_bytes", "bytes"), ("_gib", "GiB"),
                         ("_gib_bf16", "GiB"), ("_s", "s"), ("tokens", "tokens"), ("_per_turn", ""),
                         ("rate", "%"), ("fraction", "%"), ("_usd", "$"), ("cost", "$")):
        if k.endswith(suffix) or (suffix in ("tokens", "rate", "fraction", "cost") and suffix in k):
            return unit
    if "bytes" in k:
        return "bytes"
    if "ttft" in k:
        return "ms"
    return ""


def _is_time(key: str, value: float) -> bool:
    k = key.lower()
    return ("time" in k or "timestamp" in k or k.endswith("_at") or k == "ts") and value > _EPOCH_2001


def words(key: str, value: Any) -> str:
    """`value` of finding `key` in words with its unit."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return _number(key, value)
    if isinstance(value, str):
        if len(value) >= 32 and all(c in "0123456789abcdef" for c in value.lower()):
            return f"digest {value[:12]}…"  # a hash: its head identifies it
        return _cut(value)
    if isinstance(value, dict):
        parts = [f"{label(k)} {words(k, v)}" if not str(k).isdigit() else f"{k}: {words(key, v)}"
                 for k, v in list(value.items())[:_MAX_ITEMS]]
        more = f", … ({len(value)} in all)" if len(value) > _MAX_ITEMS else ""
        return _cut(", ".join(parts) + more)
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, dict) for v in value):
            return f"{len(value)} rows, one per step above"
        items = [words(key, v) for v in value[:_MAX_ITEMS]]
        more = f", … ({len(value)} in all)" if len(value) > _MAX_ITEMS else ""
        return _cut(", ".join(items) + more)
    return _cut(str(value))


def _number(key: str, value: float) -> str:
    if _is_time(key, value):
        return datetime.fromtimestamp(value, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    unit = _unit(key)
    if unit == "ms":
        return f"{value:,.0f} ms"
    if unit == "/s":
        return f"{value:,.1f} tokens/s" if "tokens" in key else f"{value:,.1f}/s"
    if unit == "s":
        return f"{value:,.2f} s"
    if unit == "bytes":
        return human_bytes(value)
    if unit == "GiB":
        return f"{value:,.1f} GiB"
    if unit == "%":
        return f"{value:.1%}" if value <= 1 else f"{value:,.1f}%"
    if unit == "$":
        return f"${value:,.4f}"
    if unit == "tokens":
        return f"{value:,.0f} tokens" if float(value).is_integer() else f"{value:,.1f} tokens"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.3g}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{value:,.0f}"


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_CHARS else text[:_MAX_CHARS - 1] + "…"


def finding_rows(findings: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, words) for the guide's findings table: single numbers first, then lists."""
    items = [(k, v) for k, v in findings.items() if k not in HIDDEN_FINDINGS]
    items.sort(key=lambda kv: isinstance(kv[1], (dict, list, tuple)))
    return [(label(k), words(k, v)) for k, v in items]


def step_details(step: dict[str, Any]) -> str:
    """The figures of one step in a line: "prompt 76 tokens, cached 64 tokens, TTFT 180 ms"."""
    parts = []
    for key in STEP_KEYS:
        value = step.get(key)
        if value is None:
            continue
        if key == "request_id":
            parts.append(f"request {value}")
        elif key in ("miss_reason", "decision", "guarded_decision"):
            parts.append(f"{label(key)}: {str(value).replace('_', ' ')}")
        else:
            parts.append(f"{label(key).replace(' tokens', '')} {words(key, value)}")
    return ", ".join(parts)
