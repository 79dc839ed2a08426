"""`cachescope billing`: what a hosted API would bill for a session or trace, with and without caching."""

from __future__ import annotations

import argparse
import sys

from app.commands._common import non_negative_float, positive_int, print_json

NAME = "billing"
HELP = "hosted prompt-caching bill (Anthropic / OpenAI rules) of a conversation, trace or stored session"

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SESSION_OR_TRACE",
                   help="conversation file (OpenAI/Anthropic JSON), token-level or Mooncake trace, or a stored session id")
    p.add_argument("--provider", choices=("anthropic", "openai", "openai-legacy"), default="anthropic",
                   help="whose rules to apply (default anthropic)")
    p.add_argument("--model", metavar="NAME", default=None,
                   help="model family, e.g. claude-sonnet-4-5 (sets the minimum and price); by default a request that "
                        "names its model is priced by that model's rules")
    p.add_argument("--breakpoints", metavar="auto|LIST", default=None,
                   help="cache breakpoints: 'auto' (the last block) or block indices such as 0,-1 (negative from the end)")
    p.add_argument("--ttl", choices=("5m", "1h"), default="5m", help="Anthropic cache lifetime (1h writes cost 2x)")
    p.add_argument("--price-per-mtok", type=non_negative_float, default=None, metavar="X",
                   help="base input price in USD per million tokens (default: from the rules file)")
    p.add_argument("--turn-gap", type=non_negative_float, default=0.0, metavar="SECONDS",
                   help="seconds between turns of a conversation file, which has no timestamps (default 0)")
    p.add_argument("--rules", metavar="PATH", default=None, help="another rules file (default resources/billing_rules.json)")
    p.add_argument("--db", metavar="PATH", default=None, help="the session database (default: the user data dir)")
    p.add_argument("--limit", type=positive_int, default=None, metavar="N", help="use only the first N requests")
    p.add_argument("--totals-only", action="store_true", help="omit the per-request rows")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from engine.analysis import billing

    data = billing.load_rules(args.rules) if args.rules else None
    rules = billing.provider_rules(args.provider, args.model, args.ttl, args.price_per_mtok, data)
    breakpoints = billing.parse_breakpoints(args.breakpoints, rules)
    reqs, counts = billing.load_billing_requests(args.source, args.db, args.turn_gap)
    if args.limit is not None:
        reqs = reqs[:args.limit]
    # Requests that name their model (a trace's, a stored trace's) are priced by it, unless
    # --model prices every request as one.
    model_rules = (None if args.model is not None else
                   billing.rules_for_models(reqs, args.provider, args.ttl, args.price_per_mtok, data,
                                            source=args.source))
    result = billing.bill(reqs, rules, breakpoints, model_rules)
    result["source"] = args.source
    result["token_counts"] = counts
    if args.totals_only:
        result.pop("requests")
    if args.json:
        print_json(result)
    else:
        _print_human(result)
    return 0


def _money(v: float | None) -> str:
    return "n/a" if v is None else f"${v:.6f}"


def _print_human(result: dict) -> None:
    out = sys.stdout
    r, t = result["rules"], result["totals"]
    for m in (result["models"].values() if "models" in result else [result]):
        r = m["rules"]
        out.write(f"{r['label']}, {r['model']} (rules checked {r['checked']}): write {r['write_multiplier']}x, "
                  f"read {r['read_multiplier']}x, minimum {r['min_cacheable_tokens']} tokens, "
                  f"TTL {r['ttl_seconds']:.0f} s" + (f", {m['totals']['requests']} requests, "
                                                     f"cost {_money(m['totals']['cost_usd'])}" if m is not result else "")
                  + "\n")
    out.write(f"token counts: {result['token_counts']}\n")
    rows = result.get("requests") or []
    if rows:
        out.write(f"{'#':>5} {'id':<14} {'prompt':>8} {'read':>8} {'write':>8} {'uncached':>9} {'cost':>11}\n")
        for row in rows[:200]:
            out.write(f"{row['index']:>5} {str(row['id'])[:14]:<14} {row['prompt_tokens']:>8} {row['read_tokens']:>8} "
                      f"{row['write_tokens']:>8} {row['uncached_tokens']:>9} {_money(row['cost_usd']):>11}\n")
            for note in row["notes"]:
                out.write(f"      note: {note}\n")
        if len(rows) > 200:
            out.write(f"... {len(rows) - 200} more (use --json)\n")
    out.write(f"total: {t['prompt_tokens']} prompt tokens, read {t['read_tokens']}, written {t['write_tokens']}, "
              f"uncached {t['uncached_tokens']}\n")
    out.write(f"cost {_money(t['cost_usd'])} with caching, {_money(t['cost_without_cache_usd'])} without "
              f"(saves {t['savings_fraction']:.1%})\n")
