"""`cachescope bench held`: a 10,000,000-block remote vLLM pool held and drawn by the app,
beside a 1,000,000-block one in the same run (`app.commands._bench_gui.bench_held_pool`).

Its own bench, last in `bench all`: building the larger pool takes minutes on a loaded
2-core machine, and an interrupted `bench all` keeps every bench that finished before it.
Each size is held in a fresh child process: the bytes a block costs are RSS growth, and in
the process of `bench all` a pool would partly grow into memory the benches before it freed
(a 1,000,000-block pool measured 327 B a block there and 473-668 B in a process of its own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from app.commands._bench_gui import TARGET_REDRAW_MS, bench_held_pool


def run_bench(quick: bool = False) -> dict[str, Any]:
    sizes: dict[str, Any] = {}
    for n in ((100_000, 1_000_000) if quick else (1_000_000, 10_000_000)):
        sizes.update(_held_apart(quick, n))
    small, large = (sizes[k] for k in sorted(sizes, key=int))
    return {"quick": quick, "sizes": sizes, "small": small, "large": large, "process": "one fresh child a size",
            "targets": {"redraw_held_pool_ms": {"value": large["median_ms"], "target": TARGET_REDRAW_MS,
                                                "met": large["median_ms"] < TARGET_REDRAW_MS},
                        "bytes_per_block": {"value": large["bytes_per_block"], "target": 100,
                                            "met": large["bytes_per_block"] <= 100}}}


def _held_apart(quick: bool, n: int) -> dict[str, Any]:
    """`bench_held_pool(quick, (n,))` in a child interpreter of its own (offscreen Qt)."""
    env = {**os.environ, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
    code = f"import json; from app.commands._bench_gui import bench_held_pool; print(json.dumps(bench_held_pool({quick!r}, ({n},))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the {n:,}-block pool's child process failed: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(run_bench(quick="--quick" in sys.argv), indent=1))
