"""Record what vLLM 0.33.0's own ZmqEventPublisher answers a late replay request.

Run by hand in an environment where vLLM imports (never in CI, never in the project's venv):

    python tests/data/vllm_late_join/record_replay.py [--out tests/data/vllm_late_join]

It starts `vllm.distributed.kv_events.ZmqEventPublisher` on loopback (replay endpoint on),
publishes 300 `KVEventBatch`es of BlockStored/BlockRemoved events from a small LRU prefix
cache (hashes from vLLM's own `hash_block_tokens` with `sha256`), then asks its ROUTER from
seq 0 and from seq 150 with a DEALER and writes the frames exactly as they came, and 20
later batches as its PUB socket sent them, to `replay_answers.jsonl.xz` (see README.md).
"""

from __future__ import annotations

import argparse
import base64
import json
import lzma
import random
import socket
import time
from collections import OrderedDict
from pathlib import Path

import zmq

import vllm
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash, maybe_convert_block_hash

NUM_BUFFERED = 300
NUM_LIVE = 20
MIDDLE = 150
BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 256
TOPIC = "kv-events"
VOCAB = 151_000
SEED = 17


class LruPrefixCache:
    """Just enough of vLLM's prefix cache to make its events: full blocks keyed by hash, the
    least recently used one evicted when the pool is full (one BlockRemoved per block, as
    vLLM's BlockPool emits them), a request's new full blocks in one BlockStored."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.blocks: OrderedDict[bytes, None] = OrderedDict()

    def admit(self, tokens: list[int], session_id: str) -> list:
        events = []
        parent = None
        new_hashes, new_tokens, stored_parent = [], [], None
        for i in range(len(tokens) // BLOCK_SIZE):
            block = tokens[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]
            h = hash_block_tokens(sha256, parent, block)
            if h in self.blocks:
                self.blocks.move_to_end(h)  # a prefix hit
            else:
                if len(self.blocks) >= self.num_blocks:
                    evicted, _ = self.blocks.popitem(last=False)
                    events.append(BlockRemoved(block_hashes=[maybe_convert_block_hash(evicted)], medium="GPU",
                                               group_idx=0))
                if not new_hashes:
                    stored_parent = None if parent is None else maybe_convert_block_hash(parent)
                self.blocks[h] = None
                new_hashes.append(maybe_convert_block_hash(h))
                new_tokens.extend(block)
            parent = h
        if new_hashes:
            events.append(BlockStored(block_hashes=new_hashes, parent_block_hash=stored_parent, token_ids=new_tokens,
                                      block_size=BLOCK_SIZE, lora_id=None, medium="GPU", lora_name=None,
                                      group_idx=0, kv_cache_spec_kind="full_attention", session_id=session_id))
        return events

    def cached(self) -> list[int]:
        return sorted(maybe_convert_block_hash(h) for h in self.blocks)


def workload(n: int, cache: LruPrefixCache, rng: random.Random) -> list[list]:
    """`n` scheduler steps: each admits one or two chats that share one of four system
    prompts (8 blocks) and a per-session history, plus a fresh tail."""
    systems = [[rng.randrange(VOCAB) for _ in range(8 * BLOCK_SIZE)] for _ in range(4)]
    histories: dict[str, list[int]] = {}
    steps = []
    for _ in range(n):
        events = []
        for _ in range(rng.choice((1, 1, 2))):
            session = f"sess-{rng.randrange(40)}"
            history = histories.setdefault(session, list(systems[rng.randrange(4)]))
            history.extend(rng.randrange(VOCAB) for _ in range(rng.randrange(4, 16) * BLOCK_SIZE))
            if len(history) > 48 * BLOCK_SIZE:  # a chat that ran too long starts over
                history[:] = systems[rng.randrange(4)] + history[-10 * BLOCK_SIZE:]
            events.extend(cache.admit(history, session))
        steps.append(events)
    return steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ask(ctx: zmq.Context, endpoint: str, start: int) -> tuple[list[list[bytes]], float]:
    """The ROUTER's whole answer to `[b"", start]`, as a DEALER receives it, and its duration."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    t0 = time.monotonic()
    dealer.send_multipart((b"", start.to_bytes(8, "big")))
    frames = []
    deadline = t0 + 60
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not dealer.poll(int(left * 1000) + 1):
                raise SystemExit(f"no end marker from {endpoint} within 60 s ({len(frames)} frames)")
            msg = dealer.recv_multipart()
            frames.append(msg)
            if msg[2] == ZmqEventPublisher.END_SEQ:
                return frames, time.monotonic() - t0
    finally:
        dealer.close(linger=0)


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def b64(frames: list[bytes]) -> list[str]:
    return [base64.b64encode(f).decode() for f in frames]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()
    init_none_hash(sha256)
    rng = random.Random(SEED)
    cache = LruPrefixCache(NUM_GPU_BLOCKS)
    steps = workload(NUM_BUFFERED + NUM_LIVE, cache, rng)

    port, replay_port = free_port(), free_port()
    pub = ZmqEventPublisher(0, f"tcp://*:{port}", f"tcp://*:{replay_port}", topic=TOPIC)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.connect(f"tcp://127.0.0.1:{port}")
    time.sleep(0.5)  # PUB/SUB's slow join; every live frame is checked below, so a miss fails loudly
    replay = f"tcp://127.0.0.1:{replay_port}"
    try:
        # The buffered batches, published at the server's own pace, none read yet.
        for events in steps[:NUM_BUFFERED]:
            pub.publish(KVEventBatch(ts=time.time(), events=events))
        wait_until(lambda: len(pub._buffer) == NUM_BUFFERED, 30, "the buffered batches")
        answers = {}
        for start in (0, MIDDLE):
            frames, seconds = ask(ctx, replay, start)
            answers[start] = (frames, seconds)
        for events in steps[NUM_BUFFERED:]:
            pub.publish(KVEventBatch(ts=time.time(), events=events))
        wait_until(lambda: len(pub._buffer) == NUM_BUFFERED + NUM_LIVE, 30, "the live batches")
        live = []
        while sub.poll(2000) and len(live) < NUM_BUFFERED + NUM_LIVE:
            live.append(sub.recv_multipart())
        sockopts = {"pub": {"SNDHWM": pub._pub.getsockopt(zmq.SNDHWM), "RCVHWM": pub._pub.getsockopt(zmq.RCVHWM)},
                    "router": {"SNDHWM": pub._replay.getsockopt(zmq.SNDHWM),
                               "RCVHWM": pub._replay.getsockopt(zmq.RCVHWM)}}
        config = pub.get_publisher_config()
    finally:
        pub.shutdown()
        sub.close(linger=0)

    # What vLLM sent on PUB is the same payload its replay buffer keeps.
    assert len(live) == NUM_BUFFERED + NUM_LIVE, f"the SUB got {len(live)} live frames"
    replayed = {int.from_bytes(f[2], "big"): f[3] for f in answers[0][0][:-1]}
    assert sorted(replayed) == list(range(NUM_BUFFERED))
    for topic, seq, payload in live[:NUM_BUFFERED]:
        assert topic == TOPIC.encode() and replayed[int.from_bytes(seq, "big")] == payload
    assert answers[MIDDLE][0] == [f for f in answers[0][0] if f[2] == ZmqEventPublisher.END_SEQ
                                  or int.from_bytes(f[2], "big") >= MIDDLE]

    # The server's pool after n batches: the same workload again on a fresh cache.
    cached_after = {}
    for n in (MIDDLE, NUM_BUFFERED, NUM_BUFFERED + NUM_LIVE):
        pool = LruPrefixCache(NUM_GPU_BLOCKS)
        workload(n, pool, random.Random(SEED))
        cached_after[n] = pool.cached()
    payload_bytes = sum(len(p) for p in replayed.values())
    meta = {
        "kind": "meta", "vllm": vllm.__version__, "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
        "topic": TOPIC, "buffer_steps": config.buffer_steps, "hwm": config.hwm, "sockopts": sockopts,
        "num_buffered": NUM_BUFFERED, "num_live": NUM_LIVE, "middle": MIDDLE, "payload_bytes": payload_bytes,
        "answer_seconds": {str(k): round(v[1], 4) for k, v in answers.items()},
        "block_size": BLOCK_SIZE, "num_gpu_blocks": NUM_GPU_BLOCKS,
        "cached_after": {str(n): hashes for n, hashes in cached_after.items()},
    }
    out = args.out / "replay_answers.jsonl.xz"
    # xz, not gzip: its window spans the whole file, so the answer from the middle (the
    # tail of the one from 0) and re-stored blocks cost almost nothing.
    with lzma.open(out, "wt", preset=9 | lzma.PRESET_EXTREME) as f:
        f.write(json.dumps(meta) + "\n")
        for start in (0, MIDDLE):
            for frames in answers[start][0]:
                f.write(json.dumps({"kind": "replay", "start": start, "frames": b64(frames)}) + "\n")
        for frames in live[NUM_BUFFERED:]:
            f.write(json.dumps({"kind": "pub", "frames": b64(frames)}) + "\n")
    print(f"{out}: {out.stat().st_size} bytes; {NUM_BUFFERED} buffered batches, {payload_bytes} payload bytes, "
          f"answer from 0 in {answers[0][1]:.3f} s; pool after {NUM_BUFFERED}: "
          f"{len(cached_after[NUM_BUFFERED])} blocks")


if __name__ == "__main__":
    main()
