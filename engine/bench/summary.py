"""The targets of issue 20 from one `cachescope bench all` run, in one table.

Every bench returns its own figures; `summarize` reads them back (it measures nothing)
and gives, per target, what is timed, the target, the measured value, the anchor measured
beside it in the same run (the other side of the ratio: the headless replay, the Python
engine, msgpack's own unpack, the reference pool, a bare Qt window), the ratio of the two
and whether the target is met. A bench that did not run or failed gives its rows with
`value` None, `met` False and the reason in `missing`, so the table always has every row.

Each row: `bench`, `what`, `unit`, `value`, `target` (a sentence: "<= 1.5x the anchor",
">= 1,000,000"), `anchor` (a number, or None when the bench has nothing beside it),
`anchor_what`, `ratio` (value / anchor) and `met`; some carry more figures (`extra`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

Results = dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    bench: str
    what: str
    unit: str
    target: str
    anchor_what: str
    # results -> (value, anchor, met, extra); a KeyError means the bench gave no such figure
    read: Callable[[Results], tuple[Any, Any, bool, dict[str, Any]]]


def _dig(results: Results, *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            raise KeyError(".".join(path))
        node = node[key]
    return node


def _open_trace(r: Results):
    o = _dig(r, "gui", "open_trace")
    ratio = o["app_open_to_last_event_drawn_s"] / o["headless_replay_s"]
    return (o["app_open_to_last_event_drawn_s"], o["headless_replay_s"], ratio <= 1.5,
            {"events": o["events"], "requests": o["requests"]})


def _open_capture(r: Results):
    c = _dig(r, "capture")
    opened = c["frames_capture"]
    return (opened["open_to_last_event_drawn_s"], c["headless_route_cpu_s"],
            opened["open_to_last_event_drawn_s"] <= 1.5 * c["headless_route_cpu_s"],
            {"events": opened["events"], "rss_growth_mb": round(opened["rss_growth_bytes"] / 1e6, 1),
             "frames_db_mb": c["frames_db_mb"],
             "capture_of_events_open_s": c["events_capture"]["open_to_last_event_drawn_s"],
             "capture_of_events_rss_growth_mb": round(c["events_capture"]["rss_growth_bytes"] / 1e6, 1),
             "capture_of_events_db_mb": c["events_db_mb"]})


def _kernel(r: Results):
    k = _dig(r, "engine", "kernel")
    return (k["kernel_blocks_per_s_cpu"], k["python_blocks_per_s_cpu"], k["kernel_blocks_per_s_cpu"] >= 5_000_000,
            {"kernel_cpu_s": k["kernel_cpu_s"], "python_cpu_s": k["python_cpu_s"],
             "stages_cpu_s": k["kernel_stages_cpu_s"], "kernel_blocks_per_s_wall": k["kernel_blocks_per_s"],
             "python_blocks_per_s_wall": k["python_blocks_per_s"], "lookup_blocks": k["lookup_blocks"],
             "identical_results": k["identical_results"]})


def _kernel_loop(r: Results):
    k = _dig(r, "engine", "kernel")
    return (k["kernel_loop_blocks_per_s_cpu"], k["python_blocks_per_s_cpu"],
            k["kernel_loop_blocks_per_s_cpu"] >= 5_000_000,
            {"kernel_loop_cpu_s": k["kernel_loop_cpu_s"],
             "kernel_loop_blocks_per_s_wall": k["kernel_loop_blocks_per_s"],
             "identical_results": k["identical_results"]})


def _kernel_first_use(r: Results):
    k = _dig(r, "engine", "kernel")
    first = k["first_use_after_install_s"]
    return (first, k["python_first_use_s"], first < k["python_first_use_s"],
            {"install_warmup_s": k["install_warmup_s"], "install_kernel_part_s": k["install_kernel_part_s"],
             "first_use_after_install_cpu_s": k["first_use_after_install_cpu_s"],
             "python_first_use_cpu_s": k["python_first_use_cpu_s"]})


def _scrub(r: Results):
    s = _dig(r, "engine", "scrub")
    return (s["scrub_worst_ms"], round(s["record_and_checkpoint_s"] * 1000, 1), s["scrub_worst_ms"] < 100,
            {"events": s["events"], "scrub_median_ms": s["scrub_median_ms"], "checkpoints": s["checkpoints"]})


def _msgpack(r: Results) -> float:
    return _dig(r, "attach", "msgpack_unpack_only", "events_per_s_cpu")


def _into_pool(r: Results):
    t = _dig(r, "attach", "targets", "events_per_s_into_pool")
    return t["value"], _msgpack(r), t["value"] >= 1_000_000, {}


def _attached(r: Results) -> dict[str, Any]:
    return _dig(r, "gui", "attached")


def _app_path(r: Results):
    a = _attached(r)
    got, ref = a["journal"], a["reference"]
    return (got["events_per_s_wall"], ref["events_per_s_wall"], got["events_per_s_wall"] >= 500_000,
            {"vllm_events": got["vllm_events"], "cachescope_events": got["cachescope_events"],
             "events_per_s_cpu": got["events_per_s_cpu"], "gui_thread_cpu_s": got["gui_thread_cpu_s"],
             "missed": got["missed"], "reference_events_per_s_cpu": ref["events_per_s_cpu"]})


def _attached_stall(r: Results):
    a = _attached(r)
    got, ref = a["journal"], a["reference"]
    return (got["longest_process_events_ms"], ref["longest_process_events_ms"], got["longest_process_events_ms"] < 50,
            {"gui_cpu_in_that_pass_ms": got["longest_process_events_cpu_ms"],
             "passes_over_50_ms": got["stalls_over_50_ms"]})


def _app_path_to_state(r: Results):
    g = _dig(r, "gui", "app_path")
    got = g["journal_route"]
    return (g["journal_events_per_s_cpu"], g["event_events_per_s_cpu"], g["journal_events_per_s_cpu"] >= 500_000,
            {"vllm_events": got["vllm_events"], "cachescope_events": got["cachescope_events"],
             "events_per_s_wall": got["events_per_s_wall"], "stages_cpu_s": got["stages_cpu_s"],
             "takes": got.get("num_takes"), "writes": got.get("num_writes"),
             "taken_per_tick_events_per_s_cpu": g.get("journal_taken_per_tick_events_per_s_cpu")})


def _pool_bytes(r: Results):
    t = _dig(r, "attach", "targets", "bytes_per_block")
    ref = _dig(r, "attach", "memory")
    return t["value"], ref["bytes_per_block"], t["value"] <= 100, {"blocks": ref["blocks"]}


def _app_remote_bytes(r: Results):
    held = _dig(r, "held", "small")  # the journal route, as an attach holds its pools
    anchor = _dig(r, "attach", "targets", "bytes_per_block")["value"]
    extra: dict[str, Any] = {"blocks": held["blocks"], **_after_evictions(held)}
    event_route = r.get("gui", {}).get("remote_redraw", {})
    if "bytes_per_block" in event_route:  # the event route, which attaches no longer take
        extra["event_route_bytes_per_block"] = event_route["bytes_per_block"]
    return held["bytes_per_block"], anchor, held["bytes_per_block"] <= 100, extra


def _opened_trace_bytes(r: Results):
    o = _dig(r, "gui", "open_trace")
    value = o["bytes_per_distinct_block"]
    extra = {k: o[k] for k in ("distinct_blocks", "events", "trace_bytes_per_event", "bytes_per_event",
                               "bytes_per_pool_block", "rss_growth_mb", "numba_fixed_mb", "trace_rss_growth_mb",
                               "headless_peak_rss_mb") if k in o}
    return value, o["log_row_bytes_per_distinct_block"], value <= 100, extra


def _fleet(key: str, reference_key: str, ok: Callable[[Any, dict], bool]):
    def read(r: Results):
        a = _dig(r, "attach")
        fleet = a["fleet_columnar"] if "fleet_columnar" in a else a["fleet"]
        ref = a["fleet"] if "fleet_columnar" in a else None
        return (fleet[key], None if ref is None else ref[reference_key], ok(fleet[key], fleet),
                {"pools": fleet["pools"], "streams": fleet["streams"], "events_per_s_each": fleet["events_per_s_each"],
                 "batches_sent": fleet["batches_sent"], "batches_received": fleet["batches_received"]})
    return read


def _window(r: Results):
    w = _dig(r, "gui", "window")
    up = w["median_gui_command_s"]
    return (up, w.get("median_bare_qt_s"), up < 1.0,
            {"median_window_child_s": w["median_s"], "median_gui_command_cpu_s": w["median_gui_command_cpu_s"],
             "heavy_modules_before_first_paint": w["gui_command_heavy_before_first_paint"],
             "median_all_panels_built_s": w["median_all_panels_built_s"], "runs": w["runs"]})


def _ingest_stall(r: Results):
    g = _dig(r, "gui", "ingestion")
    return (g["max_gui_gap_ms"], g.get("idle_max_gui_gap_ms"), g["max_gui_gap_ms"] < 50,
            {"events": g["num_events"], "events_per_s": g["events_per_s"],
             "longest_batch_gui_cpu_ms": g.get("longest_batch_gui_cpu_ms")})


def _after_evictions(held: dict) -> dict[str, Any]:
    """What `bench held` says of a held pool beside its target figure: RSS a block once its
    server evicted (20 frames of 64 removals and 64 stores) and its arrays' resident bytes."""
    out = {}
    if "bytes_per_block_after_evictions" in held:
        out["bytes_per_block_after_evictions"] = held["bytes_per_block_after_evictions"]
    if "resident_bytes_per_block" in held:
        out["resident_arrays_bytes_per_block_after_evictions"] = held["resident_bytes_per_block"]["all_arrays"]
    return out


def _held(key: str, ok: Callable[[Any], bool]):
    def read(r: Results):
        h = _dig(r, "held")
        small, large = h["small"], h["large"]
        return (large[key], small[key], ok(large[key]),
                {"blocks": large["blocks"], "anchor_blocks": small["blocks"], "hold_s": large["hold_s"],
                 "anchor_hold_s": small["hold_s"], "first_redraw_ms": large["first_redraw_ms"],
                 "max_ms": large["max_ms"], "median_unchanged_ms": large.get("median_unchanged_ms"),
                 "rss_growth_mb": large["rss_growth_mb"],
                 "blocks_per_cell": large["blocks_per_cell"], **_after_evictions(large)})
    return read


def _stream(r: Results):
    s = _dig(r, "stream")
    growth = s["targets"]["bounded_memory_mb_growth_after_settling"]["value"]
    blocks_met = s["lookup_blocks"] >= 214_000_000
    return (growth, s["peak_rss_mb_settled"], growth < 50 and blocks_met,
            {"lookup_blocks": s["lookup_blocks"], "copies": s["copies"], "settled_at_copy": s["settled_at_copy"],
             "blocks_per_s": s["blocks_per_s"],
             "peak_rss_mb_end": s["peak_rss_mb_end"], "blocks_target_met": blocks_met})


TARGETS: tuple[Target, ...] = (
    Target("open_trace_app_vs_headless", "gui",
           "File > Open of the Mooncake conversation trace in a real offscreen 1280x800 window until every view has "
           "drawn the last event", "s", "<= 1.5x the anchor",
           "headless `cachescope replay` of the same file, same pool", _open_trace),
    Target("open_capture_app_vs_headless_route", "capture",
           "File > Open of a recorded attach (100,000 vLLM events, `attach --record`'s frames) in a real offscreen "
           "1280x800 window until every view has drawn the last event (median of 3 fresh processes)", "s",
           "<= 1.5x the anchor",
           "the same frames through the attach's route headless (decoded, applied, placed, written to PoolState; "
           "CPU time, median of 3), same run", _open_capture),
    Target("kernel_lookups_per_s", "engine",
           "replay kernel on the parsed Mooncake trace, the whole of it: array preparation, interning, the compiled "
           "loop and the Python engine's result rows (best of 5)",
           "block lookups/s (CPU time of the one thread)", ">= 5,000,000",
           "the Python engine on the same parsed trace, same clock", _kernel),
    Target("kernel_loop_lookups_per_s", "engine",
           "the kernel's compiled bookkeeping loop alone (the issue's 'bookkeeping itself')",
           "block lookups/s (CPU time of the one thread)", ">= 5,000,000",
           "the Python engine on the same parsed trace, same clock", _kernel_loop),
    Target("kernel_first_use_s", "engine",
           "first use of the kernel after install: a fresh process replays the parsed Mooncake trace, numba's "
           "import and the kernel's load from the cache `make`'s install step filled included (that install-time "
           "compile is timed once, in `extra`)",
           "s", "< 1x the anchor", "a fresh process's first replay of the same trace on the Python engine",
           _kernel_first_use),
    Target("scrub_worst_ms", "engine",
           "scrubbing a columnar kernel log of about 1M events (the Mooncake trace three times over) to random "
           "events, forward and back: the worst of 43", "ms", "< 100",
           "recording that log (a replay from event 0)", _scrub),
    Target("events_per_s_into_pool", "attach",
           "recorded vLLM frames decoded into the engine's remote pool (what `bench attach` reports as its target)",
           "vLLM events/s (CPU time)", ">= 1,000,000", "msgpack's own unpack of the same frames", _into_pool),
    Target("events_per_s_app_path", "gui",
           "an attached server's whole path through the app, as a user meets it: a publisher process sends "
           "recorded vLLM frames over loopback ZMQ as fast as it can to a real offscreen 1280x800 window attached "
           "by File > Attach (the journal route: columnar pools, the placing thread, PoolState at the GUI tick, "
           "the views drawing), until every row is in the log (app.commands._bench_live_attach); the median of "
           "3 runs",
           "vLLM events/s (wall)", ">= 500,000",
           "the event route it replaced (the reference RemotePool's events through the bridge), same window, "
           "same stream, same run", _app_path),
    Target("attached_longest_stall_ms", "gui",
           "the same attached window: the longest pass of its event loop while the stream came in, the longest "
           "of the 3 runs", "ms", "< 50",
           "the event route's longest pass, same window, same run", _attached_stall),
    Target("events_per_s_app_path_to_pool_state", "gui",
           "the same route headless, on one thread: frames decoded and applied to the journalling pool 64 at a "
           "time, the rows taken and placed as the window's feed takes them (every 50 ms, in bites of a tick's "
           "budget) and written to the window's PoolState (log, live pool, series, checkpoints, overlay) as its "
           "GUI ticks write them (app.runtime.live_path.app_routes); the median of 3 runs",
           "vLLM events/s (CPU time)", ">= 500,000",
           "the event route into the same PoolState (the reference RemotePool's events), same stream, same run",
           _app_path_to_state),
    Target("bytes_per_block_remote_pool", "attach",
           "memory per tracked block in the engine's remote pool, token ids included (tracemalloc)",
           "bytes", "<= 100", "the reference pool (`engine.remote.pool.RemotePool`) holding the same stream",
           _pool_bytes),
    Target("bytes_per_block_app_remote_pool", "held",
           "RSS growth per tracked block of a 1,000,000-block remote vLLM pool in the app, held as an attach "
           "holds it (frames into the journalling columnar pool, its journal into the window's PoolState: pool, "
           "log, checkpoints, tier overlay; bench held's smaller pool, in a process of its own)", "bytes", "<= 100",
           "the engine's remote pool (bench attach, same run)",
           _app_remote_bytes),
    Target("bytes_per_block_app_opened_trace", "gui",
           "RSS growth of the app opening the Mooncake trace a moment after its window is up, what the first use of "
           "the kernel loads (numba's compiled code, loaded in the window's process by a two-request replay "
           "before the open) left out, per distinct block of the trace "
           "(the log, its checkpoints, series and views)", "bytes", "<= 100",
           "the log's event rows alone, per distinct block", _opened_trace_bytes),
    Target("fleet_missed_batches", "attach",
           "64 loopback ZMQ streams at 2,500 vLLM events/s each into one Attachment, the app's bridge on a Qt "
           "event loop: batches missed", "batches", "0", "the reference pools, same streams, same run",
           _fleet("missed_batches", "missed_batches",
                  lambda v, f: v == 0 and f["batches_received"] == f["batches_sent"])),
    Target("fleet_seconds_behind", "attach",
           "the same 64 streams: seconds the consumer was still behind after the last send", "s", "<= 1",
           "the reference pools, same streams, same run",
           _fleet("seconds_behind_after_the_last_send", "seconds_behind_after_the_last_send",
                  lambda v, f: v <= 1.0)),
    Target("fleet_longest_stall_ms", "attach",
           "the same 64 streams: the longest stall of the Qt event loop", "ms", "< 50",
           "the reference pools, same streams, same run",
           _fleet("longest_stall_ms", "longest_stall_ms", lambda v, f: v < 50)),
    Target("ingestion_longest_stall_ms", "gui",
           "the longest GUI stall while a thread pushes the Mooncake replay's events through the bridge",
           "ms", "< 50", "the same probe timer's longest gap with nothing ingesting", _ingest_stall),
    Target("window_up_s", "gui",
           "`cachescope gui --no-model` as a user starts it (a fresh interpreter, its settings and database in "
           "a new folder) to the main window's first paint (median)", "s", "< 1.0",
           "a fresh interpreter to the first paint of an empty Qt main window", _window),
    Target("held_10m_pool_redraw_ms", "held",
           "a 10,000,000-block remote vLLM pool held by the app (frames into the columnar pool, its journal into "
           "the window's PoolState) and drawn by the block table of a real offscreen window: redraw, median of 20",
           "ms", "< 16", "the same with a 1,000,000-block pool, same run", _held("median_ms", lambda v: v < 16)),
    Target("bytes_per_block_app_10m_pool", "held",
           "RSS growth per block of that 10,000,000-block pool in the app (pool, log, checkpoints, tier overlay; "
           "in a process of its own)",
           "bytes", "<= 100", "the same with a 1,000,000-block pool, same run",
           _held("bytes_per_block", lambda v: v <= 100)),
    Target("stream_214m_blocks_memory_growth_mb", "stream",
           "the six WEKA files replayed over and over through the streamed kernel (about 214M block lookups): "
           "peak RSS growth from the 10th copy to the last", "MB", "< 50, with >= 214M lookups",
           "peak RSS at the 10th copy (the 5th in a quick run)", _stream),
)


def summarize(results: Results) -> dict[str, dict[str, Any]]:
    """One row per target of `TARGETS`, read from `results` (bench name -> its output)."""
    table: dict[str, dict[str, Any]] = {}
    for t in TARGETS:
        row: dict[str, Any] = {"bench": t.bench, "what": t.what, "unit": t.unit, "target": t.target,
                               "anchor_what": t.anchor_what}
        bench = results.get(t.bench)
        try:
            if bench is None:
                raise KeyError(f"bench {t.bench} did not run")
            if "error" in bench:
                raise KeyError(f"bench {t.bench} failed: {bench['error']}")
            value, anchor, met, extra = t.read(results)
        except (KeyError, TypeError, ZeroDivisionError) as exc:
            why = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            row.update(value=None, anchor=None, ratio=None, met=False, missing=str(why))
        else:
            ratio = None
            if isinstance(value, (int, float)) and isinstance(anchor, (int, float)) and anchor:
                ratio = round(value / anchor, 3)
            row.update(value=value, anchor=anchor, ratio=ratio, met=bool(met))
            if extra:
                row["extra"] = extra
        table[t.name] = row
    return table
