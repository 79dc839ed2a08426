"""Loopback ports for the ZMQ tests that stay free across pytest-xdist workers.

A port the kernel hands out for `bind(("127.0.0.1", 0))` is free only until it is closed:
another process may take it before the test binds it again. Each xdist worker therefore
takes its ports from a range of its own below Linux's ephemeral range (32768-60999 by
default), which the kernel never hands out for port 0, and checks each port by binding it.
"""

from __future__ import annotations

import os
import random
import socket

_FIRST, _SPAN = 10_000, 2_500  # worker k: [_FIRST + k * _SPAN, _FIRST + (k + 1) * _SPAN)


def _worker_index() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # gw0, gw1, ... (no xdist: gw0)
    digits = name.lstrip("gw")
    return int(digits) % 8 if digits.isdigit() else 0


_start = _FIRST + _worker_index() * _SPAN
_offset = [random.Random(os.getpid()).randrange(_SPAN)]  # where the next search starts


def free_ports(n: int = 1) -> int:
    """A base port p with p .. p+n-1 all free on 127.0.0.1, from this worker's own range.

    Ports handed out are never handed out again by this process (until the range wraps),
    so two calls before either test binds cannot return overlapping ports."""
    for _ in range(_SPAN):
        base = _start + _offset[0] % (_SPAN - n)
        _offset[0] += 1
        socks = []
        try:
            for i in range(n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + i))
            _offset[0] += n
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError(f"no {n} free ports in {_start}..{_start + _SPAN - 1}")
