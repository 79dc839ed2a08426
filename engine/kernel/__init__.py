"""A compiled replay kernel (numba) for the prefix-cache bookkeeping of `engine.core`.

`replay_kernel` gives what `engine.core.replay.replay` gives, and its events as a
`engine.core.columnar.ColumnarLog`; the Python engine stays the reference. Compiled at
first use and cached on disk (`cache=True`).
"""

from engine.kernel.replay import KernelReplay, TraceArrays, prepare, replay_kernel, unsupported_reason

__all__ = ["KernelReplay", "TraceArrays", "prepare", "replay_kernel", "unsupported_reason"]
