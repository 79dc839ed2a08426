"""Publishing our engine's pool in vLLM 0.33's wire format: our publisher into our subscriber
reproduces the engine's cached set exactly, and our frames look like the recorded ones.
Real ZMQ sockets on loopback, ephemeral ports, bounded waits."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from _ports import free_ports  # tests/ is on sys.path
from engine.core.events import EventBus
from engine.core.hashing import BlockHasher
from engine.core.manager import PrefixCacheManager
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import read_trace
from engine.remote import AttachOptions, Attachment, EnginePublisher, VllmPublisher
from engine.remote.wire import decode_batch, parse_pub, parse_replay

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "vllm"


def free_port() -> int:
    return free_ports()


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def write_trace(tmp_path: Path) -> Path:
    """Requests sharing prefixes, with two tenants, in a pool small enough to evict."""
    rows = []
    system = list(range(1000, 1024))
    for i in range(14):
        tokens = system + [2000 + i] * (5 + 3 * (i % 4)) + list(range(3000, 3000 + 4 * (i % 3)))
        rows.append({"id": f"r{i}", "tokens": tokens, "output_length": 3, "tenant": "blue" if i % 5 == 0 else None})
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("int_hashes", [True, False])
def test_our_publisher_into_our_subscriber_reproduces_the_engine_pool(tmp_path, int_hashes):
    port, replay_port = free_port(), free_port()
    publisher = VllmPublisher(f"tcp://*:{port}", f"tcp://*:{replay_port}", topic="kv-events", int_hashes=int_hashes)
    bus = EventBus()
    engine_pub = EnginePublisher(publisher, bus, block_size=4)
    manager = PrefixCacheManager(20, 4, BlockHasher("vllm-sha256"), bus)
    att = Attachment(AttachOptions((f"tcp://127.0.0.1:{port}",), (f"tcp://127.0.0.1:{replay_port}",),
                                   topic="kv-events"))
    att.events.subscribe(lambda e: None)
    try:
        att.start()
        result = replay(read_trace(write_trace(tmp_path), 4), ReplayConfig(block_size=4, capacity_blocks=20),
                        manager=manager).to_dict()
        engine_pub.close()
        assert result["totals"]["evicted_blocks"] > 0 and publisher.next_seq > 3
        wait_for(lambda: att.subscribers[0].health.last_seq == publisher.next_seq - 1)
        with att.lock:
            pool = att.pools[0]
            expected = {h[-8:] if int_hashes else h for h in manager.pool.blocks_by_hash}
            assert pool.cached_hashes() == expected
            assert pool.num_removed == result["totals"]["evicted_blocks"]
            assert "blue" in pool.tenants
            block = next(b for _, b in pool.blocks() if b.parent_hash is None and b.tenant == "blue")
            assert block.token_ids == tuple(range(1000, 1004))
        h = att.subscribers[0].health
        assert (h.missed, h.malformed, h.restarts) == (0, 0, 0)
    finally:
        att.stop()
        publisher.close()


def _fixture(rank: int, sock: str) -> list[list[bytes]]:
    rows = [json.loads(line) for line in (DATA / "vllm_zmq_frames.jsonl").read_text().splitlines()]
    return [[base64.b64decode(f) for f in r["frames"]] for r in rows if r["rank"] == rank and r["socket"] == sock]


def test_our_frames_look_like_vllm_frames(tmp_path):
    port, replay_port = free_port(), free_port()
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(f"tcp://127.0.0.1:{port}")  # a concrete host: the publisher connects, as vLLM does
    publisher = VllmPublisher(f"tcp://127.0.0.1:{port}", f"tcp://*:{replay_port}", topic="kv-events")
    dealer = ctx.socket(zmq.DEALER)
    try:
        for _ in range(200):  # PUB drops what it sends before the connection is up
            publisher.publish([])
            if sub.poll(50):
                break
        while sub.poll(200):
            sub.recv_multipart()
        bus = EventBus()
        engine_pub = EnginePublisher(publisher, bus, block_size=16)
        path = tmp_path / "one.jsonl"
        path.write_text(json.dumps({"id": "a", "tokens": list(range(1, 18)), "output_length": 1}) + "\n")
        manager = PrefixCacheManager(8, 16, BlockHasher("vllm-sha256"), bus)
        replay(read_trace(path, 16), ReplayConfig(block_size=16, capacity_blocks=8), manager=manager)
        engine_pub.close()
        assert sub.poll(5000)
        frames = sub.recv_multipart()
        recorded = _fixture(0, "pub")[0]
        assert len(frames) == 3 and frames[0] == recorded[0] == b"kv-events" and len(frames[1]) == 8
        _, seq, payload = parse_pub(frames)
        ours = decode_batch(seq, payload)
        vllm_first = decode_batch(*parse_replay(_fixture(0, "replay")[0]))
        # the same prompt, block size and hash scheme: the very event vLLM 0.33 published
        assert ours.events[0] == vllm_first.events[0]
        assert ours.data_parallel_rank == 0 and msgpack.unpackb(payload)[2] == 0
        # the replay socket answers in 0.33's four-frame layout and ends with its marker
        dealer.connect(f"tcp://127.0.0.1:{replay_port}")
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replies = []
        while dealer.poll(5000):
            reply = dealer.recv_multipart()
            replies.append(reply)
            if parse_replay(reply) is None:
                break
        assert len(replies) == publisher.next_seq + 1
        assert all(len(r) == 4 and r[1] == b"kv-events" for r in replies[:-1])
        assert replies[-1] == [b"", b"", b"\xff" * 8, b""] == _fixture(0, "replay")[-1]
    finally:
        dealer.close(linger=0)
        sub.close(linger=0)
        publisher.close()


def test_replay_publish_on_the_command_line(tmp_path):
    port, replay_port = free_port(), free_port()
    trace = write_trace(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "app", "replay", str(trace), "--no-model", "--capacity-blocks", "20",
                             "--block-size", "4", "--hash", "vllm-sha256", "--json", "--publish", f"tcp://*:{port}",
                             "--publish-replay", f"tcp://*:{replay_port}", "--publish-hold", "15"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    att = Attachment(AttachOptions((f"tcp://127.0.0.1:{port}",), (f"tcp://127.0.0.1:{replay_port}",)))
    try:
        # The run is over before anyone subscribes (it says so on stderr); a late subscriber
        # gets all of it from the replay socket while the sockets are held open.
        line = proc.stderr.readline()
        assert "holding" in line, line + proc.stderr.read()
        att.start()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        totals = json.loads(out)["totals"]
        with att.lock:
            assert att.pools[0].num_stored == totals["stored_blocks"]
            assert att.pools[0].num_removed == totals["evicted_blocks"]
            assert att.pools[0].num_cached == totals["stored_blocks"] - totals["evicted_blocks"]
        assert att.subscribers[0].health.missed == 0
    finally:
        att.stop()
        if proc.poll() is None:
            proc.kill()
