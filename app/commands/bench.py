"""`cachescope bench NAME`: speed and memory targets, measured as side-by-side ratios."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

from app.commands._common import print_json
from engine.core.errors import InputError

NAME = "bench"
HELP = "run a benchmark (engine, stream, ttft, semantic, attach, gui, or all) and report ratios against its targets"

BENCHES = {
    "engine": "engine.bench.prefix_cache",
    "stream": "engine.bench.stream",
    "ttft": "engine.bench.ttft",
    "semantic": "engine.bench.semantic",
    "attach": "app.commands._bench_attach",
    "gui": "app.commands._bench_gui",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=[*BENCHES, "all"], help="which benchmark")
    p.add_argument("--quick", action="store_true", help="a smaller run (used by the test suite)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    names = list(BENCHES) if args.name == "all" else [args.name]
    results: dict[str, dict] = {}
    for name in names:
        try:
            mod = importlib.import_module(BENCHES[name])
        except ImportError as exc:
            raise InputError(f"benchmark {name!r} is not available: {exc}") from None
        t0 = time.perf_counter()
        results[name] = mod.run_bench(quick=args.quick)
        results[name]["wall_s"] = round(time.perf_counter() - t0, 2)
        if not args.json:
            _print_human(name, results[name])
    if args.json:
        print_json(results if len(names) > 1 else results[names[0]])
    return 0


def _print_human(name: str, result: dict) -> None:
    out = sys.stdout
    out.write(f"== bench {name} ({result.get('wall_s', '?')} s)\n")
    for key, value in result.items():
        if key in ("targets", "wall_s"):
            continue
        out.write(f"  {key}: {json.dumps(value)}\n")
    for tname, t in result.get("targets", {}).items():
        mark = "met" if t.get("met") else "NOT met"
        out.write(f"  target {tname}: {t.get('value')} (want {t.get('target')}) {mark}\n")
