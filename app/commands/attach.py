"""`cachescope attach`: watch one or more running vLLM servers' KV-cache event streams."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from app.commands._common import print_json
from engine.core.errors import InputError
from engine.core.events import EventBus
from engine.remote.vllm_events import RemotePool, VllmSubscriber

NAME = "attach"
HELP = "subscribe to vLLM KV-cache events (--kv-events-config) and show the remote pool"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("endpoints", nargs="+", metavar="ENDPOINT", help="e.g. tcp://127.0.0.1:5557 (one pool each)")
    p.add_argument("--replay", action="append", default=[], metavar="ENDPOINT",
                   help="replay socket for each endpoint, in order (vLLM's replay_endpoint), to refill gaps")
    p.add_argument("--topic", default="", help="ZMQ topic (default: all)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this many seconds (default: until Ctrl-C)")
    p.add_argument("--max-batches", type=int, default=None, help="stop after this many batches in all")
    p.add_argument("--json", action="store_true", help="print one JSON line per event, then a summary line")


def run(args: argparse.Namespace) -> int:
    if len(args.replay) > len(args.endpoints):
        raise InputError("give at most one --replay endpoint per event endpoint")
    lock = threading.RLock()  # on_batch holds it while the bus calls emit_line
    done = threading.Event()
    pools: list[RemotePool] = []
    subs: list[VllmSubscriber] = []
    num_batches = [0]
    for i, endpoint in enumerate(args.endpoints):
        bus = EventBus()
        pool = RemotePool(bus, endpoint)
        pools.append(pool)

        def emit_line(event, endpoint=endpoint):
            if args.json:
                with lock:
                    sys.stdout.write(json.dumps({"endpoint": endpoint, "event": event.to_dict()}) + "\n")

        bus.subscribe(emit_line)

        def on_batch(batch, pool=pool):
            with lock:
                pool.apply(batch)
                num_batches[0] += 1
                if not args.json:
                    sys.stdout.write(f"{pool.endpoint} seq {batch.seq}: {len(batch.events)} events, "
                                     f"{len(pool.cached)} blocks cached, {pool.num_stored} stored, "
                                     f"{pool.num_removed} removed\n")
                sys.stdout.flush()
                if args.max_batches is not None and num_batches[0] >= args.max_batches:
                    done.set()

        replay = args.replay[i] if i < len(args.replay) else None
        subs.append(VllmSubscriber(endpoint, on_batch, replay, args.topic,
                                   on_error=lambda exc: sys.stderr.write(f"cachescope: warning: {exc}\n")))
    for sub in subs:
        sub.start()
    deadline = None if args.seconds is None else time.monotonic() + args.seconds
    try:
        while not done.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            done.wait(0.1)
    finally:
        for sub in subs:
            sub.stop()
    summary = [{"endpoint": p.endpoint, "batches": p.num_batches, "stored": p.num_stored, "removed": p.num_removed,
                "cached": len(p.cached), "gaps_refilled": s.num_gaps_refilled, "missed_batches": s.num_missed}
               for p, s in zip(pools, subs)]
    if args.json:
        print_json({"summary": summary})
    else:
        for row in summary:
            sys.stdout.write(" ".join(f"{k}={v}" for k, v in row.items()) + "\n")
    return 0
