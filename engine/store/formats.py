"""Reading conversations and traces for import: OpenAI `messages`, ShareGPT, Anthropic
Messages bodies, MT-bench questions, token-level and Mooncake JSONL, and Cachescope
session files. Parsing only: every problem is a `TraceError` naming file, line and field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core import validation as v
from engine.core.errors import InputError, TraceError
from engine.core.hashing import HASH_NAMES
from engine.core.sniff import document_format
from engine.core.trace import MAX_LINE_BYTES, MOONCAKE_BLOCK_SIZE, TraceRequest, parse_trace_line

FORMATS = ("openai", "sharegpt", "anthropic", "mt-bench", "tokens", "mooncake", "cachescope", "weka")
MAX_FILE_BYTES = v.MAX_FILE_BYTES

OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                  "system": "system", "tool": "tool", "observation": "tool", "function_response": "tool",
                  "function_call": "assistant"}
_MEDIA_PLACEHOLDERS = {"image_url": "[image]", "input_image": "[image]", "image": "[image]",
                       "input_audio": "[audio]", "file": "[file]", "document": "[document]"}


@dataclass(slots=True, frozen=True)
class Message:
    """One message: `content` is the text the chat template renders; `extra` keeps the
    structure the text was flattened from (content blocks, tool calls). `position` and
    `version` are set by session files, which carry the edit history."""

    role: str
    content: str
    extra: dict[str, Any] | None = None
    position: int | None = None
    version: int = 1
    created: str | None = None


@dataclass(slots=True)
class Conversation:
    """One importable unit: a chat (messages) or a whole trace file (requests)."""

    title: str
    format: str
    kind: str = "chat"  # chat | trace
    messages: list[Message] = field(default_factory=list)
    trace: list[TraceRequest] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    line: int | None = None


def load_conversations(path: str | Path, format: str | None = None,
                       max_line_bytes: int = MAX_LINE_BYTES) -> list[Conversation]:
    """Parse every conversation in `path`; the format is detected unless given."""
    name = str(path)
    if format is not None and format not in FORMATS:
        raise InputError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    p = Path(path)
    docs = _parse_text(_file_text(p, name, max_line_bytes), name)
    fmt = format or detect_format(docs, name)
    stem = p.name.split(".")[0] or p.name
    if fmt in ("tokens", "mooncake"):
        return [_trace_conversation(docs, name, fmt, stem)]
    if fmt == "weka":
        from engine.store.weka import weka_conversation

        title, requests, settings, line = weka_conversation(docs, name)
        return [Conversation(title, fmt, "trace", [], requests, settings, line)]
    if fmt == "openai" and isinstance(docs[0][1], dict) and "role" in docs[0][1] and "messages" not in docs[0][1]:
        docs = [(docs[0][0], {"messages": [d for _, d in docs]})]  # a bare list of messages
    parse = {"openai": _openai, "sharegpt": _sharegpt, "anthropic": _anthropic,
             "mt-bench": _mt_bench, "cachescope": _session_file}[fmt]
    out = []
    for i, (line, obj) in enumerate(docs):
        if not isinstance(obj, dict):
            raise TraceError(name, line, None, f"expected a JSON object, got {_type(obj)}")
        conv = parse(obj, name, line)
        conv.line = line
        if not conv.title:
            conv.title = f"{stem} #{i + 1}" if len(docs) > 1 else stem
        out.append(conv)
    return out


# ---------------------------------------------------------------------------- reading JSON
def read_documents(data: bytes, name: str, max_line_bytes: int = MAX_LINE_BYTES) -> list[tuple[int, Any]]:
    """The JSON values of a file with the line each starts on: one document, the items of
    a top-level array, or one value per line (JSONL)."""
    return _parse_text(_decode(data, name, max_line_bytes), name)


def _file_text(path: Path, name: str, max_line_bytes: int) -> str:
    # The bytes are dropped as soon as they are decoded: one copy of the file at a time.
    return _decode(v.read_bytes(path, "conversation file", MAX_FILE_BYTES), name, max_line_bytes)


def _decode(data: bytes, name: str, max_line_bytes: int) -> str:
    """`data` as text, refusing a line longer than the limit and bytes that are not UTF-8
    (both named by line), without splitting the file into a copy of its lines."""
    if len(data) > max_line_bytes:
        start, no = 0, 1
        while start <= len(data):
            end = data.find(b"\n", start)
            end = len(data) if end < 0 else end
            if end - start > max_line_bytes:
                raise TraceError(name, no, None, f"line is longer than {max_line_bytes} bytes")
            start, no = end + 1, no + 1
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        no = data.count(b"\n", 0, exc.start) + 1
        raise TraceError(name, no, None, f"not valid UTF-8 ({exc.reason} at byte {exc.start - line_start})") from None


_NON_SPACE = re.compile(r"[^ \t\r\n]")


def _parse_text(text: str, name: str) -> list[tuple[int, Any]]:
    # One pass of the decoder over the text, value after value: no stripped copy, no list
    # of lines, and the first document is not parsed twice (whole, then as JSONL).
    begin = 1 if text.startswith("\ufeff") else 0
    found = _NON_SPACE.search(text, begin)
    if found is None:
        raise TraceError(name, None, None, "the file is empty")
    pos = found.start()
    first_line = text.count("\n", 0, pos) + 1
    v.check_depth(text, name, first_line)  # the whole text is at least as deep as any line of it
    if text[pos] == "[":
        items = _array_items(text, name)
        if not items:
            raise TraceError(name, first_line, None, "the file is an empty list; it holds nothing to read")
        return items
    return _values(text, name, pos, first_line)


def _values(text: str, name: str, pos: int, line: int) -> list[tuple[int, Any]]:
    """One document, or one value per line (JSONL); a problem is located as a line-by-line
    reader would: the line, and the column within it."""
    docs: list[tuple[int, Any]] = []
    n, counted = len(text), pos
    while True:
        line += text.count("\n", counted, pos)
        counted = pos
        try:
            value, end = v.DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            if docs:
                raise _line_error(text, name, pos, line) from None
            at = exc.pos
            raise TraceError(name, text.count("\n", 0, at) + 1, None,
                             f"not valid JSON ({exc.msg} at column {at - text.rfind(chr(10), 0, at)})") from None
        except (ValueError, RecursionError) as exc:  # the shared decoder's refusals (NaN, 1e999, 5000 digits)
            problem = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
            raise TraceError(name, line, None, f"not valid JSON ({problem})") from None
        found = _NON_SPACE.search(text, end)
        multi_line = text.find("\n", pos, end) >= 0
        if found is None:
            if docs and multi_line:
                raise _line_error(text, name, pos, line)
            docs.append((line, value))
            return docs
        if text.find("\n", end, found.start()) < 0 or multi_line:
            raise _line_error(text, name, pos, line)  # more on the same line, or JSONL of multi-line values
        docs.append((line, value))
        pos = found.start()


def _line_error(text: str, name: str, pos: int, line: int) -> TraceError:
    """The error of the line holding `pos`, parsed alone, as JSONL reads it."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    try:
        _loads(text[start:] if end < 0 else text[start:end])
    except json.JSONDecodeError as exc:
        where = "" if isinstance(exc, _Refused) else f" at column {exc.colno}"
        return TraceError(name, line, None, f"not valid JSON ({exc.msg}{where})")
    return TraceError(name, line, None, "not valid JSON (a value spans several lines of a file of one value per line)")


class _Refused(json.JSONDecodeError):
    """A value the shared decoder refuses (NaN, 1e999, a 5000-digit integer); it has no column."""


def _loads(text: str) -> Any:
    # The shared decoder's limits (finite numbers, at most 20-digit integers) as a
    # JSONDecodeError, so a JSONL fallback can tell them from "Extra data".
    try:
        return v.DECODER.decode(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise _Refused("nested too deeply", text, 0) from None
    except ValueError as exc:
        raise _Refused(str(exc).split(";")[0], text, 0) from None


def _array_items(text: str, name: str) -> list[tuple[int, Any]]:
    decoder = v.DECODER
    pos = text.index("[") + 1
    items: list[tuple[int, Any]] = []
    n = len(text)

    def skip(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    def fail(i: int, msg: str) -> TraceError:
        line = text.count("\n", 0, i) + 1
        col = i - (text.rfind("\n", 0, i) + 1) + 1
        return TraceError(name, line, None, f"not valid JSON ({msg} at column {col})")

    pos = skip(pos)
    if pos < n and text[pos] == "]":
        end = skip(pos + 1)
        if end != n:
            raise fail(end, "Extra data")
        return []
    while True:
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise fail(exc.pos, exc.msg) from None
        except RecursionError:
            raise fail(pos, "nested too deeply") from None
        except ValueError as exc:
            raise fail(pos, str(exc).split(";")[0]) from None
        items.append((text.count("\n", 0, pos) + 1, value))
        pos = skip(end)
        if pos < n and text[pos] == ",":
            pos = skip(pos + 1)
            continue
        if pos < n and text[pos] == "]":
            end = skip(pos + 1)
            if end != n:
                raise fail(end, "Extra data")
            return items
        raise fail(pos, "Expecting ',' delimiter")


def detect_format(docs: list[tuple[int, Any]], name: str) -> str:
    """Guess the format from the documents' keys (`engine.core.sniff`); `--format` overrides it."""
    line, first = docs[0]
    if not isinstance(first, dict):
        raise TraceError(name, line, None, f"expected a JSON object, got {_type(first)}")
    fmt = document_format(first, [d for _, d in docs])
    if fmt is None:
        raise TraceError(name, line, None, "cannot tell the format: expected 'messages', 'conversations', 'turns', "
                                           "'tokens' or 'hash_ids' (use --format to choose one)")
    return fmt


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


# ---------------------------------------------------------------------------- helpers
def _str(obj: dict[str, Any], key: str, name: str, line: int, field_name: str, *, required: bool = True,
         allow_empty: bool = True) -> str | None:
    if key not in obj or obj[key] is None:
        if required:
            raise TraceError(name, line, field_name, "missing")
        return None
    value = obj[key]
    if not isinstance(value, str):
        raise TraceError(name, line, field_name, f"expected a string, got {_type(value)}")
    if not allow_empty and not value.strip():
        raise TraceError(name, line, field_name, "is empty")
    return value


def _list(obj: dict[str, Any], key: str, name: str, line: int, field_name: str) -> list[Any]:
    if key not in obj:
        raise TraceError(name, line, field_name, "missing")
    value = obj[key]
    if not isinstance(value, list):
        raise TraceError(name, line, field_name, f"expected a list, got {_type(value)}")
    if not value:
        raise TraceError(name, line, field_name, "the conversation is empty")
    return value


def _title(obj: dict[str, Any]) -> str:
    for key in ("title", "id", "conversation_id"):
        value = obj.get(key)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
    return ""


def _check_has_user(messages: list[Message], name: str, line: int, field_name: str) -> None:
    if not any(m.role == "user" for m in messages):
        raise TraceError(name, line, field_name, "has no user message, so there is no request to run")


def _tools(obj: dict[str, Any], name: str, line: int) -> list[Any] | None:
    tools = obj.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise TraceError(name, line, "tools", f"expected a list, got {_type(tools)}")
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise TraceError(name, line, f"tools[{i}]", f"expected an object, got {_type(t)}")
    return tools


def _model_setting(obj: dict[str, Any], settings: dict[str, Any], name: str, line: int) -> None:
    model = obj.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise TraceError(name, line, "model", f"expected a string, got {_type(model)}")
        settings["source_model"] = model


# ---------------------------------------------------------------------------- chat formats
def _openai_content(content: Any, name: str, line: int, fld: str) -> tuple[str, list[Any] | None]:
    if isinstance(content, str):
        return content, None
    if not isinstance(content, list):
        raise TraceError(name, line, fld, f"expected a string or a list of parts, got {_type(content)}")
    texts = []
    for j, part in enumerate(content):
        pf = f"{fld}[{j}]"
        if not isinstance(part, dict):
            raise TraceError(name, line, pf, f"expected an object, got {_type(part)}")
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text"):
            texts.append(_str(part, "text", name, line, f"{pf}.text"))
        elif kind in _MEDIA_PLACEHOLDERS:
            texts.append(_MEDIA_PLACEHOLDERS[kind])
        else:
            raise TraceError(name, line, f"{pf}.type", f"unknown content part type {kind!r}")
    return "\n".join(texts), content


def _openai(obj: dict[str, Any], name: str, line: int) -> Conversation:
    raw = _list(obj, "messages", name, line, "messages")
    messages = []
    for i, m in enumerate(raw):
        fld = f"messages[{i}]"
        if not isinstance(m, dict):
            raise TraceError(name, line, fld, f"expected an object, got {_type(m)}")
        role = m.get("role")
        if not isinstance(role, str) or role not in OPENAI_ROLES:
            raise TraceError(name, line, f"{fld}.role", f"unknown role {role!r}; expected one of {', '.join(OPENAI_ROLES)}")
        extra = {k: m[k] for k in ("name", "tool_calls", "tool_call_id", "function_call") if m.get(k) is not None}
        if "name" in extra and not isinstance(extra["name"], str):
            raise TraceError(name, line, f"{fld}.name", f"expected a string, got {_type(extra['name'])}")
        if "tool_calls" in extra and not isinstance(extra["tool_calls"], list):
            raise TraceError(name, line, f"{fld}.tool_calls", f"expected a list, got {_type(extra['tool_calls'])}")
        content = m.get("content")
        if content is None:
            if role != "assistant" or not (extra.get("tool_calls") or extra.get("function_call")):
                raise TraceError(name, line, f"{fld}.content", "missing")
            text, parts = "", None
        else:
            text, parts = _openai_content(content, name, line, f"{fld}.content")
        if parts is not None:
            extra["parts"] = parts
        messages.append(Message(role, text, extra or None))
    _check_has_user(messages, name, line, "messages")
    settings: dict[str, Any] = {}
    tools = _tools(obj, name, line)
    if tools:
        settings["tools"] = tools
    _model_setting(obj, settings, name, line)
    return Conversation(_title(obj), "openai", "chat", messages, None, settings)


def _sharegpt(obj: dict[str, Any], name: str, line: int) -> Conversation:
    raw = _list(obj, "conversations", name, line, "conversations")
    messages = []
    system = _str(obj, "system", name, line, "system", required=False)
    if system:
        messages.append(Message("system", system))
    for i, m in enumerate(raw):
        fld = f"conversations[{i}]"
        if not isinstance(m, dict):
            raise TraceError(name, line, fld, f"expected an object, got {_type(m)}")
        who = m.get("from")
        if not isinstance(who, str) or who.lower() not in SHAREGPT_ROLES:
            raise TraceError(name, line, f"{fld}.from", f"unknown speaker {who!r}; expected human, gpt, system or tool")
        value = _str(m, "value", name, line, f"{fld}.value")
        role = SHAREGPT_ROLES[who.lower()]
        messages.append(Message(role, value, {"from": who} if who not in ("human", "gpt", "system") else None))
    _check_has_user(messages, name, line, "conversations")
    return Conversation(_title(obj), "sharegpt", "chat", messages, None, {})


def _anthropic_blocks(content: Any, name: str, line: int, fld: str) -> tuple[str, list[Any] | None]:
    if isinstance(content, str):
        return content, None
    if not isinstance(content, list):
        raise TraceError(name, line, fld, f"expected a string or a list of content blocks, got {_type(content)}")
    if not content:
        raise TraceError(name, line, fld, "has no content blocks")
    texts: list[str] = []
    for j, block in enumerate(content):
        bf = f"{fld}[{j}]"
        if not isinstance(block, dict):
            raise TraceError(name, line, bf, f"expected a content block object, got {_type(block)}")
        kind = block.get("type")
        if kind == "text":
            texts.append(_str(block, "text", name, line, f"{bf}.text") or "")
        elif kind in ("image", "document"):
            texts.append(_MEDIA_PLACEHOLDERS[kind])
        elif kind == "tool_use":
            tool = _str(block, "name", name, line, f"{bf}.name", allow_empty=False)
            args = block.get("input", {})
            if not isinstance(args, dict):
                raise TraceError(name, line, f"{bf}.input", f"expected an object, got {_type(args)}")
            texts.append(f"[tool_use {tool}] {json.dumps(args, ensure_ascii=False, sort_keys=True)}")
        elif kind == "tool_result":
            _str(block, "tool_use_id", name, line, f"{bf}.tool_use_id")
            inner = block.get("content", "")
            inner_text = "" if inner == [] else _anthropic_blocks(inner, name, line, f"{bf}.content")[0]
            texts.append(f"[tool_result{' error' if block.get('is_error') is True else ''}] {inner_text}")
        elif kind == "thinking":
            texts.append(f"[thinking] {_str(block, 'thinking', name, line, f'{bf}.thinking')}")
        elif kind == "redacted_thinking":
            texts.append("[redacted thinking]")
        else:
            raise TraceError(name, line, f"{bf}.type", f"unknown content block type {kind!r}")
    return "\n".join(texts), content


def _anthropic(obj: dict[str, Any], name: str, line: int) -> Conversation:
    raw = _list(obj, "messages", name, line, "messages")
    messages: list[Message] = []
    if obj.get("system") is not None:
        text, blocks = _anthropic_blocks(obj["system"], name, line, "system")
        messages.append(Message("system", text, {"blocks": blocks} if blocks is not None else None))
    for i, m in enumerate(raw):
        fld = f"messages[{i}]"
        if not isinstance(m, dict):
            raise TraceError(name, line, fld, f"expected an object, got {_type(m)}")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise TraceError(name, line, f"{fld}.role", f"unknown role {role!r}; Anthropic messages are user or assistant "
                                                        "(the system prompt is the top-level 'system')")
        if "content" not in m:
            raise TraceError(name, line, f"{fld}.content", "missing")
        text, blocks = _anthropic_blocks(m["content"], name, line, f"{fld}.content")
        messages.append(Message(role, text, {"blocks": blocks} if blocks is not None else None))
    _check_has_user(messages, name, line, "messages")
    settings: dict[str, Any] = {}
    tools = _tools(obj, name, line)
    if tools:
        for i, t in enumerate(tools):
            _str(t, "name", name, line, f"tools[{i}].name", allow_empty=False)
        settings["tools"] = tools
    _model_setting(obj, settings, name, line)
    return Conversation(_title(obj), "anthropic", "chat", messages, None, settings)


def _mt_bench(obj: dict[str, Any], name: str, line: int) -> Conversation:
    turns = _list(obj, "turns", name, line, "turns")
    messages = [Message("user", _str({"t": t}, "t", name, line, f"turns[{i}]", allow_empty=False) or "")
                for i, t in enumerate(turns)]
    qid, category = obj.get("question_id"), obj.get("category")
    title = f"MT-bench {qid}" + (f" ({category})" if isinstance(category, str) else "") if qid is not None else ""
    return Conversation(title, "mt-bench", "chat", messages, None, {})


# ---------------------------------------------------------------------------- traces
def _trace_line(obj: Any, name: str, line: int, index: int, fmt: str) -> TraceRequest:
    key = "tokens" if fmt == "tokens" else "hash_ids"
    if not isinstance(obj, dict):
        raise TraceError(name, line, None, f"expected a JSON object, got {_type(obj)}")
    if key not in obj:
        raise TraceError(name, line, key, f"missing; every line of a {fmt} trace needs it")
    other = "hash_ids" if fmt == "tokens" else "tokens"
    if other in obj:
        raise TraceError(name, line, other, f"not expected in a {fmt} trace")
    return parse_trace_line(obj, name, line, index, MOONCAKE_BLOCK_SIZE if fmt == "mooncake" else None)


def _trace_conversation(docs: list[tuple[int, Any]], name: str, fmt: str, stem: str) -> Conversation:
    first = docs[0][0] if docs else None
    requests = []
    for i, (line, obj) in enumerate(docs):
        requests.append(_trace_line(obj, name, line, i, fmt))
        docs[i] = (line, None)  # each parsed line is dropped once it is a request: one copy of the trace
    if not requests:
        raise TraceError(name, None, None, "the file holds no requests")
    settings = {"block_size": MOONCAKE_BLOCK_SIZE} if fmt == "mooncake" else {}
    return Conversation(stem, fmt, "trace", [], requests, settings, first)


def trace_request_dict(tr: TraceRequest) -> dict[str, Any]:
    """A trace request as the JSONL line it came from (ids and timestamps included)."""
    out: dict[str, Any] = {"id": tr.id}
    if tr.timestamp is not None:
        out["timestamp"] = tr.timestamp
    if tr.tenant is not None:
        out["tenant"] = tr.tenant
    if tr.tokens is not None:
        out["tokens"] = list(tr.tokens)
        out["output_tokens"] = list(tr.output_tokens or ())
    else:
        out["input_length"] = tr.input_length
        out["output_length"] = tr.output_length
        out["hash_ids"] = list(tr.hash_ids or ())
    return out


# ---------------------------------------------------------------------------- session files
_SESSION_KEYS = {"title": str, "kind": str, "model": (str, type(None)), "block_size": int, "capacity_blocks": int,
                 "seed": (int, type(None)), "hash": str, "created": str, "source_path": (str, type(None)),
                 "source_format": (str, type(None)), "settings": dict}


def _session_file(obj: dict[str, Any], name: str, line: int) -> Conversation:
    version = obj.get("version")
    if version != 1:
        raise TraceError(name, line, "version", f"unsupported session file version {version!r}; this build reads 1")
    session = obj.get("session")
    if not isinstance(session, dict):
        raise TraceError(name, line, "session", f"expected an object, got {_type(session)}")
    settings: dict[str, Any] = {}
    for key, typ in _SESSION_KEYS.items():
        value = session.get(key)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise TraceError(name, line, f"session.{key}", f"expected {_type_name(typ)}, got {_type(value)}")
        settings[key] = value
    if settings["kind"] not in ("chat", "trace"):
        raise TraceError(name, line, "session.kind", f"expected 'chat' or 'trace', got {settings['kind']!r}")
    # The same ranges as the command line and the store, so what imports also replays.
    v.integer(settings["block_size"], name, line, "session.block_size", 1, v.MAX_TOKENS)
    v.integer(settings["capacity_blocks"], name, line, "session.capacity_blocks", 1, v.MAX_INT64)
    if settings["seed"] is not None:
        v.integer(settings["seed"], name, line, "session.seed", -v.MAX_INT64 - 1, v.MAX_INT64)
    try:
        v.check_block_pool(settings["capacity_blocks"], "a pool")
    except InputError as exc:
        raise TraceError(name, line, "session.capacity_blocks", str(exc)) from None
    if settings["hash"] not in HASH_NAMES:
        raise TraceError(name, line, "session.hash", f"unknown hash {settings['hash']!r}")
    messages = _session_messages(obj.get("messages"), name, line)
    trace = None
    if settings["kind"] == "trace":
        raw = obj.get("trace")
        if not isinstance(raw, list) or not raw:
            raise TraceError(name, line, "trace", "a trace session needs a non-empty list of requests")
        fmt = "tokens" if isinstance(raw[0], dict) and "tokens" in raw[0] else "mooncake"
        trace = []
        for i, item in enumerate(raw):
            try:
                trace.append(_trace_line(item, name, line, i, fmt))
            except TraceError as exc:
                raise TraceError(name, line, f"trace[{i}].{exc.field or ''}".rstrip("."), exc.problem) from None
    elif not any(m.role == "user" for m in messages):
        raise TraceError(name, line, "messages", "has no user message, so there is no request to run")
    return Conversation(settings.pop("title"), "cachescope", settings.pop("kind"), messages, trace, settings)


def _type_name(typ: Any) -> str:
    typs = typ if isinstance(typ, tuple) else (typ,)
    return " or ".join({str: "a string", int: "an integer", dict: "an object", type(None): "null"}[t] for t in typs)


def _session_messages(raw: Any, name: str, line: int) -> list[Message]:
    if not isinstance(raw, list):
        raise TraceError(name, line, "messages", f"expected a list, got {_type(raw)}")
    out: list[Message] = []
    seen: set[tuple[int, int]] = set()
    for i, m in enumerate(raw):
        fld = f"messages[{i}]"
        if not isinstance(m, dict):
            raise TraceError(name, line, fld, f"expected an object, got {_type(m)}")
        for key, typ in (("position", int), ("version", int), ("role", str), ("content", str), ("created", str)):
            if not isinstance(m.get(key), typ) or isinstance(m.get(key), bool):
                raise TraceError(name, line, f"{fld}.{key}", f"expected {_type_name(typ)}, got {_type(m.get(key))}")
        if m["role"] not in OPENAI_ROLES:
            raise TraceError(name, line, f"{fld}.role", f"unknown role {m['role']!r}")
        v.integer(m["position"], name, line, f"{fld}.position", 0, v.MAX_INT64)
        v.integer(m["version"], name, line, f"{fld}.version", 1, v.MAX_INT64)
        if (m["position"], m["version"]) in seen:
            raise TraceError(name, line, fld, "positions start at 0, versions at 1, and each pair appears once")
        seen.add((m["position"], m["version"]))
        extra = m.get("extra")
        if extra is not None and not isinstance(extra, dict):
            raise TraceError(name, line, f"{fld}.extra", f"expected an object, got {_type(extra)}")
        out.append(Message(m["role"], m["content"], extra, m["position"], m["version"], m["created"]))
    positions = sorted({p for p, _ in seen})
    if positions != list(range(len(positions))):
        raise TraceError(name, line, "messages", "message positions must run 0, 1, 2, ... without gaps")
    return out
