"""A late join to a busy vLLM server: every buffered batch, however slow the consumer.

`RecordedVllm` serves `data/vllm_late_join/replay_answers.jsonl.xz`, recorded from vLLM
0.33.0's own ZmqEventPublisher (its README): a ROUTER with vLLM's socket options that
answers a replay request with the recorded frames at burst speed, as vLLM's publisher loop
does, and an XPUB (wire-identical to PUB; it tells us when the subscriber has joined) for
the live batches. The last tests run vLLM's real publisher; they are skipped where vLLM
does not import (CI). Every loop is bounded in time.
"""

from __future__ import annotations

import base64
import functools
import json
import lzma
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq

from engine.remote import AttachOptions, Attachment
from engine.remote.wire import canonical_hash, parse_replay
from test_vllm_attach import free_ports, wait_for, wait_for_subscriber  # tests/ is on sys.path

DATA = Path(__file__).resolve().parent / "data" / "vllm_late_join"
SLOW = 0.01  # seconds per batch: --json to a pipe, or the app while drawing
REFILL_TIMEOUT = 0.2  # far less than a slow consumer takes over 300 batches


@dataclass(slots=True, frozen=True)
class Recording:
    meta: dict
    answers: dict[int, list[list[bytes]]]  # start seq -> what the DEALER received, end marker last
    live: list[list[bytes]]  # PUB frames of the batches after the buffered ones

    def cached_after(self, num_batches: int) -> set[bytes]:
        """vLLM's pool (block hashes) once it had published `num_batches` batches."""
        return {canonical_hash(h) for h in self.meta["cached_after"][str(num_batches)]}


@functools.cache
def recording() -> Recording:
    with lzma.open(DATA / "replay_answers.jsonl.xz", "rt") as f:
        rows = [json.loads(line) for line in f]
    answers: dict[int, list[list[bytes]]] = {}
    live = []
    for row in rows[1:]:
        frames = [base64.b64decode(x) for x in row["frames"]]
        if row["kind"] == "replay":
            answers.setdefault(row["start"], []).append(frames)
        else:
            live.append(frames)
    return Recording(rows[0], answers, live)


def seq_of(frames: list[bytes]) -> int:
    return int.from_bytes(frames[-2], "big", signed=True)


class RecordedVllm:
    """vLLM 0.33's publisher as recorded: `num_published` batches buffered before anyone
    joined, at most `buffer_steps` of them kept (vLLM's deque), PUB frames for what
    `publish` sends. Its replay loop is vLLM's `_service_replay`: every buffered batch from
    the asked seq, then the end marker, sent as fast as the socket takes them."""

    def __init__(self, num_published: int, buffer_steps: int | None = None, max_answer: int | None = None) -> None:
        rec = recording()
        meta = rec.meta
        *replies, self.end = rec.answers[0]
        self.replies = {seq_of(f): f for f in replies}
        for frames in rec.live:  # the same layout the replay socket would answer with
            self.replies[seq_of(frames)] = [b"", *frames]
        self.buffer: deque[int] = deque(range(num_published), maxlen=buffer_steps or meta["buffer_steps"])
        self.max_answer = max_answer  # an answer whose tail (end marker too) never arrives
        self.lock = threading.Lock()
        self.requests: list[int] = []
        self.ctx = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.SNDHWM, meta["sockopts"]["pub"]["SNDHWM"])
        self.pub.setsockopt(zmq.RCVHWM, meta["sockopts"]["pub"]["RCVHWM"])
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.SNDHWM, meta["sockopts"]["router"]["SNDHWM"])
        self.port, self.replay_port = free_ports(), free_ports()
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoints(self) -> tuple[str, str]:
        return f"tcp://127.0.0.1:{self.port}", f"tcp://127.0.0.1:{self.replay_port}"

    def wait_joined(self, timeout: float = 10.0) -> None:
        wait_for_subscriber(self.pub, timeout)

    def publish(self, seq: int, drop: bool = False) -> None:
        """Buffer batch `seq` and send it on PUB (`drop`: lost on the way to us)."""
        with self.lock:
            self.buffer.append(seq)
        if not drop:
            self.pub.send_multipart(self.replies[seq][1:])

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            request = self.router.recv_multipart()
            if len(request) != 3:  # vLLM logs it and answers nothing
                continue
            client, _empty, start = request
            start_seq = int.from_bytes(start, "big")
            self.requests.append(start_seq)
            with self.lock:
                buffered = list(self.buffer)
            answer = [self.replies[seq] for seq in buffered if seq >= start_seq]
            if self.max_answer is not None and len(answer) > self.max_answer:
                answer = answer[:self.max_answer]
            else:
                answer.append(self.end)
            for frames in answer:
                self.router.send_multipart([client, *frames])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.pub.close(linger=0)
        self.router.close(linger=0)


class SlowConsumer:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.seqs: list[int] = []
        self.notices: list[tuple[str, str]] = []

    def on_batch(self, pool, batch, events) -> None:
        self.seqs.append(batch.seq)
        if self.delay:
            time.sleep(self.delay)

    def on_notice(self, pool, kind, message) -> None:
        self.notices.append((kind, message))


def attach(endpoint: str, replay: str, delay: float) -> tuple[Attachment, SlowConsumer]:
    got = SlowConsumer(delay)
    att = Attachment(AttachOptions((endpoint,), (replay,), topic="kv-events", refill_timeout=REFILL_TIMEOUT),
                     on_batch=got.on_batch, on_notice=got.on_notice)
    return att.start(), got


def delivered(att: Attachment, last_seq: int, timeout: float) -> None:
    """Until batch `last_seq` is in: `_deliver` sets `last_seq` after every other counter."""
    wait_for(lambda: att.subscribers[0].health.last_seq == last_seq, timeout=timeout)


def test_the_recording_is_vllms_answer_and_the_server_repeats_it():
    rec = recording()
    meta = rec.meta
    assert (meta["vllm"], meta["num_buffered"], meta["buffer_steps"]) == ("0.33.0", 300, 10_000)
    assert meta["sockopts"]["router"]["SNDHWM"] == 2 * (meta["buffer_steps"] + 1)  # vLLM's _replay_hwm
    assert 0.9e6 < meta["payload_bytes"] < 1.3e6
    assert [seq_of(f) for f in rec.answers[0]] == [*range(300), -1]
    assert rec.answers[150] == rec.answers[0][150:]  # from the middle: the same frames, the same marker
    assert all(len(f) == 4 and f[0] == b"" and f[1] == b"kv-events" for f in rec.answers[0][:-1])
    assert rec.answers[0][-1] == [b"", b"", b"\xff" * 8, b""]
    assert [seq_of(f) for f in rec.live] == list(range(300, 320))
    server = RecordedVllm(300)
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    try:
        dealer.connect(server.endpoints[1])
        for start in (0, 150):
            dealer.send_multipart((b"", start.to_bytes(8, "big")))
            answer = []
            while not answer or parse_replay(answer[-1]) is not None:
                assert dealer.poll(10_000), "the recorded server stopped answering"
                answer.append(dealer.recv_multipart())
            assert answer == rec.answers[start]
    finally:
        dealer.close(linger=0)
        server.close()


@pytest.mark.parametrize("delay", [0, SLOW], ids=["fast", "slow-consumer"])
def test_a_late_join_to_a_busy_server_gets_every_buffered_batch(delay):
    rec = recording()
    server = RecordedVllm(300)
    att, got = attach(*server.endpoints, delay)
    try:
        delivered(att, 299, timeout=60)
        server.wait_joined()
        for seq in range(300, 320):
            server.publish(seq)
        delivered(att, 319, timeout=30)
        h = att.subscribers[0].health
        assert got.seqs == list(range(320))
        assert (h.batches, h.refilled, h.missed, h.malformed) == (320, 300, 0, 0)
        assert server.requests == [0]  # one answer, read whole: nothing to ask again
        with att.lock:
            assert att.pools[0].cached_hashes() == rec.cached_after(320)
            assert att.pools[0].num_cached == len(rec.cached_after(320)) == rec.meta["num_gpu_blocks"]
        assert not any(kind in ("missed", "refill_timeout") for kind, _ in got.notices)
    finally:
        att.stop()
        server.close()


def test_a_half_way_join_refills_a_live_gap_whole():
    rec = recording()
    server = RecordedVllm(150)
    att, got = attach(*server.endpoints, SLOW)
    try:
        delivered(att, 149, timeout=60)
        server.wait_joined()
        for seq in range(150, 300):
            server.publish(seq, drop=160 <= seq < 260)  # 100 batches only the buffer has
        delivered(att, 299, timeout=60)
        h = att.subscribers[0].health
        assert got.seqs == list(range(300))
        assert (h.refilled, h.missed, h.malformed) == (250, 0, 0)
        assert server.requests == [0, 160]
        with att.lock:
            assert att.pools[0].cached_hashes() == rec.cached_after(300)
        assert not any(kind == "missed" for kind, _ in got.notices)
    finally:
        att.stop()
        server.close()


def test_an_answer_cut_short_is_asked_again_from_the_first_batch_missing():
    # What a ROUTER whose send queue overflowed sends (vLLM before its replay SNDHWM was
    # raised): the head of the answer, then nothing, not even the end marker.
    rec = recording()
    server = RecordedVllm(300, max_answer=120)
    att, got = attach(*server.endpoints, SLOW)
    try:
        delivered(att, 299, timeout=60)
        h = att.subscribers[0].health
        assert got.seqs == list(range(300)) and (h.missed, h.refilled) == (0, 300)
        assert server.requests == [0, 120, 240]  # the last answer is short enough to end
        assert [k for k, _ in got.notices].count("refill_timeout") == 2
        with att.lock:
            assert att.pools[0].cached_hashes() == rec.cached_after(300)
        server.wait_joined()
        server.publish(300)  # and the live stream goes on
        delivered(att, 300, timeout=30)
        assert got.seqs[-1] == 300 and server.requests == [0, 120, 240]
    finally:
        att.stop()
        server.close()


def test_what_the_buffer_no_longer_holds_is_missed_exactly():
    server = RecordedVllm(300, buffer_steps=5)  # holds 295..299
    att, got = attach(*server.endpoints, SLOW)
    try:
        delivered(att, 299, timeout=30)
        assert got.seqs == list(range(295, 300)) and att.subscribers[0].health.missed == 295
        server.wait_joined()
        for seq in range(300, 310):
            server.publish(seq, drop=True)
        server.publish(310)  # the gap 300..309; the buffer now holds 306..310
        delivered(att, 310, timeout=30)
        for seq in range(311, 320):
            server.publish(seq)
        delivered(att, 319, timeout=30)
        h = att.subscribers[0].health
        assert got.seqs == [*range(295, 300), *range(306, 320)]
        assert (h.missed, h.refilled, h.last_seq) == (295 + 6, 5 + 4, 319)
        assert server.requests == [0, 300]
        missed = [m for kind, m in got.notices if kind == "missed"]
        assert len(missed) == 2 and all("no longer buffers" in m for m in missed)
    finally:
        att.stop()
        server.close()


# ---- vLLM's own publisher (skipped where vLLM is not installed) ---------------------------

def vllm_publisher(buffer_steps: int = 10_000):
    kv = pytest.importorskip("vllm.distributed.kv_events")
    import msgspec

    port, replay_port = free_ports(), free_ports()
    pub = kv.ZmqEventPublisher(0, f"tcp://*:{port}", f"tcp://*:{replay_port}", buffer_steps=buffer_steps,
                               topic="kv-events")
    rec = recording()
    payloads = [f[3] for f in rec.answers[0][:-1]] + [f[2] for f in rec.live]
    batches = [msgspec.msgpack.decode(p, type=kv.KVEventBatch) for p in payloads]
    return pub, batches, f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"


def published(pub, n: int) -> bool:
    # The publisher's own buffer: the one place that says a batch has gone out.
    return bool(pub._buffer) and pub._buffer[-1][0] == n - 1


def test_vllms_publisher_late_and_half_way_joins_lose_nothing():
    pub, batches, endpoint, replay = vllm_publisher()
    rec = recording()
    att = None
    try:
        for b in batches[:150]:
            pub.publish(b)
        wait_for(lambda: published(pub, 150), timeout=30)
        att, got = attach(endpoint, replay, SLOW)
        for b in batches[150:300]:  # published while the join is being read
            pub.publish(b)
        wait_for(lambda: (att.subscribers[0].health.last_seq or 0) >= 149, timeout=60)
        for b in batches[300:]:
            pub.publish(b)
        delivered(att, 319, timeout=60)
        h = att.subscribers[0].health
        assert got.seqs == list(range(320)) and (h.missed, h.malformed) == (0, 0)
        with att.lock:
            assert att.pools[0].cached_hashes() == rec.cached_after(320)
    finally:
        if att is not None:
            att.stop()
        pub.shutdown()


def test_vllms_publisher_with_a_short_buffer_counts_exactly_what_it_dropped():
    pub, batches, endpoint, replay = vllm_publisher(buffer_steps=5)
    att = None
    try:
        for b in batches[:300]:
            pub.publish(b)
        wait_for(lambda: published(pub, 300), timeout=30)
        att, got = attach(endpoint, replay, SLOW)
        delivered(att, 299, timeout=30)
        h = att.subscribers[0].health
        assert got.seqs == list(range(295, 300)) and (h.missed, h.refilled) == (295, 5)
    finally:
        if att is not None:
            att.stop()
        pub.shutdown()
