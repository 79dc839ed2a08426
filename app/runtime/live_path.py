"""The attached server's whole path through the app, timed: frames decoded, the remote pool's
events handed over, and each GUI tick's batch applied to `PoolState` (log, live pool,
series, checkpoints, the tier/rank/age overlay), as `PoolState` runs it in the window.

`engine.bench.attach`'s "app path" figure stops at the bridge; `app_path_rate` goes on to
the pool state the views read, once on the live columnar log and once on the Python
`EventLog` it replaced, on the same recorded stream in one run. No Qt event loop is
needed: `PoolState` is a QObject whose signals nobody is connected to here.
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

    print(json.dumps(compare(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000), indent=1))
