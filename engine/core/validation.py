"""One validation layer for everything read from outside: JSON text, numbers, and sizes.

Every reader (traces, conversations, session files, model configs, billing rules, command-line
numbers) goes through these functions, so the same value is accepted or refused the same way
everywhere, and a refusal is one `InputError` sentence naming the file, line and field. What
the values mean stays with each reader; this module only knows JSON, ranges and memory.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from itertools import accumulate, count
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from engine.core.errors import InputError, TraceError, show_path  # noqa: F401 - show_path: for every reader

# JSON nested deeper than this is refused before it is parsed: no format we read needs more
# than a dozen levels, and the C parser recurses once per level (RecursionError, or a crash
# on a thread with a small stack, for a file of a few kilobytes of brackets).
MAX_JSON_DEPTH = 64
# Integers longer than this are refused while parsing (2**64 has 20 digits), long before
# Python's 4300-digit limit turns a crafted file into an internal error.
MAX_INT_DIGITS = 20
MAX_FILE_BYTES = 1 << 30

MAX_TOKEN_ID = 2**32 - 1      # vocabularies are far smaller; ids are stored as uint32-sized ints
MAX_HASH_ID = 2**64 - 1       # Mooncake / vLLM block hashes are unsigned 64-bit
MAX_INT64 = 2**63 - 1         # what an SQLite INTEGER (session fields, --seed) can hold
MAX_TOKENS = 2**32 - 1        # a request's prompt or output length

_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_BRACKETS = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = str.maketrans({"[": "1", "{": "1", "]": "0", "}": "0"})


# ---------------------------------------------------------------------------- JSON
def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in `text` (brackets inside strings ignored)."""
    brackets = _BRACKETS.sub("", _STRING.sub("", text)).translate(_DEPTH_STEP)
    if not brackets:
        return 0
    return max(0, max(accumulate(1 if c == "1" else -1 for c in brackets)))


# Every integer of at most five digits parses to one shared object: a token id then costs
# the 8 bytes of its list slot instead of 36 (a 28-byte int of its own), so a line of 8M ids
# decodes to 64 MB, not 290 MB. Five digits cover the bundled SmolLM2's and GPT-2's
# vocabularies; the table is 3.6 MB, built in ~10 ms at import. Measured: parsing a line of
# 5-digit ids takes ~1.5x as long as with a fresh int each.
_SHARED_INTS = tuple(range(100_000))


def _parse_int(token: str, _int: Any = int, _shared: tuple[int, ...] = _SHARED_INTS) -> int:
    if len(token) < 6 and token[0] != "-":
        return _shared[_int(token)]
    if len(token.lstrip("-")) > MAX_INT_DIGITS:
        raise _TooLarge(f"an integer of {len(token.lstrip('-'))} digits is too large (at most {MAX_INT_DIGITS})")
    return _int(token)


def _parse_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _TooLarge(f"{token[:24]} is too large for a number")
    return value


def _parse_constant(token: str) -> Any:
    raise _TooLarge(f"{token} is not a number JSON allows")


class _TooLarge(ValueError):
    """A number the parser hooks refuse; turned into a `TraceError` by `loads`."""


DECODER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)


def loads(text: str | bytes, name: str, line: int | None = None, field: str | None = None) -> Any:
    """Parse one JSON value with the limits above; every problem is a `TraceError`.

    `line` is where `text` starts in the file; the error's line is counted from there.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(name, line, field, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    check_depth(text, name, line, field)
    try:
        return DECODER.decode(text)
    except json.JSONDecodeError as exc:
        at = exc.lineno if line is None else line + exc.lineno - 1
        raise TraceError(name, at, field, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except (_TooLarge, ValueError) as exc:
        raise TraceError(name, line, field, f"not valid JSON: {str(exc).split(';')[0]}") from None
    except RecursionError:  # only reachable with a smaller interpreter limit than MAX_JSON_DEPTH
        raise TraceError(name, line, field, f"nested more than {MAX_JSON_DEPTH} levels deep") from None


def check_depth(text: str, name: str, line: int | None = None, field: str | None = None) -> None:
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return  # a text cannot nest deeper than the brackets it has; skips the scan of most lines
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        at = _deep_line(text)
        line = at if line is None else line + at - 1
        raise TraceError(name, line, field, f"nested {depth} levels deep; at most {MAX_JSON_DEPTH} are allowed")


def _deep_line(text: str) -> int:
    # Only on the failing path: the line (counted from 1) where the nesting passes the limit.
    depth = 0
    for number, line in enumerate(text.split("\n"), start=1):
        for c in _BRACKETS.sub("", _STRING.sub("", line)):
            depth += 1 if c in "[{" else -1
            if depth > MAX_JSON_DEPTH:
                return number
    return 1


# ---------------------------------------------------------------------------- files
# What `stat` calls the kinds of file that are not regular files, as a sentence says them.
_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str | None:
    return next((name for test, name in _NOT_REGULAR if test(mode)), None)


def _refuse_kind(name: str, mode: int, what: str) -> None:
    kind = _kind(mode)
    if kind is not None:
        raise TraceError(name, None, None, f"is {kind}; only a regular file can be read as a {what}")
    if not stat.S_ISREG(mode):  # pragma: no cover - every other kind is listed above
        raise TraceError(name, None, None, f"is not a regular file; only a regular file can be read as a {what}")


def check_regular_file(path: str | Path, what: str = "file") -> os.stat_result:
    """`path`'s status, refusing what is missing, unreadable or not a regular file (a
    directory, a FIFO, a device, a socket), without opening it: opening a FIFO blocks
    until a writer comes, and reading a device never ends."""
    name = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TraceError(name, None, None, "no such file") from None
    except NotADirectoryError:
        raise TraceError(name, None, None, "no such file (a part of the path is not a directory)") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise TraceError(name, None, None, f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    _refuse_kind(name, st.st_mode, what)
    return st


def open_input(path: str | Path, what: str = "file", max_bytes: int | None = MAX_FILE_BYTES) -> BinaryIO:
    """Open an input file for reading, the one way every reader does it.

    Refuses what `check_regular_file` refuses, checked before the open and again on the
    opened descriptor (the path may have been swapped in between); the open itself is
    non-blocking, so even a FIFO put there after the check cannot hang. With `max_bytes`,
    a file larger than that is refused before anything is read.
    """
    check_regular_file(path, what)
    name = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:
        raise TraceError(name, None, None, f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        st = os.fstat(fd)
        _refuse_kind(name, st.st_mode, what)
        if max_bytes is not None and st.st_size > max_bytes:
            raise TraceError(name, None, None, f"the {what} is {st.st_size:,} bytes; at most {max_bytes:,} are read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


READ_CHUNK = 8 << 20  # bytes per read of a whole file


def read_limited(fh: BinaryIO, name: str, what: str, max_bytes: int) -> bytes:
    """All of `fh`, reading at most `max_bytes` + 1 bytes (a file may grow after its size
    was checked, or report a size it does not have).

    Read in chunks: `fh.read(n)` allocates n bytes before it reads any, so one read of the
    limit would cost the whole limit in memory for a file of a few bytes."""
    data = bytearray()
    try:
        while len(data) <= max_bytes:
            chunk = fh.read(min(READ_CHUNK, max_bytes + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise TraceError(name, None, None, f"cannot be read ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise TraceError(name, None, None, f"the {what} is more than {max_bytes:,} bytes; at most {max_bytes:,} are read")
    return bytes(data)


def read_bytes(path: str | Path, what: str = "file", max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """A whole input file, refusing what is missing, not a regular file, unreadable or too large."""
    with open_input(path, what, max_bytes) as fh:
        return read_limited(fh, str(path), what, max_bytes)


def iter_lines(fh: BinaryIO, name: str, max_line_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its newline) for each line of `fh`, reading no line
    further than `max_line_bytes` + 1 bytes: a longer one is refused before the rest of it
    is read, so memory stays bounded by the limit whatever the file holds."""
    for line_no in count(1):
        try:
            raw = fh.readline(max_line_bytes + 2)
        except OSError as exc:
            raise TraceError(name, line_no, None, f"cannot be read ({exc.strerror})") from None
        if not raw:
            return
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if len(raw) > max_line_bytes:
            raise TraceError(name, line_no, None, f"line is longer than {max_line_bytes:,} bytes")
        yield line_no, raw


def first_line(path: str | Path, max_line_bytes: int) -> bytes | None:
    """The first non-blank line of a regular file (its byte order mark dropped), read no
    further than the limit; None when the file cannot be read or has no such line (the
    reader then says why)."""
    try:
        with open_input(path, max_bytes=None) as fh:
            for _, raw in iter_lines(fh, str(path), max_line_bytes):
                if raw.strip():
                    return raw.removeprefix(b"\xef\xbb\xbf")
    except (OSError, InputError):
        return None
    return None


def load_json_file(path: str | Path, what: str = "JSON file") -> Any:
    """Read and parse a whole JSON file (a config, the billing rules)."""
    data = read_bytes(path, what)
    if not data.strip():
        raise TraceError(str(path), None, None, f"the {what} is empty")
    return loads(data, str(path), 1)


# ---------------------------------------------------------------------------- values
def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def integer(value: Any, name: str, line: int | None, field: str, lo: int = 0, hi: int = MAX_INT64) -> int:
    """A whole number in [lo, hi]; refuses booleans, fractions (2.7) and numeric strings."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and lo <= value <= hi:
            return int(value)  # 4.0 from a JSON writer that prints every number as a float
        raise TraceError(name, line, field, f"expected a whole number, got {_describe(value)}")
    if value < lo or value > hi:
        raise TraceError(name, line, field, f"{_short(value)} is out of range; expected {lo} to {_short(hi)}")
    return value


def number(value: Any, name: str, line: int | None, field: str, lo: float | None = None,
           hi: float | None = None) -> float:
    """A finite number (int or float) in [lo, hi]; NaN and infinities are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(name, line, field, f"expected a number, got {_describe(value)}")
    try:
        out = float(value)
    except OverflowError:
        raise TraceError(name, line, field, f"{_short(value)} is too large") from None
    if not math.isfinite(out):
        raise TraceError(name, line, field, f"expected a finite number, got {value}")
    if (lo is not None and out < lo) or (hi is not None and out > hi):
        bounds = f"at least {lo}" if hi is None else (f"at most {hi}" if lo is None else f"{lo} to {hi}")
        raise TraceError(name, line, field, f"{value} is out of range; expected {bounds}")
    return out


def id_list(value: Any, name: str, line: int | None, field: str, hi: int) -> tuple[int, ...]:
    """A list of ids in [0, hi] (token ids, hash ids)."""
    if not isinstance(value, list):
        raise TraceError(name, line, field, f"expected a list of integers, got {_type(value)}")
    # At C speed for a good list (8M ids in ~0.5 s, not ~3 s); a bad one is walked to name its item.
    if value and set(map(type, value)) == {int} and min(value) >= 0 and max(value) <= hi:
        return tuple(value)
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TraceError(name, line, field, f"item {i} is {_describe(v)}, not an integer")
        if v < 0 or v > hi:
            raise TraceError(name, line, field, f"item {i} is {_short(v)}; ids run from 0 to {_short(hi)}")
    return tuple(value)


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"a {len(text)}-digit number"


def _describe(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _short(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 24 else value[:21] + "...")
    return _type(value)


# ---------------------------------------------------------------------------- memory
def available_memory() -> int:
    """Bytes this process can still allocate without swapping (MemAvailable on Linux), and
    no more than its address-space limit (`ulimit -v`, RLIMIT_AS) leaves it."""
    try:
        import psutil

        available = int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - psutil missing or unsupported: fall back to the page count
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            available = 1 << 62  # unknown: do not refuse
    return min(available, _address_space_left())


def _address_space_left() -> int:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return 1 << 62
        with open("/proc/self/statm", "rb") as fh:
            mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        return max(0, soft - mapped)
    except (ImportError, OSError, ValueError, IndexError):
        return 1 << 62


def human_bytes(n: float, digits: int = 1) -> str:
    """`n` bytes in binary units ("1.5 GiB"); the one formatter the messages and views share."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(n) < 1024 or unit == "EiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.{digits}f} {unit}"
        n /= 1024
    return f"{n:,.{digits}f} EiB"  # pragma: no cover


def check_memory(num_bytes: int, what: str) -> None:
    """Refuse, before allocating, what would not fit in this machine's available memory."""
    if num_bytes <= 64 * 2**20:
        return  # small enough never to matter; skips the system call on hot paths
    available = available_memory()
    if num_bytes > available:
        raise InputError(f"{what} needs {human_bytes(num_bytes)} of memory but this machine has "
                         f"{human_bytes(available)} available; choose a smaller size")


# Measured (VmHWM of `replay --kernel python --capacity-blocks N`, N = 2M to 8M, CPython 3.11):
# 153 bytes a block: the `Block` (slots, ten fields), its list slot and its free-queue links.
# (128 was the `Block` and its slot alone.) A block that stores a hash costs more: see
# engine.analysis.sweep, whose estimate counts what a replay stores.
BYTES_PER_BOOKKEEPING_BLOCK = 160


def check_block_pool(num_blocks: int, what: str = "a pool") -> None:
    check_memory(num_blocks * BYTES_PER_BOOKKEEPING_BLOCK, f"{what} of {num_blocks:,} blocks")
