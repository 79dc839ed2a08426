"""`cachescope sessions`: list, show, import, export, delete, edit and replay stored sessions."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from app.commands._common import add_pool_size, non_negative_int, positive_int, print_json, seed_int
from engine.core.errors import InputError
from engine.core.hashing import HASH_NAMES
from engine.core.validation import check_regular_file

NAME = "sessions"
HELP = "stored sessions: list, show, import, export, delete, edit a message and re-run, replay"

ACTIONS = {
    "list": "list the stored sessions",
    "show": "show a session's settings, messages (with --history, every version) and runs",
    "import": "import a conversation or trace file (one session per conversation)",
    "export": "export a session as a session file, an OpenAI-style JSON or JSONL",
    "delete": "delete a session with its messages, runs and events",
    "edit": "store a new version of message K and re-run from there: what did the edit invalidate?",
    "replay": "replay a session through a fresh engine with its stored seed, recording the run",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    parsers = {name: sub.add_parser(name, help=text, description=text) for name, text in ACTIONS.items()}
    for name, sp in parsers.items():
        sp.add_argument("--db", metavar="PATH", default=None,
                        help="database file (default: cachescope.db in the user data directory, or $CACHESCOPE_DB)")
        if name != "export":
            sp.add_argument("--json", action="store_true", help="print one JSON object")
        if name not in ("list", "import"):
            sp.add_argument("session", metavar="ID", type=positive_int, help="session id (see `sessions list`)")
    parsers["show"].add_argument("--history", action="store_true", help="every version of every message")
    imp = parsers["import"]
    imp.add_argument("file", metavar="FILE", help="conversation or trace file (a WEKA kv-cache-tester file keeps its models)")
    imp.add_argument("--format", choices=("openai", "sharegpt", "anthropic", "mt-bench", "tokens", "mooncake",
                                          "cachescope", "weka"), default=None, help="force the format instead of detecting it")
    imp.add_argument("--title", default=None, help="session title (default: from the file)")
    imp.add_argument("--model", default=None, metavar="M", help="model whose chat template renders the session")
    imp.add_argument("--block-size", type=positive_int, default=None, metavar="N",
                     help="tokens per block (default 16; 512 for Mooncake traces)")
    add_pool_size(imp, "pool size in blocks")
    imp.add_argument("--seed", type=seed_int, default=None, metavar="S", help="hash seed stored with the session (default 0)")
    imp.add_argument("--hash", choices=HASH_NAMES, default=None,
                     help="block hash (default sha256; vllm-sha256 and vllm-sha256-cbor equal a vLLM server's)")
    exp = parsers["export"]
    exp.add_argument("--format", choices=("session", "openai", "jsonl"), default="session",
                     help="session: a .cachescope.json that round-trips exactly (default); openai; jsonl")
    exp.add_argument("-o", "--output", metavar="PATH", default=None, help="write to PATH instead of standard output")
    edit = parsers["edit"]
    edit.add_argument("--message", type=non_negative_int, required=True, metavar="K",
                      help="message to edit, counted from 0 with the system message included")
    edit.add_argument("--content", required=True, metavar="TEXT", help="the new text of message K")
    add_pool_size(edit, "pool size for the re-run (default: the session's)")
    edit.add_argument("--generate", action="store_true",
                      help="run the real model and regenerate the replies from message K on (default: keep them)")
    edit.add_argument("--max-new-tokens", type=positive_int, default=64, metavar="N",
                      help="tokens per regenerated reply (with --generate; default 64)")
    rep = parsers["replay"]
    add_pool_size(rep, "pool size (default: the session's)")
    rep.add_argument("--concurrency", type=positive_int, default=1, metavar="K", help="requests in flight at once")
    rep.add_argument("--no-record", action="store_true", help="do not store the run, its requests and events")
    rep.add_argument("--totals-only", action="store_true", help="omit the per-request rows")


def run(args: argparse.Namespace) -> int:
    if not getattr(args, "action", None):
        raise InputError(f"choose an action: {', '.join(ACTIONS)} (see `cachescope sessions --help`)")
    from engine.store.database import Store

    if args.action == "import" and not os.path.isdir(args.file):
        # Refuse a missing file, a FIFO or a device before the database is made for it.
        check_regular_file(args.file, "file to import")
    # Reads never take the write lock, never change the file, and never create one.
    with Store(args.db, read_only=args.action in _READ_ACTIONS) as store:
        return _ACTIONS[args.action](store, args)


_READ_ACTIONS = ("list", "show", "export")


def _list(store: Any, args: argparse.Namespace) -> int:
    sessions = store.list_sessions()
    if args.json:
        print_json({"sessions": [_session_dict(s) for s in sessions]})
        return 0
    if not sessions:
        sys.stdout.write("no sessions yet; import one with `cachescope sessions import FILE`\n")
    for s in sessions:
        size = f"{s.num_messages} messages" if s.kind == "chat" else f"{s.source_format} trace"
        sys.stdout.write(f"{s.id:>5}  {s.title[:40]:<40}  {size:<18} runs {s.num_runs:<3} {s.created[:19]}\n")
    return 0


def _session_dict(s: Any) -> dict[str, Any]:
    return {"id": s.id, "title": s.title, "kind": s.kind, "model": s.model, "block_size": s.block_size,
            "capacity_blocks": s.capacity_blocks, "seed": s.seed, "hash": s.hash, "created": s.created,
            "source_path": s.source_path, "source_format": s.source_format, "settings": s.settings,
            "num_messages": s.num_messages, "num_runs": s.num_runs}


def _show(store: Any, args: argparse.Namespace) -> int:
    info = store.get_session(args.session)
    messages = store.messages(info.id, include_history=args.history)
    runs = store.runs(info.id)
    num_trace = store.num_trace_requests(info.id)
    if args.json:
        print_json({"session": _session_dict(info),
                    "messages": [{"position": m.position, "version": m.version, "role": m.role, "content": m.content,
                                  "extra": m.extra, "created": m.created, "current": m.is_current} for m in messages],
                    "num_trace_requests": num_trace,
                    "runs": [{"id": r.id, "kind": r.kind, "created": r.created, "status": r.status,
                              "totals": r.totals} for r in runs]})
        return 0
    out = sys.stdout
    out.write(f"session {info.id}: {info.title} ({info.kind}, {info.source_format or 'created here'})\n")
    out.write(f"model {info.model or 'default'}  block size {info.block_size}  capacity {info.capacity_blocks} blocks"
              f"  seed {info.seed}  hash {info.hash}\n")
    for m in messages:
        mark = "" if m.is_current else " (old)"
        text = m.content.replace("\n", " ")
        out.write(f"[{m.position}] v{m.version}{mark} {m.role}: {text[:100]}{'...' if len(text) > 100 else ''}\n")
    if num_trace:
        out.write(f"{num_trace} trace requests\n")
    for r in runs:
        t = r.totals or {}
        out.write(f"run {r.id} {r.kind} {r.status} {r.created[:19]}  hit rate {t.get('hit_rate', 0):.1%}\n")
    return 0


def _import(store: Any, args: argparse.Namespace) -> int:
    from engine.store.sessions import import_file

    ids = import_file(store, args.file, args.format, title=args.title, model=args.model, block_size=args.block_size,
                      capacity_blocks=args.capacity_blocks, seed=args.seed, hash_name=args.hash)
    if args.json:
        print_json({"session_ids": ids})
    else:
        sys.stdout.write(f"imported {len(ids)} session{'s' if len(ids) != 1 else ''}: "
                         f"{', '.join(map(str, ids))}\n")
    return 0


def _export(store: Any, args: argparse.Namespace) -> int:
    from engine.store.sessions import export_session

    text = export_session(store, args.session, args.output, args.format)
    if args.output is None:
        sys.stdout.write(text)
    return 0


def _delete(store: Any, args: argparse.Namespace) -> int:
    store.delete_session(args.session)
    if args.json:
        print_json({"deleted": args.session})
    else:
        sys.stdout.write(f"deleted session {args.session}\n")
    return 0


def _edit(store: Any, args: argparse.Namespace) -> int:
    from engine.store.edit import edit_and_rerun

    result = edit_and_rerun(store, args.session, args.message, args.content, capacity_blocks=args.capacity_blocks,
                            generate=args.generate, max_new_tokens=args.max_new_tokens)
    if args.json:
        print_json(result.to_dict())
        return 0
    out = sys.stdout
    out.write(f"message {result.message} is now version {result.version}\n")
    if result.invalidated_from_block is None:
        out.write("no request changed\n")
        return 0
    out.write(f"invalidated from block {result.invalidated_from_block} (token {result.divergence_token})\n")
    out.write(f"cached tokens {result.cached_tokens_before} -> {result.cached_tokens_after}; "
              f"the edit costs {result.edit_cost_tokens} more computed tokens\n")
    for r in result.requests:
        out.write(f"  request {r.index} (after message {r.message_position}): cached {r.cached_tokens}"
                  f"/{r.prompt_tokens}, {r.miss_reason} at block {r.first_miss_block}"
                  f" (message {r.miss_message})\n")
    return 0


def _replay(store: Any, args: argparse.Namespace) -> int:
    from engine.store.sessions import replay_session

    result = replay_session(store, args.session, capacity_blocks=args.capacity_blocks,
                            concurrency=args.concurrency, persist=not args.no_record).to_dict(not args.totals_only)
    if args.json:
        print_json(result)
        return 0
    from app.commands.replay import print_human

    print_human(result)
    if result["config"].get("run_id") is not None:
        sys.stdout.write(f"recorded as run {result['config']['run_id']}\n")
    return 0


_ACTIONS = {"list": _list, "show": _show, "import": _import, "export": _export, "delete": _delete,
            "edit": _edit, "replay": _replay}
