"""`cachescope attach`: watch running vLLM servers' KV-cache event streams headless.

Prints one line per converted event (`--json`) or per batch, stream notices (refills,
missed batches, malformed frames, restarts), probe answers when they change, and a
summary per stream. The work is `engine.remote.Attachment`; this module only prints.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from typing import Any

from app.commands._common import positive_int, print_json
from engine.core.errors import InputError
from engine.core.hashing import VLLM_HASHES

NAME = "attach"
HELP = "subscribe to vLLM KV-cache events (--kv-events-config) and show the remote pool"


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds, 0 or more")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("endpoints", nargs="+", metavar="ENDPOINT",
                   help="the server's PUB endpoint, e.g. tcp://127.0.0.1:5557 (one pool each)")
    p.add_argument("--replay", action="append", default=[], metavar="ENDPOINT",
                   help="replay socket of each endpoint, in order (vLLM's replay_endpoint): fetches what the "
                        "server buffered before we joined and refills gaps")
    p.add_argument("--topic", default="", help="ZMQ topic (default: all)")
    p.add_argument("--bind", action="store_true",
                   help="bind the endpoint (e.g. tcp://*:5557) for a server configured with a concrete host, "
                        "which then connects to us")
    p.add_argument("--data-parallel-size", type=positive_int, default=1, metavar="N",
                   help="subscribe to ranks 0..N-1 (rank r adds r to both ports): one pool per rank")
    p.add_argument("--seconds", type=seconds, default=None, help="stop after this many seconds (default: until Ctrl-C)")
    p.add_argument("--max-batches", type=positive_int, default=None, metavar="N", help="stop after N batches in all")
    p.add_argument("--probe", metavar="FILE", default=None,
                   help="a prompt (.txt, messages JSON or token trace): report how much of it the server "
                        "holds each time that changes")
    p.add_argument("--model", metavar="M", default=None,
                   help="tokenizer for --probe (local HF folder, .gguf or hub id; default: the bundled model)")
    p.add_argument("--salt", default=None, metavar="S", help="cache_salt of the probed prompt")
    p.add_argument("--block-size", type=positive_int, default=None, metavar="N",
                   help="the server's block size for --probe (default: from its events, else 16)")
    p.add_argument("--hash", choices=VLLM_HASHES, default="vllm-sha256",
                   help="the server's prefix_caching_hash_algo for --probe (default vllm-sha256)")
    p.add_argument("--hash-seed", default=None, metavar="SEED",
                   help="the server's PYTHONHASHSEED, if it was started with one")
    p.add_argument("--record", action="store_true", help="keep the stream in the session store as a session")
    p.add_argument("--db", metavar="PATH", default=None, help="database for --record (default: the user's)")
    p.add_argument("--refill-timeout", type=seconds, default=2.0, metavar="S",
                   help="longest silence of the replay socket within an answer (default 2 s): a slow "
                        "answer is read whole, one cut short is asked again from the first batch missing")
    p.add_argument("--json", action="store_true", help="print one JSON line per event, then a summary line")


def _probe(args: argparse.Namespace) -> Any:
    if args.probe is None:
        if args.model is not None or args.salt is not None:
            raise InputError("--model and --salt apply to --probe; give --probe FILE")
        return None
    from engine.analysis.diff import load_request
    from engine.core.hashing import BlockHasher
    from engine.model.loader import load_tokenizer
    from engine.remote.probe import PromptProbe

    req = load_request(args.probe, load_tokenizer(args.model), args.salt)
    return PromptProbe(tuple(req.token_ids), BlockHasher(args.hash, hash_seed=args.hash_seed), req.salt,
                       args.block_size)


def run(args: argparse.Namespace) -> int:
    from engine.remote.attachment import AttachOptions, Attachment

    if args.refill_timeout == 0:
        raise InputError("--refill-timeout must be more than 0 seconds")
    options = AttachOptions(tuple(args.endpoints), tuple(args.replay), args.topic, args.data_parallel_size,
                            args.bind, args.refill_timeout)
    probe = _probe(args)
    out = sys.stdout
    done = threading.Event()
    state: dict[str, Any] = {"batches": 0, "probe": None}

    def show_probe(pools: list) -> None:
        if probe is None:
            return
        answer = probe.check(pools).to_dict()
        if answer != state["probe"]:
            state["probe"] = answer
            if args.json:
                print_json({"probe": answer})
            else:
                out.write(f"probe: {answer['cached_tokens']} of {answer['prompt_tokens']} tokens cached; "
                          f"first missing block {answer['first_missing_block']}: {answer['reason']}\n")

    def on_batch(pool, batch, events) -> None:
        if args.json:
            for e in events:
                print_json({"endpoint": pool.source, "event": e.to_dict()})
        else:
            out.write(f"{pool.source} seq {batch.seq}: {len(batch.events)} events, {pool.num_cached} blocks "
                      f"cached ({', '.join(f'{m} {pool.num_cached_in(m)}' for m in pool.tiers) or 'none'}), "
                      f"{pool.num_stored} stored, {pool.num_removed} removed\n")
        show_probe(att.pools)
        out.flush()
        if batch.events or not events:  # a restart's reset is not a batch
            state["batches"] += 1
        if args.max_batches is not None and state["batches"] >= args.max_batches:
            done.set()

    def on_notice(pool, kind, message) -> None:
        if args.json:
            print_json({"notice": {"endpoint": pool.source, "kind": kind, "message": message}})
        else:
            out.write(f"note: {message}\n")
        out.flush()

    att = Attachment(options, on_batch=on_batch, on_notice=on_notice)
    # An empty event listener keeps the bus active, so events are built for --json and --record.
    unsubscribe = att.events.subscribe(lambda e: None) if args.json else None
    recorder = None
    if args.record:
        from engine.analysis.remote_capture import Recorder

        recorder = Recorder(args.db, options).start(att.events)
    try:
        att.start()
        with att.lock:
            show_probe(att.pools)
        deadline = None if args.seconds is None else time.monotonic() + args.seconds
        while not done.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            done.wait(0.1 if left is None else min(left, 0.1))
    finally:
        att.stop()
        if unsubscribe is not None:
            unsubscribe()
    summary = _summary(att)
    if recorder is not None:
        block_size = next((p.block_size for p in att.pools if p.block_size), None)
        recorder.finish({"streams": summary}, block_size)
    if args.json:
        result: dict[str, Any] = {"summary": summary}
        if len(att.pools) > 1:
            result["combined"] = {"cached": att.combined.num_cached,
                                  "tiers": {m: att.combined.num_cached_in(m) for m in att.combined.mediums()}}
        if recorder is not None:
            result["recorded"] = {"session": recorder.session_id, "run": recorder.run_id, "events": recorder.num_events}
        print_json(result)
    else:
        for row in summary:
            out.write(" ".join(f"{k}={v}" for k, v in row.items() if k != "tiers") + "\n")
        if recorder is not None:
            out.write(f"recorded as session {recorder.session_id} ({recorder.num_events} events)\n")
    return 0


def _summary(att: Any) -> list[dict[str, Any]]:
    rows = []
    for pool, sub in zip(att.pools, att.subscribers):
        h = sub.health
        rows.append({"endpoint": pool.source, "rank": pool.rank, "batches": h.batches, "stored": pool.num_stored,
                     "removed": pool.num_removed, "cached": pool.num_cached,
                     "tiers": {m: pool.num_cached_in(m) for m in pool.tiers}, "refilled": h.refilled,
                     "gaps_refilled": h.refilled, "missed_batches": h.missed, "malformed": h.malformed,
                     "restarts": h.restarts, "last_seq": h.last_seq})
    return rows
