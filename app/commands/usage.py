"""`cachescope usage`: what a provider or vLLM server cached per request (from a log with
usage fields) beside what Cachescope predicts, and why each unexpected miss missed."""

from __future__ import annotations

import argparse
import sys

from app.commands._common import add_pool_size, positive_int, print_json

NAME = "usage"
HELP = "observed vs predicted prompt caching of a request/response log (OpenAI, Anthropic, vLLM)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", metavar="LOG", nargs="+",
                   help="JSONL of {request, response} pairs, or a batch's two files: OpenAI Batch input + output, "
                        "Anthropic Message Batches requests + results")
    p.add_argument("--model", metavar="M", default=None,
                   help="tokenizer of the served model (default: the bundled SmolLM2; for hosted APIs, a stand-in)")
    p.add_argument("--block-size", type=positive_int, default=None, metavar="N",
                   help="the vLLM server's block size (predicts with the engine; default 16 for a vLLM log)")
    add_pool_size(p, "usable blocks of the server's pool (default: unbounded)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from engine.analysis.usage import compare_usage
    from engine.model.loader import load_tokenizer
    from engine.store.usage_logs import read_usage_log

    entries = read_usage_log(*args.log)
    from engine.model.loader import DEFAULT_MODEL_NAME

    result = compare_usage(entries, load_tokenizer(args.model), args.block_size, args.capacity_blocks, args.model,
                           args.model or DEFAULT_MODEL_NAME)
    if args.json:
        print_json(result)
    else:
        print_human(result)
    return 0


def print_human(result: dict) -> None:
    out = sys.stdout
    t = result["totals"]
    out.write(f"{t['requests']} requests ({', '.join(result['apis'])}), predicted by {result['predicted_by']}\n")
    for note in result["notes"]:
        out.write(f"note: {note}\n")
    out.write(f"{'id':<22} {'prompt':>7} {'cached':>7} {'predicted':>9} {'diff':>6}  cause\n")
    for r in result["requests"]:
        c = r["cause"]
        why = f"{c['cause']} at token {c['first_divergent_token']} vs {c['against']}: {c['detail']}" if c else ""
        out.write(f"{str(r['id'])[:22]:<22} {r['observed']['prompt_tokens']:>7} {r['observed']['cached_tokens']:>7} "
                  f"{r['predicted']['cached_tokens']:>9} {r['difference']:>6}  {why}\n")
    out.write(f"cached tokens: observed {t['observed_cached_tokens']}, predicted {t['predicted_cached_tokens']} "
              f"({t['matching_requests']} of {t['requests']} requests agree); unexpected misses {t['unexpected_misses']}\n")
