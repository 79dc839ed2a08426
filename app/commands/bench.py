"""`cachescope bench NAME`: speed and memory targets, measured as side-by-side ratios."""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
import threading
import time

from app.commands._common import print_json
from engine.bench.summary import summarize
from engine.core.errors import InputError

NAME = "bench"
HELP = ("run a benchmark (engine, stream, attach, gui, capture, ttft, semantic, held, or all) and report ratios "
        "against its targets")

# `all` runs them in this order: issue 20's benches first, then the model's, then the 10M-block pool.
BENCHES = {
    "engine": "engine.bench.prefix_cache",
    "stream": "engine.bench.stream",
    "attach": "app.commands._bench_attach",
    "gui": "app.commands._bench_gui",
    "capture": "app.commands._bench_capture",
    "ttft": "engine.bench.ttft",
    "semantic": "engine.bench.semantic",
    "held": "app.commands._bench_held",  # last: the 10M-block pool takes minutes
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=[*BENCHES, "all"], help="which benchmark")
    p.add_argument("--quick", action="store_true", help="a smaller run (used by the test suite)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    """One bench, or all of them in turn. `all` adds a top-level `targets` table: every
    target of issue 20 with its value, the anchor measured beside it and the ratio
    (`engine.bench.summary`); a bench that fails there gives its error and the others run,
    and Ctrl-C or SIGTERM stops the run and prints what the finished benches measured."""
    everything = args.name == "all"
    names = list(BENCHES) if everything else [args.name]
    results: dict[str, dict] = {}
    failed: list[str] = []
    on_term = None
    if everything and threading.current_thread() is threading.main_thread():
        on_term = signal.signal(signal.SIGTERM, _interrupt)
    try:
        if everything and ("gui" in names or "held" in names):
            # One QApplication for the whole run, made before any bench starts a Qt event
            # loop: bench attach's would otherwise be a QCoreApplication, on which bench
            # gui cannot build a widget (Qt has one application object per process).
            from app.commands._bench_gui import _app

            qt_app = _app()  # noqa: F841 - kept for the whole run
        _run_each(names, args, results, failed, everything)
    except KeyboardInterrupt:
        if not everything:
            raise
        stopped = [name for name in names if name not in results]
        for name in stopped:
            results[name] = {"error": "interrupted before it finished"}
        failed.extend(stopped)
        sys.stderr.write(f"cachescope bench: interrupted; not measured: {', '.join(stopped)}\n")
    finally:
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)
    if everything:
        table = summarize(results)
        if args.json:
            print_json({"targets": table, "quick": args.quick, **results})
        else:
            _print_table(table)
    elif args.json:
        print_json(results[names[0]])
    sys.stdout.flush()
    return 1 if failed else 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run_each(names: list[str], args: argparse.Namespace, results: dict[str, dict], failed: list[str],
              everything: bool) -> None:
    for name in names:
        try:
            mod = importlib.import_module(BENCHES[name])
        except ImportError as exc:
            if not everything:
                raise InputError(f"benchmark {name!r} is not available: {exc}") from None
            mod = None
            error = f"not available: {exc}"
        t0 = time.perf_counter()
        if mod is not None:
            try:
                results[name] = mod.run_bench(quick=args.quick)
            except Exception as exc:  # noqa: BLE001 - `all` reports it and runs the next bench
                if not everything:
                    raise
                error = f"{type(exc).__name__}: {exc}"
        if name not in results:
            results[name] = {"error": error}
            failed.append(name)
            sys.stderr.write(f"cachescope bench: {name} failed ({error}); the other benches still run\n")
        results[name]["wall_s"] = round(time.perf_counter() - t0, 2)
        if not args.json:
            _print_human(name, results[name])


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


def _print_table(table: dict[str, dict]) -> None:
    out = sys.stdout
    out.write("== targets (issue 20): value | anchor beside it | ratio | target\n")
    for name, row in table.items():
        if row["value"] is None:
            out.write(f"  {name}: not measured ({row['missing']})\n")
            continue
        mark = "met" if row["met"] else "NOT met"
        ratio = "" if row["ratio"] is None else f"{row['ratio']}x"
        out.write(f"  {name}: {row['value']} {row['unit']} | {row['anchor']} ({row['anchor_what']}) | {ratio} | "
                  f"want {row['target']}: {mark}\n")
