"""What a hosted API would bill for prompt caching, request by request.

Provider rules come from resources/billing_rules.json, never from code. Requests are
sequences of content blocks (`Segment`s), built from conversations or traces by the
helpers at the end of this module. A request that names its model is priced by that
model's rules (`rules_for_models`) unless one model is chosen for all. No Qt, no model.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from array import array
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

from engine.core import validation
from engine.core.errors import InputError, TraceError
from engine.core.sniff import WEKA_FORMAT, file_kind, is_request_trace
from engine.core.trace import MOONCAKE_BLOCK_SIZE, common_prefix_length
from engine.analysis.conversations import load_conversation_file, messages_of
from engine.model.chat import message_spans
from engine.resources import resource_path

RULES_PATH = resource_path("billing_rules.json")
PROVIDERS = ("anthropic", "openai", "openai-legacy")


@dataclass(slots=True, frozen=True)
class Segment:
    """One content block. Equal `key`s mean equal content up to and including this block."""

    key: Hashable
    num_tokens: int
    token_ids: tuple[int, ...] | None = None
    label: str = ""


@dataclass(slots=True, frozen=True)
class BillingRequest:
    """One request. `implied_boundaries`: the source has no message boundaries (a block-level
    trace), so every block boundary inside a written prefix counts as readable later."""

    request_id: str
    segments: tuple[Segment, ...]
    time_s: float = 0.0
    implied_boundaries: bool = False
    model: str | None = None  # the model the request names (a trace's), priced by its own rules

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.segments)


@dataclass(slots=True, frozen=True)
class ProviderRules:
    """The rules of one provider and model, resolved from the data file."""

    provider: str
    model: str
    label: str
    checked: str
    mode: str  # "breakpoints" (explicit cache_control) or "implicit" (longest cached prefix)
    min_cacheable_tokens: int
    ttl_seconds: float
    ttl_refreshed_on_hit: bool
    write_multiplier: float
    read_multiplier: float
    max_breakpoints: int
    lookback_blocks: int | None
    hit_step_tokens: int
    max_lifetime_seconds: float | None
    price_per_mtok: float | None

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


def load_rules(path: str | Path | None = None) -> dict[str, Any]:
    """The provider rules file, checked field by field (errors name the file and the field)."""
    p = Path(path) if path is not None else RULES_PATH
    data = validation.load_json_file(p, "billing rules file")
    check_rules(data, str(p))
    return data


_NUMBER = (validation.number, {"lo": 0.0})
_RULE_FIELDS: dict[str, tuple[bool, Any]] = {
    # field: (required, check); the checks use the shared validation layer.
    "mode": (True, ("breakpoints", "implicit")),
    "max_breakpoints": (False, (validation.integer, {"lo": 0, "hi": 1000})),
    "lookback_blocks": (False, (validation.integer, {"lo": 1, "hi": validation.MAX_INT64})),
    "ttl_seconds": (True, (validation.number, {"lo": 0.0, "hi": 1e12})),
    "write_multiplier": (True, _NUMBER), "read_multiplier": (True, _NUMBER),
    "hit_step_tokens": (False, (validation.integer, {"lo": 1, "hi": validation.MAX_TOKENS})),
    "min_cacheable_tokens": (False, (validation.integer, {"lo": 0, "hi": validation.MAX_TOKENS})),
    "max_lifetime_seconds": (False, (validation.number, {"lo": 0.0, "hi": 1e12})),
}
_MODEL_FIELDS = {"min_cacheable_tokens": _RULE_FIELDS["min_cacheable_tokens"][1], "base_input_usd_per_mtok": _NUMBER,
                 "write_multiplier": _NUMBER, "read_multiplier": _NUMBER}


def check_rules(data: Any, name: str) -> None:
    """Refuse a rules file whose structure or numbers the calculator cannot use."""
    def check(value: Any, fld: str, how: Any) -> None:
        if value is None:
            return
        if isinstance(how, tuple) and how and isinstance(how[0], str):
            if value not in how:
                raise TraceError(name, None, fld, f"expected one of {', '.join(how)}, got {value!r}")
            return
        fn, kw = how
        fn(value, name, None, fld, **kw)

    def obj(value: Any, fld: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise TraceError(name, None, fld, "expected an object")
        return value

    providers = obj(obj(data, "").get("providers"), "providers")
    for pname, p in providers.items():
        pf = f"providers.{pname}"
        obj(p, pf)
        for key, (required, how) in _RULE_FIELDS.items():
            if required and p.get(key) is None:
                raise TraceError(name, None, f"{pf}.{key}", "missing")
            check(p.get(key), f"{pf}.{key}", how)
        if "ttl_refreshed_on_hit" in p and not isinstance(p["ttl_refreshed_on_hit"], bool):
            raise TraceError(name, None, f"{pf}.ttl_refreshed_on_hit", "expected true or false")
        for tname, opt in obj(p.get("ttl_options", {}), f"{pf}.ttl_options").items():
            for key in ("ttl_seconds", "write_multiplier"):
                value = obj(opt, f"{pf}.ttl_options.{tname}").get(key)
                if value is None:
                    raise TraceError(name, None, f"{pf}.ttl_options.{tname}.{key}", "missing")
                check(value, f"{pf}.ttl_options.{tname}.{key}", _RULE_FIELDS[key][1])
        models = obj(p.get("models"), f"{pf}.models")
        if not models:
            raise TraceError(name, None, f"{pf}.models", "lists no model")
        if not isinstance(p.get("default_model"), str) or _match_family(p["default_model"], models) is None:
            raise TraceError(name, None, f"{pf}.default_model", "must name one of the provider's models")
        for mname, m in models.items():
            for key, how in _MODEL_FIELDS.items():
                check(obj(m, f"{pf}.models.{mname}").get(key), f"{pf}.models.{mname}.{key}", how)


def provider_rules(provider: str, model: str | None = None, ttl: str = "5m",
                   price_per_mtok: float | None = None, rules: dict[str, Any] | None = None) -> ProviderRules:
    """Resolve `provider` + `model` (a family name or a dated id such as claude-sonnet-4-5-20250929)."""
    data = rules if rules is not None else load_rules()
    providers = data.get("providers", {})
    if provider not in providers:
        raise InputError(f"unknown provider {provider!r}; choose one of {', '.join(sorted(providers))}")
    p = providers[provider]
    models = p["models"]
    name = model or p["default_model"]
    family = _match_family(name, models)
    if family is None:
        raise InputError(f"unknown {provider} model {name!r}; known: {', '.join(models)}")
    m = models[family]
    ttl_s, write_mult = p["ttl_seconds"], p["write_multiplier"]
    options = p.get("ttl_options", {})
    if ttl in options:
        ttl_s, write_mult = options[ttl]["ttl_seconds"], options[ttl]["write_multiplier"]
    elif ttl != "5m":
        raise InputError(f"{provider} has no {ttl!r} cache lifetime option")
    price = price_per_mtok if price_per_mtok is not None else m.get("base_input_usd_per_mtok")
    if price is not None and (not math.isfinite(price) or price < 0):
        raise InputError(f"the price per million tokens must be a finite number of at least 0, not {price}")
    return ProviderRules(
        provider=provider, model=name, label=p.get("label", provider), checked=p.get("checked", data.get("checked", "")),
        mode=p["mode"], min_cacheable_tokens=int(m.get("min_cacheable_tokens", p.get("min_cacheable_tokens", 1024))),
        ttl_seconds=float(ttl_s), ttl_refreshed_on_hit=bool(p.get("ttl_refreshed_on_hit", True)),
        write_multiplier=float(m.get("write_multiplier", write_mult)),
        read_multiplier=float(m.get("read_multiplier", p["read_multiplier"])),
        max_breakpoints=int(p.get("max_breakpoints", 4)), lookback_blocks=p.get("lookback_blocks"),
        hit_step_tokens=int(p.get("hit_step_tokens", 1)), max_lifetime_seconds=p.get("max_lifetime_seconds"),
        price_per_mtok=price)


_DATE_SUFFIX = re.compile(r"\d{8}|\d{4}-\d{2}-\d{2}")


def _match_family(name: str, models: dict[str, Any]) -> str | None:
    if name in models:
        return name
    # A dated id ("claude-sonnet-4-5-20250929", "gpt-4o-2024-08-06") belongs to its family;
    # "claude-opus-4-6" is a model of its own, not a date of claude-opus-4.
    best = [f for f in models if name.startswith(f + "-") and _DATE_SUFFIX.fullmatch(name[len(f) + 1:])]
    return max(best, key=len) if best else None


def rules_for_models(requests: Iterable[BillingRequest], provider: str, ttl: str = "5m",
                     price_per_mtok: float | None = None, rules: dict[str, Any] | None = None,
                     source: str = "the trace") -> dict[str, ProviderRules]:
    """The rules of every model the requests name, by the name they give; a model the rules
    file has no table for is one sentence naming it and the first request that names it."""
    data = rules if rules is not None else load_rules()
    out: dict[str, ProviderRules] = {}
    for req in requests:
        if req.model is None or req.model in out:
            continue
        try:
            out[req.model] = provider_rules(provider, req.model, ttl, price_per_mtok, data)
        except InputError:
            known = ", ".join(data.get("providers", {}).get(provider, {}).get("models", {}))
            raise InputError(f"{source}: request {req.request_id} names model {req.model!r}, which has no {provider} "
                             f"price table (known: {known}); pass --model NAME to bill every request as one "
                             f"model") from None
    return out


def parse_breakpoints(text: str | None, rules: ProviderRules) -> tuple[int, ...] | None:
    """'auto' -> (-1,): one slot at the last block; '0,-1' -> block indices (negative from the end).

    None means the provider's implicit caching (OpenAI without explicit breakpoints).
    """
    if text is None or text.strip() == "":
        return (-1,) if rules.mode == "breakpoints" else None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if rules.max_breakpoints == 0:
        raise InputError(f"{rules.label} caches automatically and takes no breakpoints; drop --breakpoints")
    if items == ["auto"] and rules.mode == "implicit":
        return None
    out: list[int] = []
    for item in items:
        if item == "auto":
            out.append(-1)
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise InputError(f"breakpoint {item!r} is not a block index; give 'auto' or a list such as 0,-1") from None
    if len(set(out)) > rules.max_breakpoints:
        raise InputError(f"{rules.label} allows at most {rules.max_breakpoints} cache breakpoints, not {len(set(out))}")
    return tuple(out)


@dataclass(slots=True)
class _Entry:
    num_tokens: int
    created_s: float
    last_used_s: float
    request_id: str


@dataclass(slots=True)
class BillingCalculator:
    """Feeds requests in time order through one provider's cache and prices each one."""

    rules: ProviderRules
    breakpoints: tuple[int, ...] | None = (-1,)
    entries: dict[Hashable, _Entry] = field(default_factory=dict)
    children: dict[Hashable, dict[Hashable, tuple[int, ...]]] = field(default_factory=dict)
    model_rules: Mapping[str, ProviderRules] = field(default_factory=dict)  # by the name a request gives

    def rules_of(self, req: BillingRequest) -> ProviderRules:
        """The rules `req` is priced by: its own model's, else the chosen model's."""
        return self.model_rules.get(req.model, self.rules) if req.model is not None else self.rules

    def _alive(self, key: Hashable, t: float, notes: list[str]) -> _Entry | None:
        e = self.entries.get(key)
        if e is None:
            return None
        r = self.rules  # lifetimes are the provider's, the same for each of its models
        idle = t - e.last_used_s
        if idle > r.ttl_seconds:
            notes.append(f"the cached prefix of {e.num_tokens} tokens from request {e.request_id} expired: "
                         f"{idle:.0f} s idle is past the {r.ttl_seconds:.0f} s time to live")
        elif r.max_lifetime_seconds is not None and t - e.created_s > r.max_lifetime_seconds:
            notes.append(f"the cached prefix of {e.num_tokens} tokens from request {e.request_id} expired: "
                         f"older than the {r.max_lifetime_seconds:.0f} s maximum lifetime")
        else:
            return e
        del self.entries[key]
        return None

    def _touch(self, key: Hashable, num_tokens: int, t: float, request_id: str) -> bool:
        """Refresh or create the entry for a prefix; True when it was created."""
        e = self.entries.get(key)
        if e is not None:
            if self.rules.ttl_refreshed_on_hit:
                e.last_used_s = t
            return False
        self.entries[key] = _Entry(num_tokens, t, t, request_id)
        return True

    def bill(self, req: BillingRequest) -> dict[str, Any]:
        if self.breakpoints is None:
            return self._price(req, *self._implicit(req))
        return self._price(req, *self._explicit(req))

    def _explicit(self, req: BillingRequest) -> tuple[int, int, list[int], list[str]]:
        """Anthropic-style: reads look back from each breakpoint; writes land on breakpoints."""
        r, t, notes = self.rules_of(req), req.time_s, []
        segs = req.segments
        n = len(segs)
        ends = _cumsum(s.num_tokens for s in segs)
        bps = sorted({b if b >= 0 else n + b for b in self.breakpoints if -n <= b < n})
        lookback = r.lookback_blocks if r.lookback_blocks is not None else n
        read_j = -1
        for b in bps:
            for j in range(b, max(-1, b - lookback), -1):
                if self._alive(segs[j].key, t, notes) is not None:
                    read_j = max(read_j, j)
                    break
        if bps:
            # A longer cached prefix that no breakpoint's lookback reached is silently not read.
            for j in range(bps[-1], read_j, -1):
                if self._alive(segs[j].key, t, notes) is not None:
                    notes.append(f"a cached prefix of {ends[j]} tokens (block {j}) lies more than {lookback} blocks "
                                 f"before every breakpoint, outside the lookback: it was not read")
                    break
        read_tokens = ends[read_j] if read_j >= 0 else 0
        if read_j >= 0:
            self._touch(segs[read_j].key, ends[read_j], t, req.request_id)
        written_to = read_tokens
        for b in bps:
            if ends[b] < r.min_cacheable_tokens:
                notes.append(f"the prefix of {ends[b]} tokens at breakpoint block {b} is below the "
                             f"{r.min_cacheable_tokens}-token minimum of {r.model}: silently not cached")
                continue
            self._touch(segs[b].key, ends[b], t, req.request_id)
            if b > read_j:
                written_to = max(written_to, ends[b])
                if req.implied_boundaries:
                    for j in range(read_j + 1, b):
                        self._touch(segs[j].key, ends[j], t, req.request_id)
        if not bps:
            notes.append("no breakpoint falls inside this request: nothing is cached")
        return read_tokens, written_to - read_tokens, [ends[b] for b in bps], notes

    def _implicit(self, req: BillingRequest) -> tuple[int, int, list[int], list[str]]:
        """OpenAI-style: the longest cached prefix is read; a long enough prompt is written whole."""
        r, t, notes = self.rules_of(req), req.time_s, []
        segs = req.segments
        total = req.num_tokens
        matched, parent, j = 0, None, 0
        while j < len(segs) and self._alive(segs[j].key, t, notes) is not None:
            matched += segs[j].num_tokens
            parent = segs[j].key
            j += 1
        if j < len(segs) and segs[j].token_ids is not None:
            best = 0
            for child_key, tokens in self.children.get(parent, {}).items():
                if child_key in self.entries and self._alive(child_key, t, []) is not None:
                    best = max(best, common_prefix_length(tokens, segs[j].token_ids))
            matched += best
        cached = 0
        if matched >= r.min_cacheable_tokens:
            step = r.hit_step_tokens
            cached = r.min_cacheable_tokens + (matched - r.min_cacheable_tokens) // step * step
        elif matched:
            notes.append(f"the {matched} tokens shared with the cache are below the {r.min_cacheable_tokens}-token "
                         f"minimum of {r.model}: not read")
        written = 0
        if total < r.min_cacheable_tokens:
            notes.append(f"the prompt's {total} tokens are below the {r.min_cacheable_tokens}-token minimum of "
                         f"{r.model}: silently not cached (the API does not say so)")
        else:
            end, parent = 0, None
            for s in segs:
                end += s.num_tokens
                self._touch(s.key, end, t, req.request_id)
                if s.token_ids is not None:
                    self.children.setdefault(parent, {})[s.key] = s.token_ids
                parent = s.key
            written = total - matched
        return cached, written, [], notes

    def _price(self, req: BillingRequest, read: int, write: int, bps: list[int], notes: list[str]) -> dict[str, Any]:
        r = self.rules_of(req)
        total = req.num_tokens
        uncached = total - read - write
        weighted = uncached + write * r.write_multiplier + read * r.read_multiplier
        row: dict[str, Any] = {"id": req.request_id, "time_s": req.time_s, "prompt_tokens": total,
                               "read_tokens": read, "write_tokens": write, "uncached_tokens": uncached,
                               "usage": usage_fields(r.provider, total, read, write, uncached),
                               "weighted_tokens": round(weighted, 4),
                               "cost_usd": _usd(weighted, r.price_per_mtok),
                               "cost_without_cache_usd": _usd(total, r.price_per_mtok),
                               "breakpoint_tokens": bps, "notes": notes}
        if self.model_rules:
            row["model"] = r.model
        return row


def usage_fields(provider: str, total: int, read: int, write: int, uncached: int) -> dict[str, Any]:
    """The usage object as the provider's API would return it."""
    if provider == "anthropic":
        return {"cache_creation_input_tokens": write, "cache_read_input_tokens": read, "input_tokens": uncached}
    if provider == "openai":
        return {"prompt_tokens": total, "cached_tokens": read, "cache_write_tokens": write}
    return {"prompt_tokens": total, "prompt_tokens_details": {"cached_tokens": read}}


# A long bill reports its progress (and may be stopped) once per this many requests.
PROGRESS_EVERY = 256
Progress = Callable[[int, int], None]  # (requests done, requests in all; 0 while still reading)


def _report(progress: Progress | None, done: int, total: int) -> None:
    if progress is not None and done % PROGRESS_EVERY == 0:
        progress(done, total)


def bill(requests: Iterable[BillingRequest], rules: ProviderRules,
         breakpoints: tuple[int, ...] | None = (-1,),
         model_rules: Mapping[str, ProviderRules] | None = None,
         progress: Progress | None = None) -> dict[str, Any]:
    """Price `requests` (sorted by time, stable) through a fresh cache; the billing JSON.

    With `model_rules` (`rules_for_models`), a request naming a model is priced by that
    model's minimum, multipliers and price, and the JSON adds a subtotal per model; a
    request naming none is priced by `rules`. Without, every request is priced by `rules`.
    `progress(done, total)` is called every `PROGRESS_EVERY` requests billed, on the
    caller's thread; an exception it raises stops the bill there (a panel's Cancel)."""
    calc = BillingCalculator(rules, breakpoints, model_rules=dict(model_rules or {}))
    ordered = sorted(enumerate(requests), key=lambda ir: (ir[1].time_s, ir[0]))
    rows, priced_by = [], []
    for index, req in ordered:
        row = calc.bill(req)
        row["index"] = index
        rows.append(row)
        priced_by.append(calc.rules_of(req))
        _report(progress, len(rows), len(ordered))
    tot = _totals(rows, rules)
    out = {"provider": rules.provider, "model": rules.model, "rules": rules.to_dict(),
           "breakpoints": "implicit" if breakpoints is None else list(breakpoints),
           "requests": rows, "totals": tot}
    if model_rules:
        groups: dict[str, tuple[ProviderRules, list[dict[str, Any]]]] = {}
        for row, r in zip(rows, priced_by):
            groups.setdefault(r.model, (r, []))[1].append(row)
        out["models"] = {name: {"rules": r.to_dict(), "totals": _totals(group, r)}
                         for name, (r, group) in sorted(groups.items())}
        subtotals = [m["totals"] for m in out["models"].values()]
        for key in ("cost_usd", "cost_without_cache_usd"):
            parts = [m[key] for m in subtotals]
            tot[key] = None if any(v is None for v in parts) else round(sum(parts), 8)
        tot["savings_usd"] = (None if tot["cost_usd"] is None
                              else round(tot["cost_without_cache_usd"] - tot["cost_usd"], 8))
        out["model"] = "per request"
    return out


def _totals(rows: list[dict[str, Any]], rules: ProviderRules) -> dict[str, Any]:
    tot = {k: sum(row[k] for row in rows) for k in ("prompt_tokens", "read_tokens", "write_tokens", "uncached_tokens")}
    weighted = sum(row["weighted_tokens"] for row in rows)
    tot["requests"] = len(rows)
    tot["weighted_tokens"] = round(weighted, 4)
    tot["usage"] = usage_fields(rules.provider, tot["prompt_tokens"], tot["read_tokens"], tot["write_tokens"],
                                tot["uncached_tokens"])
    tot["cost_usd"] = _usd(weighted, rules.price_per_mtok)
    tot["cost_without_cache_usd"] = _usd(tot["prompt_tokens"], rules.price_per_mtok)
    tot["savings_usd"] = (None if tot["cost_usd"] is None
                          else round(tot["cost_without_cache_usd"] - tot["cost_usd"], 8))
    tot["savings_fraction"] = round(1 - weighted / tot["prompt_tokens"], 6) if tot["prompt_tokens"] else 0.0
    tot["num_notes"] = sum(len(row["notes"]) for row in rows)
    return tot


def _usd(weighted_tokens: float, price: float | None) -> float | None:
    return None if price is None else round(weighted_tokens * price / 1e6, 8)


def _cumsum(values: Iterable[int]) -> list[int]:
    out, acc = [], 0
    for v in values:
        acc += v
        out.append(acc)
    return out


def chain_segments(parts: Sequence[tuple[str, Sequence[int]]], salt: str | None = None) -> tuple[Segment, ...]:
    """Content blocks from (label, token ids) pairs; each key digests every block before it."""
    out = []
    digest = hashlib.blake2b(repr(salt).encode(), digest_size=16).digest()
    for label, tokens in parts:
        ids = tuple(int(t) for t in tokens)
        digest = hashlib.blake2b(digest + array("q", ids).tobytes(), digest_size=16).digest()
        out.append(Segment(digest, len(ids), ids, label))
    return tuple(out)


# ---- building requests from files -------------------------------------------------------

_MOD = (1 << 61) - 1
_BASE = 1_000_003


def _prefix_hashes(tokens: Iterable[int]) -> array:
    # 8 bytes a token in an array, not a 32-byte int each in a list: a 50 MB line is 8M tokens.
    out, h = array("q", [0]), 0
    for tok in tokens:
        h = (h * _BASE + tok + 1) % _MOD
        out.append(h)
    return out


def requests_from_trace(trace: Iterable[Any], block_size: int = MOONCAKE_BLOCK_SIZE,
                        time_scale: float = 1000.0, progress: Progress | None = None) -> list[BillingRequest]:
    """Billing requests from `engine.core.trace.TraceRequest`s; timestamps are milliseconds
    (`time_scale` 1000; a kv-cache-tester trace gives seconds: 1). A request's model, when it
    has one, keys its blocks (a cache is keyed to its model).

    A trace has no message boundaries, so a token-level request is cut where an earlier
    request's prompt (or prompt plus output) ended: that is where a conversation's turns
    meet. A Mooncake request is cut into its 512-token hash blocks; its partial last block
    has its own id, so a later turn can only be matched on whole blocks (an underestimate
    of at most 511 tokens per read). `progress(read, 0)` as in `bill`, every
    `PROGRESS_EVERY` requests read.
    """
    known: dict[int, set[int]] = {}
    out = []
    for tr in trace:
        t = (tr.timestamp or 0) / time_scale
        model = getattr(tr, "model", None)
        if tr.hash_ids is not None:
            segs, left = [], tr.input_length
            for i, hid in enumerate(tr.hash_ids):
                n = min(block_size, left) if i < len(tr.hash_ids) - 1 else left
                if n <= 0:
                    break
                key = ("mooncake", tr.tenant, i, hid) if model is None else ("mooncake", tr.tenant, model, i, hid)
                segs.append(Segment(key, n, None, f"block {i}"))
                left -= n
            out.append(BillingRequest(tr.id, tuple(segs), t, implied_boundaries=True, model=model))
            _report(progress, len(out), 0)
            continue
        tokens = tr.tokens
        hashes = _prefix_hashes(chain(tokens, tr.output_tokens or ()))
        n = len(tokens)
        cuts = sorted(L for L, seen in known.items() if 0 < L < n and hashes[L] in seen) + [n]
        segs, start = [], 0
        for end in cuts:
            segs.append(Segment(("tokens", tr.tenant, end, hashes[end]), end - start, tuple(tokens[start:end]),
                                f"tokens {start}-{end}"))
            start = end
        out.append(BillingRequest(tr.id, tuple(segs), t, model=model))
        for end in {n, len(hashes) - 1}:
            known.setdefault(end, set()).add(hashes[end])
        _report(progress, len(out), 0)
    return out


def requests_from_conversations(conversations: Iterable[Any], tokenizer: Any,
                                turn_gap_s: float = 0.0) -> list[BillingRequest]:
    """One request per user turn, each message one content block, tokens from `tokenizer`.

    Token counts are an approximation: each message as the bundled model's chat template
    frames it, not the provider's own tokenizer (which the APIs do not publish).
    """
    out, clock = [], 0.0
    for ci, conv in enumerate(conversations):
        msgs = messages_of(conv)
        spans = message_spans(tokenizer, msgs)
        segs = chain_segments([(f"{i}:{m['role']}", span) for i, (m, span) in enumerate(zip(msgs, spans))])
        cid = getattr(conv, "id", None) or getattr(conv, "conversation_id", None) or str(ci)
        for k, m in enumerate(msgs):
            if m["role"] == "user":
                out.append(BillingRequest(f"{cid}/{k}", segs[:k + 1], clock))
                clock += turn_gap_s
    return out


def load_billing_requests(source: str, db: str | None = None, turn_gap_s: float = 0.0,
                          model: str | None = None,
                          progress: Progress | None = None) -> tuple[list[BillingRequest], str]:
    """Requests of a file or a stored session id ("7" or "session:7"), and where counts come
    from. A trace's `progress` is `requests_from_trace`'s (a conversation is tokenised whole)."""
    path = Path(source)
    m = re.fullmatch(r"(?:session:)?(\d+)", source)
    if not path.exists() and m:
        from engine.store.database import Store

        from engine.store.sessions import session_requests

        with Store(db, read_only=True) as store:
            info = store.get_session(int(m.group(1)))
            if info.kind == "trace" and info.settings.get("source_format") == WEKA_FORMAT:
                # an imported kv-cache-tester trace: its models (kept in the settings), its
                # block size, and its times in seconds, as billing the file reads them
                trace, _ = session_requests(store, info)
                block_size = info.settings.get("block_size")
                if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
                    block_size = info.block_size
                return (requests_from_trace(trace, block_size, time_scale=1.0, progress=progress),
                        f"kv-cache-tester token counts ({block_size}-token blocks, keyed by model); t in seconds")
            if info.kind == "trace":
                return requests_from_trace(store.trace_requests(info.id), progress=progress), "trace token counts"
            convs = [[{"role": r.role, "content": r.content} for r in store.messages(info.id)]]
    elif not os.path.lexists(path):
        raise InputError(f"{validation.show_path(source)}: no such file or stored session")
    elif path.is_dir() or (validation.check_regular_file(path, "trace or conversation file")
                           and file_kind(path) == WEKA_FORMAT):
        from engine.store.weka import load_weka, merged_requests, to_trace_requests

        traces = load_weka(path)
        reqs = to_trace_requests(merged_requests(traces), {t.id: t.hash_id_scope for t in traces})
        return (requests_from_trace(reqs, traces[0].block_size, time_scale=1.0, progress=progress),
                f"kv-cache-tester token counts ({traces[0].block_size}-token blocks, keyed by model); t in seconds")
    elif is_request_trace(path):
        from engine.core.trace import read_trace

        # Streamed: each line is dropped once it is billed, so the trace is not held twice.
        return (requests_from_trace(read_trace(path), progress=progress),
                "trace token counts; timestamps read as milliseconds")
    else:
        convs = load_conversation_file(path)
    from engine.model.loader import load_tokenizer

    reqs = requests_from_conversations(convs, load_tokenizer(model), turn_gap_s)
    if not reqs:
        raise InputError(f"{source}: the conversation holds no user message, so nothing is billed")
    return reqs, ("approximate: the bundled SmolLM2 tokenizer with ChatML framing per message, "
                  "not the provider's own tokenizer")
