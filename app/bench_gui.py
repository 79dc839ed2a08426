"""`cachescope bench gui`: block-grid redraw, event ingestion and window start-up, timed.

Workloads are real: the Mooncake conversation trace replayed through the engine supplies
the events and the pool state. Targets: redraw of 16K blocks < 16 ms, ingestion of 100K
events/s with no GUI stall over 50 ms, window up in < 1.5 s (in a fresh process).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = ROOT / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
GRID_BLOCKS = 16_384
TARGET_REDRAW_MS = 16.0
TARGET_EVENTS_PER_S = 100_000.0
TARGET_STALL_MS = 50.0
TARGET_WINDOW_S = 1.5

_WINDOW_CHILD = """
import os, sys, time
t0 = time.perf_counter()
from PySide6.QtWidgets import QApplication
app = QApplication(sys.argv[:1])
from app.context import make_test_context
from app.main_window import MainWindow
ctx = make_test_context(sys.argv[1])
w = MainWindow(ctx, load_model=False)
w.show()
app.processEvents()
print(f"{time.perf_counter() - t0:.6f}", flush=True)
ctx.shutdown()
w.deleteLater()
app.processEvents()
"""


def _app() -> Any:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    return QApplication.instance() or QApplication(sys.argv[:1])


def _recorded_events(num_requests: int, block_size: int, capacity: int) -> list:
    """Events of a real Mooncake replay, recorded once so the producer is not the bottleneck."""
    from engine.core.events import EventBus
    from engine.core.replay import ReplayConfig, replay
    from engine.core.trace import read_trace

    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    trace = read_trace(MOONCAKE, block_size)
    requests = [r for _, r in zip(range(num_requests), trace)]
    replay(requests, ReplayConfig(block_size=block_size, capacity_blocks=capacity, seed=0), events=bus)
    return events


def _dispose(app: Any, *objects: Any) -> None:
    """Delete widgets while Qt is alive; left to interpreter exit, PySide6 may crash."""
    import gc

    for obj in objects:
        if hasattr(obj, "close"):
            obj.close()
        obj.deleteLater()
    app.processEvents()
    gc.collect()


def _wait(app: Any, condition, timeout_s: float) -> None:
    deadline = time.perf_counter() + timeout_s
    while not condition():
        if time.perf_counter() > deadline:
            raise RuntimeError("the benchmark workload did not finish in time")
        app.processEvents()
        time.sleep(0.001)


def bench_redraw(quick: bool) -> dict[str, Any]:
    """Redraw of the block grid with 16K blocks filled by a real replay, repainted each time."""
    from app.context import engine_info, make_test_context
    from app.views.block_table_view import BlockTableView

    app = _app()
    ctx = make_test_context()
    view = None
    try:
        view = BlockTableView(ctx)
        view.resize(1200, 800)
        view.show()
        bus = ctx.new_event_bus(engine_info(block_size=512, num_blocks=GRID_BLOCKS))
        events = _recorded_events(600 if quick else 3000, 512, GRID_BLOCKS)
        ctx.bridge.detach()
        ctx.bridge.push(events)
        ctx.bridge.flush(everything=True)
        del bus
        app.processEvents()
        times = []
        for _ in range(10 if quick else 40):
            t = time.perf_counter()
            view.redraw()
            view.glw.viewport().repaint()
            times.append((time.perf_counter() - t) * 1000)
        p = ctx.state.projection
        return {"num_blocks": p.num_blocks, "num_blocks_in_use_or_cached": p.num_in_use + p.num_cached_free,
                "num_events": len(events), "median_ms": round(statistics.median(times), 3),
                "p90_ms": round(sorted(times)[int(len(times) * 0.9) - 1], 3), "max_ms": round(max(times), 3)}
    finally:
        ctx.shutdown()
        _dispose(app, *([view] if view is not None else []), ctx)


def bench_ingestion(quick: bool) -> dict[str, Any]:
    """Events pushed from another thread as fast as it can, through the bridge into PoolState,
    while a 5 ms probe timer in the GUI thread records the longest gap between its ticks."""
    from PySide6.QtCore import QTimer

    from app.context import engine_info, make_test_context

    app = _app()
    ctx = make_test_context()
    try:
        events = _recorded_events(1500 if quick else 12_031, 512, 4096)
        ctx.new_event_bus(engine_info(block_size=512, num_blocks=4096))
        deliver = ctx.bridge._on_event  # exactly what the bus calls for each event
        ticks: list[float] = []
        probe = QTimer()
        probe.setInterval(5)
        probe.timeout.connect(lambda: ticks.append(time.perf_counter()))
        probe.start()
        _wait(app, lambda: len(ticks) >= 3, 5)

        def produce() -> None:
            for e in events:
                deliver(e)

        t0 = time.perf_counter()
        ticks.clear()
        ticks.append(t0)
        producer = threading.Thread(target=produce)
        producer.start()
        _wait(app, lambda: len(ctx.state.log) >= len(events), 300)
        elapsed = time.perf_counter() - t0
        producer.join()
        probe.stop()
        gaps = [(b - a) * 1000 for a, b in zip(ticks, ticks[1:])]
        return {"num_events": len(events), "seconds": round(elapsed, 4),
                "events_per_s": round(len(events) / elapsed, 1), "num_batches": ctx.bridge.num_flushes,
                "max_gui_gap_ms": round(max(gaps) if gaps else 0.0, 2),
                "p99_gui_gap_ms": round(sorted(gaps)[int(len(gaps) * 0.99) - 1] if gaps else 0.0, 2)}
    finally:
        ctx.shutdown()
        _dispose(app, ctx)


def bench_window(quick: bool) -> dict[str, Any]:
    """Seconds from a fresh interpreter to the main window shown, without a model (median)."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(2 if quick else 5):
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", _WINDOW_CHILD, tmp], capture_output=True, text=True,
                                  cwd=ROOT, env=env, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"the window did not start: {proc.stderr.strip()[-300:]}")
            times.append((time.perf_counter() - t, float(proc.stdout.strip().splitlines()[-1])))
    return {"runs": len(times), "median_s": round(statistics.median(t for t, _ in times), 3),
            "median_in_process_s": round(statistics.median(s for _, s in times), 3)}


def _target(value: float, target: float, lower_is_better: bool = True) -> dict[str, Any]:
    met = value < target if lower_is_better else value >= target
    return {"value": value, "target": target, "met": met}


def run_bench(quick: bool = False) -> dict[str, Any]:
    redraw = bench_redraw(quick)
    ingest = bench_ingestion(quick)
    window = bench_window(quick)
    return {
        "quick": quick,
        "redraw": redraw,
        "ingestion": ingest,
        "window": window,
        # Side-by-side ratios: measured against target (> 1 means headroom).
        "ratios": {"redraw_target_over_median": round(TARGET_REDRAW_MS / max(redraw["median_ms"], 1e-9), 2),
                   "ingestion_rate_over_target": round(ingest["events_per_s"] / TARGET_EVENTS_PER_S, 2),
                   "stall_target_over_max_gap": round(TARGET_STALL_MS / max(ingest["max_gui_gap_ms"], 1e-9), 2),
                   "window_target_over_median": round(TARGET_WINDOW_S / max(window["median_s"], 1e-9), 2)},
        "targets": {
            "redraw_16k_blocks_ms": _target(redraw["median_ms"], TARGET_REDRAW_MS),
            "ingestion_events_per_s": _target(ingest["events_per_s"], TARGET_EVENTS_PER_S, lower_is_better=False),
            "ingestion_max_gui_stall_ms": _target(ingest["max_gui_gap_ms"], TARGET_STALL_MS),
            "window_up_s": _target(window["median_s"], TARGET_WINDOW_S),
        },
    }
