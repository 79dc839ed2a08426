"""`cachescope semantic`: evaluate the semantic cache on labelled pairs, and query its store."""

from __future__ import annotations

import argparse
import sys

from app.commands._common import non_negative_float, positive_int, print_json
from engine.core.errors import InputError

NAME = "semantic"
HELP = ("semantic cache: precision on labelled pairs (eval), the stored entries (query, add, list, remove), "
        "and the exact-response repeat rate of a conversation file (repeats)")


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is outside 0..1")
    return value


def _store_options(p: argparse.ArgumentParser, embedder: bool = True) -> None:
    p.add_argument("--db", metavar="PATH", default=None, help="database file (default: the user data directory, or $CACHESCOPE_DB)")
    p.add_argument("--tenant", metavar="T", default=None, help="tenant whose entries to use; tenants never see each other's")
    p.add_argument("--model", metavar="M", default="", help="language model the responses came from (entries of other models are never served)")
    if embedder:
        p.add_argument("--embedding-model", metavar="PATH", default=None,
                       help="local sentence-transformers folder (default: bundled all-MiniLM-L6-v2)")
        p.add_argument("--ttl", type=non_negative_float, metavar="SECONDS", default=None, help="expire entries older than this")
        p.add_argument("--max-entries", type=positive_int, metavar="N", default=None, help="evict least recently used entries beyond N")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="semantic_command", metavar="ACTION", parser_class=type(p))
    sub.required = True

    ev = sub.add_parser("eval", help="precision, recall and false-hit rate on a labelled pairs file")
    ev.add_argument("pairs", metavar="PAIRS.jsonl", help='JSONL of {"a", "b", "same", "category"}; "heldout" and "dev" name the shipped sets')
    ev.add_argument("--thresholds", metavar="LIST", default=None, help="comma-separated thresholds (default 0.7,0.75,0.8,0.85,0.9,0.95)")
    ev.add_argument("--guard", action="store_true", help="show the guarded decision (flagged pairs not served) in the table")
    ev.add_argument("--embedding-model", metavar="PATH", default=None, help="local sentence-transformers folder")
    ev.add_argument("--json", action="store_true", help="print one JSON object")

    q = sub.add_parser("query", help="look a prompt up: neighbours, scores, risk flags and the decision")
    q.add_argument("prompt", metavar="PROMPT")
    q.add_argument("--threshold", type=_threshold, default=0.90, metavar="T", help="hit when the best cosine >= T (default 0.90)")
    q.add_argument("--guard", action="store_true", help="guarded mode: a flagged neighbour is not served")
    q.add_argument("--top-k", type=positive_int, default=5, metavar="K", help="neighbours to show (default 5)")
    _store_options(q)

    a = sub.add_parser("add", help="store a prompt and its response")
    a.add_argument("prompt", metavar="PROMPT")
    a.add_argument("response", metavar="RESPONSE")
    _store_options(a)

    ls = sub.add_parser("list", help="the stored entries")
    _store_options(ls, embedder=False)
    ls.add_argument("--all-tenants", action="store_true", help="entries of every tenant")

    rp = sub.add_parser("repeats", help="byte-identical repeat rate of a conversation file: what an exact response cache would serve")
    rp.add_argument("conversations", metavar="FILE", help="OpenAI/ShareGPT/Anthropic conversations or a token-level trace")
    rp.add_argument("--model", metavar="M", default="", help="model name for requests that do not name one")
    rp.add_argument("--json", action="store_true", help="print one JSON object")

    rm = sub.add_parser("remove", help="delete stored entries by id")
    rm.add_argument("ids", metavar="ID", type=positive_int, nargs="+")
    _store_options(rm, embedder=False)


def run(args: argparse.Namespace) -> int:
    return {"eval": _eval, "query": _query, "add": _add, "list": _list, "remove": _remove,
            "repeats": _repeats}[args.semantic_command](args)


def _embedder(args: argparse.Namespace):
    from transformers.utils import logging as hf_logging

    from engine.semantic.cache import Embedder

    hf_logging.disable_progress_bar()  # a command line prints its result, not loading bars
    return Embedder(args.embedding_model)


def _eval(args: argparse.Namespace) -> int:
    from engine.resources import resource_path
    from engine.semantic.evaluation import DEFAULT_THRESHOLDS, evaluate, load_pairs, pair_flags, pair_scores, parse_thresholds

    thresholds = parse_thresholds(args.thresholds) if args.thresholds else list(DEFAULT_THRESHOLDS)
    path = {"dev": resource_path("semantic_pairs.jsonl"),
            "heldout": resource_path("semantic_pairs_heldout.jsonl")}.get(args.pairs, args.pairs)
    pairs = load_pairs(path)  # before the model loads, so a bad file fails at once
    result = evaluate(pairs, pair_scores(pairs, _embedder(args)), pair_flags(pairs), thresholds)
    result["file"] = str(path)
    result["guard"] = bool(args.guard)
    if args.json:
        print_json(result)
        return 0
    fmt = lambda v: "   -  " if v is None else f"{v:6.3f}"  # noqa: E731
    out = sys.stdout
    out.write(f"{result['pairs']} pairs: " + ", ".join(f"{c} {n}" for c, n in result["categories"].items()) + "\n")
    out.write("threshold  precision  recall  false-hit" + ("   guarded: precision  recall  false-hit" if args.guard else "") + "\n")
    for row in result["thresholds"]:
        line = f"{row['threshold']:9.2f}  {fmt(row['precision'])}    {fmt(row['recall'])}  {fmt(row['false_hit_rate'])}"
        if args.guard:
            g = row["guarded"]
            line += f"            {fmt(g['precision'])}  {fmt(g['recall'])}  {fmt(g['false_hit_rate'])}"
        out.write(line + "\n")
    return 0


def _open_cache(args: argparse.Namespace, threshold: float = 0.90, guard: bool = False, top_k: int = 5,
                read_only: bool = False):
    from engine.semantic.cache import SemanticCache
    from engine.store.database import Store

    store = Store(args.db, read_only=read_only)  # before the embedder: a bad --db fails fast and quietly
    embedder = _embedder(args)
    return SemanticCache(embedder, store, model=args.model, threshold=threshold, guard=guard, top_k=top_k,
                         ttl_seconds=args.ttl, max_entries=args.max_entries)


def _check_prompt(text: str, what: str = "prompt") -> None:
    if not text.strip():
        raise InputError(f"the {what} is empty")


def _query(args: argparse.Namespace) -> int:
    _check_prompt(args.prompt)
    cache = _open_cache(args, args.threshold, args.guard, args.top_k, read_only=True)
    result = cache.lookup(args.prompt, tenant=args.tenant)
    if args.json:
        print_json(result.to_dict())
        return 0
    out = sys.stdout
    out.write(f"decision: {result.decision}  (threshold {result.threshold:.2f}{', guarded' if result.guard else ''})\n")
    if result.served:
        out.write(f"response [{result.served.entry_id}]: {result.served.response}\n")
    for n in result.neighbours:
        flags = "; ".join(str(f) for f in n.flags) or "-"
        out.write(f"  {n.score:.3f}  [{n.entry_id}] {n.prompt[:70]}  flags: {flags}\n")
    if not result.neighbours:
        out.write("  (no stored entries for this model and tenant)\n")
    return 0


def _add(args: argparse.Namespace) -> int:
    _check_prompt(args.prompt)
    cache = _open_cache(args)
    entry_id = cache.add(args.prompt, args.response, tenant=args.tenant)
    if args.json:
        print_json(cache.entry(entry_id).to_dict())
    else:
        sys.stdout.write(f"stored entry {entry_id}\n")
    return 0


def _list(args: argparse.Namespace) -> int:
    from engine.semantic.cache import list_entries
    from engine.store.database import Store

    entries = list_entries(Store(args.db, read_only=True), tenant=args.tenant, all_tenants=args.all_tenants,
                           model=args.model if args.model else None)
    if args.json:
        print_json({"entries": [e.to_dict() for e in entries]})
        return 0
    for e in entries:
        tenant = f" tenant={e.tenant}" if e.tenant else ""
        sys.stdout.write(f"[{e.id}] hits={e.hits}{tenant} {e.prompt[:70]!r} -> {e.response[:50]!r}\n")
    if not entries:
        sys.stdout.write("no entries\n")
    return 0


def _remove(args: argparse.Namespace) -> int:
    from engine.semantic.cache import delete_entries
    from engine.store.database import Store

    delete_entries(Store(args.db), args.ids)
    if args.json:
        print_json({"removed": args.ids})
    else:
        sys.stdout.write(f"removed {len(args.ids)} entries\n")
    return 0


def _repeats(args: argparse.Namespace) -> int:
    from engine.store.formats import load_conversations
    from engine.semantic.response_cache import conversation_requests, repeat_rate

    requests = conversation_requests(load_conversations(args.conversations), model=args.model)
    result = {"file": str(args.conversations), **repeat_rate(requests)}
    if args.json:
        print_json(result)
    else:
        sys.stdout.write(f"{result['requests']} requests, {result['unique']} unique, {result['repeats']} byte-identical "
                         f"repeats: an exact response cache would serve {result['repeat_rate']:.1%}\n")
    return 0
