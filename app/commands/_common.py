"""Helpers shared by subcommands: JSON output and argument types.

Every number on the command line is parsed here, with the ranges of
`engine.core.validation`, so a value the engine cannot hold is refused by argparse (one
line, exit status 2) instead of overflowing later.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from fractions import Fraction
from typing import Any

from engine.core.validation import MAX_INT64

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTPE]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15, "eb": 10**18,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50, "eib": 2**60}
_INT = re.compile(r"^\s*[+-]?\d+\s*$")
_MAX_DIGITS = 40  # far beyond 2**63, far below Python's 4300-digit conversion limit


def print_json(data: Any) -> None:
    # allow_nan=False: NaN and Infinity are not JSON; inputs are checked to be finite, so
    # this only turns a bug into an error instead of output other tools cannot parse.
    json.dump(data, sys.stdout, indent=None, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    sys.stdout.write("\n")


def _int(text: str, lo: int, hi: int) -> int:
    if not _INT.match(text):
        shown = text if len(text) <= 24 else text[:21] + "..."
        raise argparse.ArgumentTypeError(f"{shown!r} is not a whole number")
    if len(text.strip().lstrip("+-")) > _MAX_DIGITS:
        raise argparse.ArgumentTypeError(f"a {len(text.strip())}-digit number is too large (at most {hi})")
    value = int(text)
    if value < lo:
        raise argparse.ArgumentTypeError(f"{value} must be at least {lo}")
    if value > hi:
        raise argparse.ArgumentTypeError(f"{value} is too large (at most {hi})")
    return value


def positive_int(text: str) -> int:
    return _int(text, 1, MAX_INT64)


def vllm_gpu_blocks(text: str) -> int:
    """A vLLM server's `num_gpu_blocks` -> the usable blocks of the same pool (N - 1)."""
    from engine.core.blocks import usable_blocks_of_vllm

    try:
        return usable_blocks_of_vllm(_int(text, 2, MAX_INT64))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_pool_size(p: argparse.ArgumentParser, help_blocks: str, dest: str = "capacity_blocks",
                  flag: str = "--capacity-blocks", default: int | None = None) -> None:
    """The pool size in usable blocks (`flag`) or as a vLLM server's num_gpu_blocks; one `dest`."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(flag, type=positive_int, default=default, dest=dest, metavar="N", help=help_blocks)
    group.add_argument("--num-gpu-blocks", type=vllm_gpu_blocks, dest=dest, metavar="N",
                       help="the same as a vLLM server's num_gpu_blocks (its null block included: N - 1 usable blocks)")


def non_negative_int(text: str) -> int:
    return _int(text, 0, MAX_INT64)


def seed_int(text: str) -> int:
    """A hash seed: any signed 64-bit integer (it is stored in SQLite and hashed as 8 bytes)."""
    return _int(text, -MAX_INT64 - 1, MAX_INT64)


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (seconds, prices); nan and inf are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:24]!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or value > 1e15:
        raise argparse.ArgumentTypeError(f"{text[:24]} must be a finite number from 0 to 1e15")
    return value


def byte_size(text: str) -> int:
    """'512MiB', '2GB', '1048576' -> bytes (at most 2**63 - 1; whether it fits is checked later)."""
    m = _SIZE.match(text)
    if not m:
        shown = text if len(text) <= 24 else text[:21] + "..."
        raise argparse.ArgumentTypeError(f"{shown!r} is not a size such as 512MiB or 2GB")
    unit = (m.group(2) or "B").lower()
    if len(m.group(1)) > _MAX_DIGITS:
        raise argparse.ArgumentTypeError(f"a {len(m.group(1))}-digit size is too large")
    value = int(Fraction(m.group(1)) * _UNITS[unit])  # exact: no float overflow on long numbers
    if value > MAX_INT64:
        raise argparse.ArgumentTypeError(f"{text.strip()[:24]} is too large a size")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text.strip()} is less than one byte")
    return value
