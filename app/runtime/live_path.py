"""The attached server's whole path through the app, timed: frames decoded, the remote pool's
events handed over, and each GUI tick's batch applied to `PoolState` (log, live pool,
series, checkpoints, the tier/rank/age overlay), as `PoolState` runs it in the window.

`engine.bench.attach`'s "app path" figure stops at the bridge; `app_path_rate` goes on to
the pool state the views read, once on the live columnar log and once on the Python
`EventLog` it replaced, on the same recorded stream in one run. That is the event route
(the reference RemotePool's events); an attach takes the journal route, which
`journal_app_rate` times with the calls the app's tick makes, and `app_routes` puts both
side by side. No Qt event loop is needed: `PoolState` is a QObject whose signals nobody is
connected to here.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from engine.bench.attach import BridgeLike, recorded_stream
from engine.core.events import EventBus
from engine.remote import fastwire
from engine.remote.pool import RemotePool

FRAMES_PER_TICK = 64  # frames that arrive within one 16 ms GUI frame at fleet rates


def app_path_rate(num_events: int = 100_000, columnar: bool = True, gpu_blocks: int = 30_000,
                  frames_per_tick: int = FRAMES_PER_TICK) -> dict[str, Any]:
    """vLLM events per second (CPU time) from frames to `PoolState`, per GUI tick."""
    from app.runtime.state import PoolState

    payloads, made, _ = recorded_stream(num_events, gpu_blocks=gpu_blocks)
    fastwire.warm_up()
    bus = EventBus()
    sink = BridgeLike()
    bus.subscribe(sink)
    pool = RemotePool("bench", events=bus)
    state = PoolState(columnar=columnar)
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "model": "vLLM bench"})
    if columnar:  # the compiled series pass, loaded (or compiled once) before the clock starts
        from engine.core.live_log import LiveColumnarLog

        LiveColumnarLog(4, 16).extend(_one_store_event())
    applied = 0
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, len(payloads), frames_per_tick):
        for seq in range(start, min(len(payloads), start + frames_per_tick)):
            pool.apply(fastwire.decode_batch(seq, payloads[seq]))
        with sink.lock:
            batch = list(sink.buffer)
            sink.buffer.clear()
        state.apply_events(batch)
        applied += len(batch)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return {"log": "LiveColumnarLog" if columnar else "EventLog", "vllm_events": made, "cachescope_events": applied,
            "slots": state.projection.num_blocks, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "events_per_s_cpu": round(made / max(cpu, 1e-9)), "events_per_s_wall": round(made / wall),
            "cachescope_events_per_s_cpu": round(applied / max(cpu, 1e-9))}


def journal_path_rate(num_events: int = 100_000, gpu_blocks: int = 30_000,
                      frames_per_tick: int = FRAMES_PER_TICK) -> dict[str, Any]:
    """The same stream through a columnar pool's journal: frames decoded to columns, applied
    to `ColumnarPool(journal=True)`, and each tick's journal rows appended to a live columnar
    log (`engine.core.live_journal`), no Event per block: the log's side alone (the whole
    attach through a window: `app.commands._bench_live_attach`)."""
    from engine.core.live_journal import append_journal, journal_log
    from engine.remote import colpool

    payloads, made, _ = recorded_stream(num_events, gpu_blocks=gpu_blocks)
    fastwire.warm_up()
    colpool.warm_up()
    pool = colpool.ColumnarPool("bench", journal=True)
    log = journal_log(16)
    warm_log = journal_log(16)
    warm = colpool.ColumnarPool("warm", journal=True)
    warm.apply(fastwire.decode_columns(0, payloads[0]))
    append_journal(warm_log, warm.take_journal(), warm, "warm")
    rows = 0
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, len(payloads), frames_per_tick):
        pool.apply_many([fastwire.decode_columns(seq, payloads[seq])
                         for seq in range(start, min(len(payloads), start + frames_per_tick))])
        rows += append_journal(log, pool.take_journal(), pool, "bench")
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return {"log": "LiveColumnarLog from the journal", "vllm_events": made, "cachescope_events": rows,
            "slots": log.live.num_blocks, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "events_per_s_cpu": round(made / max(cpu, 1e-9)), "events_per_s_wall": round(made / wall),
            "cachescope_events_per_s_cpu": round(rows / max(cpu, 1e-9))}


def journal_app_rate(num_events: int = 100_000, gpu_blocks: int = 30_000,
                     frames_per_tick: int = FRAMES_PER_TICK, overlay: bool = True,
                     takes: str = "feed") -> dict[str, Any]:
    """vLLM events per second (CPU time) through the route an attach takes in the app, headless:
    frames decoded to columns a tick's run at a time (`fastwire.decode_columns_many`, as the
    subscriber decodes the frames it finds waiting) and applied to the journalling pool
    an `Attachment` makes (`journal_pool_class`, `apply_many` per tick as its held batches
    are); the rows taken and placed by a `JournalFeed`'s steps (`take_journal_rows`,
    `prepare_journal`) and written to the window's `PoolState` (`apply_prepared`: log, live
    pool, series, checkpoints, the remote overlay) in blocks of a tick's budget, as
    `RemoteController._commit_ready` writes them; all on one thread. Stages apart in CPU
    time: decode, pool, place, write ("commit").

    `takes` says when rows are taken: "feed", as the app's placing thread takes them (once
    TAKE_EVERY_S has passed since its last take, in bites of what a GUI tick's budget
    writes, TICK_BUDGET_S at the running estimate per row, until a bite is short); "tick",
    every tick's rows at once after its apply (the app's route before it had a placing
    thread: a take, a placing and a write per 64 frames, each with a fixed cost of numpy
    calls that the feed's takes pay about 20 times less often)."""
    from app.runtime.journal_feed import TAKE_EVERY_S, JournalFeed, JournalPools
    from app.runtime.remote import FIRST_ROW_SECONDS, next_row_seconds, tick_rows
    from app.runtime.state import PoolState
    from engine.remote import colpool
    from engine.remote.overlay import journal_pool_class

    if takes not in ("feed", "tick"):
        raise ValueError(f"takes is 'feed' or 'tick', not {takes!r}")
    payloads, made, _ = recorded_stream(num_events, gpu_blocks=gpu_blocks)
    fastwire.warm_up()
    colpool.warm_up()
    _warm_journal_state()
    pool = journal_pool_class()("bench")
    att = JournalPools([pool])
    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM bench"})
    if not overlay:
        state.remote = None
    row_seconds = [FIRST_ROW_SECONDS]  # RemoteController's running estimate of a written row's time

    def budget() -> int:
        return 1 << 30 if takes == "tick" else tick_rows(row_seconds[0])

    feed = JournalFeed(att, state.log, {}, budget)  # its steps, on this thread (not started)
    stages = dict.fromkeys(("decode", "pool", "place", "commit"), 0.0)
    clock = time.process_time
    rows = num_takes = num_writes = 0
    gc.collect()
    w0, c0 = time.perf_counter(), clock()
    last_take = time.monotonic()
    for start in range(0, len(payloads), frames_per_tick):
        t0 = clock()
        batches = fastwire.decode_columns_many(start, payloads[start:start + frames_per_tick])
        t1 = clock()
        with att.lock:
            pool.apply_many(batches)
        t2 = clock()
        stages["decode"] += t1 - t0
        stages["pool"] += t2 - t1
        last = start + frames_per_tick >= len(payloads)
        if takes == "feed" and not last and time.monotonic() - last_take < TAKE_EVERY_S:
            continue
        last_take = time.monotonic()
        while feed.step() >= budget():  # (JournalFeed._run: a full bite, and the next at once)
            pass
        num_takes += 1
        t3 = clock()
        while feed.num_ready:  # a GUI tick's blocks at a time
            wrote = state.apply_prepared(feed.pop_blocks(budget()), notify=False)
            if wrote:
                row_seconds[0] = next_row_seconds(row_seconds[0], state.journal_seconds, wrote)
            rows += wrote
            num_writes += 1
        t4 = clock()
        stages["place"] += t3 - t2
        stages["commit"] += t4 - t3
    wall, cpu = time.perf_counter() - w0, clock() - c0
    return {"route": "journal to PoolState" + ("" if overlay else " (no overlay)"), "takes": takes,
            "vllm_events": made, "cachescope_events": rows, "log_rows": len(state.log),
            "slots": state.projection.num_blocks, "num_takes": num_takes, "num_writes": num_writes,
            "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "events_per_s_cpu": round(made / max(cpu, 1e-9)), "events_per_s_wall": round(made / wall),
            "stages_cpu_s": {k: round(v, 3) for k, v in stages.items()}}


def _warm_journal_state() -> None:
    """The placer, the live log's passes and the overlay's loop loaded (or compiled) before a clock."""
    from app.runtime.state import PoolState
    from engine.core.live_journal import prepare_journal
    from engine.remote.overlay import journal_pool_class

    payloads, _, _ = recorded_stream(200, gpu_blocks=64)
    pool = journal_pool_class()("warm")
    pool.apply_many([fastwire.decode_columns(i, p) for i, p in enumerate(payloads)])
    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True})
    rows = pool.take_journal()
    state.apply_prepared([(prepare_journal(state.log, rows, pool, "warm"), pool.times_of(rows))])


def median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run of `runs` whose `key` is the median (the lower middle one of an even number),
    with every run's `key` beside it (`runs_<key>`): one run of an attach on a shared 2-core
    machine moved by 15% or more from the next (a wall-clock rate most)."""
    got = dict(sorted(runs, key=lambda r: r[key])[(len(runs) - 1) // 2])
    got[f"runs_{key}"] = [r[key] for r in runs]
    return got


def app_routes(num_events: int = 100_000, gpu_blocks: int = 30_000,
               frames_per_tick: int = FRAMES_PER_TICK, repeats: int = 3) -> dict[str, Any]:
    """An attach's path through the app, headless, both routes on the same stream in one run:
    the journal route the app takes (`journal_app_rate`, its rows taken as the feed takes
    them, `repeats` times: its median run by rate) beside the event route it replaced
    (`app_path_rate`: the reference RemotePool's events into the same `PoolState`, 36x
    slower, once); and the journal route with a take per tick's apply, as it was timed
    before it followed the feed (its median run too)."""
    journal = median_run([journal_app_rate(num_events, gpu_blocks, frames_per_tick) for _ in range(repeats)],
                         "events_per_s_cpu")
    per_tick = median_run([journal_app_rate(num_events, gpu_blocks, frames_per_tick, takes="tick")
                           for _ in range(repeats)], "events_per_s_cpu")
    events = app_path_rate(num_events, columnar=True, gpu_blocks=gpu_blocks, frames_per_tick=frames_per_tick)
    return {"journal_route": journal, "journal_route_taken_per_tick": per_tick, "event_route": events,
            "journal_events_per_s_cpu": journal["events_per_s_cpu"],
            "journal_taken_per_tick_events_per_s_cpu": per_tick["events_per_s_cpu"],
            "event_events_per_s_cpu": events["events_per_s_cpu"],
            "journal_vs_event_route": round(journal["events_per_s_cpu"] / max(events["events_per_s_cpu"], 1), 3),
            "journal_vs_target_500k": round(journal["events_per_s_cpu"] / 500_000, 3)}


def _one_store_event() -> list:
    from engine.core.events import BlockStored

    return [BlockStored(seq=0, time=0.0, request_id="warm", block_id=0, block_hash=b"w" * 8, parent_hash=None,
                        token_ids=(), salt=None)]


def compare(num_events: int = 100_000) -> dict[str, Any]:
    """Both logs side by side on the same stream, and their ratio."""
    ref = app_path_rate(num_events, columnar=False)
    col = app_path_rate(num_events, columnar=True)
    journal = journal_path_rate(num_events)
    return {"event_log": ref, "live_columnar_log": col, "journal_to_live_columnar_log": journal,
            "columnar_vs_event_log": round(col["events_per_s_cpu"] / max(ref["events_per_s_cpu"], 1), 3),
            "journal_vs_event_log": round(journal["events_per_s_cpu"] / max(ref["events_per_s_cpu"], 1), 3),
            "journal_vs_target": round(journal["events_per_s_cpu"] / 500_000, 3)}


if __name__ == "__main__":
    import json
    import sys

    # `python -m app.runtime.live_path 100000 routes`: the journal route beside the event route
    num = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    print(json.dumps(app_routes(num) if sys.argv[2:] == ["routes"] else compare(num), indent=1))
