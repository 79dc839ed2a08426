"""The exact response cache: a finished response keyed by the SHA-256 of the canonical request.

Canonical request = model, rendered messages (or prompt token ids) and sampling settings as
canonical JSON, so a hit means a byte-identical request and costs no model work at all.
Similarity-based reuse is `engine.semantic.cache`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from engine.core.errors import InputError

# Sampling settings that change the output; anything else in a request is not part of it.
SAMPLING_DEFAULTS: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 32,
                                     "seed": None, "repetition_penalty": 1.0, "stop": None}


def _canonical_value(value: Any, where: str) -> Any:
    if isinstance(value, str):
        # NFC so that the same text typed two ways is the same request.
        return unicodedata.normalize("NFC", value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {str(k): _canonical_value(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise InputError(f"{where} has a value of type {type(value).__name__}, which a request cannot contain")


def canonical_request(model: str, messages: Sequence[Mapping[str, Any]] | None = None, *,
                      prompt_token_ids: Sequence[int] | None = None,
                      sampling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The request as a canonical dict: sampling defaults filled in, numbers normalised."""
    if not isinstance(model, str):
        raise InputError("the model of a request must be a string")
    if (messages is None) == (prompt_token_ids is None):
        raise InputError("a request needs either messages or prompt token ids")
    settings = dict(SAMPLING_DEFAULTS)
    for key, value in (sampling or {}).items():
        if key not in SAMPLING_DEFAULTS:
            raise InputError(f"unknown sampling setting {key!r}; known: {', '.join(SAMPLING_DEFAULTS)}")
        settings[key] = value
    out: dict[str, Any] = {"model": model, "sampling": _canonical_value(settings, "sampling")}
    if messages is not None:
        rendered = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or "content" not in m:
                raise InputError(f"message {i} needs a 'role' and a 'content'")
            rendered.append(_canonical_value(dict(m), f"messages[{i}]"))
        out["messages"] = rendered
    else:
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt_token_ids):
            raise InputError("prompt token ids must be whole numbers")
        out["prompt_token_ids"] = list(prompt_token_ids)
    return out


def canonical_json(request: Mapping[str, Any]) -> bytes:
    return json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def request_key(model: str, messages: Sequence[Mapping[str, Any]] | None = None, *,
                prompt_token_ids: Sequence[int] | None = None, sampling: Mapping[str, Any] | None = None) -> str:
    """Hex SHA-256 of the canonical JSON of the request."""
    request = canonical_request(model, messages, prompt_token_ids=prompt_token_ids, sampling=sampling)
    return hashlib.sha256(canonical_json(request)).hexdigest()


def is_deterministic(sampling: Mapping[str, Any] | None) -> bool:
    """Greedy decoding, or sampling with a fixed seed: the same request gives the same text."""
    settings = {**SAMPLING_DEFAULTS, **(sampling or {})}
    return float(settings["temperature"]) == 0.0 or settings["seed"] is not None


@dataclass(slots=True, frozen=True)
class ResponseEntry:
    key: str
    model: str
    response: str
    created: float
    last_hit: float | None
    hits: int

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "model": self.model, "response": self.response, "created": self.created,
                "last_hit": self.last_hit, "hits": self.hits}


@dataclass(slots=True, frozen=True)
class ResponseLookup:
    key: str
    hit: bool
    response: str | None


class ResponseCache:
    """Byte-identical requests answered from storage. Thread-safe.

    `store` (an `engine.store.database.Store`) persists entries in `response_entries`; None keeps
    them in memory. Non-deterministic requests (temperature > 0 without a seed) are looked
    up but never stored unless `cache_sampled` is set, since a repeat should sample anew.
    """

    def __init__(self, store: Any = None, *, max_entries: int | None = None, cache_sampled: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        if max_entries is not None and max_entries < 1:
            raise InputError("the maximum number of entries must be at least 1")
        self.store = store
        self.max_entries = max_entries
        self.cache_sampled = cache_sampled
        self.clock = clock
        self.num_lookups = 0
        self.num_hits = 0
        self._lock = threading.RLock()
        self._entries: OrderedDict[str, ResponseEntry] = OrderedDict()  # least recently used first
        self._tables = store.semantic if store is not None else None
        self._persist = store is not None and not store.read_only
        if store is not None:
            for row in self._tables.response_rows():
                self._entries[row[0]] = ResponseEntry(*row)
            self._evict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def repeat_rate(self) -> float:
        """Share of lookups that were byte-identical repeats of a stored request."""
        return self.num_hits / self.num_lookups if self.num_lookups else 0.0

    def entries(self) -> list[ResponseEntry]:
        with self._lock:
            return list(self._entries.values())

    def lookup(self, model: str, messages: Sequence[Mapping[str, Any]] | None = None, *,
               prompt_token_ids: Sequence[int] | None = None, sampling: Mapping[str, Any] | None = None) -> ResponseLookup:
        key = request_key(model, messages, prompt_token_ids=prompt_token_ids, sampling=sampling)
        with self._lock:
            self.num_lookups += 1
            entry = self._entries.get(key)
            if entry is None:
                return ResponseLookup(key, False, None)
            self.num_hits += 1
            now = self.clock()
            self._entries[key] = ResponseEntry(key, entry.model, entry.response, entry.created, now, entry.hits + 1)
            self._entries.move_to_end(key)
            if self._persist:
                self._tables.touch_response(key, now)
            return ResponseLookup(key, True, entry.response)

    def put(self, model: str, response: str, messages: Sequence[Mapping[str, Any]] | None = None, *,
            prompt_token_ids: Sequence[int] | None = None, sampling: Mapping[str, Any] | None = None) -> str | None:
        """Store `response` for the request; returns its key, or None if it is not cacheable."""
        if not isinstance(response, str):
            raise InputError("a cached response must be a string")
        if not self.cache_sampled and not is_deterministic(sampling):
            return None
        request = canonical_request(model, messages, prompt_token_ids=prompt_token_ids, sampling=sampling)
        data = canonical_json(request)
        key = hashlib.sha256(data).hexdigest()
        with self._lock:
            now = self.clock()
            self._entries[key] = ResponseEntry(key, model, response, now, None, 0)
            self._entries.move_to_end(key)
            if self._persist:
                self._tables.put_response(key, model, data.decode("utf-8"), response, now)
            self._evict()
        return key

    def get_or_compute(self, model: str, messages: Sequence[Mapping[str, Any]], compute: Callable[[], str], *,
                       sampling: Mapping[str, Any] | None = None) -> tuple[str, bool]:
        """(response, hit): a hit does no model work; a miss calls `compute()` and stores it."""
        found = self.lookup(model, messages, sampling=sampling)
        if found.hit:
            return found.response or "", True
        response = compute()
        self.put(model, response, messages, sampling=sampling)
        return response, False

    def _evict(self) -> None:
        if self.max_entries is None:
            return
        while len(self._entries) > self.max_entries:
            key, _ = self._entries.popitem(last=False)
            if self._persist:
                self._tables.remove_response(key)


def repeat_rate(requests: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Byte-identical repeats in a stream of requests ({"model", "messages", "sampling"}).

    What an exact response cache with unbounded size would have served: the first
    occurrence of each canonical request misses, every later copy hits.
    """
    seen: set[str] = set()
    num = num_repeats = 0
    for i, r in enumerate(requests):
        if not isinstance(r, Mapping):
            raise InputError(f"request {i} is not an object")
        key = request_key(str(r.get("model", "")), r.get("messages"), prompt_token_ids=r.get("prompt_token_ids"),
                          sampling=r.get("sampling"))
        num += 1
        if key in seen:
            num_repeats += 1
        seen.add(key)
    return {"requests": num, "unique": len(seen), "repeats": num_repeats,
            "repeat_rate": num_repeats / num if num else 0.0}


def conversation_requests(conversations: Iterable[Any], model: str = "") -> list[dict[str, Any]]:
    """The requests a client would send for imported conversations (`engine.store.formats`).

    A chat sends, for each user turn, every message up to and including it; a token-level
    trace sends each request's token ids. Block-level (Mooncake) requests have no content
    and are skipped: their repeats are prefix-cache hits, not byte-identical requests.
    """
    out: list[dict[str, Any]] = []
    for conv in conversations:
        settings = dict(getattr(conv, "settings", None) or {})
        sampling = {k: v for k, v in settings.items() if k in SAMPLING_DEFAULTS}
        if "max_tokens" in settings and "max_new_tokens" not in sampling:
            sampling["max_new_tokens"] = settings["max_tokens"]
        conv_model = str(settings.get("model") or model)
        if getattr(conv, "kind", "chat") == "trace":
            for r in conv.trace or []:
                if r.tokens is not None:
                    out.append({"model": conv_model, "prompt_token_ids": list(r.tokens), "sampling": sampling})
            continue
        messages = [{"role": m.role, "content": m.content} for m in conv.messages]
        for i, m in enumerate(messages):
            if m["role"] == "user":
                out.append({"model": conv_model, "messages": messages[: i + 1], "sampling": sampling})
    return out
