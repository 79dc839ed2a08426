"""`cachescope diff A B`: the first token where two requests diverge, and why."""

from __future__ import annotations

import argparse
import sys

from app.commands._common import positive_int, print_json

NAME = "diff"
HELP = "token diff of two requests: first divergent token, matching blocks and the cause"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="a message file (OpenAI-style JSON), a .txt file (one user message), "
                                          "a token-level trace (first line) or session:ID:REQ")
    p.add_argument("b", metavar="B", help="the later request, in any of the same forms")
    p.add_argument("--model", metavar="M", default=None, help="tokenizer and chat template (default: bundled SmolLM2)")
    p.add_argument("--block-size", type=positive_int, default=16, metavar="N", help="tokens per block (default 16)")
    p.add_argument("--salt-a", metavar="TENANT", default=None, help="tenant salt of A")
    p.add_argument("--salt-b", metavar="TENANT", default=None, help="tenant salt of B")
    p.add_argument("--window", type=positive_int, default=8, metavar="N", help="tokens shown either side (default 8)")
    p.add_argument("--db", metavar="PATH", default=None, help="the session database for session:ID:REQ")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from engine.analysis.diff import diff_requests, load_request
    from engine.core.validation import check_regular_file
    from engine.model.loader import load_tokenizer

    for spec in (args.a, args.b):  # a missing file, a FIFO or a device: refused before the tokenizer loads
        if not spec.startswith("session:"):
            check_regular_file(spec, "request file")
    tokenizer = load_tokenizer(args.model)
    a = load_request(args.a, tokenizer, args.salt_a, args.db)
    b = load_request(args.b, tokenizer, args.salt_b, args.db)
    result = diff_requests(tokenizer, a, b, args.block_size, args.window).to_dict()
    if args.json:
        for side in ("a", "b"):
            result[side].pop("token_texts")
        print_json(result)
    else:
        _print_human(result)
    return 0


def _print_human(r: dict) -> None:
    out = sys.stdout
    d = r["first_divergent_token"]
    out.write(f"A: {r['a']['num_tokens']} tokens   B: {r['b']['num_tokens']} tokens   block size {r['block_size']}\n")
    if d is None:
        out.write(f"no divergence; {r['matching_blocks']} whole blocks match\n")
    else:
        out.write(f"first divergent token: {d}; {r['matching_blocks']} whole blocks match "
                  f"({r['reusable_blocks']} reusable by B)\n")
    out.write(f"cause: {r['cause']}: {r['explanation']}\n")
    if d is not None:
        for side in ("a", "b"):
            s = r[side]
            div = s["divergent"]
            at = f"{div['id']} {div['text']!r}" if div else "(end of request)"
            out.write(f"{side.upper()} at {d}: {at}\n   ...{s['text']!r}...\n")
