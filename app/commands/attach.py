"""`cachescope attach`: watch running vLLM and SGLang servers' KV-cache event streams headless.

Prints one line per converted event (`--json`) or per batch, stream notices (refills,
missed batches, malformed frames, restarts), probe answers when they change (with several
servers, the router's view: a score per server and the one it picks), and a summary per
stream. The work is `engine.remote.Attachment` and `engine.remote.fleet`; this module only
prints, through one writer, so every line is whole and the summary comes last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from app.commands._common import positive_int
from engine.core.errors import InputError
from engine.core.hashing import SERVER_HASHES

NAME = "attach"
HELP = "subscribe to vLLM or SGLang KV-cache events (--kv-events-config) and show the remote pools"


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds, 0 or more")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("endpoints", nargs="*", metavar="ENDPOINT",
                   help="a server's PUB endpoint, e.g. tcp://127.0.0.1:5557, or an SGLang server's http://HOST:PORT "
                        "(its /server_info names the endpoints); several: one server each")
    p.add_argument("--servers", metavar="FILE", default=None,
                   help="a fleet: one 'name endpoint [replay]' per line (# comments), added to ENDPOINTs")
    p.add_argument("--replay", action="append", default=[], metavar="ENDPOINT",
                   help="replay socket of each tcp ENDPOINT, in order (vLLM's replay_endpoint): fetches what the "
                        "server buffered before we joined and refills gaps")
    p.add_argument("--topic", default=None,
                   help="ZMQ topic, matched exactly (default: all; with --bind every kv@<pod>@<model> topic is a "
                        "server of its own)")
    p.add_argument("--bind", action="store_true",
                   help="bind the endpoint (e.g. tcp://*:5557) for servers that connect to us: a vLLM server "
                        "configured with a concrete host, or llm-d's centralized mode (many pods, one endpoint)")
    p.add_argument("--data-parallel-size", type=positive_int, default=1, metavar="N",
                   help="subscribe to ranks 0..N-1 (rank r adds r to both ports): one pool per rank")
    p.add_argument("--seconds", type=seconds, default=None, help="stop after this many seconds (default: until Ctrl-C)")
    p.add_argument("--max-batches", type=positive_int, default=None, metavar="N", help="stop after N batches in all")
    p.add_argument("--probe", metavar="FILE", default=None,
                   help="a prompt (.txt, messages JSON or token trace): report how much of it the servers "
                        "hold each time that changes, and with several servers which one a KV-aware router picks")
    p.add_argument("--model", metavar="M", default=None,
                   help="tokenizer for --probe (local HF folder, .gguf or hub id; default: the bundled model)")
    p.add_argument("--salt", default=None, metavar="S", help="cache_salt of the probed prompt")
    p.add_argument("--block-size", type=positive_int, default=None, metavar="N",
                   help="the server's block size for --probe (default: from /server_info or its events, else 16)")
    p.add_argument("--hash", choices=SERVER_HASHES, default="vllm-sha256",
                   help="the server's hash for --probe: vLLM's prefix_caching_hash_algo (default vllm-sha256) "
                        "or sglang-sha256")
    p.add_argument("--hash-seed", default=None, metavar="SEED",
                   help="the server's PYTHONHASHSEED, if it was started with one (vllm-* hashes)")
    p.add_argument("--weights", default=None, metavar="TIER=W,...",
                   help="tier weights of the router's score (llm-d: GPU=1,CPU=0.8; other tiers other=0.5)")
    p.add_argument("--record", action="store_true", help="keep the stream in the session store as a session")
    p.add_argument("--db", metavar="PATH", default=None, help="database for --record (default: the user's)")
    p.add_argument("--refill-timeout", type=seconds, default=2.0, metavar="S",
                   help="longest silence of the replay socket within an answer (default 2 s): a slow "
                        "answer is read whole, one cut short is asked again from the first batch missing")
    p.add_argument("--json", action="store_true", help="print one JSON line per event, then a summary line")


@dataclass(slots=True)
class Targets:
    """What to subscribe to, from ENDPOINTs, --servers and SGLang's /server_info."""

    endpoints: list[str] = field(default_factory=list)
    replays: list[str] = field(default_factory=list)  # "" where an endpoint has none
    servers: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    topic: str | None = None
    block_size: int | None = None
    listed: bool = False  # ranks listed one by one (an http server or a servers file)

    def add(self, endpoint: str, replay: str, server: str, rank: int) -> None:
        self.endpoints.append(endpoint)
        self.replays.append(replay)
        self.servers.append(server)
        self.ranks.append(rank)


def _targets(args: argparse.Namespace) -> Targets:
    from engine.remote.discovery import fetch_server_info, read_servers
    from engine.remote.subscriber import endpoint_for_rank

    t = Targets()
    if not args.endpoints and args.servers is None:
        raise InputError("give an ENDPOINT (tcp://HOST:PORT or http://HOST:PORT) or --servers FILE")
    urls = [e for e in args.endpoints if e.startswith(("http://", "https://"))]
    if len(args.replay) > len(args.endpoints) - len(urls):
        raise InputError("give at most one --replay per tcp ENDPOINT")
    if (urls or args.servers) and args.bind:
        raise InputError("--bind takes tcp endpoints only: http servers and --servers files are connected to")
    dp = args.data_parallel_size
    t.listed = bool(urls or args.servers)
    num_tcp = 0
    for entry in args.endpoints:  # in the order given
        if entry.startswith(("http://", "https://")):
            described = fetch_server_info(entry)
            if t.topic is None:
                t.topic = described.topic
            t.block_size = t.block_size or described.block_size
            for ep in described.endpoints:
                t.add(ep.endpoint, ep.replay_endpoint or "", ep.server, ep.rank)
            continue
        replay = args.replay[num_tcp] if num_tcp < len(args.replay) else ""
        num_tcp += 1
        if not t.listed:
            t.add(entry, replay, entry, 0)
            continue
        for r in range(dp):
            t.add(endpoint_for_rank(entry, r), endpoint_for_rank(replay, r) if replay else "", entry, r)
    if args.servers is not None:
        for ep in read_servers(args.servers):
            for r in range(dp):
                t.add(endpoint_for_rank(ep.endpoint, r),
                      endpoint_for_rank(ep.replay_endpoint, r) if ep.replay_endpoint else "", ep.server, r)
    if len(set(zip(t.servers, t.ranks))) < len(t.servers):
        raise InputError("a server is named twice: give each endpoint its own name")
    return t


def _options(args: argparse.Namespace, t: Targets) -> Any:
    from engine.remote.attachment import AttachOptions

    topic = args.topic if args.topic is not None else (t.topic or "")
    while t.replays and t.replays[-1] == "":
        t.replays.pop()
    if t.listed:
        return AttachOptions(tuple(t.endpoints), tuple(t.replays), topic, 1, args.bind, args.refill_timeout,
                             servers=tuple(t.servers), ranks=tuple(t.ranks))
    return AttachOptions(tuple(t.endpoints), tuple(t.replays), topic, args.data_parallel_size, args.bind,
                         args.refill_timeout)


def _probe(args: argparse.Namespace, block_size: int | None) -> Any:
    if args.probe is None:
        if args.model is not None or args.salt is not None or args.weights is not None:
            raise InputError("--model, --salt and --weights apply to --probe; give --probe FILE")
        return None
    if args.hash_seed is not None and not args.hash.startswith("vllm-"):
        raise InputError("--hash-seed applies to the vllm-sha256 and vllm-sha256-cbor hashes")
    from engine.analysis.diff import load_request
    from engine.core.hashing import BlockHasher
    from engine.model.loader import load_tokenizer
    from engine.remote.probe import PromptProbe

    req = load_request(args.probe, load_tokenizer(args.model), args.salt)
    return PromptProbe(tuple(req.token_ids), BlockHasher(args.hash, hash_seed=args.hash_seed), req.salt,
                       args.block_size or block_size)


class Output:
    """The one writer of stdout: each line is serialized whole before any of it is written
    (NaN or infinity refused, never half a line), lines from subscriber threads never
    interleave, and once `close` has written the summary nothing else is written."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._closed = False
        self.num_refused = 0

    def json(self, obj: Any) -> None:
        try:
            line = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (ValueError, TypeError, RecursionError) as exc:
            self.num_refused += 1
            line = json.dumps({"notice": {"kind": "error", "message": f"a line was not JSON ({type(exc).__name__})"}})
        self.text(line + "\n")

    def text(self, text: str) -> None:
        with self._lock:
            if self._closed:
                return
            self._out.write(text)
            self._out.flush()

    def close(self, last: str) -> None:
        with self._lock:
            if not self._closed:
                self._out.write(last)
                self._out.flush()
            self._closed = True


def run(args: argparse.Namespace) -> int:
    from engine.remote.attachment import Attachment
    from engine.remote.fleet import TierWeights

    if args.refill_timeout == 0:
        raise InputError("--refill-timeout must be more than 0 seconds")
    try:
        weights = TierWeights.parse(args.weights) if args.weights is not None else TierWeights()
    except ValueError as exc:
        raise InputError(f"--weights: {exc}") from None
    targets = _targets(args)
    options = _options(args, targets)
    probe = _probe(args, targets.block_size)
    out = Output(sys.stdout)
    done = threading.Event()
    state: dict[str, Any] = {"batches": 0, "probe": None}

    def show_probe() -> None:
        if probe is None:
            return
        answer: dict[str, Any] = {"probe": probe.check(att.pools).to_dict()}
        fleet = att.fleet()
        if len(fleet) > 1:
            bs = probe.block_size_of(att.pools)
            answer.update(fleet.route(probe.keys(bs), bs, weights).to_dict())
        if answer == state["probe"]:
            return
        state["probe"] = answer
        if args.json:
            out.json(answer)
            return
        p = answer["probe"]
        line = (f"probe: {p['cached_tokens']} of {p['prompt_tokens']} tokens cached; first missing block "
                f"{p['first_missing_block']}: {p['reason']}\n")
        if "servers" in answer:
            line += "".join(f"  {s['server']}: {s['matched_blocks']} block(s), {s['cached_tokens']} tokens, "
                            f"score {s['score']:g}, overlap {s['overlap_blocks']}\n" for s in answer["servers"])
            line += f"  best server: {answer['best_server'] or 'none (no server holds block 0)'}\n"
        out.text(line)

    def on_batch(pool, batch, events) -> None:
        if args.json:
            for e in events:
                out.json({"endpoint": pool.source, "server": pool.server or pool.source, "event": e.to_dict()})
        else:
            out.text(f"{pool.source} seq {batch.seq}: {len(batch.events)} events, {pool.num_cached} blocks cached "
                     f"({', '.join(f'{m} {pool.num_cached_in(m)}' for m in pool.mediums()) or 'none'}), "
                     f"{pool.num_stored} stored, {pool.num_removed} removed\n")
        show_probe()
        if batch.events or not events:  # a restart's reset is not a batch
            state["batches"] += 1
        if args.max_batches is not None and state["batches"] >= args.max_batches:
            done.set()

    def on_notice(pool, kind, message) -> None:
        if args.json:
            out.json({"notice": {"endpoint": pool.source, "kind": kind, "message": message}})
        else:
            out.text(f"note: {message}\n")

    att = Attachment(options, on_batch=on_batch, on_notice=on_notice)
    # An empty event listener keeps the bus active, so events are built for --json.
    unsubscribe = att.events.subscribe(lambda e: None) if args.json else None
    recorder = None
    if args.record:
        from engine.analysis.remote_capture import Recorder

        recorder = Recorder(args.db, options).start(att)  # the frames as the servers send them
    try:
        att.start()
        with att.lock:
            show_probe()
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
    with att.lock:  # a subscriber thread still in on_batch finishes its lines first
        summary = _summary(att)
        fleet = att.fleet()
        servers = [s.to_dict() for s in fleet.summaries()] if len(fleet) > 1 else None
        num_shared = len(fleet.shared_blocks()) if servers else 0
        combined = {"cached": att.combined.num_cached,
                    "tiers": {m: att.combined.num_cached_in(m) for m in att.combined.mediums()}}
        many = len(att.pools) > 1
    if recorder is not None:
        block_size = next((p.block_size for p in att.pools if p.block_size), None)
        recorder.finish({"streams": summary}, block_size)
    if args.json:
        result: dict[str, Any] = {"summary": summary}
        if many:
            result["combined"] = combined
        if servers is not None:
            result["servers"] = servers
            result["shared_blocks"] = num_shared
        if recorder is not None:
            result["recorded"] = {"session": recorder.session_id, "run": recorder.run_id, "frames": recorder.num_frames}
        try:
            last = json.dumps(result, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
        except ValueError:
            last = json.dumps({"summary": "not JSON"}) + "\n"
        out.close(last)
    else:
        lines = [" ".join(f"{k}={v}" for k, v in row.items() if k not in ("tiers", "media", "no_token_ids", "hits",
                                                                          "unknown_events", "tenants", "groups"))
                 + (f" tiers={','.join(f'{t}:{n}' for t, n in row['tiers'].items())}" if row["tiers"] else "")
                 for row in summary]
        if servers is not None:
            lines.append(f"{len(servers)} servers; {num_shared} block(s) held by more than one")
        if recorder is not None:
            lines.append(f"recorded as session {recorder.session_id} ({recorder.num_frames:,} batches)")
        out.close("".join(line + "\n" for line in lines))
    return 0


def _summary(att: Any) -> list[dict[str, Any]]:
    rows = []
    for pool, sub in zip(att.pools, att.subscribers):
        h = sub.health
        tiers = pool.mediums()
        rows.append({"endpoint": pool.source, "server": pool.server or pool.source, "rank": pool.rank,
                     "batches": h.batches, "stored": pool.num_stored, "removed": pool.num_removed,
                     "cached": pool.num_cached, "tiers": {m: pool.num_cached_in(m) for m in tiers},
                     "media": {m: dict(pool.media.get(m, {})) for m in tiers},
                     "no_token_ids": {m: n for m in tiers if (n := pool.num_without_tokens(m))},
                     "hits": {str(k) if k is not None else "": v for k, v in pool.hits_by_session.items()},
                     "tenants": sorted(pool.tenants), "groups": [g.to_dict() for g in pool.groups.values()],
                     "unknown_events": dict(pool.num_unknown_events),
                     "refilled": h.refilled, "gaps_refilled": h.refilled, "missed_batches": h.missed,
                     "malformed": h.malformed, "restarts": h.restarts, "last_seq": h.last_seq,
                     "other_topics": sub.num_other_topics})
    return rows
