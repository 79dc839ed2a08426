"""`cachescope bench attach`: recorded vLLM frames decoded into the remote pool, and its memory.

The stream is written with `engine.remote.wire.encode_batch`, whose bytes equal vLLM
0.33's for every recorded fixture frame: steps of a few events, BlockStored runs of 1-8
blocks of 16 tokens with integer hashes, GPU evictions once the tier is full, and some
blocks offloaded to CPU. Figures and target ratios are printed side by side; nothing here
asserts a speed.
"""

from __future__ import annotations

import gc
import random
import time
import tracemalloc
from typing import Any

from engine.core.events import EventBus
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, decode_batch, encode_batch

TARGET_EVENTS_PER_S = 500_000
TARGET_BYTES_PER_BLOCK = 300
BLOCK_SIZE = 16


def recorded_stream(num_events: int, gpu_blocks: int, seed: int = 0) -> tuple[list[bytes], int, int]:
    """Payloads of a server with `gpu_blocks` GPU blocks: (payloads, vLLM events, block operations)."""
    rng = random.Random(seed)
    cached: list[int] = []
    next_hash = 1 << 63  # above 2**63: the unsigned 64-bit hashes older readers got wrong
    payloads: list[bytes] = []
    num_ops = 0
    made = 0
    ts = 1_796_000_000.0
    while made < num_events:
        step: list[VllmEvent] = []
        for _ in range(rng.randint(4, 12)):
            k = rng.randint(1, 8)
            if len(cached) + k > gpu_blocks:
                victims = [cached.pop(rng.randrange(len(cached))) for _ in range(k)]
                step.append(VllmEvent("BlockRemoved", tuple(h.to_bytes(8, "big") for h in victims), medium="GPU"))
                num_ops += k
            parent = rng.choice(cached) if cached and rng.random() < 0.7 else None
            hashes = list(range(next_hash, next_hash + k))
            next_hash += k
            tokens = tuple(rng.randrange(49_152) for _ in range(k * BLOCK_SIZE))
            medium = "CPU" if rng.random() < 0.1 else "GPU"
            step.append(VllmEvent("BlockStored", tuple(h.to_bytes(8, "big") for h in hashes),
                                  parent.to_bytes(8, "big") if parent is not None else None, tokens, BLOCK_SIZE,
                                  medium=medium))
            if medium == "GPU":
                cached.extend(hashes)
            num_ops += k
        ts += 0.01
        payloads.append(encode_batch(ts, step, 0))
        made += len(step)
    return payloads, made, num_ops


def _rate(payloads: list[bytes], num_events: int, step: Any) -> dict[str, Any]:
    """Run `step(seq, payload)` over the stream; wall and CPU time (the machine may be shared)."""
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    for seq, p in enumerate(payloads):
        step(seq, p)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "events_per_s_wall": round(num_events / wall),
            "events_per_s_cpu": round(num_events / max(cpu, 1e-9))}


def memory_per_block(num_blocks: int) -> dict[str, Any]:
    """Traced bytes of a pool holding `num_blocks` GPU blocks (tokens and hashes included)."""
    payloads, _, _ = recorded_stream(num_blocks // 4, gpu_blocks=num_blocks * 4, seed=1)  # no evictions
    gc.collect()
    tracemalloc.start()
    try:
        pool = RemotePool("bench", max_removed=0)
        for seq, p in enumerate(payloads):
            pool.apply(decode_batch(seq, p))
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    n = pool.num_cached
    return {"blocks": n, "bytes": traced, "bytes_per_block": round(traced / n, 1)}


def run_bench(quick: bool = False) -> dict[str, Any]:
    import msgpack

    num_events = 20_000 if quick else 200_000
    payloads, made, num_ops = recorded_stream(num_events, gpu_blocks=30_000)
    out: dict[str, Any] = {"stream": {"batches": len(payloads), "vllm_events": made, "block_operations": num_ops,
                                      "megabytes": round(sum(map(len, payloads)) / 1e6, 1)}}
    # The ceiling of any Python reader: msgpack's C unpacker alone, no checks, no pool.
    out["msgpack_unpack_only"] = _rate(payloads, made, lambda seq, p: msgpack.unpackb(p, raw=False,
                                                                                      strict_map_key=False))
    out["decode_only"] = _rate(payloads, made, decode_batch)
    pool = RemotePool("bench")
    out["decode_into_pool"] = _rate(payloads, made, lambda seq, p: pool.apply(decode_batch(seq, p)))
    out["decode_into_pool"]["block_operations_per_s_cpu"] = round(num_ops / max(out["decode_into_pool"]["cpu_s"], 1e-9))
    out["decode_into_pool"]["cached_blocks"] = pool.num_cached
    # The same with a listener: every block becomes a Cachescope event (what the app and
    # --json/--record pay); the gap to the line above is the cost of that conversion.
    bus = EventBus()
    bus.subscribe(lambda e: None)
    listened = RemotePool("bench", events=bus)
    out["decode_into_pool_with_events"] = _rate(payloads, made, lambda seq, p: listened.apply(decode_batch(seq, p)))
    out["memory"] = memory_per_block(100_000 if quick else 1_000_000)
    rate = out["decode_into_pool"]["events_per_s_cpu"]
    ceiling = out["msgpack_unpack_only"]["events_per_s_cpu"]
    per_block = out["memory"]["bytes_per_block"]
    out["ratios"] = {"pool_vs_target": round(rate / TARGET_EVENTS_PER_S, 3),
                     "pool_vs_msgpack_unpack_only": round(rate / ceiling, 3),
                     "events_vs_pool": round(out["decode_into_pool_with_events"]["events_per_s_cpu"] / rate, 3),
                     "bytes_per_block_vs_target": round(per_block / TARGET_BYTES_PER_BLOCK, 3)}
    out["note"] = ("events are vLLM events (a BlockStored carries 1-8 blocks of 16 tokens); rates use CPU time "
                   "because the machine may be shared; the wall figures are beside them")
    out["targets"] = {
        "events_per_s": {"value": rate, "target": TARGET_EVENTS_PER_S, "met": rate >= TARGET_EVENTS_PER_S},
        "bytes_per_block": {"value": per_block, "target": TARGET_BYTES_PER_BLOCK,
                            "met": per_block <= TARGET_BYTES_PER_BLOCK},
    }
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run_bench(quick="--quick" in sys.argv), indent=1))
