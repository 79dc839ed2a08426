"""Block-level JSONL traces that say their own block size: kvcache-simulator's lines
`{"block_size", "hash_ids", "input_length"}`. The lines are Mooncake's with the block size
written in; `declared_block_size` reads it from the first line so a replay needs no flag,
and `check_block_sizes` refuses a file whose lines disagree or differ from the replay's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from engine.core import validation as v
from engine.core.errors import TraceError
from engine.core.trace import MAX_LINE_BYTES

MAX_BLOCK_SIZE = 1 << 20


def _lines(path: str | Path) -> Iterator[tuple[int, bytes]]:
    name = str(path)
    try:
        fh = Path(path).open("rb")
    except OSError as exc:
        raise TraceError(name, None, None, f"cannot be read ({exc.strerror})") from None
    with fh:
        for no, raw in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(raw) > MAX_LINE_BYTES:
                raise TraceError(name, no, None, f"line is longer than {MAX_LINE_BYTES} bytes")
            if raw.strip():
                yield no, raw.removeprefix(b"\xef\xbb\xbf") if no == 1 else raw


def _size(obj: object, name: str, line: int) -> int | None:
    if not isinstance(obj, dict) or "block_size" not in obj:
        return None
    return v.integer(obj["block_size"], name, line, "block_size", 1, MAX_BLOCK_SIZE)


def declared_block_size(path: str | Path) -> int | None:
    """The `block_size` the first line of a block-level JSONL trace gives, or None (a
    Mooncake trace, a token trace, or a file the trace reader will refuse). A block size
    that is not a whole number of at least 1 raises `TraceError` naming the field."""
    if not Path(path).is_file():
        return None
    try:
        no, raw = next(_lines(path))
        obj = v.loads(raw, str(path), no)
    except (TraceError, StopIteration):
        return None  # the trace reader says what is wrong
    return _size(obj, str(path), no) if isinstance(obj, dict) and "hash_ids" in obj else None


def check_block_sizes(path: str | Path, block_size: int) -> None:
    """Refuse a line whose `block_size` is not `block_size` (one sentence, naming the line)."""
    name = str(path)
    for no, raw in _lines(path):
        size = _size(v.loads(raw, name, no), name, no)
        if size is not None and size != block_size:
            raise TraceError(name, no, "block_size",
                             f"this line's hash ids name {size}-token blocks, the replay uses {block_size}")
