"""`cachescope replay` of WEKA kv-cache-tester traces: a file, or a folder replayed as
concurrent users; prints the published table's two columns beside what the engine holds."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.commands._common import print_json
from engine.core.errors import InputError


def is_weka_input(path: Path) -> bool:
    from engine.core.sniff import WEKA_FORMAT, file_kind

    return path.is_dir() or (path.is_file() and file_kind(path) == WEKA_FORMAT)


def run_weka(args: argparse.Namespace, events: object = None) -> int:
    from engine.analysis.weka import weka_summary
    from engine.store.weka import load_weka

    traces = load_weka(args.trace)
    size = traces[0].block_size
    if args.block_size not in (16, size):  # 16 is the option's default: the trace's own size is used
        raise InputError(f"{args.trace}: its hash ids name {size}-token blocks; give --block-size {size} or leave it out")
    if args.kv_memory is not None:
        raise InputError("--kv-memory needs a model; a kv-cache-tester trace takes --capacity-blocks, "
                         "--capacity-tokens or --num-gpu-blocks")
    capacity = args.capacity_blocks
    if args.capacity_tokens is not None:
        if args.capacity_tokens < size:
            raise InputError(f"a capacity of {args.capacity_tokens} tokens holds no block of {size} tokens")
        capacity = args.capacity_tokens // size
    result = weka_summary(traces, capacity, args.concurrency, args.shared_across_models,
                          None if args.random_seed else args.seed, args.hash, events)
    if args.totals_only:
        result.pop("requests", None)
    if args.json:
        print_json(result)
    else:
        print_weka(result)
    return 0


def print_weka(result: dict) -> None:
    out = sys.stdout
    cfg = result["config"]
    t = result["totals"]
    keyed = "keyed by model" if cfg["keyed_by_model"] else "one cache shared across models (what-if)"
    pool = (f"a pool of {cfg['capacity_blocks']} blocks" if cfg["capacity_blocks"] is not None
            else f"an unbounded pool ({cfg['unbounded_capacity_blocks']} blocks, nothing evicted)")
    out.write(f"{len(result['traces'])} kv-cache-tester trace(s), {t['requests']} requests "
              f"({t['subagent_requests']} of sub-agents), blocks of {cfg['block_size']}, {pool}, cache {keyed}\n")
    bounded = cfg["capacity_blocks"] is not None
    head = f"{'trace':<12} {'reqs':>5} {'Same-Model%':>12} {'Cumulative%':>12} {'held%':>7} {'hit rate%':>10}"
    if bounded:
        head += f" {'bounded held% (with / without sub-agents)':>44}"
    out.write(head + "  models\n")
    for r in result["traces"]:
        line = (f"{r['trace']:<12} {r['requests']:>5} {r['same_model_pct']:>12.1f} {r['cumulative_pct']:>12.1f} "
                f"{r['unbounded_held_pct']:>7.1f} {r['engine_hit_rate_pct']:>10.1f}")
        if bounded:
            line += f" {r['bounded_held_pct_with_subagents']:>30.1f} / {r['bounded_held_pct_without_subagents']:.1f}"
        out.write(line + "  " + ", ".join(r["models"]) + "\n")
    out.write("Same-Model% and Cumulative%: kv-cache-tester's definition (per model, the first request of each "
              "model and sub-agent requests left out); held%: blocks an unbounded engine cache held for the same "
              "requests\n")
    out.write(f"note: {result['note']}\n")
    if bounded:
        out.write(f"bounded run: hit rate {t['hit_rate']:.1f}%  refused {t['refused_requests']}\n")
