"""`cachescope sweep`: hit rate of a trace against block size and against pool capacity."""

from __future__ import annotations

import argparse
import sys

from app.commands._common import positive_int, print_json, seed_int

NAME = "sweep"
HELP = "what-if sweep: hit rate of a trace or conversation file against block size and capacity"


def int_list(text: str) -> list[int]:
    values = [positive_int(t) for t in text.split(",") if t.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers of at least 1, such as 1,2,4,8")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    from engine.analysis.sweep import DEFAULT_BLOCK_SIZES, DEFAULT_CAPACITIES

    p.add_argument("trace", metavar="TRACE",
                   help="token-level or Mooncake JSONL trace, a WEKA kv-cache-tester file or folder, or a conversation "
                        "file (tokenised with the real tokenizer)")
    p.add_argument("--block-sizes", type=int_list, default=list(DEFAULT_BLOCK_SIZES), metavar="LIST",
                   help="block sizes to try (default 1,2,4,8,16,32,64; a Mooncake trace fixes 512)")
    p.add_argument("--capacities", type=int_list, default=list(DEFAULT_CAPACITIES), metavar="LIST",
                   help="pool capacities in blocks to try (default 64,...,4096)")
    p.add_argument("--block-size", type=positive_int, default=16, metavar="N",
                   help="block size held fixed while the capacity varies (default 16)")
    p.add_argument("--capacity-tokens", type=positive_int, default=None, metavar="N",
                   help="pool size in tokens held fixed while the block size varies (default: the whole trace)")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="use only the first N requests")
    p.add_argument("--model", metavar="M", default=None, help="tokenizer for conversation files (default: bundled SmolLM2)")
    p.add_argument("--seed", type=seed_int, default=0, metavar="S", help="hash seed (default 0)")
    p.add_argument("--shared-across-models", action="store_true",
                   help="what if one cache were shared across models (by default a cache is keyed to its model)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from engine.analysis.sweep import sweep_file

    def tokenizer():
        from engine.model.loader import load_tokenizer

        return load_tokenizer(args.model)

    result = sweep_file(args.trace, args.block_sizes, args.capacities, block_size=args.block_size,
                        capacity_tokens=args.capacity_tokens, limit=args.limit, seed=args.seed,
                        keyed_by_model=not args.shared_across_models, tokenizer_loader=tokenizer)
    if args.json:
        print_json(result)
    else:
        _print_human(result)
    return 0


def _print_human(result: dict) -> None:
    out = sys.stdout
    out.write(f"{result['trace']}: {result['requests']} requests ({result['kind']}), {result['total_tokens']} tokens\n")
    for note in result["notes"]:
        out.write(f"note: {note}\n")
    for series, title in (("block_size", f"hit rate by block size (pool of {result['capacity_tokens']} tokens)"),
                          ("capacity", f"hit rate by capacity (block size {result['block_size']})")):
        rows = [p for p in result["points"] if p["series"] == series]
        if not rows:
            continue
        out.write(f"{title}\n{'block':>7} {'blocks':>8} {'hit rate':>9} {'served':>8} {'cached':>10} "
                  f"{'evicted':>9} {'refused':>8}\n")
        for p in rows:
            out.write(f"{p['block_size']:>7} {p['capacity_blocks']:>8} {p['hit_rate']:>9.1%} "
                      f"{p['served_hit_rate']:>8.1%} {p['cached_tokens']:>10} {p['evicted_blocks']:>9} "
                      f"{p['refused_requests']:>8}\n")
    if any(p["refused_requests"] for p in result["points"]):
        out.write("hit rate counts refused requests' prompt tokens as missed; served: over served requests only\n")
