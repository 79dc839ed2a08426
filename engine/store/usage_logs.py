"""Request/response logs that carry usage: what a provider or server actually cached.

Read here, one `UsageEntry` per request, in the shapes the APIs produce them:
- the OpenAI Batch API's input file (`{custom_id, method, url, body}` lines) with its output
  file (`{id, custom_id, response: {status_code, request_id, body}, error}` lines), matched
  by `custom_id`;
- Anthropic Message Batches: the requests (`{custom_id, params}` lines, or the create body
  `{"requests": [...]}`) with the results (`{custom_id, result: {type, message}}` lines, in
  any order);
- JSONL of `{"request", "response"}` pairs from either API, including vLLM's OpenAI server
  (`usage.prompt_tokens_details.cached_tokens` with `--enable-prompt-tokens-details`).
What is predicted for them lives in `engine.analysis.usage`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from engine.core import validation as v
from engine.core.errors import TraceError
from engine.core.trace import MAX_LINE_BYTES

APIS = ("openai", "anthropic", "vllm")
MAX_FILE_BYTES = v.MAX_FILE_BYTES
MAX_ENTRIES = 1_000_000


@dataclass(slots=True)
class UsageEntry:
    """One request with what the API reported for it. Token counts are the provider's own.

    `cached_tokens` were read from the cache; `written_tokens` were written to it (Anthropic's
    `cache_creation_input_tokens`; None where the API does not report writes); `prompt_tokens`
    is every input token, cached or not."""

    id: str
    api: str  # openai | anthropic | vllm
    model: str | None
    line: int
    messages: list[dict[str, str]]  # role and text, system first when there is one
    tools: list[Any] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # request fields that render into the prompt
    time_s: float | None = None  # the response's `created` (seconds), when the API gives it
    prompt_tokens: int = 0
    cached_tokens: int = 0
    written_tokens: int | None = None
    output_tokens: int = 0
    output_text: str = ""
    finish_reason: str | None = None
    error: str | None = None  # the batch says this request failed: it has no usage to compare

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens - (self.written_tokens or 0)

    def observed(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "written_tokens": self.written_tokens, "uncached_tokens": self.uncached_tokens,
                "output_tokens": self.output_tokens}


# ---------------------------------------------------------------------------- reading lines
def _documents(path: str | Path) -> Iterator[tuple[int, Any]]:
    """The JSON values of a JSONL file (or a file holding one JSON document), bounded."""
    name = str(path)
    data = v.read_bytes(path, "usage log", MAX_FILE_BYTES)
    if not data.strip():
        raise TraceError(name, None, None, "the file is empty")
    stripped = data.lstrip()
    if stripped[:1] in (b"{", b"[") and b"\n" in data.strip():
        try:  # one pretty-printed document
            yield 1, v.loads(data, name, 1)
            return
        except TraceError:
            pass
    count = 0
    for no, raw in enumerate(data.split(b"\n"), start=1):
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(name, no, None, f"line is longer than {MAX_LINE_BYTES} bytes")
        if not raw.strip():
            continue
        count += 1
        if count > MAX_ENTRIES:
            raise TraceError(name, no, None, f"more than {MAX_ENTRIES:,} requests; split the log")
        yield no, v.loads(raw.removeprefix(b"\xef\xbb\xbf") if no == 1 else raw, name, no)


def _obj(value: Any, name: str, line: int | None, fld: str | None) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TraceError(name, line, fld, f"expected an object, got {v._type(value)}")
    return value


def _count(obj: dict[str, Any], key: str, name: str, line: int, fld: str, required: bool = True) -> int | None:
    if key not in obj or obj[key] is None:
        if required:
            raise TraceError(name, line, fld, "missing; the usage needs it to compare with what was predicted")
        return None
    return v.integer(obj[key], name, line, fld, 0, v.MAX_TOKENS)


def _text(content: Any, name: str, line: int, fld: str) -> str:
    """The text of a message's content: a string, or the text of its parts (OpenAI
    `{"type": "text", "text"}`, Anthropic text / tool_use / tool_result blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TraceError(name, line, fld, f"expected a string or a list of content parts, got {v._type(content)}")
    parts = []
    for i, part in enumerate(content):
        p = _obj(part, name, line, f"{fld}[{i}]")
        kind = p.get("type")
        if kind in ("text", "input_text", "output_text"):
            if not isinstance(p.get("text"), str):
                raise TraceError(name, line, f"{fld}[{i}].text", "expected a string")
            parts.append(p["text"])
        elif kind == "tool_use":
            parts.append(f"[tool_use {p.get('name')}: {_canonical(p.get('input'))}]")
        elif kind == "tool_result":
            parts.append(f"[tool_result {p.get('tool_use_id')}: {_text(p.get('content'), name, line, f'{fld}[{i}].content')}]")
        elif kind in ("image", "image_url", "input_image", "document"):
            parts.append(f"[{kind}]")
        elif kind == "thinking":
            parts.append(str(p.get("thinking", "")))
        else:
            raise TraceError(name, line, f"{fld}[{i}].type", f"unknown content part {kind!r}"[:120])
    return "\n".join(parts)


def _canonical(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _messages(raw: Any, name: str, line: int, fld: str) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise TraceError(name, line, fld, "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(raw):
        m = _obj(m, name, line, f"{fld}[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise TraceError(name, line, f"{fld}[{i}].role", f"expected a role such as 'user', got {role!r}"[:120])
        text = _text(m.get("content"), name, line, f"{fld}[{i}].content")
        if m.get("tool_calls"):
            text += "\n" + _canonical(m["tool_calls"])
        out.append({"role": "user" if role == "tool" else role, "content": text})
    return out


# Request fields that change what is rendered into the prompt (a change to one is a "changed
# setting"); sampling fields such as temperature do not.
_PROMPT_SETTINGS = ("tool_choice", "response_format", "reasoning_effort", "thinking", "system")


def _request(body: Any, api: str, name: str, line: int, fld: str) -> tuple[str | None, list[dict[str, str]],
                                                                          list[Any], dict[str, Any]]:
    b = _obj(body, name, line, fld)
    model = b.get("model")
    if model is not None and not isinstance(model, str):
        raise TraceError(name, line, f"{fld}.model", f"expected a string, got {v._type(model)}")
    messages = _messages(b.get("messages"), name, line, f"{fld}.messages")
    if api == "anthropic" and b.get("system") is not None:
        messages = [{"role": "system", "content": _text(b["system"], name, line, f"{fld}.system")}] + messages
    tools = b.get("tools") or []
    if not isinstance(tools, list):
        raise TraceError(name, line, f"{fld}.tools", f"expected a list, got {v._type(tools)}")
    settings = {k: b[k] for k in _PROMPT_SETTINGS if k in b and k != "system"}
    return model, messages, tools, settings


def _openai_response(body: Any, entry: UsageEntry, name: str, line: int, fld: str) -> None:
    b = _obj(body, name, line, fld)
    usage = _obj(b.get("usage"), name, line, f"{fld}.usage")
    entry.prompt_tokens = _count(usage, "prompt_tokens", name, line, f"{fld}.usage.prompt_tokens") or 0
    details = usage.get("prompt_tokens_details")
    cached = 0
    if details is not None:
        cached = _count(_obj(details, name, line, f"{fld}.usage.prompt_tokens_details"), "cached_tokens", name, line,
                        f"{fld}.usage.prompt_tokens_details.cached_tokens", required=False) or 0
    if cached > entry.prompt_tokens:
        raise TraceError(name, line, f"{fld}.usage.prompt_tokens_details.cached_tokens",
                         f"{cached} cached tokens are more than the {entry.prompt_tokens} prompt tokens")
    entry.cached_tokens = cached
    entry.output_tokens = _count(usage, "completion_tokens", name, line, f"{fld}.usage.completion_tokens",
                                 required=False) or 0
    if b.get("created") is not None:
        entry.time_s = v.number(b["created"], name, line, f"{fld}.created", 0)
    if b.get("model") is not None and entry.model is None and isinstance(b["model"], str):
        entry.model = b["model"]
    choices = b.get("choices") or []
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        msg = choices[0].get("message") or {}
        entry.output_text = msg.get("content") or "" if isinstance(msg, dict) else ""
        entry.finish_reason = choices[0].get("finish_reason")
    if "prompt_logprobs" in b or "kv_transfer_params" in b:  # fields only vLLM's server sends
        entry.api = "vllm"


def _anthropic_message(body: Any, entry: UsageEntry, name: str, line: int, fld: str) -> None:
    b = _obj(body, name, line, fld)
    usage = _obj(b.get("usage"), name, line, f"{fld}.usage")
    uncached = _count(usage, "input_tokens", name, line, f"{fld}.usage.input_tokens") or 0
    read = _count(usage, "cache_read_input_tokens", name, line, f"{fld}.usage.cache_read_input_tokens",
                  required=False) or 0
    written = _count(usage, "cache_creation_input_tokens", name, line, f"{fld}.usage.cache_creation_input_tokens",
                     required=False) or 0
    entry.prompt_tokens = uncached + read + written
    entry.cached_tokens = read
    entry.written_tokens = written
    entry.output_tokens = _count(usage, "output_tokens", name, line, f"{fld}.usage.output_tokens", required=False) or 0
    if isinstance(b.get("model"), str) and entry.model is None:
        entry.model = b["model"]
    content = b.get("content")
    entry.output_text = _text(content, name, line, f"{fld}.content") if content is not None else ""
    entry.finish_reason = b.get("stop_reason")


def _api_of_pair(req: dict[str, Any], resp: dict[str, Any]) -> str:
    if resp.get("type") == "message" or (isinstance(resp.get("usage"), dict) and "input_tokens" in resp["usage"]):
        return "anthropic"
    return "openai"


# ---------------------------------------------------------------------------- the shapes
def _pairs(docs: list[tuple[int, Any]], name: str) -> list[UsageEntry]:
    out = []
    for i, (line, doc) in enumerate(docs):
        d = _obj(doc, name, line, None)
        for key in ("request", "response"):
            if key not in d:
                raise TraceError(name, line, key, "missing; each line is one {\"request\", \"response\"} pair")
        req = _obj(d["request"], name, line, "request")
        resp = _obj(d["response"], name, line, "response")
        api = _api_of_pair(req, resp)
        model, messages, tools, settings = _request(req, api, name, line, "request")
        rid = resp.get("id") if isinstance(resp.get("id"), str) else str(i)
        entry = UsageEntry(rid, api, model, line, messages, tools, settings)
        if isinstance(d.get("time"), (int, float)) and not isinstance(d.get("time"), bool):
            entry.time_s = v.number(d["time"], name, line, "time", 0)
        (_anthropic_message if api == "anthropic" else _openai_response)(resp, entry, name, line, "response")
        out.append(entry)
    return out


def _custom_id(d: dict[str, Any], name: str, line: int) -> str:
    cid = d.get("custom_id")
    if not isinstance(cid, str) or not cid:
        raise TraceError(name, line, "custom_id", f"expected a non-empty string, got {cid!r}"[:120])
    return cid


def _batch(inputs: list[tuple[int, Any]], outputs: list[tuple[int, Any]], in_name: str, out_name: str,
           api: str) -> list[UsageEntry]:
    """Requests of a batch in input order, each with its result (matched by custom_id)."""
    results: dict[str, tuple[int, dict[str, Any]]] = {}
    for line, doc in outputs:
        d = _obj(doc, out_name, line, None)
        cid = _custom_id(d, out_name, line)
        if cid in results:
            raise TraceError(out_name, line, "custom_id", f"{cid!r} has two results")
        results[cid] = (line, d)
    out, seen = [], set()
    for line, doc in inputs:
        d = _obj(doc, in_name, line, None)
        cid = _custom_id(d, in_name, line)
        if cid in seen:
            raise TraceError(in_name, line, "custom_id", f"{cid!r} is used by two requests; batch ids are unique")
        seen.add(cid)
        body = d.get("params") if api == "anthropic" else d.get("body")
        model, messages, tools, settings = _request(body, api, in_name, line, "params" if api == "anthropic" else "body")
        if cid not in results:
            raise TraceError(in_name, line, "custom_id", f"{cid!r} has no result in {out_name}")
        rline, res = results.pop(cid)
        entry = UsageEntry(cid, api, model, line, messages, tools, settings)
        if api == "anthropic":
            r = _obj(res.get("result"), out_name, rline, "result")
            if r.get("type") != "succeeded":
                err = r.get("error") if isinstance(r.get("error"), dict) else {}
                inner = err.get("error") if isinstance(err.get("error"), dict) else err
                entry.error = f"{r.get('type')}: {inner.get('message', '')}".strip().rstrip(":")
                out.append(entry)
                continue
            _anthropic_message(r.get("message"), entry, out_name, rline, "result.message")
        else:
            if res.get("error") is not None or not isinstance(res.get("response"), dict):
                err = res.get("error") if isinstance(res.get("error"), dict) else {}
                entry.error = f"error: {err.get('message', 'no response')}"
                out.append(entry)
                continue
            resp = res["response"]
            status = resp.get("status_code")
            if status != 200:
                entry.error = f"HTTP {status}"
                out.append(entry)
                continue
            _openai_response(resp.get("body"), entry, out_name, rline, "response.body")
        out.append(entry)
    if results:
        cid, (rline, _) = next(iter(results.items()))
        raise TraceError(out_name, rline, "custom_id", f"{cid!r} matches no request in {in_name}")
    return out


def _shape(docs: list[tuple[int, Any]]) -> str:
    first = docs[0][1]
    if not isinstance(first, dict):
        return "unknown"
    if "request" in first and "response" in first:
        return "pairs"
    if "custom_id" in first and "params" in first:
        return "anthropic-requests"
    if "custom_id" in first and "result" in first:
        return "anthropic-results"
    if "custom_id" in first and "body" in first and "method" in first:
        return "openai-input"
    if "custom_id" in first and "response" in first:
        return "openai-output"
    if isinstance(first.get("requests"), list) and len(docs) == 1:
        return "anthropic-create"
    return "unknown"


def read_usage_log(*paths: str | Path) -> list[UsageEntry]:
    """The requests of a usage log: one file of pairs, or a batch's two files (either order)."""
    if not paths or len(paths) > 2:
        raise TraceError("usage log", None, None, "give one log of request/response pairs, or a batch's two files")
    loaded = []
    for p in paths:
        docs = list(_documents(p))
        shape = _shape(docs)
        if shape == "anthropic-create":
            docs = [(docs[0][0], r) for r in docs[0][1]["requests"]]
            shape = "anthropic-requests"
        loaded.append((str(p), docs, shape))
    if len(loaded) == 1:
        name, docs, shape = loaded[0]
        if shape != "pairs":
            hint = {"openai-input": "an OpenAI batch input file: give its output file too",
                    "openai-output": "an OpenAI batch output file: give its input file too",
                    "anthropic-requests": "Anthropic batch requests: give the results file too",
                    "anthropic-results": "Anthropic batch results: give the requests file too"}.get(shape)
            raise TraceError(name, docs[0][0], None, hint or "not a usage log: expected {\"request\", \"response\"} "
                             "lines, or a batch's requests and results")
        entries = _pairs(docs, name)
    else:
        by_shape = {shape: (name, docs) for name, docs, shape in loaded}
        if set(by_shape) == {"openai-input", "openai-output"}:
            (in_name, ins), (out_name, outs) = by_shape["openai-input"], by_shape["openai-output"]
            entries = _batch(ins, outs, in_name, out_name, "openai")
        elif set(by_shape) == {"anthropic-requests", "anthropic-results"}:
            (in_name, ins), (out_name, outs) = by_shape["anthropic-requests"], by_shape["anthropic-results"]
            entries = _batch(ins, outs, in_name, out_name, "anthropic")
        else:
            raise TraceError(loaded[0][0], None, None, "the two files are not one batch's requests and results "
                             f"(found {loaded[0][2]} and {loaded[1][2]})")
    if not entries:
        raise TraceError(str(paths[0]), None, None, "the log holds no requests")
    return entries


def looks_like_usage_log(path: str | Path) -> bool:
    """True when the first line of `path` is a request/response pair or a batch line (what
    File > Open asks before taking a JSONL file for a conversation). Reads one line, bounded."""
    try:
        with Path(path).open("rb") as fh:
            raw = fh.readline(MAX_LINE_BYTES + 1)
    except OSError:
        return False
    if not raw.strip() or len(raw) > MAX_LINE_BYTES:
        return False
    try:
        first = v.loads(raw.removeprefix(b"\xef\xbb\xbf"), str(path), 1)
    except TraceError:
        return False
    return _shape([(1, first)]) not in ("unknown", "anthropic-create")
