"""What a file holds, told from its first bytes and its first JSON document's keys.

The one sniffer every reader asks: `cachescope replay`, `sessions import` (through
`engine.store.formats.detect_format`) and the app's File > Open. Parsing stays with the
readers (`engine.core.trace`, `engine.store.formats`); nothing here reads a whole file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from engine.core import validation as v
from engine.core.trace import MAX_LINE_BYTES

SESSION_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".cachescope")
SQLITE_HEADER = b"SQLite format 3"
SESSION_FILE_FORMAT = "cachescope-session"  # the "format" of an exported Cachescope session
TRACE_FORMATS = ("tokens", "mooncake")  # request traces: one request per JSONL line
WEKA_FORMAT = "weka"  # a WEKA kv-cache-tester conversation: one JSON document (engine.store.weka)
_WEKA_SNIFF_BYTES = 64 * 1024
_WEKA_KEYS = re.compile(rb'"(?:hash_id_scope|block_size)"\s*:')


def document_format(first: Any, docs: Sequence[Any] = ()) -> str | None:
    """The format a file's documents are in, from the keys of the first one: cachescope,
    weka, mooncake, tokens, sharegpt, mt-bench, anthropic or openai; None when the keys say
    nothing. `docs` (every document, the first included) tells Anthropic bodies from OpenAI ones."""
    if not isinstance(first, dict):
        return None
    if first.get("format") == SESSION_FILE_FORMAT:
        return "cachescope"
    if isinstance(first.get("requests"), list) and ("hash_id_scope" in first or "block_size" in first):
        return WEKA_FORMAT
    if "hash_ids" in first:
        return "mooncake"
    if "tokens" in first:
        return "tokens"
    if "conversations" in first:
        return "sharegpt"
    if "turns" in first:
        return "mt-bench"
    if "messages" in first:
        return "anthropic" if any(isinstance(d, dict) and _looks_anthropic(d) for d in docs or (first,)) else "openai"
    if "role" in first:
        return "openai"
    return None


def trace_format(path: str | Path) -> str | None:
    """"tokens" or "mooncake" when the first non-blank line of `path` is a request of a
    token-level or block-level trace; None otherwise, or when it cannot be read (the
    reader then says why). Only a regular file is opened, and only its first line is read,
    no further than the trace reader's line limit."""
    raw = v.first_line(path, MAX_LINE_BYTES)
    if raw is None:
        return None
    try:
        fmt = document_format(v.loads(raw, str(path), 1))
    except ValueError:  # TraceError: the reader reports the line
        return None
    return fmt if fmt in TRACE_FORMATS else None


def is_weka_trace(path: str | Path) -> bool:
    """True when `path` starts as a WEKA kv-cache-tester document does: one JSON object whose
    first 64 KiB name `hash_id_scope` or `block_size` before its `requests` list. Only that
    prefix is read; the reader (`engine.store.weka`) checks the rest."""
    try:
        with v.open_input(path, max_bytes=None) as fh:
            head = fh.read(_WEKA_SNIFF_BYTES)
    except (OSError, ValueError):
        return False
    head = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if not head.startswith(b"{"):
        return False
    at = head.find(b'"requests"')
    keys = _WEKA_KEYS.search(head)
    return at > 0 and keys is not None and keys.start() < at


def is_request_trace(path: str | Path) -> bool:
    """True when `path` is a token-level or block-level (Mooncake) JSONL trace."""
    return trace_format(path) is not None


def file_kind(path: str | Path) -> str:
    """"session" (a Cachescope database), "trace" (token or block JSONL), "weka" (a WEKA
    kv-cache-tester conversation) or "conversation"
    (anything else: the conversation reader names what is wrong with it)."""
    p = Path(path)
    if p.suffix.lower() in SESSION_SUFFIXES:
        return "session"
    try:
        with v.open_input(p, max_bytes=None) as fh:
            if fh.read(len(SQLITE_HEADER)) == SQLITE_HEADER:
                return "session"
    except (OSError, ValueError):  # not a regular file, unreadable: the conversation reader says why
        return "conversation"
    if is_weka_trace(p):
        return "weka"
    return "trace" if is_request_trace(p) else "conversation"


def _looks_anthropic(obj: dict[str, Any]) -> bool:
    if "system" in obj:
        return True
    tools = obj.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools):
        return True
    messages = obj.get("messages")
    for m in messages if isinstance(messages, list) else ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            for b in content:
                if isinstance(b, dict) and (b.get("type") in ("tool_use", "tool_result", "thinking")
                                            or (b.get("type") == "image" and "source" in b)):
                    return True
    return False
