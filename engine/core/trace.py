"""Reading request traces for `replay`: token-level JSONL and block-level (Mooncake) JSONL.

Each line becomes a `TraceRequest`. Errors name the file, the line and the field. The
richer conversation formats (OpenAI, ShareGPT, Anthropic) live in `engine.store.formats`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from engine.core.errors import TraceError

MAX_LINE_BYTES = 64 * 1024 * 1024


@dataclass(slots=True, frozen=True)
class TraceRequest:
    """One request of a trace. Exactly one of `tokens` or `hash_ids` is set."""

    index: int
    line: int
    id: str
    tenant: str | None
    tokens: tuple[int, ...] | None
    output_tokens: tuple[int, ...] | None
    hash_ids: tuple[int, ...] | None
    input_length: int
    output_length: int
    timestamp: float | None = None

    @property
    def is_block_level(self) -> bool:
        return self.hash_ids is not None


def _int_list(value: Any, path: str, line: int, name: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TraceError(path, line, name, f"expected a list of integers, got {type(value).__name__}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TraceError(path, line, name, f"item {i} is {v!r}, not an integer")
        if v < 0:
            raise TraceError(path, line, name, f"item {i} is {v}, ids cannot be negative")
    return tuple(value)


def _non_negative_int(value: Any, path: str, line: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(path, line, name, f"expected a non-negative integer, got {value!r}")
    if value < 0:
        raise TraceError(path, line, name, f"expected a non-negative integer, got {value}")
    return value


def parse_trace_line(obj: Any, path: str, line: int, index: int, block_size: int | None) -> TraceRequest:
    if not isinstance(obj, dict):
        raise TraceError(path, line, None, f"expected a JSON object, got {type(obj).__name__}")
    rid = obj.get("id", str(index))
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise TraceError(path, line, "id", f"expected a string, got {rid!r}")
    tenant = obj.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise TraceError(path, line, "tenant", f"expected a string, got {tenant!r}")
    ts = obj.get("timestamp")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
        raise TraceError(path, line, "timestamp", f"expected a number, got {ts!r}")
    if "tokens" in obj:
        tokens = _int_list(obj["tokens"], path, line, "tokens")
        if not tokens:
            raise TraceError(path, line, "tokens", "the prompt is empty; a request needs at least one token")
        out = _int_list(obj.get("output_tokens", []), path, line, "output_tokens")
        return TraceRequest(index, line, str(rid), tenant, tokens, out, None, len(tokens), len(out), ts)
    if "hash_ids" in obj:
        hash_ids = _int_list(obj["hash_ids"], path, line, "hash_ids")
        if "input_length" not in obj:
            raise TraceError(path, line, "input_length", "missing; block-level traces need it")
        n_in = _non_negative_int(obj["input_length"], path, line, "input_length")
        n_out = _non_negative_int(obj.get("output_length", 0), path, line, "output_length")
        if n_in < 1:
            raise TraceError(path, line, "input_length", "the prompt is empty; a request needs at least one token")
        if block_size is not None and len(hash_ids) < n_in // block_size:
            raise TraceError(path, line, "hash_ids",
                             f"{len(hash_ids)} ids cannot cover {n_in} tokens in blocks of {block_size}")
        return TraceRequest(index, line, str(rid), tenant, None, None, hash_ids, n_in, n_out, ts)
    raise TraceError(path, line, "tokens", "missing; a line needs 'tokens' (token level) or 'hash_ids' (block level)")


def read_trace(path: str | Path, block_size: int | None = None) -> Iterator[TraceRequest]:
    """Yield the requests of a JSONL trace in file order; raises `TraceError` on bad input."""
    p = Path(path)
    name = str(path)
    if not p.exists():
        raise TraceError(name, None, None, "no such file")
    if p.is_dir():
        raise TraceError(name, None, None, "is a directory, not a trace file")
    index = 0
    with p.open("rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(name, line_no, None, f"line is longer than {MAX_LINE_BYTES} bytes")
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TraceError(name, line_no, None, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(name, line_no, None, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
            yield parse_trace_line(obj, name, line_no, index, block_size)
            index += 1
    if index == 0:
        raise TraceError(name, None, None, "the file holds no requests")


def load_trace(path: str | Path, block_size: int | None = None) -> list[TraceRequest]:
    return list(read_trace(path, block_size))


def is_request_trace(path: str | Path) -> bool:
    """True when the first non-blank line is a token-level or block-level request."""
    try:
        with Path(path).open("rb") as fh:
            for raw in fh:
                if raw.strip():
                    obj = json.loads(raw)
                    return isinstance(obj, dict) and ("tokens" in obj or "hash_ids" in obj)
    except (OSError, ValueError):
        return False
    return False


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
