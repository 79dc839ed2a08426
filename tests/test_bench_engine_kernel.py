"""`bench engine`'s kernel figures: the whole is the replay command's wait (preparation to
the `ReplayResult`), the rows made on demand and the JSON rows are timed apart, and the
kernel's result is checked equal to the Python engine's, rows included. No timing is
asserted: only what each figure covers.
"""

from __future__ import annotations

import time

from engine.bench.prefix_cache import _stages, bench_kernel
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace
from engine.resources import RESOURCES


def test_the_kernel_bench_reports_each_stage_and_an_identical_result():
    out = bench_kernel(limit=300, repeats=1, first_use_runs=False)
    assert out["identical_results"] is True and out["requests"] == 300
    stages = out["kernel_stages_cpu_s"]
    assert set(stages) == {"prepare", "intern", "loop", "result", "whole", "json_rows", "rows_on_demand"}
    assert out["kernel_cpu_s"] == stages["whole"] and out["kernel_loop_cpu_s"] == stages["loop"]
    # the rate is the whole's: stages are rounded to 0.1 ms in the report, so the reported
    # whole is within 0.05 ms of the one the rate was taken from (a 0.76 ms whole reads 0.8)
    rate, blocks = out["kernel_blocks_per_s_cpu"], out["lookup_blocks"]
    assert abs(blocks / rate - stages["whole"]) <= 0.00005 + 0.001 * stages["whole"]
    assert out["kernel_recorded_cpu_s"] > 0 and out["recorded_events"] > 0


def test_the_whole_leaves_the_row_objects_to_the_caller_that_reads_them():
    requests = load_trace(RESOURCES / "traces" / "mooncake_conversation_trace.jsonl", 512)[:200]
    config = ReplayConfig(block_size=512, capacity_blocks=300)
    calls = []

    def clock() -> float:
        calls.append(None)
        return time.perf_counter()

    best, run = _stages(requests, config, 1, clock)
    # the run the bench timed is the replay command's result, and its rows were made after
    # the whole was read (by the "rows_on_demand" stage), equal to the Python engine's
    assert run.result.columns is not None and run.result._rows is not None
    assert run.result.requests == replay(requests, config).requests
    assert best["whole"] >= best["loop"] and len(calls) >= 6
