"""Helpers shared by subcommands: JSON output and argument types."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=None, separators=(",", ":"), ensure_ascii=False)
    sys.stdout.write("\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must not be negative")
    return value


def byte_size(text: str) -> int:
    """'512MiB', '2GB', '1048576' -> bytes."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 512MiB or 2GB")
    unit = (m.group(2) or "B").lower()
    return int(float(m.group(1)) * _UNITS[unit])
