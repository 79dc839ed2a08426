"""A compiled replay kernel (numba) for the prefix-cache bookkeeping of `engine.core`.

`replay_kernel` gives what `engine.core.replay.replay` gives, and its events as a
`engine.core.columnar.ColumnarLog`; the Python engine stays the reference. Compiled at
first use and cached on disk (`cache=True`). `engine.kernel.dispatch.replay_with` chooses
between the two and needs numba only when the kernel runs, so this package imports it
lazily too.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KernelReplay", "TraceArrays", "prepare", "replay_kernel", "unsupported_reason"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from engine.kernel import replay

        return getattr(replay, name)
    raise AttributeError(f"module 'engine.kernel' has no attribute {name!r}")
