"""Block arithmetic every layer shares. (The block size behind Mooncake's hash ids is
`engine.core.trace.MOONCAKE_BLOCK_SIZE`, beside the trace reader that needs it.)
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of `b`-sized blocks that hold `a` items."""
    return -(-a // b)
