"""`cachescope compare A B`: two runs on one request axis, with per-request deltas (B - A)
and a CI gate on the hit rate (`--fail-if-hit-rate-drops`)."""

from __future__ import annotations

import argparse
import sys

from app.commands._common import positive_int, print_json, seed_int, vllm_gpu_blocks
from engine.core.errors import InputError
from engine.core.hashing import HASH_NAMES

NAME = "compare"
HELP = ("compare two runs (traces, conversation or session files, session:ID, run:ID, run:ID@SERVER, demo:NAME) "
        "request by request")


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:24]!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text[:24]} is not a fraction from 0 to 1 (0.05 is five points)")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="the baseline: a token-level or Mooncake trace, a conversation or "
                                          ".cachescope.json file, session:ID (replayed), run:ID (as recorded), "
                                          "run:ID@SERVER (one server of a recorded fleet attach) or "
                                          "demo:NAME[:PART] (a demo's requests, or one part such as "
                                          "demo:timestamp-at-front:front)")
    p.add_argument("b", metavar="B", help="the run compared with it, in any of the same forms")
    for side in ("", "-a", "-b"):
        which = {"": "both sides", "-a": "A only", "-b": "B only"}[side]
        dest = side.replace("-", "_")
        p.add_argument(f"--block-size{side}", type=positive_int, default=None, metavar="N", dest=f"block_size{dest}",
                       help=f"tokens per block, {which}" + (" (default 16)" if not side else ""))
        cap = p.add_mutually_exclusive_group()
        cap.add_argument(f"--capacity-blocks{side}", type=positive_int, metavar="N", dest=f"capacity_blocks{dest}",
                         help=f"pool size in blocks, {which}" + (" (default: the whole run fits)" if not side else ""))
        cap.add_argument(f"--capacity-tokens{side}", type=positive_int, metavar="N", dest=f"capacity_tokens{dest}",
                         help=f"pool size in tokens, {which} (the same memory at any block size)")
        cap.add_argument(f"--num-gpu-blocks{side}", type=vllm_gpu_blocks, metavar="N", dest=f"capacity_blocks{dest}",
                         help=f"pool size as a vLLM server's num_gpu_blocks, {which}")
        p.add_argument(f"--hash{side}", choices=HASH_NAMES, default=None, dest=f"hash{dest}",
                       help=f"block hash, {which}" + (" (default sha256)" if not side else ""))
    p.add_argument("--seed", type=seed_int, default=0, metavar="S", help="hash seed so digests repeat (default 0)")
    p.add_argument("--concurrency", type=positive_int, default=1, metavar="K", help="requests in flight (default 1)")
    p.add_argument("--requests", type=positive_int, default=None, metavar="N", help="only the first N requests of each side")
    p.add_argument("--db", metavar="PATH", default=None, help="the session database for session:ID and run:ID")
    p.add_argument("--kernel", choices=("auto", "numba", "python"), default="auto",
                   help="the bookkeeping that replays each side: the compiled kernel where it can run it (auto, "
                        "the default), always it (numba), or the Python engine, the reference (python); "
                        "the result is the same")
    p.add_argument("--fail-if-hit-rate-drops", type=fraction, default=None, metavar="X",
                   help="exit 1 when B's hit rate is lower than A's by more than X (a fraction: 0.02 = 2 points)")
    p.add_argument("--cost", choices=("anthropic", "openai", "openai-legacy"), default=None, metavar="PROVIDER",
                   help="add the cost per turn: what PROVIDER's API would bill each request on A and on B "
                        "(as 'cachescope billing' does), with B - A")
    p.add_argument("--cost-model", metavar="NAME", default=None, help="model family for --cost (sets the price)")
    p.add_argument("--totals-only", action="store_true", help="omit the per-request rows")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def side_options(args: argparse.Namespace, side: str):
    from engine.analysis.compare import SideOptions

    def pick(name: str, default):
        own = getattr(args, f"{name}_{side}")
        both = getattr(args, name)
        return own if own is not None else both if both is not None else default

    blocks, tokens = pick("capacity_blocks", None), pick("capacity_tokens", None)
    if getattr(args, f"capacity_blocks_{side}") is not None:
        tokens = None  # the side's own pool size wins over the common one
    elif getattr(args, f"capacity_tokens_{side}") is not None:
        blocks = None
    return SideOptions(block_size=pick("block_size", 16), capacity_blocks=blocks, capacity_tokens=tokens,
                       hash=pick("hash", "sha256"), seed=args.seed, concurrency=args.concurrency, limit=args.requests)


def run(args: argparse.Namespace) -> int:
    from engine.analysis.compare import compare

    demos = None
    if args.a.startswith("demo:") or args.b.startswith("demo:"):
        from app.views.compare.demo_sides import demo_runs

        demos = demo_runs()
    rules = None
    if args.cost is not None:
        from engine.analysis.billing import provider_rules

        rules = provider_rules(args.cost, args.cost_model)  # a bad model fails before the replays
    result = compare(args.a, args.b, side_options(args, "a"), side_options(args, "b"), args.db, demos=demos,
                     kernel=args.kernel)
    out = result.to_dict()
    if rules is not None:
        from engine.analysis.compare import cost_per_turn

        cost = cost_per_turn(result, rules)
        for row, c in zip(out["requests"], cost.pop("requests")):
            row.update({k: c[k] for k in ("cost_usd_a", "cost_usd_b", "cost_delta_usd")})
        out["cost"] = cost
    if args.totals_only:
        out.pop("requests")
    gate = args.fail_if_hit_rate_drops
    failed = gate is not None and result.hit_rate_drop > gate
    if gate is not None:
        out["gate"] = {"fail_if_hit_rate_drops": gate, "hit_rate_drop": result.hit_rate_drop, "failed": failed}
    if args.json:
        print_json(out)
    else:
        _print_human(out)
    if failed:
        sys.stderr.write(f"cachescope: B's hit rate {result.b.hit_rate:.2%} is {result.hit_rate_drop:.2%} below A's "
                         f"{result.a.hit_rate:.2%}, more than the {gate:.2%} allowed\n")
        return 1
    return 0


def _print_human(r: dict) -> None:
    out = sys.stdout
    for side in ("a", "b"):
        t, c = r[side]["totals"], r[side]["config"]
        out.write(f"{side.upper()}: {r[side]['label']}  block size {c.get('block_size')}  "
                  f"pool {c.get('capacity_blocks')} blocks  "
                  f"requests {t['requests']}  cached {t['cached_tokens']} of {t['prompt_tokens']}  "
                  f"hit rate {t['hit_rate']:.2%}  evicted {t['evicted_blocks']}\n")
    d, s = r["delta"], r["summary"]
    out.write(f"B - A: cached {d['cached_tokens']:+d} tokens, hit rate {d['hit_rate']:+.2%}; B reuses more on "
              f"{s['b_reuses_more']} requests, less on {s['b_reuses_less']}, the same on {s['same']} "
              f"(aligned by {r['aligned_by']})\n")
    blocks = r.get("blocks")
    if blocks is not None:
        out.write(f"blocks held at the end: A {blocks['held_a']:,}, B {blocks['held_b']:,}, both "
                  f"{blocks['held_by_both']:,}, only A {blocks['only_a']:,}, only B {blocks['only_b']:,}\n")
    cost = r.get("cost")
    if cost is not None and cost["cost_delta_usd"] is not None:
        out.write(f"cost ({cost['provider']}, {cost['model']}): A ${cost['a']['cost_usd']:.6f}, "
                  f"B ${cost['b']['cost_usd']:.6f}, B - A {cost['cost_delta_usd']:+.6f} USD\n")
    elif cost is not None and cost["unknown"]:
        out.write(f"cost: not known for {' and '.join(cost['unknown'])} (a recorded run, or a demo served "
                  f"without the model, keeps no prompts to price)\n")
    elif cost is not None:  # the rules file names no price for this model: tokens, not dollars
        a, b = cost["a"], cost["b"]
        out.write(f"cost ({cost['provider']}, {cost['model']}): no price in the rules; read/written tokens "
                  f"A {a['read_tokens']:,}/{a['write_tokens']:,}, B {b['read_tokens']:,}/{b['write_tokens']:,}\n")
    rows = [x for x in r.get("requests") or [] if x["cached_delta"]]
    if rows:
        out.write(f"{'#':>5} {'id':<14} {'cached A':>9} {'cached B':>9} {'delta':>7}  B\n")
        for x in rows[:100]:
            out.write(f"{x['position']:>5} {str(x['id_a'] or x['id_b'])[:14]:<14} {x['cached_tokens_a']:>9} "
                      f"{x['cached_tokens_b']:>9} {x['cached_delta']:>+7}  {x['b_reuses']}\n")
        if len(rows) > 100:
            out.write(f"... {len(rows) - 100} more requests differ (use --json)\n")
