"""Reading request traces for `replay`: token-level JSONL and block-level (Mooncake) JSONL.

Each line becomes a `TraceRequest`. Errors name the file, the line and the field. The
richer conversation formats (OpenAI, ShareGPT, Anthropic) live in `engine.store.formats`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import msgspec

from engine.core import validation as v
from engine.core.errors import TraceError

MAX_LINE_BYTES = 64 * 1024 * 1024
# Tokens per Mooncake hash id (FAST '25 trace release): the block size a block-level line is
# checked against when the reader is not told another one.
MOONCAKE_BLOCK_SIZE = 512
# Lines up to this size are parsed by msgspec first (no Python call per number); a longer one
# goes to `validation.loads`, whose shared small ints keep an 8M-id line at 64 MB.
FAST_LINE_BYTES = 1 << 20
_FAST_DECODE = msgspec.json.Decoder().decode
# The largest magnitude `validation.loads` parses: integers of at most MAX_INT_DIGITS digits.
_INT_BOUND = 10 ** v.MAX_INT_DIGITS
_NUMBERS = frozenset((int, float, bool))
# The small ints `validation.loads` shares, so that a trace held in memory costs 8 bytes per
# token id either way (msgspec makes an int object of its own for each).
_SHARED_INTS = v._SHARED_INTS


def _within_limits(value: Any) -> bool:
    """True when nothing in `value` is an integer `validation.loads` would refuse as too long."""
    kind = type(value)
    if kind is int:
        return -_INT_BOUND < value < _INT_BOUND
    if kind is list:
        if not value:
            return True
        kinds = set(map(type, value))
        if kinds <= _NUMBERS:
            return int not in kinds or (min(value) > -_INT_BOUND and max(value) < _INT_BOUND)
        return all(map(_within_limits, value))
    if kind is dict:
        return all(map(_within_limits, value.values()))
    return True  # str, float (msgspec refuses one out of range), bool, None


class SharedInts:
    """The shared ints by value, for the lines of one trace read (`read_trace` makes one).

    Built on the first list with ids on both sides of the table's end (5 MB) and kept for the
    read's next lines, so a trace of such lines builds it once; dropped with the read, so an
    opened trace does not keep it for the life of the process.
    """

    __slots__ = ("_by_value",)

    def __init__(self) -> None:
        self._by_value: dict[int, int] | None = None

    def by_value(self) -> dict[int, int]:
        if self._by_value is None:
            self._by_value = dict(zip(_SHARED_INTS, _SHARED_INTS))
        return self._by_value


def fast_loads(raw: bytes, shared: SharedInts | None = None) -> Any:
    """The JSON value of one trace line, or None to say "ask `validation.loads`".

    `shared` carries the by-value map of the shared ints from one line to the next (a reader
    of many lines passes one; without it a line that needs the map builds its own).

    Equal to `validation.loads` wherever it answers: a line that might nest too deep, is not
    UTF-8, is not JSON msgspec reads, or holds an integer longer than `validation` allows,
    is left to `validation.loads`, which parses it or names the problem in its own words.
    """
    if len(raw) > FAST_LINE_BYTES or raw.count(b"[") + raw.count(b"{") > v.MAX_JSON_DEPTH:
        return None
    try:
        value = _FAST_DECODE(raw.decode("utf-8"))
    except (UnicodeDecodeError, msgspec.DecodeError):
        return None
    if type(value) is not dict:
        return value if value is not None and _within_limits(value) else None
    id_lists: list[tuple[Any, int, int]] = []  # a trace line: its lists of ids checked and shared once
    for key, item in value.items():
        kind = type(item)
        if kind is list and item and set(map(type, item)) == {int}:
            low, high = min(item), max(item)
            if low <= -_INT_BOUND or high >= _INT_BOUND:
                return None
            id_lists.append((key, low, high))
        elif not _within_limits(item):
            return None
    for key, low, high in id_lists:
        value[key] = _shared(value[key], low, high, shared)
    return value


def _shared(ids: list[int], low: int, high: int, shared: SharedInts | None) -> list[int]:
    """`ids` (from `low` to `high`) with each one `validation.loads` shares taken from its table."""
    if low >= 0 and high < len(_SHARED_INTS):
        return list(map(_SHARED_INTS.__getitem__, ids))  # token ids of a small vocabulary
    if low >= len(_SHARED_INTS) or high < 0:
        return ids
    lookup = (shared or SharedInts()).by_value()
    return list(map(lookup.get, ids, ids))  # some fit, some not: still at C speed


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
    model: str | None = None  # the model the request went to: part of its cache key

    @property
    def is_block_level(self) -> bool:
        return self.hash_ids is not None


def parse_trace_line(obj: Any, path: str, line: int, index: int, block_size: int | None) -> TraceRequest:
    if not isinstance(obj, dict):
        raise TraceError(path, line, None, f"expected a JSON object, got {type(obj).__name__}")
    rid = obj.get("id", str(index))
    if not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise TraceError(path, line, "id", f"expected a string, got {rid!r}")
    if isinstance(rid, int):
        rid = v.integer(rid, path, line, "id", -v.MAX_INT64 - 1, v.MAX_INT64)
    tenant = obj.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise TraceError(path, line, "tenant", f"expected a string, got {tenant!r}")
    ts = obj.get("timestamp")
    if ts is not None:
        ts = v.number(ts, path, line, "timestamp")
    if "tokens" in obj and "hash_ids" in obj:
        raise TraceError(path, line, "hash_ids", "a line has 'tokens' (token level) or 'hash_ids' (block level), not both")
    if "tokens" in obj:
        tokens = v.id_list(obj["tokens"], path, line, "tokens", v.MAX_TOKEN_ID)
        if not tokens:
            raise TraceError(path, line, "tokens", "the prompt is empty; a request needs at least one token")
        out = v.id_list(obj.get("output_tokens", []), path, line, "output_tokens", v.MAX_TOKEN_ID)
        return TraceRequest(index, line, str(rid), tenant, tokens, out, None, len(tokens), len(out), ts)
    if "hash_ids" in obj:
        hash_ids = v.id_list(obj["hash_ids"], path, line, "hash_ids", v.MAX_HASH_ID)
        if "input_length" not in obj:
            raise TraceError(path, line, "input_length", "missing; block-level traces need it")
        n_in = v.integer(obj["input_length"], path, line, "input_length", 1, v.MAX_TOKENS)
        n_out = v.integer(obj.get("output_length", 0), path, line, "output_length", 0, v.MAX_TOKENS)
        size = block_size or MOONCAKE_BLOCK_SIZE
        if len(hash_ids) < n_in // size:
            raise TraceError(path, line, "hash_ids",
                             f"{len(hash_ids)} ids cannot cover {n_in} tokens in blocks of {size}")
        return TraceRequest(index, line, str(rid), tenant, None, None, hash_ids, n_in, n_out, ts)
    raise TraceError(path, line, "tokens", "missing; a line needs 'tokens' (token level) or 'hash_ids' (block level)")


def read_trace(path: str | Path, block_size: int | None = None) -> Iterator[TraceRequest]:
    """Yield the requests of a JSONL trace in file order; raises `TraceError` on bad input.

    The file is checked to be a regular file before it is opened (`validation.open_input`)
    and read one line at a time, no line past `MAX_LINE_BYTES`, so memory is bounded by the
    longest line whatever the file holds; the whole trace is never in memory at once.
    """
    name = str(path)
    index = 0
    shared = SharedInts()
    with v.open_input(path, "trace file", max_bytes=None) as fh:
        for line_no, raw in v.iter_lines(fh, name, MAX_LINE_BYTES):
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark, as import accepts
            if not raw.strip():
                continue
            obj = fast_loads(raw, shared)
            if obj is None:
                obj = v.loads(raw, name, line_no)
            del raw  # hold one form of a line at a time: a 50 MB line is 8M ids
            request = parse_trace_line(obj, name, line_no, index, block_size)
            del obj
            yield request
            index += 1
    if index == 0:
        raise TraceError(name, None, None, "the file holds no requests")


def load_trace(path: str | Path, block_size: int | None = None) -> list[TraceRequest]:
    return list(read_trace(path, block_size))


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
