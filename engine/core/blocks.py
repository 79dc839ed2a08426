"""Block arithmetic every layer shares. (The block size behind Mooncake's hash ids is
`engine.core.trace.MOONCAKE_BLOCK_SIZE`, beside the trace reader that needs it.)
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of `b`-sized blocks that hold `a` items."""
    return -(-a // b)


def usable_blocks_of_vllm(num_gpu_blocks: int) -> int:
    """The pool size (usable blocks) of a vLLM server started with `num_gpu_blocks` blocks.

    vLLM 0.33.0 takes block 0 as its null block before anything is allocated, so a server
    whose log says `num_gpu_blocks = N` caches in N - 1 blocks; a pool of N here would
    evict later than the server does.
    """
    if isinstance(num_gpu_blocks, bool) or not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 2:
        raise ValueError(f"a vLLM pool of num_gpu_blocks={num_gpu_blocks!r} has no usable block "
                         "(block 0 is vLLM's null block): give at least 2")
    return num_gpu_blocks - 1
