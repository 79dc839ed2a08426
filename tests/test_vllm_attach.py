"""Attaching to a vLLM KV-event stream: wire format, gap refill from the replay socket, CLI.

The publisher here plays a vLLM server on loopback with vLLM's exact framing:
PUB `[topic, seq (8 bytes big-endian), msgpack EventBatch]` and a ROUTER replay socket.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import msgpack
import pytest
import zmq

from engine.core.events import EventBus
from engine.core.projection import PoolProjection
from engine.remote.vllm_events import RemoteEvent, RemotePool, VllmSubscriber, decode_batch, encode_batch

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeVllm:
    """A loopback publisher speaking vLLM's ZmqEventPublisher protocol."""

    def __init__(self) -> None:
        self.ctx = zmq.Context.instance()
        self.port, self.replay_port = free_port(), free_port()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=1000)
        self.seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def publish(self, payload: bytes, drop: bool = False) -> None:
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if not drop:
            self.pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))

    def resend_last(self) -> None:
        seq, payload = self.buffer[-1]
        self.pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))

    def _serve_replay(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            client, _, start = self.router.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            for seq, buf in list(self.buffer):
                if seq >= start_seq:
                    self.router.send_multipart((client, b"", seq.to_bytes(8, "big"), buf))
            self.router.send_multipart((client, b"", (-1).to_bytes(8, "big", signed=True), b""))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pub.close(linger=0)
        self.router.close(linger=0)


def stored(hashes, parent, tokens, bs=4) -> RemoteEvent:
    return RemoteEvent("BlockStored", tuple(hashes), parent, tuple(tokens), bs)


def test_decode_both_encodings_and_int_hashes():
    ev = [stored([b"\x01" * 8, b"\x02" * 8], None, range(8)), RemoteEvent("BlockRemoved", (b"\x01" * 8,)),
          RemoteEvent("AllBlocksCleared")]
    for array_like in (True, False):
        batch = decode_batch(3, encode_batch(1.5, ev, array_like=array_like))
        assert batch.seq == 3 and batch.ts == 1.5
        assert [e.kind for e in batch.events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
        assert batch.events[0].token_ids == tuple(range(8)) and batch.events[0].block_size == 4
    # older vLLM: integer hashes, negative included, array-like with a dp rank
    raw = msgpack.packb([2.0, [["BlockStored", [12345, -7], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None, "GPU"]], 0])
    batch = decode_batch(0, raw)
    assert batch.data_parallel_rank == 0
    assert len(batch.events[0].block_hashes) == 2 and batch.events[0].block_hashes[0] != batch.events[0].block_hashes[1]
    with pytest.raises(ValueError, match="not valid msgpack|not an EventBatch"):
        decode_batch(0, b"\xc1garbage")
    with pytest.raises(ValueError, match="unknown KV event type"):
        decode_batch(0, msgpack.packb([0.0, [["BlockMoved", []]]]))


def test_remote_pool_projection_builds_the_hash_tree():
    bus = EventBus()
    proj = PoolProjection(0, 4)
    bus.subscribe(proj.apply)
    pool = RemotePool(bus, "x")
    a, b, c = b"a" * 8, b"b" * 8, b"c" * 8
    pool.apply(decode_batch(0, encode_batch(0.0, [stored([a, b], None, range(8))])))
    pool.apply(decode_batch(1, encode_batch(0.0, [stored([c], a, [9, 9, 9, 9])])))
    assert pool.cached == {a, b, c}
    assert proj.num_hashed == 3
    assert proj.parents[proj.block_of_hash(b)] == a and proj.parents[proj.block_of_hash(c)] == a
    pool.apply(decode_batch(2, encode_batch(0.0, [RemoteEvent("BlockRemoved", (b,))])))
    assert proj.block_of_hash(b) is None and proj.num_hashed == 2
    pool.apply(decode_batch(3, encode_batch(0.0, [RemoteEvent("AllBlocksCleared")])))
    assert proj.num_hashed == 0 and not pool.cached


def test_subscriber_refills_a_gap_from_the_replay_socket():
    server = FakeVllm()
    got: list = []
    sub = VllmSubscriber(server.endpoint, got.append, server.replay_endpoint).start()
    try:
        time.sleep(0.3)  # PUB/SUB joins asynchronously
        for i in range(10):
            payload = encode_batch(float(i), [stored([bytes([i]) * 8], None, [i] * 4)])
            server.publish(payload, drop=i in (3, 4, 5))
            time.sleep(0.02)
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sub.stop()
        server.close()
    assert [b.seq for b in got] == list(range(10))
    assert sub.num_gaps_refilled >= 1 and sub.num_missed == 0


def test_attach_command_prints_events_and_summary():
    server = FakeVllm()
    proc = subprocess.Popen([sys.executable, "-m", "app", "attach", server.endpoint, "--replay",
                             server.replay_endpoint, "--max-batches", "3", "--seconds", "30", "--json"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Two batches go out before the subscriber has joined; it must fetch them from the
        # replay socket when the third, re-sent until it lands, reaches it.
        for i in range(3):
            server.publish(encode_batch(float(i), [stored([bytes([i + 1]) * 8], None, [i] * 4)],
                                        array_like=i % 2 == 0), drop=True)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            server.resend_last()
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
    finally:
        server.close()
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    kinds = [line["event"]["kind"] for line in lines if "event" in line]
    assert kinds.count("block_stored") == 3
    summary = lines[-1]["summary"][0]
    assert summary["stored"] == 3 and summary["cached"] == 3


def test_attach_rejects_a_bad_endpoint(capsys):
    from app.cli import main

    assert main(["attach", "localhost:5557", "--seconds", "0"]) == 2
    assert "not a ZMQ endpoint" in capsys.readouterr().err
