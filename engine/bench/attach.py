"""`cachescope bench attach`: recorded vLLM frames decoded into the remote pool, its memory, and a fleet.

The stream is written with `engine.remote.wire.encode_batch`, whose bytes equal vLLM
0.33's for every recorded fixture frame: steps of a few events, BlockStored runs of 1-8
blocks of 16 tokens with integer hashes, GPU evictions once the tier is full, and some
blocks offloaded to CPU. In one run, side by side: msgpack's own unpack of the frames (the
ceiling of any reader that makes Python objects), the reference reader
(`engine.remote.wire`) and the fast one (`engine.remote.fastwire`, what the subscriber
uses), each alone, into the pool, and through the app's path (the pool emitting
Cachescope events to a listener that does what the app's `EngineBridge` does per event:
one append under a lock). Then 64 loopback ZMQ streams (64 publisher threads in one child
process, bound on 127.0.0.1, bounded in time) at 2,500 events/s each into one
`Attachment`, with the longest stall of the consumer's event loop (`cachescope bench
attach` passes a Qt event loop, offscreen; alone, a Python loop on the main thread).
Figures and target ratios are printed side by side; nothing here asserts a speed.
"""

from __future__ import annotations

import gc
import multiprocessing
import random
import threading
import time
import tracemalloc
from collections import deque
from typing import Any, Callable

from engine.core.events import EventBus
from engine.remote import colpool, fastwire
from engine.remote.pool import RemotePool
from engine.remote.wire import VllmEvent, decode_batch, encode_batch

TARGET_POOL_EVENTS_PER_S = 1_000_000
TARGET_APP_EVENTS_PER_S = 500_000
TARGET_BYTES_PER_BLOCK = 100
TARGET_STALL_MS = 50
FLEET_STREAMS = 64
FLEET_EVENTS_PER_S = 2_500  # per stream
BLOCK_SIZE = 16

# An event loop for the fleet run: `loop(attachment, bus, seconds)` runs the consumer's
# loop for that long while the streams arrive and returns {"longest_stall_ms": ..., ...}.
EventLoop = Callable[[Any, EventBus, float], dict[str, Any]]
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


class BridgeLike:
    """What the app's EngineBridge does per event on the engine's thread: one append under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buffer: deque[Any] = deque()

    def __call__(self, event: Any) -> None:
        with self.lock:
            self.buffer.append(event)

    def drain(self) -> int:
        with self.lock:
            n = len(self.buffer)
            self.buffer.clear()
        return n


def memory_per_block(num_blocks: int, decode: Any = fastwire.decode_batch, pool_class: Any = RemotePool
                     ) -> dict[str, Any]:
    """Traced bytes of a pool holding `num_blocks` GPU blocks (tokens and hashes included;
    for the columnar pool, every array at its capacity)."""
    payloads, _, _ = recorded_stream(num_blocks // 4, gpu_blocks=num_blocks * 4, seed=1)  # no evictions
    gc.collect()
    tracemalloc.start()
    try:
        pool = pool_class("bench", max_removed=0)
        for seq, p in enumerate(payloads):
            pool.apply(decode(seq, p))
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    n = pool.num_cached
    out = {"blocks": n, "bytes": traced, "bytes_per_block": round(traced / n, 1)}
    if isinstance(pool, colpool.ColumnarPool):
        out["breakdown_bytes_per_block"] = columnar_breakdown(pool)
    return out


def columnar_breakdown(pool: colpool.ColumnarPool) -> dict[str, Any]:
    """Where a columnar pool's bytes go, per block held (every array at its capacity)."""
    n = max(pool.num_cached, 1)
    cap = len(pool.F)
    per = {"slots": cap, "slot_capacity_per_block": round(cap / n, 3),
           # a journalled pool's K has a row per store (its parent the store before's, or PX's)
           ("hash_K_key_per_store_uint64" if pool.journal else "hash_K_key_and_parent_uint64"): pool.K.nbytes / n,
           # a journalled pool's L is the batch row alone (its store row, SO, gives the rest)
           f"L_{'batch_row' if pool.journal else 'token_start_batch_row_order'}_{pool.L.dtype}": pool.L.nbytes / n,
           f"C_tokens_announced_removed_copies{'' if pool.journal else '_tenant'}_{pool.C.dtype}": pool.C.nbytes / n,
           "F_width_tier_parent_width_raw_medium_uint8": pool.F.nbytes / n,
           "table_uint32_at_load": round(pool.S[colpool.S_LIVE] / (len(pool.tab) - 1), 3),
           "table": pool.tab.nbytes / n,
           f"token_ids_{pool.tok.dtype}": pool.tok.nbytes / n,
           "token_ids_used_per_block": round(int(pool.S[colpool.S_TOKUSED]) / n, 2),
           "batch_table_seq_and_time": (pool.T.nbytes + pool.BSEQ.nbytes) / n,
           # one set of entries, table and values for both maps, a FIFO each (colpool._RemovalMaps)
           "removed_and_departed_maps": pool.maps.nbytes / n,
           # the journal's rows, each store's parent width (JS), the slots' stores (SO), the explicit
           # parents (PX) and the stores' runs of one token count and tenant (RX)
           "journal_rows_J_JS_SO_PX_RX": sum(a.nbytes for a in (pool.J, pool.JS, pool.SO, pool.PX, pool.RX)) / n,
           "all_arrays": pool.nbytes / n}
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in per.items()}


# ---- the fleet: 64 loopback streams -----------------------------------------------------

def _publish(payloads: list[bytes], num_streams: int, rate: float, events_per_batch: float, ports: Any,
             go: Any, sent: Any, done: Any) -> None:  # pragma: no cover - runs in the child process
    import zmq

    ctx = zmq.Context()
    counts = [0] * num_streams
    interval = events_per_batch / rate
    bound = threading.Barrier(num_streams + 1)

    def run(i: int) -> None:  # each socket lives on its own thread (ZMQ sockets are not thread-safe)
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.LINGER, 1000)
        ports.put((i, sock.bind_to_random_port("tcp://127.0.0.1")))
        bound.wait()
        go.wait(60)
        start = time.monotonic()
        for seq, payload in enumerate(payloads):
            wait = start + seq * interval - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            sock.send_multipart([b"", seq.to_bytes(8, "big", signed=True), payload])
            counts[i] += 1
        # Open until the consumer is done: a PUB closed under a lagging SUB cuts its last
        # message short, and libzmq 4.3.5's SUB asserts (fq.cpp: !_more) on that.
        done.wait(300)
        sock.close(linger=0)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(num_streams)]
    for t in threads:
        t.start()
    bound.wait()
    while any(t.is_alive() for t in threads) and sum(counts) < num_streams * len(payloads):
        time.sleep(0.05)
    sent.put(sum(counts))
    for t in threads:
        t.join()
    ctx.term()


def python_loop(attachment: Any, bus: EventBus, seconds: float) -> dict[str, Any]:
    """The consumer's loop without Qt: a 5 ms tick on the main thread draining the events."""
    sink = BridgeLike()
    bus.subscribe(sink)
    longest = 0.0
    drained = 0
    end = time.monotonic() + seconds
    last = time.monotonic()
    while last < end:
        time.sleep(0.005)
        drained += sink.drain()
        now = time.monotonic()
        longest = max(longest, now - last - 0.005)
        last = now
    return {"event_loop": "python main thread, 5 ms tick", "longest_stall_ms": round(longest * 1000, 1),
            "events_drained": drained}


def fleet_streams(num_streams: int = FLEET_STREAMS, rate: float = FLEET_EVENTS_PER_S, seconds: float = 10.0,
                  event_loop: EventLoop | None = None, columnar: bool = False) -> dict[str, Any]:
    """`num_streams` loopback publishers at `rate` vLLM events/s each for `seconds` into one
    Attachment (`columnar`: into columnar pools, which emit no event per block)."""
    from engine.remote.attachment import Attachment, AttachOptions

    payloads, made, _ = recorded_stream(int(rate * seconds), gpu_blocks=30_000, seed=3)
    per_batch = made / len(payloads)
    mp = multiprocessing.get_context("spawn")
    ports, sent, go, done = mp.Queue(), mp.Queue(), mp.Event(), mp.Event()
    child = mp.Process(target=_publish, args=(payloads, num_streams, rate, per_batch, ports, go, sent, done),
                       daemon=True)
    child.start()
    att = None
    try:
        bound = dict(ports.get(timeout=60) for _ in range(num_streams))
        endpoints = tuple(f"tcp://127.0.0.1:{bound[i]}" for i in range(num_streams))
        bus = EventBus()
        att = Attachment(AttachOptions(endpoints, columnar=columnar), events=bus).start()
        time.sleep(1.0)  # ZMQ's slow joiner: every SUB connected before the first batch
        go.set()
        loop = (event_loop or python_loop)(att, bus, seconds + 2.0)
        num_sent = sent.get(timeout=60)
        t0 = time.monotonic()  # what the consumer still had queued when the publishers were done
        while sum(h.batches + h.missed for h in att.health()) < num_sent and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        behind_s = round(time.monotonic() - t0, 2)
        health = att.health()
    finally:
        if att is not None:
            att.stop()
        done.set()
        child.join(10)
        if child.is_alive():
            child.terminate()
    received = sum(h.batches for h in health)
    missed = sum(h.missed for h in health)
    return {"streams": num_streams, "pools": "columnar" if columnar else "reference, emitting per block",
            "events_per_s_each": rate, "seconds": seconds, "batches_sent": num_sent,
            "batches_received": received, "missed_batches": missed,
            "malformed": sum(h.malformed for h in health), "events_sent": made * num_streams,
            "seconds_behind_after_the_last_send": behind_s,
            **loop}


def run_bench(quick: bool = False, event_loop: EventLoop | None = None) -> dict[str, Any]:
    import msgpack

    fastwire.warm_up()  # compiled or loaded from the disk cache; timed below when compiled
    num_events = 20_000 if quick else 200_000
    payloads, made, num_ops = recorded_stream(num_events, gpu_blocks=30_000)
    out: dict[str, Any] = {"stream": {"batches": len(payloads), "vllm_events": made, "block_operations": num_ops,
                                      "megabytes": round(sum(map(len, payloads)) / 1e6, 1)}}
    # The ceiling of any Python reader: msgpack's C unpacker alone, no checks, no pool.
    out["msgpack_unpack_only"] = _rate(payloads, made, lambda seq, p: msgpack.unpackb(p, raw=False,
                                                                                      strict_map_key=False))
    out["reference_decode_only"] = _rate(payloads, made, decode_batch)
    out["fast_decode_only"] = _rate(payloads, made, fastwire.decode_batch)
    for name, decode in (("reference", decode_batch), ("fast", fastwire.decode_batch)):
        pool = RemotePool("bench")
        r = out[f"{name}_into_pool"] = _rate(payloads, made, lambda seq, p: pool.apply(decode(seq, p)))
        r["block_operations_per_s_cpu"] = round(num_ops / max(r["cpu_s"], 1e-9))
        r["cached_blocks"] = pool.num_cached
        # The app's path: every block becomes a Cachescope event handed to the bridge.
        bus = EventBus()
        sink = BridgeLike()
        bus.subscribe(sink)
        listened = RemotePool("bench", events=bus)
        out[f"{name}_app_path"] = _rate(payloads, made, lambda seq, p: (listened.apply(decode(seq, p)), sink.drain()))
    # The columnar pool (engine.remote.colpool, compiled), fed by fastwire's columns, as an
    # attachment feeds it: each frame held as it arrives, and the held ones decoded and applied
    # many at once (every HOLD_FRAMES, the most a stream holds; it applies fewer at once
    # when its socket runs dry, never more). Then one frame at a time (the route before), and
    # decoding and applying each alone (the frames decoded beforehand).
    from engine.remote.attachment import HOLD_FRAMES

    colpool.warm_up()
    cpool = colpool.ColumnarPool("bench")
    held: list[Any] = []

    def attach_step(seq: int, p: bytes) -> None:
        held.append(p)
        if len(held) >= HOLD_FRAMES or seq == len(payloads) - 1:
            cpool.apply_many(fastwire.decode_columns_many(seq + 1 - len(held), held))
            held.clear()
    r = out["columnar_into_pool"] = _rate(payloads, made, attach_step)
    r["block_operations_per_s_cpu"] = round(num_ops / max(r["cpu_s"], 1e-9))
    r["cached_blocks"] = cpool.num_cached
    r["frames_applied_at_once"] = HOLD_FRAMES
    one = colpool.ColumnarPool("bench")
    r = out["columnar_into_pool_one_frame_at_a_time"] = _rate(
        payloads, made, lambda seq, p: one.apply(fastwire.decode_columns(seq, p)))
    r["cached_blocks"] = one.num_cached
    out["columns_decode_only"] = _rate(payloads, made, fastwire.decode_columns)
    out["columns_decode_runs_only"] = _rate(  # as the attach decodes: a run of HOLD_FRAMES at once
        list(range(0, len(payloads), HOLD_FRAMES)), made,
        lambda i, _i: fastwire.decode_columns_many(i * HOLD_FRAMES, payloads[i * HOLD_FRAMES:(i + 1) * HOLD_FRAMES]))
    # decoded beforehand as the attach decodes them (a run of HOLD_FRAMES at once, whose
    # arrays the pool applies from), so that apply alone times the attach's apply
    runs = [fastwire.decode_columns_many(i, payloads[i:i + HOLD_FRAMES]) for i in range(0, len(payloads), HOLD_FRAMES)]
    apool = colpool.ColumnarPool("bench")
    out["columnar_apply_only"] = _rate(list(range(len(runs))), made, lambda seq, _i: apool.apply_many(runs[seq]))
    del runs
    out["memory"] = memory_per_block(100_000 if quick else 1_000_000)
    out["columnar_memory"] = memory_per_block(100_000 if quick else 1_000_000, fastwire.decode_columns,
                                              colpool.ColumnarPool)
    out["fleet"] = fleet_streams(seconds=2.0 if quick else 5.0, event_loop=event_loop)
    out["fleet_columnar"] = fleet_streams(seconds=2.0 if quick else 5.0, event_loop=event_loop, columnar=True)
    ceiling = out["msgpack_unpack_only"]["events_per_s_cpu"]
    pool_rate = out["columnar_into_pool"]["events_per_s_cpu"]
    app_rate = out["fast_app_path"]["events_per_s_cpu"]
    per_block = out["columnar_memory"]["bytes_per_block"]
    fleet = out["fleet"]
    out["ratios"] = {
        "fast_decode_vs_msgpack_unpack_only": round(out["fast_decode_only"]["events_per_s_cpu"] / ceiling, 3),
        "reference_decode_vs_msgpack_unpack_only": round(out["reference_decode_only"]["events_per_s_cpu"] / ceiling, 3),
        "fast_vs_reference_decode": round(out["fast_decode_only"]["events_per_s_cpu"]
                                          / out["reference_decode_only"]["events_per_s_cpu"], 3),
        "fast_vs_reference_into_pool": round(out["fast_into_pool"]["events_per_s_cpu"]
                                             / out["reference_into_pool"]["events_per_s_cpu"], 3),
        "columnar_vs_fast_into_pool": round(pool_rate / out["fast_into_pool"]["events_per_s_cpu"], 3),
        "columnar_vs_reference_bytes_per_block": round(per_block / out["memory"]["bytes_per_block"], 3),
        "pool_vs_msgpack_unpack_only": round(pool_rate / ceiling, 3),
        "pool_vs_target": round(pool_rate / TARGET_POOL_EVENTS_PER_S, 3),
        "event_route_vs_target": round(app_rate / TARGET_APP_EVENTS_PER_S, 3),
        "bytes_per_block_vs_target": round(per_block / TARGET_BYTES_PER_BLOCK, 3),
        "fleet_received_vs_sent": round(fleet["batches_received"] / max(fleet["batches_sent"], 1), 3),
        "stall_vs_target": round(fleet["longest_stall_ms"] / TARGET_STALL_MS, 3),
    }
    out["note"] = ("events are vLLM events (a BlockStored carries 1-8 blocks of 16 tokens); rates use CPU time "
                   "because the machine may be shared; the wall figures are beside them. memory is the engine's "
                   "remote pool (the app's own pool state is bench gui's). The targets read the columnar pool "
                   "(engine.remote.colpool) into the pool (decoded per frame, applied 64 frames at a time as an "
                   "attachment's stream holds them) and for memory (columnar_memory.breakdown_bytes_per_block "
                   "says where a block's bytes go); fleet_columnar is the Attachment on columnar "
                   "pools (each stream holding its frames until its socket runs dry, 64 frames or 2 ms); "
                   "fast_app_path and the fleet run the reference pool emitting one event per block (the event "
                   "route); the app's own path, the journal route, is bench gui's attached and app_path")
    out["targets"] = {
        "events_per_s_into_pool": {"value": pool_rate, "target": TARGET_POOL_EVENTS_PER_S,
                                   "met": pool_rate >= TARGET_POOL_EVENTS_PER_S},
        # the event route an attach took before the journal (the app's path is bench gui's)
        "events_per_s_event_route_to_bridge": {"value": app_rate, "target": TARGET_APP_EVENTS_PER_S,
                                               "met": app_rate >= TARGET_APP_EVENTS_PER_S},
        "bytes_per_block": {"value": per_block, "target": TARGET_BYTES_PER_BLOCK,
                            "met": per_block <= TARGET_BYTES_PER_BLOCK},
        "fleet_missed_batches": {"value": fleet["missed_batches"], "target": 0,
                                 "met": fleet["missed_batches"] == 0
                                 and fleet["batches_received"] == fleet["batches_sent"]},
        "fleet_seconds_behind": {"value": fleet["seconds_behind_after_the_last_send"], "target": 1.0,
                                 "met": fleet["seconds_behind_after_the_last_send"] <= 1.0},
        "fleet_longest_stall_ms": {"value": fleet["longest_stall_ms"], "target": TARGET_STALL_MS,
                                   "met": fleet["longest_stall_ms"] < TARGET_STALL_MS},
        "fleet_columnar_missed_batches": {"value": out["fleet_columnar"]["missed_batches"], "target": 0,
                                          "met": out["fleet_columnar"]["missed_batches"] == 0
                                          and out["fleet_columnar"]["batches_received"]
                                          == out["fleet_columnar"]["batches_sent"]},
        "fleet_columnar_seconds_behind": {"value": out["fleet_columnar"]["seconds_behind_after_the_last_send"],
                                          "target": 1.0,
                                          "met": out["fleet_columnar"]["seconds_behind_after_the_last_send"] <= 1.0},
        "fleet_columnar_longest_stall_ms": {"value": out["fleet_columnar"]["longest_stall_ms"],
                                            "target": TARGET_STALL_MS,
                                            "met": out["fleet_columnar"]["longest_stall_ms"] < TARGET_STALL_MS},
    }
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run_bench(quick="--quick" in sys.argv), indent=1))
