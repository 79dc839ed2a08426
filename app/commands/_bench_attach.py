"""`cachescope bench attach` from the app: `engine.bench.attach` with its 64 loopback streams
consumed through a Qt event loop, as the app consumes them.

The engine's bench is Qt-free; here the fleet's events reach the app's own `EngineBridge`
(its listener appends under a lock on each stream's thread, its 16 ms timer flushes them
as `sigEvents` on the Qt thread), and a 5 ms QTimer on the same loop records the longest
time the loop could not run: the stall a window would show while the fleet streams in.
"""

from __future__ import annotations

import time
from typing import Any

from engine.bench import attach
from engine.core.events import EventBus

TICK_MS = 5


def qt_loop(attachment: Any, bus: EventBus, seconds: float) -> dict[str, Any]:
    """Run a Qt event loop with the app's bridge on `bus` for `seconds`; its longest stall."""
    import shiboken6
    from PySide6.QtCore import QCoreApplication, QEventLoop, QTimer

    from app.runtime.bridge import EngineBridge

    app = QCoreApplication.instance() or QCoreApplication([])
    bridge = EngineBridge()
    drained = [0]
    bridge.sigEvents.connect(lambda events: drained.__setitem__(0, drained[0] + len(events)))
    bridge.attach(bus)
    longest = [0.0]
    last = [time.perf_counter()]

    def tick() -> None:
        now = time.perf_counter()
        longest[0] = max(longest[0], now - last[0] - TICK_MS / 1000)
        last[0] = now

    ticker = QTimer(interval=TICK_MS)
    ticker.timeout.connect(tick)
    loop = QEventLoop()
    ticker.start()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    last[0] = time.perf_counter()
    loop.exec()
    ticker.stop()
    bridge.detach()
    bridge.flush()
    # Delete the Qt objects here, on the thread they live in: left to the collector, a
    # collection a later bench's thread sets off can free the bridge there, and its timer's
    # destructor crashed `bench all` in libQt6Core ("Timers cannot be stopped from another
    # thread").
    bridge.stop()
    for obj in (ticker, loop, bridge):
        shiboken6.delete(obj)
    del app
    return {"event_loop": f"Qt ({QCoreApplication.__name__}), the app's EngineBridge, a {TICK_MS} ms timer",
            "longest_stall_ms": round(longest[0] * 1000, 1), "events_drained": drained[0]}


def run_bench(quick: bool = False) -> dict[str, Any]:
    return attach.run_bench(quick=quick, event_loop=qt_loop)
