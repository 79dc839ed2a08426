"""`cachescope bench gui`: opening a trace, block-grid redraw, event ingestion and window start-up, timed.

Workloads are real: the Mooncake conversation trace replayed through the engine supplies
the events and the pool state; a remote vLLM pool of 1M blocks is built from events shaped
as `engine.remote` converts them. Targets: redraw of 16K blocks < 16 ms, of the 1M-block
remote pool < 16 ms (memory per tracked block reported), ingestion of 100K
events/s with no GUI stall over 50 ms, window up (first paint) in < 1.0 s from a fresh
interpreter; and what
the user waits for: File > Open of the Mooncake trace until every view shows the last event,
at most 1.5x the headless `cachescope replay` of the same file, measured in the same run.
"""

from __future__ import annotations

import gc
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from app.runtime.context import AppContext
    from app.views.pool.block_table_view import BlockTableView

ROOT = Path(__file__).resolve().parents[2]  # the checkout: app/commands/ is two below it
MOONCAKE = ROOT / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
GRID_BLOCKS = 16_384
REMOTE_BLOCKS = 1_000_000
TARGET_REDRAW_MS = 16.0
TARGET_EVENTS_PER_S = 100_000.0
TARGET_STALL_MS = 50.0
TARGET_WINDOW_S = 1.0  # first paint (issue 20)

_WINDOW_CHILD = """
import os, sys, time
from PySide6.QtWidgets import QApplication
app = QApplication(sys.argv[:1])
from app.runtime.context import make_test_context
from app.window.main_window import MainWindow
ctx = make_test_context(sys.argv[1])
w = MainWindow(ctx, load_model=False)
w.show()
while not getattr(w, "first_painted", True):  # a window without the flag: shown is painted
    app.processEvents()
painted = time.time()
pg_at_paint = "pyqtgraph" in sys.modules
while not getattr(w, "startup_done", True):
    app.processEvents()
print(f"{painted:.6f} {time.time():.6f} {int(pg_at_paint)}", flush=True)
ctx.shutdown()
w.deleteLater()
app.processEvents()
"""


# `cachescope gui --no-model` itself, as a user starts it (the command line, the default
# store and the demos included): an event filter reads the time, the process's CPU time and
# the heavy modules already imported as the main window gets its first UpdateRequest.
_COMMAND_CHILD = """
import os, sys, time
from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QApplication
app = QApplication(sys.argv[:1])
HEAVY = ("numpy", "numba", "torch", "transformers", "pyqtgraph", "msgspec", "sqlite_utils", "engine.remote")
class Watch(QObject):
    def eventFilter(self, obj, event):
        if event.type() == QEvent.Type.UpdateRequest and obj.objectName() == "MainWindow":
            heavy = ",".join(m for m in HEAVY if m in sys.modules) or "-"
            print(f"{time.time():.6f} {time.process_time():.6f} {heavy}", flush=True)
            os._exit(0)  # the window is up: what follows is not timed here
        return False
watch = Watch()
app.installEventFilter(watch)
from app.cli import main
main(["gui", "--no-model"])
"""


# The anchor of window up: an empty QMainWindow from a fresh interpreter, first paint by the
# same sign MainWindow uses (the backing store painted and flushed: UpdateRequest handled).
_BARE_CHILD = """
import sys, time
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication, QMainWindow
app = QApplication(sys.argv[:1])
class Bare(QMainWindow):
    first_painted = False
    def event(self, event):
        handled = super().event(event)
        if event.type() == QEvent.Type.UpdateRequest:
            self.first_painted = True
        return handled
w = Bare()
w.show()
while not w.first_painted:
    app.processEvents()
print(f"{time.time():.6f}", flush=True)
"""


# The start of a child process that opens a file in a window (`bench_open`, and
# `app.commands._bench_capture`): a 1280x800 window on a test context in folder argv[1],
# up and warm, and `rss()`.
WINDOW_CHILD = """
import gc, json, os, sys, time
from PySide6.QtWidgets import QApplication
app = QApplication(sys.argv[:1])
from app.runtime.context import make_test_context
from app.window.main_window import MainWindow
ctx = make_test_context(sys.argv[1])
w = MainWindow(ctx, load_model=False)
w.resize(1280, 800)
w.show()
app.processEvents()
getattr(w, "finish_startup", lambda: None)()  # the panels built after the first paint: not the open's time
app.processEvents()
# the live log's passes load on a thread of their own after the first paint (numba with
# them): a user opens a file a moment later; here the open waits for it, so that neither
# its time nor its memory counts a warm-up still running beside it
getattr(ctx, "wait_warm", lambda timeout=None: False)(120)
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
"""

_OPEN_CHILD = WINDOW_CHILD + """
from app.runtime.jobs import trace_block_size, trace_capacity
from pathlib import Path
path = Path(sys.argv[2])
gc.collect()
numba_before = "numba" in sys.modules
# numba's one-time load, in this process: the kernel and the columnar log's compiled code
# loaded from numba's disk cache by a replay of two requests, as a window's first use of
# them loads it (measured in a process of its own, it moved by ~1 MB from one to the next)
rss_load = rss()
from engine.core.columnar_log import ColumnarEventLog
from engine.core.replay import ReplayConfig
from engine.core.trace import TraceRequest
from engine.kernel.replay import replay_kernel
tiny = [TraceRequest(0, 1, "a", None, None, None, (1, 2), 1024, 2),
        TraceRequest(1, 2, "b", None, None, None, (1, 3), 1024, 2)]
tiny_log = ColumnarEventLog(replay_kernel(tiny, ReplayConfig(block_size=512, capacity_blocks=64), record=True).log,
                            time=0.0)
tiny_log.warm()
del tiny_log, tiny
gc.collect()
numba_load = rss() - rss_load
rss0 = rss()
done = []
t0 = time.perf_counter()
w.open_file(path, on_done=done.append)
while not done:
    app.processEvents()
    time.sleep(0.001)
t_shown = time.perf_counter() - t0
for _ in range(5):  # the frame the views draw after the last batch
    app.processEvents()
elapsed = time.perf_counter() - t0
block_size = trace_block_size(path)
gc.collect()
from app.runtime.allocator import wait_released
wait_released(10)  # the trims after the views' first paints, on the releaser's thread, done
grown = rss() - rss0
log = ctx.state.log
columnar = getattr(log, "columnar", None)  # the kernel's log; None when the Python engine ran
print(json.dumps({"rss_growth_bytes": grown, "open_to_last_event_drawn_s": elapsed, "open_to_shown_s": t_shown,
                  "events": len(log), "block_size": block_size, "capacity": trace_capacity(path, block_size),
                  "distinct_blocks": len(columnar.keys) if columnar is not None else None,
                  "rows": columnar.num_rows if columnar is not None else None,
                  "rows_bytes": columnar.nbytes() if columnar is not None else None,
                  "numba_loaded_before": numba_before, "numba_load_bytes": numba_load,
                  "ok": done[0] is not None}), flush=True)
ctx.shutdown()
w.deleteLater()
app.processEvents()
"""


# `cachescope ARGS` in a fresh process that reports its own peak RSS when done: VmHWM
# (this process image's high-water mark; getrusage's ru_maxrss would count the parent's
# pages the child had before its exec).
_HEADLESS_CHILD = """
import sys
from app.cli import main
code = main(sys.argv[1:])
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
sys.stderr.write(f"\\nVmHWM_kB {hwm}\\n")
sys.exit(code)
"""


def _headless(args: list[str], env: dict[str, str]) -> tuple[float, int]:
    """`cachescope ARGS` to its end: (seconds, its peak RSS in bytes)."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _HEADLESS_CHILD, *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=3600)
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"the headless replay failed: {proc.stderr.strip()[-300:]}")
    return seconds, int(proc.stderr.split("VmHWM_kB")[-1].split()[0]) * 1024


def bench_open(quick: bool) -> dict[str, Any]:
    """File > Open of the Mooncake trace in a real (offscreen) 1280x800 window, from the open
    until every view has drawn the last event, in a fresh process; beside it, in the same
    run, `cachescope replay` of the same file with the same pool, headless."""
    import json

    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    with tempfile.TemporaryDirectory() as tmp:
        path = MOONCAKE
        if quick:
            path = Path(tmp) / "mooncake_first_1500.jsonl"
            with MOONCAKE.open("rb") as src:
                path.write_bytes(b"".join(line for _, line in zip(range(1500), src)))
        proc = subprocess.run([sys.executable, "-c", _OPEN_CHILD, tmp, str(path)], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"the window did not open the trace: {proc.stderr.strip()[-300:]}")
        app_run = json.loads(proc.stdout.strip().splitlines()[-1])
        headless_s, headless_peak = _headless(
            ["replay", str(path), "--no-model", "--block-size", str(app_run["block_size"]),
             "--capacity-blocks", str(app_run["capacity"]), "--json", "--totals-only"], env)
    # numba's one-time load (the kernel's and the columnar log's compiled functions; numba
    # itself too when the window's warm-up had not imported it) is taken in the window's own
    # process before the open, which therefore grows by what the trace makes it keep only
    numba_fixed = app_run["numba_load_bytes"]
    trace_grown = max(0, app_run["rss_growth_bytes"])
    grown = trace_grown + numba_fixed  # what the open grew by, numba's first load with it
    distinct = app_run["distinct_blocks"] or 0
    out = {"trace": path.name, "requests": 1500 if quick else 12_031, "events": app_run["events"],
           "capacity_blocks": app_run["capacity"],
           "app_open_to_last_event_drawn_s": round(app_run["open_to_last_event_drawn_s"], 2),
           "headless_replay_s": round(headless_s, 2),
           "app_over_headless": round(app_run["open_to_last_event_drawn_s"] / headless_s, 2),
           # RSS growth of the app over the open (log, projection, checkpoints, series, views),
           # numba's first load included (it happens at the first open)
           "rss_growth_mb": round(grown / 1e6, 1),
           "bytes_per_pool_block": round(grown / max(1, app_run["capacity"]), 1),
           "bytes_per_event": round(grown / max(1, app_run["events"]), 1),
           # the same growth without numba's fixed load (loaded and measured in the window's
           # process just before the open)
           "numba_fixed_mb": round(numba_fixed / 1e6, 1),
           "trace_rss_growth_mb": round(trace_grown / 1e6, 1),
           "trace_bytes_per_event": round(trace_grown / max(1, app_run["events"]), 1),
           "headless_peak_rss_mb": round(headless_peak / 1e6, 1)}
    if distinct:
        # a tracked block of an opened trace: one distinct block (chain) of the trace; a
        # block reference (a hash id in a request) is not one, nor is a pool block
        out.update(distinct_blocks=distinct, log_rows=app_run["rows"],
                   log_row_bytes_per_distinct_block=round(app_run["rows_bytes"] / distinct, 1),
                   bytes_per_distinct_block=round(trace_grown / distinct, 1))
    return out


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


def _block_table(ctx: AppContext) -> BlockTableView:
    """The app's block table view, shown at 1200x800 (offscreen)."""
    from app.views.pool.block_table_view import BlockTableView

    view = BlockTableView(ctx)
    view.resize(1200, 800)
    view.show()
    return view


def _draw_ms(view: Any) -> float:
    """One redraw of `view` and its repaint, in milliseconds."""
    t = time.perf_counter()
    view.redraw()
    view.glw.viewport().repaint()
    return (time.perf_counter() - t) * 1000


def bench_redraw(quick: bool) -> dict[str, Any]:
    """Redraw of the block grid with 16K blocks filled by a real replay, repainted each time."""
    from app.runtime.context import engine_info, make_test_context

    app = _app()
    ctx = make_test_context()
    view = None
    try:
        view = _block_table(ctx)
        bus = ctx.new_event_bus(engine_info(block_size=512, num_blocks=GRID_BLOCKS))
        events = _recorded_events(600 if quick else 3000, 512, GRID_BLOCKS)
        ctx.bridge.detach()
        ctx.bridge.push(events)
        ctx.bridge.flush(everything=True)
        del bus
        app.processEvents()
        times = []
        for _ in range(10 if quick else 40):
            times.append(_draw_ms(view))
        p = ctx.state.projection
        return {"num_blocks": p.num_blocks, "num_blocks_in_use_or_cached": p.num_in_use + p.num_cached_free,
                "num_events": len(events), "median_ms": round(statistics.median(times), 3),
                "p90_ms": round(sorted(times)[int(len(times) * 0.9) - 1], 3), "max_ms": round(max(times), 3)}
    finally:
        ctx.shutdown()
        _dispose(app, *([view] if view is not None else []), ctx)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _remote_events(n: int) -> list:
    """`n` BlockStored events as `engine.remote` converts a vLLM stream: chains of 8 blocks
    of 16 tokens, batches of 64 blocks sharing one RemoteInfo, tiers 70% GPU, 25% CPU, 5%
    storage, stored over 20 minutes of server time (so every age shade shows)."""
    from engine.core.events import BlockStored, RemoteInfo

    out = []
    t0 = 1_800_000_000.0
    span = 1200.0
    infos: dict[tuple[str, int], Any] = {}
    parent = None
    for i in range(n):
        batch = i // 64
        r = (batch * 7919) % 100
        medium = "GPU" if r < 70 else "CPU" if r < 95 else "STORAGE"
        info = infos.get((medium, batch))
        if info is None:
            infos.clear()
            info = infos[(medium, batch)] = RemoteInfo(source="bench", batch_seq=batch,
                                                       batch_time=t0 + span * i / n, medium=medium)
        h = (i * 0x9E3779B97F4A7C15 & (2**64 - 1)).to_bytes(8, "big")
        base = (i * 16) % 49_000
        out.append(BlockStored(seq=i, time=info.batch_time, request_id=f"bench#{batch}", block_id=-1, block_hash=h,
                               parent_hash=None if i % 8 == 0 else parent,
                               token_ids=tuple(range(base, base + 16)), salt=None, remote=info))
        parent = h
    return out


def bench_remote_redraw(quick: bool) -> dict[str, Any]:
    """The block grid of a remote vLLM pool of 1,000,000 blocks (tiers and age, aggregated
    into at most MAX_CELLS cells), and the memory the app holds per tracked block."""
    import gc

    from app.runtime.context import make_test_context
    from engine.remote.overlay import MAX_CELLS

    app = _app()
    ctx = make_test_context()
    view = None
    n = 200_000 if quick else REMOTE_BLOCKS
    try:
        view = _block_table(ctx)
        ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "model": "vLLM bench"})
        ctx.wait_warm(120)  # (the context's warm-up thread, not the pool's memory: bench_held_pool)
        gc.collect()
        rss0 = _rss_bytes()
        events = _remote_events(n)
        t = time.perf_counter()
        for i in range(0, n, 50_000):  # the bridge's largest batch
            ctx.state.apply_events(events[i:i + 50_000])
        apply_s = time.perf_counter() - t
        del events
        gc.collect()
        rss1 = _rss_bytes()
        app.processEvents()
        ctx.state.version += 1  # a change the view has not drawn yet (no signal: the bench draws itself)
        first_ms = _draw_ms(view)  # the first draw ages every block (a full pass, once per stream second)
        times, cpu = [], []
        for _ in range(10 if quick else 30):
            t, c = time.perf_counter(), time.thread_time()
            view.redraw()
            view.glw.viewport().repaint()
            times.append((time.perf_counter() - t) * 1000)
            cpu.append((time.thread_time() - c) * 1000)
        remote = ctx.state.remote
        overlay = remote.nbytes_by_part()["slots"]  # per slot: code, rank (when kept), store run, aged codes, grid
        return {"num_blocks": ctx.state.projection.num_blocks, "num_cells": len(view.cell_colors),
                "max_cells": MAX_CELLS, "blocks_per_cell": view.blocks_per_cell,
                "median_ms": round(statistics.median(times), 3), "max_ms": round(max(times), 3),
                "first_redraw_ms": round(first_ms, 3),
                # the GUI thread's own CPU time: what the redraw costs on a machine shared with other work
                "median_cpu_ms": round(statistics.median(cpu), 3), "apply_events_per_s": round(n / apply_s, 1),
                # RSS growth over the whole pool: projection, event log (each event kept for
                # scrubbing, with its 16 token ids), checkpoints and the tier overlay.
                "bytes_per_block": round((rss1 - rss0) / n, 1),
                "overlay_bytes_per_block": round(overlay / n, 1)}
    finally:
        ctx.shutdown()
        _dispose(app, *([view] if view is not None else []), ctx)


HELD_BLOCKS = 10_000_000
HELD_WARM_BLOCKS = 20_000
HELD_FRAME_BLOCKS = 8_192  # blocks per vLLM frame: 128 BlockStored events of a 64-block chain each


def _held_frames(n: int):
    """`n` blocks as vLLM 0.33 frames (`engine.remote.wire.encode_batch`), made one at a time:
    chains of 64 blocks of 16 tokens, tiers 70% GPU, 25% CPU, 5% disk by frame, stored over
    20 minutes of server time. One frame per tier is encoded; the others are copies of it
    with their own block hashes and batch time written at the template's offsets (the
    encoding of 160M token ids would otherwise take minutes)."""
    import struct

    from engine.remote.wire import VllmEvent, encode_batch

    tokens = tuple(range(1000, 1000 + 64 * 16))
    t0, span = 1_800_000_000.0, 1200.0
    mix = np.uint64(0x9E3779B97F4A7C15)

    def hashes_of(first: int, last: int) -> np.ndarray:
        # the top bit set: msgpack writes every hash as a uint64 of 8 bytes (0xcf), at a fixed offset
        return ((np.arange(first, last, dtype=np.uint64) * mix) | np.uint64(1 << 63)).astype(">u8")

    templates: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, int]] = {}
    for f, first in enumerate(range(0, n, HELD_FRAME_BLOCKS)):
        last = min(n, first + HELD_FRAME_BLOCKS)
        r = (f * 7919) % 100
        medium = "GPU" if r < 70 else "CPU" if r < 95 else "DISK"
        ts = t0 + span * first / n
        if (medium, last - first) not in templates:
            raw = hashes_of(first, last).tobytes()
            hashes = [raw[j:j + 8] for j in range(0, len(raw), 8)]
            events = [VllmEvent("BlockStored", tuple(hashes[c:c + 64]), None, tokens[:16 * len(hashes[c:c + 64])],
                                16, medium=medium) for c in range(0, len(hashes), 64)]
            payload = encode_batch(ts, events)
            at = np.zeros(len(hashes), np.int64)
            pos = 0
            for j, h in enumerate(hashes):  # in payload order: each search starts at the last one
                pos = at[j] = payload.index(h, pos)
            where = (at[:, None] + np.arange(8)).ravel()
            templates[(medium, last - first)] = (np.frombuffer(payload, np.uint8), where,
                                                 payload.index(struct.pack(">d", ts)))
        base, where, ts_at = templates[(medium, last - first)]
        frame = base.copy()
        frame[where] = hashes_of(first, last).view(np.uint8)
        frame[ts_at:ts_at + 8] = np.frombuffer(struct.pack(">d", ts), np.uint8)
        yield frame.tobytes()


def _churn_frames(n: int, count: int):
    """`count` vLLM frames for a pool `_held_frames(n)` filled: each removes 64 of its blocks
    (spread over the pool) and stores 64 new ones (a GPU chain)."""
    from engine.remote.wire import VllmEvent, encode_batch

    mix = 0x9E3779B97F4A7C15
    held = lambda i: (((i * mix) & (2**64 - 1)) | (1 << 63)).to_bytes(8, "big")  # noqa: E731 - _held_frames' hash
    t = 1_800_000_000.0 + 1200.0
    for j in range(count):
        gone = tuple(held((j * 7919 + m * (n // 64)) % n) for m in range(64))
        new = tuple(held(n + 64 * j + m) for m in range(64))
        yield encode_batch(t + j, [VllmEvent("BlockRemoved", gone, medium="GPU"),
                                   VllmEvent("BlockStored", new, None, tuple(range(1000, 1000 + 64 * 16)), 16,
                                             medium="GPU")])


def bench_held_pool(quick: bool, sizes: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Remote vLLM pools of 1M and 10M blocks held and drawn by the app, side by side in
    one run: frames decoded into the engine's columnar pool (`engine.remote.colpool`, the
    journal pool an attach uses), its journal appended to the window's `PoolState` as an
    attach's GUI ticks do, and the block table of a real offscreen window redrawn. Per
    size: RSS growth per block over the whole (pool, log, checkpoints, overlay), the time
    to hold it, and the redraw (first; median and worst after a real change each time: a
    frame of 64 removals and 64 stores applied as an attach's tick applies it; beside it,
    after a change of version alone and with no change, as `bench_remote_redraw` times
    its pool); after those frames, the RSS growth per block again (a server that evicts) and
    the arrays that make it up (`engine.bench.resident.breakdown`)."""
    from app.runtime.allocator import wait_released
    from app.runtime.context import make_test_context
    from engine.bench.resident import breakdown
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    sizes = sizes or ((100_000, 1_000_000) if quick else (REMOTE_BLOCKS, HELD_BLOCKS))
    app = _app()
    out: dict[str, Any] = {}
    # a small pool first, not reported: numba's loads (or compiles) of the pool's, the
    # journal's and the log's compiled code then count in neither size's time or memory
    for i, n in enumerate((HELD_WARM_BLOCKS, *sizes)):
        ctx = make_test_context()
        view = None
        try:
            view = _block_table(ctx)
            ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True,
                                   "model": "vLLM bench"})
            state = ctx.state
            # each context starts a warm-up thread (numba's code loaded, then a small attach
            # route run): it ran beside the pool here and its memory counted as the pool's,
            # 114.5-116.1 B a block of a 1M-block pool against 91.7-93.1 after it (2026-12-06)
            ctx.wait_warm(120)
            gc.collect()
            rss0 = _rss_bytes()
            pool = journal_pool_class()("bench")
            hold_s = 0.0  # the app's part only: the frames are made outside it
            for seq, payload in enumerate(_held_frames(n)):
                t = time.perf_counter()
                pool.apply(fastwire.decode_columns(seq, payload))
                if seq % 64 == 63:
                    _take_journal(pool, state)
                hold_s += time.perf_counter() - t
            t = time.perf_counter()
            _take_journal(pool, state)
            hold_s += time.perf_counter() - t
            gc.collect()
            wait_released()  # the big ticks' heap trims, on a thread of their own, done
            rss1 = _rss_bytes()
            app.processEvents()
            state.version += 1
            first_ms = _draw_ms(view)
            times = []
            for _ in range(10 if quick else 20):
                state.version += 1  # a change to draw each time, as a tick makes
                times.append(_draw_ms(view))
            # as bench_remote_redraw times its pool: the view redrawn with no change since
            same = [_draw_ms(view) for _ in range(10 if quick else 20)]
            # a real change before each redraw: a vLLM frame that removes 64 held blocks and
            # stores 64 new ones, through the pool and its journal, as an attach's tick applies it
            framed = []
            for j, payload in enumerate(_churn_frames(n, 10 if quick else 20)):
                pool.apply(fastwire.decode_columns(n + j, payload))
                _take_journal(pool, state)
                framed.append(_draw_ms(view))
            held = state.projection.num_blocks
            if i == 0:
                continue
            gc.collect()
            wait_released()
            rss2 = _rss_bytes()  # a server that evicts: what its first evictions made the log keep
            where = breakdown({"pool": pool, "state": state, "view": view}, n)
            out[f"{n}"] = {"blocks": n, "blocks_in_view": held, "num_cells": len(view.cell_colors),
                           "blocks_per_cell": view.blocks_per_cell, "events": len(state.log),
                           "hold_s": round(hold_s, 2), "blocks_per_s": round(n / hold_s),
                           "bytes_per_block": round((rss1 - rss0) / n, 1),
                           "rss_growth_mb": round((rss1 - rss0) / 1e6, 1),
                           # after the 20 frames that each remove 64 blocks and store 64 (the redraws')
                           "bytes_per_block_after_evictions": round((rss2 - rss0) / n, 1),
                           "first_redraw_ms": round(first_ms, 2),
                           # the target: the redraw after a real change (a frame applied)
                           "median_ms": round(statistics.median(framed), 2), "max_ms": round(max(framed), 2),
                           # the view told of a change that changed nothing, and no change at all
                           "median_version_bump_ms": round(statistics.median(times), 2),
                           "max_version_bump_ms": round(max(times), 2),
                           "median_unchanged_ms": round(statistics.median(same), 2),
                           # the arrays that hold it, by resident bytes a block (after the churn frames)
                           "resident_bytes_per_block": where}
            del pool
        finally:
            ctx.shutdown()
            _dispose(app, *([view] if view is not None else []), ctx)
            gc.collect()
    return out


def _take_journal(pool: Any, state: Any) -> None:
    """The pool's new journal rows into `state`, then released by the pool, as an attach's
    tick takes them (`app.runtime.journal_feed.take_journal_rows`)."""
    rows = pool.take_journal()
    state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
    pool.release_journal(rows.stop)


def bench_ingestion(quick: bool) -> dict[str, Any]:
    """Events pushed from another thread as fast as it can, through the bridge into PoolState,
    while a 5 ms probe timer in the GUI thread records the longest gap between its ticks."""
    from PySide6.QtCore import QTimer

    from app.runtime.context import engine_info, make_test_context

    app = _app()
    ctx = make_test_context()
    # As the app does once its model is loaded: what earlier benches of `bench all` left in
    # this process (a model, 100K-vector indexes) is frozen, so a full collection does not
    # walk it; the stall measured is the bridge's and the pool state's, not theirs.
    gc.collect()
    gc.freeze()
    try:
        events = _recorded_events(1500 if quick else 12_031, 512, 4096)
        ctx.new_event_bus(engine_info(block_size=512, num_blocks=4096))
        # As in a window a moment after it is up: the live log's compiled passes loaded by the
        # context's warm-up thread (started with the runtime after the first paint).
        ctx.wait_warm(120)
        deliver = ctx.bridge._on_event  # exactly what the bus calls for each event
        ticks: list[float] = []
        probe = QTimer()
        probe.setInterval(5)
        probe.timeout.connect(lambda: ticks.append(time.perf_counter()))
        probe.start()
        _wait(app, lambda: len(ticks) >= 3, 5)
        # The anchor: the same probe's longest gap over half a second with nothing ingesting
        # (what the machine's other load alone costs the GUI thread).
        ticks.clear()
        idle_end = time.perf_counter() + 0.5
        _wait(app, lambda: time.perf_counter() >= idle_end, 5)
        idle_gaps = [(b - a) * 1000 for a, b in zip(ticks, ticks[1:])]

        producer_cpu: list[float] = []

        def produce() -> None:
            c = time.thread_time()
            for e in events:
                deliver(e)  # the rows of the state's log are made here, on this thread
            producer_cpu.append(time.thread_time() - c)

        t0 = time.perf_counter()
        gui_cpu0 = time.thread_time()
        ticks.clear()
        ticks.append(t0)
        producer = threading.Thread(target=produce)
        producer.start()
        _wait(app, lambda: len(ctx.state.log) >= len(events), 300)
        elapsed = time.perf_counter() - t0
        gui_cpu = time.thread_time() - gui_cpu0
        producer.join()
        probe.stop()
        gaps = [(b - a) * 1000 for a, b in zip(ticks, ticks[1:])]
        return {"num_events": len(events), "seconds": round(elapsed, 4),
                "events_per_s": round(len(events) / elapsed, 1), "num_batches": ctx.bridge.num_flushes,
                # the CPU time both threads spent (they share the GIL): the rate a free core would give
                "producer_cpu_s": round(producer_cpu[0], 3), "gui_cpu_s": round(gui_cpu, 3),
                "events_per_cpu_s": round(len(events) / (producer_cpu[0] + gui_cpu), 1),
                # what the app itself spent on its costliest batch (the GUI thread's CPU time):
                # a gap longer than this is the thread waiting for the CPU or the GIL
                "longest_batch_gui_cpu_ms": round(ctx.bridge.longest_batch_cpu_s * 1000, 2),
                "max_gui_gap_ms": round(max(gaps) if gaps else 0.0, 2),
                "idle_max_gui_gap_ms": round(max(idle_gaps) if idle_gaps else 0.0, 2),
                "p99_gui_gap_ms": round(sorted(gaps)[int(len(gaps) * 0.99) - 1] if gaps else 0.0, 2)}
    finally:
        gc.unfreeze()
        ctx.shutdown()
        _dispose(app, ctx)


def bench_window(quick: bool) -> dict[str, Any]:
    """Seconds from starting a fresh interpreter to the main window's first paint, without a
    model (median: the target), and to every panel it shows at start built (they are built
    after the first paint, one per turn of the event loop); the process's whole run, exit
    included, beside them. The anchor, each run beside it: an empty Qt main window's first
    paint from a fresh interpreter (Python, PySide6 and the offscreen platform alone). Beside
    them, `cachescope gui --no-model` to its first paint, as a user starts it (settings and
    database in a temporary folder), with its CPU time and the heavy modules it imported
    before that paint."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    up, built, whole, bare, plots_early = [], [], [], [], 0
    command, command_cpu, command_heavy = [], [], set()
    with tempfile.TemporaryDirectory() as tmp:
        user = {**env, "HOME": tmp, "XDG_CONFIG_HOME": os.path.join(tmp, "config"),
                "XDG_DATA_HOME": os.path.join(tmp, "data"), "CACHESCOPE_DB": os.path.join(tmp, "cachescope.db")}
        for _ in range(2 if quick else 5):
            t_wall = time.time()
            proc = subprocess.run([sys.executable, "-c", _BARE_CHILD], capture_output=True, text=True,
                                  cwd=ROOT, env=env, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"an empty Qt window did not start: {proc.stderr.strip()[-300:]}")
            bare.append(float(proc.stdout.strip().splitlines()[-1]) - t_wall)
            t, t_wall = time.perf_counter(), time.time()
            proc = subprocess.run([sys.executable, "-c", _WINDOW_CHILD, tmp], capture_output=True, text=True,
                                  cwd=ROOT, env=env, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"the window did not start: {proc.stderr.strip()[-300:]}")
            whole.append(time.perf_counter() - t)
            painted, done, pg = proc.stdout.strip().splitlines()[-1].split()
            up.append(float(painted) - t_wall)
            built.append(float(done) - t_wall)
            plots_early += int(pg)
            t_wall = time.time()
            proc = subprocess.run([sys.executable, "-c", _COMMAND_CHILD], capture_output=True, text=True,
                                  cwd=ROOT, env=user, timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(f"cachescope gui did not start: {proc.stderr.strip()[-300:]}")
            painted, cpu, heavy = proc.stdout.strip().splitlines()[-1].split()
            command.append(float(painted) - t_wall)
            command_cpu.append(float(cpu))
            command_heavy.update(m for m in heavy.split(",") if m != "-")
    return {"runs": len(up), "median_s": round(statistics.median(up), 3),
            "median_gui_command_s": round(statistics.median(command), 3),
            "median_gui_command_cpu_s": round(statistics.median(command_cpu), 3),
            "gui_command_heavy_before_first_paint": sorted(command_heavy),
            "median_all_panels_built_s": round(statistics.median(built), 3),
            "median_process_s": round(statistics.median(whole), 3),
            "median_bare_qt_s": round(statistics.median(bare), 3),
            "runs_with_pyqtgraph_before_first_paint": plots_early}


def _target(value: float, target: float, lower_is_better: bool = True) -> dict[str, Any]:
    met = value < target if lower_is_better else value >= target
    return {"value": value, "target": target, "met": met}


def bench_app_path(quick: bool) -> dict[str, Any]:
    """An attached server's path through the app headless (`app.runtime.live_path.app_routes`):
    recorded vLLM frames through the journal route an attach takes (the journalling pool, the
    placer, `PoolState` at each tick) beside the event route it replaced, in CPU time."""
    from app.runtime.live_path import app_routes

    return app_routes(5_000 if quick else 100_000)


def bench_attached(quick: bool) -> dict[str, Any]:
    """An attach as a user meets it (`app.commands._bench_live_attach.compare_attached`): a
    publisher process streams recorded vLLM frames over loopback ZMQ into a real offscreen
    window, through the journal route and, beside it in the same window, the event route."""
    from app.commands._bench_live_attach import compare_attached

    _app()
    return compare_attached(5_000 if quick else 100_000)


def run_bench(quick: bool = False) -> dict[str, Any]:
    app_path = bench_app_path(quick)
    attached = bench_attached(quick)
    redraw = bench_redraw(quick)
    remote = bench_remote_redraw(quick)
    ingest = bench_ingestion(quick)
    window = bench_window(quick)
    opened = bench_open(quick)
    return {
        "open_trace": opened,
        "app_path": app_path,
        "attached": attached,
        "quick": quick,
        "redraw": redraw,
        "remote_redraw": remote,
        "ingestion": ingest,
        "window": window,
        # Side-by-side ratios: measured against target (> 1 means headroom).
        "ratios": {"redraw_target_over_median": round(TARGET_REDRAW_MS / max(redraw["median_ms"], 1e-9), 2),
                   "remote_redraw_target_over_median": round(TARGET_REDRAW_MS / max(remote["median_ms"], 1e-9), 2),
                   "ingestion_rate_over_target": round(ingest["events_per_s"] / TARGET_EVENTS_PER_S, 2),
                   "stall_target_over_max_gap": round(TARGET_STALL_MS / max(ingest["max_gui_gap_ms"], 1e-9), 2),
                   "window_target_over_median": round(TARGET_WINDOW_S / max(window["median_s"], 1e-9), 2)},
        "targets": {
            "open_trace_app_over_headless": {"value": opened["app_over_headless"], "target": 1.5,
                                             "met": opened["app_over_headless"] <= 1.5},
            "redraw_16k_blocks_ms": _target(redraw["median_ms"], TARGET_REDRAW_MS),
            "redraw_remote_1m_blocks_ms": _target(remote["median_ms"], TARGET_REDRAW_MS),
            "ingestion_events_per_s": _target(ingest["events_per_s"], TARGET_EVENTS_PER_S, lower_is_better=False),
            "ingestion_max_gui_stall_ms": _target(ingest["max_gui_gap_ms"], TARGET_STALL_MS),
            "window_up_s": _target(window["median_s"], TARGET_WINDOW_S),
        },
    }
