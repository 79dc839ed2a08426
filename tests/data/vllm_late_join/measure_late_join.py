"""Measure a late `cachescope attach` against vLLM 0.33.0's own ZmqEventPublisher (by hand).

    python measure_late_join.py --vllm-python /path/to/env/bin/python --tree /path/to/cachescope \\
        [--timeouts 0.2 0.5 1 2 5 30] [--scenario late half] [--consumer fast slow]

`serve` (run with the vLLM interpreter) publishes the 300 recorded batches of
replay_answers.jsonl.xz through vLLM's real publisher: all before the attach ("late"), or
150 before and 150 as soon as the attach has printed its first line ("half"). The driver
runs `python -m app attach ... --json` from `--tree` (the project's venv, or --python),
reads its output to a file ("fast") or through a throttled pipe ("slow", 64 KiB per 50
ms, like a slow terminal), and prints one row per run: batches received, missed, refill
answers cut short, the pool's block count against vLLM's (256), and whether the pool
rebuilt from the printed events holds exactly vLLM's blocks.
"""

from __future__ import annotations

import argparse
import base64
import json
import lzma
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def recorded_payloads() -> tuple[dict, list[bytes]]:
    with lzma.open(HERE / "replay_answers.jsonl.xz", "rt") as f:
        rows = [json.loads(line) for line in f]
    payloads = [base64.b64decode(r["frames"][3]) for r in rows if r["kind"] == "replay" and r["start"] == 0]
    return rows[0], payloads[:-1]  # the end marker's payload is empty


def serve(args: argparse.Namespace) -> None:
    import msgspec
    from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher

    _meta, payloads = recorded_payloads()
    batches = [msgspec.msgpack.decode(p, type=KVEventBatch) for p in payloads]
    pub = ZmqEventPublisher(0, f"tcp://*:{args.port}", f"tcp://*:{args.replay_port}", topic="kv-events")

    def publish(part: list, total: int) -> None:
        t0 = time.monotonic()
        for b in part:
            pub.publish(b)
        while not pub._buffer or pub._buffer[-1][0] != total - 1:  # its own record of what went out
            if time.monotonic() - t0 > 30:
                raise SystemExit("the publisher did not send its batches in 30 s")
            time.sleep(0.005)

    publish(batches[:args.before], args.before)
    print("ready", flush=True)
    if sys.stdin.readline().strip() == "go":
        publish(batches[args.before:], len(batches))
        print("published", flush=True)
    sys.stdin.read()  # hold the sockets until the driver is done
    pub.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(args: argparse.Namespace, tree: Path, scenario: str, consumer: str, timeout: float) -> dict:
    port, replay_port = free_port(), free_port()
    before = 300 if scenario == "late" else 150
    server = subprocess.Popen([args.vllm_python, __file__, "serve", "--port", str(port), "--replay-port",
                               str(replay_port), "--before", str(before)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        seconds = max(10.0, timeout + 10)
        cmd = [args.python, "-m", "app", "attach", f"tcp://127.0.0.1:{port}", "--replay",
               f"tcp://127.0.0.1:{replay_port}", "--topic", "kv-events", "--json", "--refill-timeout", str(timeout),
               "--max-batches", "300", "--seconds", str(seconds)]
        env = dict(os.environ, PYTHONPATH=str(tree))
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out = bytearray()
        told = scenario == "late"
        while True:
            chunk = proc.stdout.read1(65536)
            if not chunk:
                break
            out += chunk
            if not told:
                server.stdin.write("go\n")
                server.stdin.flush()
                told = True
            if consumer == "slow":
                time.sleep(0.05)
        proc.wait(timeout=120)
        elapsed = time.monotonic() - t0
        if not told:
            server.stdin.write("\n")
        lines = [json.loads(x) for x in out.decode().splitlines() if x.strip()]
        summary = lines[-1]["summary"][0]
        notices = [x["notice"]["kind"] for x in lines if "notice" in x]
        pool: set[str] = set()  # the pool rebuilt from the printed events
        for e in (x["event"] for x in lines if "event" in x):
            if e["kind"] == "block_stored":
                pool.add(e["block_hash"])
            elif e["kind"] == "block_evicted":
                pool.discard(e["block_hash"])
            elif e["kind"] == "cache_reset":
                pool.clear()
        vllm_pool = {f"{h:016x}" for h in args.meta["cached_after"]["300"]}
        return {"scenario": scenario, "consumer": consumer, "refill_timeout": timeout,
                "batches": summary["batches"], "missed": summary["missed_batches"], "cached": summary["cached"],
                "same_blocks_as_vllm": pool == vllm_pool,
                "cut_short": notices.count("refill_timeout"), "seconds": round(elapsed, 1)}
    finally:
        try:
            server.stdin.close()
        except OSError:
            pass
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--replay-port", type=int, required=True)
    s.add_argument("--before", type=int, required=True)
    parser.add_argument("--vllm-python", default=sys.executable)
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the tree's app")
    parser.add_argument("--tree", type=Path, action="append", default=[])
    parser.add_argument("--timeouts", type=float, nargs="+", default=[0.2, 0.5, 1, 2, 5, 30])
    parser.add_argument("--scenario", nargs="+", default=["late", "half"])
    parser.add_argument("--consumer", nargs="+", default=["fast", "slow"])
    args = parser.parse_args()
    if args.command == "serve":
        serve(args)
        return
    meta, _ = recorded_payloads()
    args.meta = meta
    print(json.dumps({"vllm_pool_blocks": len(meta["cached_after"]["300"])}), flush=True)
    for tree in args.tree:
        for scenario in args.scenario:
            for consumer in args.consumer:
                for timeout in args.timeouts:
                    row = one_run(args, tree, scenario, consumer, timeout)
                    print(json.dumps({"tree": str(tree), **row}), flush=True)


if __name__ == "__main__":
    main()
