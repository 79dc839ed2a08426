"""The attached server's whole app path in a real window, timed (issue 20): frames over
loopback ZMQ from a publisher process into a 1280x800 `MainWindow`'s `RemoteController`, a
real `Attachment`, `PoolState` at the GUI tick, and the views drawing, through the pools'
journal and through the reference RemotePool's events, in one window and one run.
`app.runtime.live_path` times the same stream headless (no socket, no views).

    QT_QPA_PLATFORM=offscreen .venv/bin/python -m app.commands._bench_live_attach 50000
    QT_QPA_PLATFORM=offscreen .venv/bin/python -m app.commands._bench_live_attach redraw 3

The second times one redraw of the remote timeline and metrics after three hours of a
stream (`remote_plots_redraw`).
"""

from __future__ import annotations

import gc
import shutil
import time
from typing import Any

from engine.bench.attach import recorded_stream
from engine.remote import fastwire

LOOK_S = 0.005  # how often the timed loop looks whether the last batch is in

_PUBLISHER = r"""
import sys, time, zmq
port, path = int(sys.argv[1]), sys.argv[2]
with open(path, "rb") as f:
    data = f.read()
payloads, i = [], 0
while i < len(data):
    n = int.from_bytes(data[i:i + 8], "big"); payloads.append(data[i + 8:i + 8 + n]); i += 8 + n
pub = zmq.Context.instance().socket(zmq.PUB)
pub.setsockopt(zmq.SNDHWM, 0)
pub.bind(f"tcp://127.0.0.1:{port}")
poller = zmq.Poller()
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()  # the app has subscribed: every frame from batch 0, once
for seq in range(len(payloads)):
    pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payloads[seq]])
sys.stdin.readline()
"""


def attached_app_rate(num_events: int = 100_000, journal: bool = True, gpu_blocks: int = 30_000,
                      window: Any = None, timeout_s: float = 300.0, profiler: Any = None) -> dict[str, Any]:
    """The whole app path of an attach, timed: a publisher process sends the stream's frames
    over loopback ZMQ as fast as it can, the window's `RemoteController` attaches through a
    real `Attachment` (the pools' journal, or with `journal=False` the reference RemotePool's
    events through the bridge) into `PoolState` at the GUI tick, and the window's views draw
    as they do for a user; until every batch is received and in the log. CPU time is this
    process's (subscriber threads, GUI thread and views), not the publisher's. A `profiler`
    (`cProfile.Profile`) is enabled on the GUI thread for the timed part only."""
    import socket
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from PySide6.QtWidgets import QApplication

    from app.runtime.remote import AttachSettings
    from engine.remote.attachment import AttachOptions

    payloads, made, _ = recorded_stream(num_events, gpu_blocks=gpu_blocks)
    app = QApplication.instance()
    if app is None:
        raise RuntimeError("attached_app_rate needs a QApplication")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="cachescope-live-path-"))
    blob = tmp / "frames.bin"
    blob.write_bytes(b"".join(len(p).to_bytes(8, "big") + p for p in payloads))
    own = window is None
    if own:
        window = _window(tmp)
    ctrl, state = window.remote, window.ctx.state
    ctrl.journal = journal
    settle = time.monotonic() + 30.0
    while getattr(window, "_startup", None) and time.monotonic() < settle:  # the deferred panels, built
        app.processEvents()
    if journal:  # the journal pools and overlay loop compiled (or loaded) before the clock
        _warm_journal_route()
    proc = subprocess.Popen([sys.executable, "-c", _PUBLISHER, str(port), str(blob)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        window.attach_remote(AttachSettings(AttachOptions((f"tcp://127.0.0.1:{port}",), (), "kv-events")))
        deadline = time.monotonic() + timeout_s
        joined = time.monotonic() + 1.0  # a SUB socket's subscription takes a moment to reach the PUB
        while time.monotonic() < joined or (_tokenizer_loading() and time.monotonic() < deadline):
            # the attach's tokenizer thread imports transformers (torch's C init holds the GIL
            # for seconds): done before the clock, as a window that loaded its model has it
            app.processEvents()
            time.sleep(0.005)
        gc.collect()
        if profiler is not None:
            profiler.enable()
        w0, c0, g0 = time.perf_counter(), time.process_time(), time.thread_time()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        longest, longest_cpu, slow = 0.0, 0.0, 0
        next_look = 0.0
        while True:
            t, c = time.perf_counter(), time.thread_time()
            app.processEvents()
            took = time.perf_counter() - t
            longest = max(longest, took)
            # the GUI thread's own work in that pass: on a loaded machine the wall clock
            # mostly measures the wait for a core
            longest_cpu = max(longest_cpu, time.thread_time() - c)
            slow += took > 0.05
            if t >= next_look:  # the end looked for every LOOK_S, without the attachment's lock:
                # taking it every 0.5 ms (and the health, which takes it too) had the bench's
                # loop wait on the subscriber's applies, work the app's own window never does
                next_look = t + LOOK_S
                pools = ctrl.attachment.pools
                last = pools[0].last_batch_seq if pools else None
                missed = ctrl.last_health.missed  # the window's own poll, every HEALTH_MS
                if last == len(payloads) - 1 or missed:  # the last batch applied (or one lost)
                    if not journal:
                        window.ctx.bridge.flush(everything=True)
                        app.processEvents()
                        break
                    if ctrl.pending_rows() == 0:  # the ticks have applied every journal row
                        break
                if time.monotonic() > deadline:
                    got = ctrl.health().batches
                    if got < len(payloads):
                        raise RuntimeError(f"only {got} of {len(payloads)} batches arrived in {timeout_s:g} s")
                    raise RuntimeError(f"every batch arrived, but {ctrl.pending_rows():,} journal rows were not "
                                       f"applied in {timeout_s:g} s")
            time.sleep(0.0005)
        wall, cpu, gui_cpu = time.perf_counter() - w0, time.process_time() - c0, time.thread_time() - g0
        if profiler is not None:
            profiler.disable()
        h = ctrl.health()
        events = len(state.log)
        first = int(state.log.events[0].remote.batch_seq) if events else None  # 0: nothing lost before
        if journal:
            assert state.journal_fed and ctrl.journalling
        ctrl.detach()
    finally:
        proc.stdin.write("done\n")
        proc.stdin.flush()
        proc.wait(10)
        blob.unlink(missing_ok=True)  # 25 MB a run, left in /tmp by every bench until this
        if not own:
            shutil.rmtree(tmp, ignore_errors=True)
    ctrl.journal = True
    if own:  # a window it made itself goes with it, and its folder (settings.ini) after it
        from app.runtime.context import discard_settings

        settings = window.ctx.settings
        _close(window)
        discard_settings(settings, tmp)
    return {"route": "journal" if journal else "reference RemotePool events", "vllm_events": made,
            "frames": len(payloads),
            "batches": h.batches, "missed": h.missed, "first_batch": first, "cachescope_events": events, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "gui_thread_cpu_s": round(gui_cpu, 3), "events_per_s_wall": round(made / wall),
            "events_per_s_cpu": round(made / cpu),
            "cachescope_events_per_s_wall": round(events / wall),
            "longest_process_events_ms": round(longest * 1000, 1),
            "longest_process_events_cpu_ms": round(longest_cpu * 1000, 1), "stalls_over_50_ms": slow}


def _window(folder: Any) -> Any:
    """The window an attach is timed in: a 1280x800 `MainWindow` on a test context, no model."""
    from app.runtime.context import make_test_context
    from app.window.main_window import MainWindow

    window = MainWindow(make_test_context(folder), load_model=False)
    window.resize(1280, 800)
    window.show()
    return window


def _close(window: Any) -> None:
    """Shut the window's context down, close and delete it, not left with its timers and views
    to redraw on the loop of the next bench (bench gui's ingestion measured its stall: 31 ->
    209 ms with the attach's window left open)."""
    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QApplication

    window.ctx.shutdown()
    window.close()
    window.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    QApplication.processEvents()


def _tokenizer_loading() -> bool:
    import threading

    return any(t.name == "attach-tokenizer" and t.is_alive() for t in threading.enumerate())


def _warm_journal_route() -> None:
    from app.runtime.state import PoolState
    from app.views.pool import chain_layout
    from engine.remote.overlay import journal_pool_class

    chain_layout.warm_up()

    pool = journal_pool_class()("warm")
    payloads, _, _ = recorded_stream(200, gpu_blocks=64)
    pool.apply_many([fastwire.decode_columns(i, p) for i, p in enumerate(payloads)])
    st = PoolState()
    st.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True})
    rows = pool.take_journal()
    st.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])


def remote_plots_redraw(hours: float = 3.0, rate: float = 200.0, seed: int = 0) -> dict[str, Any]:
    """CPU ms of one redraw and paint of the remote timeline and metrics after `hours` of a
    stream at about `rate` stored blocks a second (half of them removed 30 s later, a tier
    sample every 0.1 s), after a tick's worth of new rows: what a busy stream's redraw costs
    the GUI thread once the plots have hours of data (an attach's first minute has little).
    Needs a QApplication."""
    from array import array

    import numpy as np

    from app.runtime.state import PoolState
    from app.views.pool.remote_plots import RemoteMetrics, RemoteTimeline
    from engine.remote.overlay import _append_floats

    rng = np.random.default_rng(seed)
    state = PoolState()
    state.set_engine({"remote": True, "block_size": 16, "num_blocks": 0})
    o = state.remote
    t0, secs = 1_796_000_000.0, int(hours * 3600)
    per_s = (rate * (1 + 0.75 * np.sin(np.arange(secs) / 600.0))).astype(np.int64)
    stored = np.repeat(t0 + np.arange(secs, dtype=np.float64), per_s) + rng.random(int(per_s.sum()))
    _append_floats(o, "stored_times", stored)
    _append_floats(o, "removed_times", stored[::2] + 30.0)
    _append_floats(o, "lifetimes", rng.lognormal(2.0, 1.0, len(stored) // 2))
    samples = t0 + np.arange(0.0, secs, 0.1)
    _append_floats(o, "sample_times", samples)
    o.sample_counts = [array("q", (20_000 + 5_000 * np.sin(samples / 900.0)).astype(np.int64).tolist())]
    timeline, metrics = RemoteTimeline(state), RemoteMetrics(state)
    for view in (timeline, metrics):
        view.resize(900, 420)
        view.show()
    timeline.refresh()
    metrics.refresh()
    out: dict[str, Any] = {"stored": len(o.stored_times), "samples": len(samples)}
    for step in range(3):
        end = t0 + secs + step
        _append_floats(o, "stored_times", end + rng.random(2_000))
        _append_floats(o, "lifetimes", rng.lognormal(2.0, 1.0, 1_000))
        _append_floats(o, "sample_times", np.array([end]))
        o.sample_counts[0].append(20_000)
        o.revision += 1
        for name, view in (("timeline", timeline), ("metrics", metrics)):
            c = time.thread_time()
            view.refresh()
            r = time.thread_time()
            view.grab()  # the paint the redraw queues
            p = time.thread_time()
            out.setdefault(f"{name}_refresh_cpu_ms", []).append(round((r - c) * 1000, 2))
            out.setdefault(f"{name}_paint_cpu_ms", []).append(round((p - r) * 1000, 2))
    for view in (timeline, metrics):
        view.close()
        view.deleteLater()
    return out


def compare_attached(num_events: int = 100_000, repeats: int = 3) -> dict[str, Any]:
    """Both routes of a real attach in one window, one after the other, and their ratio: the
    journal route `repeats` times, its median run by wall-clock rate, with the longest pass of
    all its runs (the event route, 30x slower, once)."""
    import tempfile

    from app.runtime.live_path import median_run

    folder = tempfile.mkdtemp(prefix="cachescope-live-path-")
    window = _window(folder)
    ref = attached_app_rate(num_events, journal=False, window=window)
    runs = [attached_app_rate(num_events, journal=True, window=window) for _ in range(repeats)]
    got = median_run(runs, "events_per_s_wall")
    worst = max(runs, key=lambda r: r["longest_process_events_ms"])
    got["longest_process_events_ms"] = worst["longest_process_events_ms"]
    got["longest_process_events_cpu_ms"] = worst["longest_process_events_cpu_ms"]
    got["stalls_over_50_ms"] = sum(r["stalls_over_50_ms"] for r in runs)
    got["runs"] = len(runs)
    from app.runtime.context import discard_settings

    settings = window.ctx.settings
    _close(window)
    discard_settings(settings, folder)
    return {"reference": ref, "journal": got,
            "journal_vs_reference_wall": round(got["events_per_s_wall"] / max(ref["events_per_s_wall"], 1), 2),
            "journal_vs_target_500k": round(got["events_per_s_wall"] / 500_000, 3)}


if __name__ == "__main__":
    import json
    import sys

    from PySide6.QtWidgets import QApplication

    _app = QApplication([])
    if sys.argv[1:2] == ["redraw"]:  # `... redraw [hours]`: the remote plots' redraw after hours of a stream
        print(json.dumps(remote_plots_redraw(float(sys.argv[2]) if len(sys.argv) > 2 else 3.0), indent=1))
    else:
        print(json.dumps(compare_attached(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000), indent=1))
