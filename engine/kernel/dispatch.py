"""Choosing the bookkeeping of a trace replay: the compiled kernel or the Python engine.

`replay_with` is what `cachescope replay --kernel` and the app's File > Open call. It
imports numba only when the kernel is asked for, so "auto" still runs everything where
numba is missing.
"""

from __future__ import annotations

from dataclasses import fields as dataclass_fields
from typing import Iterable

from engine.core.errors import InputError
from engine.core.events import EventBus
from engine.core.replay import ReplayConfig, replay
from engine.core.served import ReplayResult
from engine.core.trace import TraceRequest


KERNELS = ("auto", "numba", "python")


def replay_with(kernel: str, requests: Iterable[TraceRequest], config: ReplayConfig,
                events: EventBus | None = None, source: str = "the trace") -> ReplayResult:
    """`replay` on the chosen bookkeeping: "python" (this module, the reference), "numba"
    (`engine.kernel`, compiled; the same result and events, held equal by tests) or "auto"
    (numba where it can run the trace, else Python). "numba" on a trace it cannot run is
    an `InputError` naming why. With numba, `events` gets the events after the run."""
    if kernel not in KERNELS:
        raise InputError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    if kernel == "python":
        return replay(requests, config, events, source=source)
    try:
        from engine.kernel.replay import prepare, replay_kernel, unsupported_reason
    except ImportError as exc:  # numba missing: the Python engine still runs everything
        if kernel == "auto":
            return replay(requests, config, events, source=source)
        raise InputError(f"the numba kernel is not available ({exc})") from None
    arrays = prepare(requests, config.block_size)
    why = unsupported_reason(config, arrays)
    if why is not None:
        if kernel == "auto":
            return replay(arrays.requests, config, events, source=source)
        raise InputError(why)
    listening = events is not None and events.active
    run = replay_kernel(arrays, config, record=listening, source=source)
    if listening and run.log is not None:
        assert events is not None
        for event in run.log.events():
            fields = {f.name: getattr(event, f.name) for f in dataclass_fields(event) if f.name not in ("seq", "time")}
            events.emit(type(event), **fields)
    return run.result
