"""`cachescope bench held`: a 10,000,000-block remote vLLM pool held and drawn by the app,
beside a 1,000,000-block one in the same run (`app.commands._bench_gui.bench_held_pool`).

Its own bench, last in `bench all`: building the larger pool takes minutes on a loaded
2-core machine, and an interrupted `bench all` keeps every bench that finished before it.
"""

from __future__ import annotations

from typing import Any

from app.commands._bench_gui import TARGET_REDRAW_MS, bench_held_pool


def run_bench(quick: bool = False) -> dict[str, Any]:
    sizes = bench_held_pool(quick)
    small, large = (sizes[k] for k in sorted(sizes, key=int))
    return {"quick": quick, "sizes": sizes, "small": small, "large": large,
            "targets": {"redraw_held_pool_ms": {"value": large["median_ms"], "target": TARGET_REDRAW_MS,
                                                "met": large["median_ms"] < TARGET_REDRAW_MS},
                        "bytes_per_block": {"value": large["bytes_per_block"], "target": 100,
                                            "met": large["bytes_per_block"] <= 100}}}
