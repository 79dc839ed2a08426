"""Observed beside predicted: what a provider or server cached, per request, against what
Cachescope predicts for the same requests, and why each unexpected miss missed.

vLLM logs are predicted by the engine itself: the model's own tokenizer renders each
request through its chat template, and a `PrefixCacheManager` with the server's block
size and block count serves them one at a time, so a log of requests served one at a time
must agree exactly. Hosted APIs (OpenAI, Anthropic) are predicted by the billing model
(`engine.analysis.billing`: minimum length, breakpoints, 20-block lookback, TTL from the
timestamps); their tokenizers are not available offline, so a stand-in (the bundled
SmolLM2 tokenizer) frames the messages and the result is mapped back to the provider's
own counts. Causes are found by comparing each request with the earlier one it shares
most with: edited history, reordered tools, a changed setting, a model switch, an
expired TTL, or (vLLM) an eviction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from engine.core.blocks import cdiv
from engine.core.errors import InputError
from engine.core.hashing import BlockHasher
from engine.core.manager import PrefixCacheManager, Request
from engine.core.trace import common_prefix_length
from engine.store.usage_logs import UsageEntry

CAUSES = ("edited history", "reordered tools", "changed setting", "model switch", "expired TTL", "evicted",
          "unexplained")


@dataclass(slots=True)
class _Rendered:
    entry: UsageEntry
    tokens: list[int]
    spans: list[list[int]] | None = None


def _render(tokenizer: Any, entry: UsageEntry) -> list[int]:
    from engine.model.chat import render_chat

    return render_chat(tokenizer, entry.messages)


def _output_ids(tokenizer: Any, entry: UsageEntry) -> list[int]:
    ids = list(tokenizer(entry.output_text, add_special_tokens=False)["input_ids"]) if entry.output_text else []
    if entry.finish_reason == "stop" and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return ids


def _message_diff(a: UsageEntry, b: UsageEntry) -> tuple[str, str]:
    """Why request `b` stops sharing a prefix with earlier request `a`: (cause, detail)."""
    if a.tools != b.tools:
        if len(a.tools) == len(b.tools) and sorted(map(repr, a.tools)) == sorted(map(repr, b.tools)):
            return "reordered tools", "the same tools in another order"
        return "changed setting", "the tool definitions changed"
    if a.settings != b.settings:
        keys = sorted(k for k in set(a.settings) | set(b.settings) if a.settings.get(k) != b.settings.get(k))
        return "changed setting", f"{', '.join(keys)} changed"
    for i, (x, y) in enumerate(zip(a.messages, b.messages)):
        if x != y:
            if x["role"] == "system" or y["role"] == "system":
                return "changed setting", "the system prompt changed"
            if i < len(b.messages) - 1:  # a message before the new one: the history was edited
                return "edited history", f"message {i} ({x['role']}) was edited"
            break  # only the newest message differs: new content
    return "new content", "the request continues differently"


def _previous(rendered: Sequence[_Rendered], k: int) -> tuple[int, int]:
    """The earlier request request k shares the longest token prefix with (latest on ties),
    and that length; (-1, 0) for the first."""
    best, best_len = -1, -1
    mine = rendered[k].tokens
    for j in range(k):
        n = common_prefix_length(rendered[j].tokens, mine)
        if n >= best_len:
            best, best_len = j, n
    return best, max(best_len, 0)


def _cause(rendered: Sequence[_Rendered], k: int, observed_cached: int, predicted_miss: str | None,
           ttl_s: float | None, block_size: int = 1) -> dict[str, Any] | None:
    """The cause of request k's unexpected miss, or None when it reused what it could."""
    j, shared = _previous(rendered, k)
    if j < 0:
        return None
    me, prev = rendered[k].entry, rendered[j].entry
    prev_len = len(rendered[j].tokens)
    scale = me.prompt_tokens / max(len(rendered[k].tokens), 1)  # stand-in tokens to the provider's
    out = {"against": prev.id, "first_divergent_token": shared}
    if me.model is not None and prev.model is not None and me.model != prev.model and observed_cached < shared * scale:
        return {**out, "cause": "model switch", "detail": f"{prev.model} -> {me.model}: a cache is keyed to its model"}
    if shared < prev_len and shared < len(rendered[k].tokens):
        cause, detail = _message_diff(prev, me)
        if cause != "new content":  # the request would have continued the earlier one but for this
            return {**out, "cause": cause, "detail": detail}
    reusable = min(shared, prev_len) // block_size * block_size * scale  # what the shared prefix can give back
    if observed_cached < reusable * 0.9:
        if ttl_s is not None and me.time_s is not None and prev.time_s is not None and me.time_s - prev.time_s > ttl_s:
            gap = me.time_s - prev.time_s
            return {**out, "cause": "expired TTL", "detail": f"{gap:.0f} s after {prev.id}, past the {ttl_s:.0f} s TTL"}
        if predicted_miss == "evicted":
            return {**out, "cause": "evicted", "detail": "the pool was full: its blocks were evicted for other requests"}
        return {**out, "cause": "unexplained", "detail": "the shared prefix was not read back; nothing in the log says why"}
    return None


# ---------------------------------------------------------------------------- vLLM
def predict_vllm(entries: Sequence[UsageEntry], tokenizer: Any, block_size: int,
                 capacity_blocks: int | None) -> tuple[list[dict[str, Any]], list[_Rendered], list[str]]:
    """Serve the requests one at a time on an engine shaped like the server."""
    notes: list[str] = []
    rendered = [_Rendered(e, _render(tokenizer, e)) for e in entries]
    outputs = [_output_ids(tokenizer, e) for e in entries]
    capacity = capacity_blocks or sum(cdiv(len(r.tokens) + len(o), block_size) for r, o in zip(rendered, outputs)) + 1
    mgr = PrefixCacheManager(capacity, block_size, BlockHasher("sha256", 0))
    rows = []
    for k, (r, out) in enumerate(zip(rendered, outputs)):
        e = r.entry
        if len(r.tokens) != e.prompt_tokens:
            notes.append(f"{e.id}: the tokenizer renders {len(r.tokens)} prompt tokens, the server counted "
                         f"{e.prompt_tokens}")
        if e.output_tokens and len(out) != e.output_tokens:
            notes.append(f"{e.id}: the reply re-tokenizes to {len(out)} tokens, the server generated {e.output_tokens}")
        req = Request(f"{k}", r.tokens)
        lookup = mgr.lookup(req)
        try:
            alloc = mgr.allocate(req, lookup, num_lookahead_tokens=max(len(out) - 1, 0))
        except InputError:
            rows.append({"cached_tokens": 0, "refused": True, "miss_reason": "capacity"})
            continue
        if len(out) > 1:
            mgr.append(f"{k}", token_ids=out[:-1])
        mgr.finish(f"{k}")
        rows.append({"cached_tokens": alloc.num_cached_tokens, "computed_tokens": alloc.num_computed_tokens,
                     "miss_reason": alloc.miss.reason, "first_miss_block": alloc.miss.first_miss_block})
    return rows, rendered, notes


# ---------------------------------------------------------------------------- hosted APIs
def predict_hosted(entries: Sequence[UsageEntry], tokenizer: Any, provider: str, model: str | None,
                   tokenizer_name: str = "SmolLM2-135M-Instruct") -> tuple[list[dict[str, Any]], list[_Rendered],
                                                                            list[str], float]:
    """The billing model over the requests, mapped back to the provider's token counts."""
    from engine.analysis.billing import BillingCalculator, BillingRequest, chain_segments, parse_breakpoints, \
        provider_rules
    from engine.model.chat import message_spans

    rules = _rules(provider, model or next((e.model for e in entries if e.model), None), provider_rules)
    calc = BillingCalculator(rules, parse_breakpoints(None, rules))
    notes = [f"{rules.label}: the provider's tokenizer is not available offline, so {tokenizer_name}'s tokenizer "
             f"stands in to frame the messages; cached tokens are compared in the provider's own counts (a prefix "
             f"that is an earlier request's whole prompt has that request's prompt_tokens, others are scaled)"]
    rendered, rows = [], []
    t0 = next((e.time_s for e in entries if e.time_s is not None), 0.0)
    totals_by_standin: dict[int, int] = {}
    for k, e in enumerate(entries):
        spans = message_spans(tokenizer, e.messages)
        tool_tokens = list(tokenizer(repr(e.tools), add_special_tokens=False)["input_ids"]) if e.tools else []
        # tools and settings render ahead of the messages (Anthropic's cache order: tools, system, messages),
        # and the model is the cache's first key
        head = [("model", list(tokenizer(f"model={e.model}", add_special_tokens=False)["input_ids"]))]
        parts = head + ([("tools", tool_tokens)] if tool_tokens else [])
        if e.settings:
            parts.append(("settings", list(tokenizer(repr(sorted(e.settings.items())),
                                                     add_special_tokens=False)["input_ids"])))
        parts += [(f"{i}:{m['role']}", span) for i, (m, span) in enumerate(zip(e.messages, spans))]
        tokens = [t for _, span in parts for t in span]
        rendered.append(_Rendered(e, tokens, [span for _, span in parts]))
        segs = chain_segments(parts)
        time_s = (e.time_s - t0) if e.time_s is not None else float(k)
        row = calc.bill(BillingRequest(e.id, segs, time_s))
        standin_total = len(tokens)
        scale = e.prompt_tokens / max(standin_total, 1)

        def provider_count(n: int) -> int:
            # Anchored on the longest earlier whole prompt inside the prefix (its own prompt_tokens),
            # the rest scaled: a continuation's prefix is the previous request's count exactly.
            base = max((t for t in totals_by_standin if t <= n), default=0)
            return min(totals_by_standin.get(base, 0) + round((n - base) * scale), e.prompt_tokens) if n else 0

        if rules.mode == "implicit" and row["read_tokens"]:
            # the step rule (a minimum, then whole steps) applies to the provider's own count of the shared prefix
            shared = max(common_prefix_length(r.tokens, tokens) for r in rendered[:-1]) if k else 0
            x = provider_count(shared)
            step = rules.hit_step_tokens
            read = 0 if x < rules.min_cacheable_tokens else \
                rules.min_cacheable_tokens + (x - rules.min_cacheable_tokens) // step * step
            write = read
        else:
            read, write = provider_count(row["read_tokens"]), provider_count(row["read_tokens"] + row["write_tokens"])
        totals_by_standin.setdefault(standin_total, e.prompt_tokens)
        rows.append({"cached_tokens": read, "written_tokens": max(write - read, 0),
                     "stand_in_prompt_tokens": standin_total, "stand_in_cached_tokens": row["read_tokens"],
                     "notes": row["notes"],
                     "cost_usd": row["cost_usd"]})
    return rows, rendered, notes, rules


def _rules(provider: str, model: str | None, provider_rules: Callable[..., Any]) -> Any:
    candidates = ["anthropic"] if provider == "anthropic" else ["openai", "openai-legacy"]
    for name in candidates:
        try:
            return provider_rules(name, model)
        except InputError:
            continue
    return provider_rules(candidates[0], None)


def _weighted(rules: Any, prompt: int, read: int, write: int) -> float:
    """Input tokens priced by the cache: uncached at 1, writes and reads at their multipliers."""
    return round(prompt - read - write + write * rules.write_multiplier + read * rules.read_multiplier, 4)


# ---------------------------------------------------------------------------- the comparison
def compare_usage(entries: Sequence[UsageEntry], tokenizer: Any, block_size: int | None = None,
                  capacity_blocks: int | None = None, model: str | None = None,
                  tokenizer_name: str = "SmolLM2-135M-Instruct") -> dict[str, Any]:
    """One row per request: observed, predicted, the difference in cached tokens, the cause."""
    if not entries:
        raise InputError("the log holds no requests")
    failed = [e for e in entries if e.error is not None]
    entries = [e for e in entries if e.error is None]
    if not entries:
        raise InputError(f"every request of the log failed ({failed[0].error}); there is no usage to compare")
    apis = {e.api for e in entries}
    engine_mode = apis == {"vllm"} or block_size is not None
    bs = block_size or 16
    if engine_mode:
        preds, rendered, notes = predict_vllm(entries, tokenizer, bs, capacity_blocks)
        ttl = None
        how = (f"the engine: block size {bs}, "
               + (f"{capacity_blocks} usable blocks" if capacity_blocks else "an unbounded pool")
               + f", tokens of {tokenizer_name}'s own tokenizer")
    else:
        provider = "anthropic" if "anthropic" in apis else "openai"
        preds, rendered, notes, rules = predict_hosted(entries, tokenizer, provider, model, tokenizer_name)
        ttl = rules.ttl_seconds
        how = f"the billing model ({provider})"
    rows = []
    for k, (e, p) in enumerate(zip(entries, preds)):
        observed = e.observed()
        predicted = {"cached_tokens": p["cached_tokens"]}
        if "written_tokens" in p:
            predicted["written_tokens"] = p["written_tokens"]
        for key in ("miss_reason", "first_miss_block", "stand_in_prompt_tokens", "stand_in_cached_tokens", "notes",
                    "cost_usd", "refused"):
            if key in p:
                predicted[key] = p[key]
        cause = _cause(rendered, k, e.cached_tokens, p.get("miss_reason"), ttl, bs if engine_mode else 1)
        if engine_mode:  # a server's cost of a turn is its prefill: the prompt tokens it computed
            observed["weighted_tokens"] = e.prompt_tokens - e.cached_tokens
            predicted["weighted_tokens"] = e.prompt_tokens - p["cached_tokens"]
        else:
            observed["weighted_tokens"] = _weighted(rules, e.prompt_tokens, e.cached_tokens, e.written_tokens or 0)
            predicted["weighted_tokens"] = _weighted(rules, e.prompt_tokens, p["cached_tokens"],
                                                     p.get("written_tokens", 0) if e.written_tokens is not None else 0)
            if rules.price_per_mtok is not None:
                observed["cost_usd"] = round(observed["weighted_tokens"] * rules.price_per_mtok / 1e6, 8)
                predicted["cost_usd"] = round(predicted["weighted_tokens"] * rules.price_per_mtok / 1e6, 8)
        rows.append({"id": e.id, "api": e.api, "model": e.model, "time_s": e.time_s, "observed": observed,
                     "predicted": predicted, "difference": e.cached_tokens - p["cached_tokens"], "cause": cause})
    totals = {"requests": len(rows),
              "observed_cached_tokens": sum(r["observed"]["cached_tokens"] for r in rows),
              "predicted_cached_tokens": sum(r["predicted"]["cached_tokens"] for r in rows),
              "prompt_tokens": sum(r["observed"]["prompt_tokens"] for r in rows),
              "matching_requests": sum(1 for r in rows if r["difference"] == 0),
              "unexpected_misses": sum(1 for r in rows if r["cause"] is not None)}
    totals["difference"] = totals["observed_cached_tokens"] - totals["predicted_cached_tokens"]
    totals["failed_requests"] = len(failed)
    cost_unit = ("prompt tokens computed (prefill)" if engine_mode else
                 "USD" if rules.price_per_mtok is not None else "input tokens weighted by the cache multipliers")
    return {"predicted_by": how, "apis": sorted(apis), "notes": notes, "requests": rows, "totals": totals,
            "cost_unit": cost_unit,
            "failed": [{"id": e.id, "error": e.error} for e in failed]}
