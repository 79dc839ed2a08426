"""`VllmSubscriber` reads a run of queued live frames without a zmq poll before each one.

A poll of the SUB and monitor sockets cost more than decoding a vLLM frame, so the thread
polls once, then receives what is queued until the socket is empty (`DRAIN_FRAMES` at
most). The batches, their order and the idle call are what they were.
"""

from __future__ import annotations

import threading
import time

import zmq

from engine.remote.subscriber import VllmSubscriber
from tests.test_subscriber_idle import Recorder
from tests.test_vllm_attach import FixtureServer, wait_for


def test_queued_frames_are_read_without_a_poll_each(monkeypatch):
    ready_polls: list[int] = []
    poll = zmq.Poller.poll

    def counting(self, timeout=None):
        out = poll(self, timeout)
        if out and threading.current_thread().name.startswith("vllm-sub"):
            ready_polls.append(len(out))
        return out
    monkeypatch.setattr(zmq.Poller, "poll", counting)
    server = FixtureServer()
    rec = Recorder()
    gate = threading.Event()

    def slow(batch) -> None:
        rec.batch(batch)
        if batch.seq == 1:
            gate.wait(5)
    sub = VllmSubscriber(server.endpoint, slow, topic="kv-events", on_idle=rec.idle).start()
    try:
        server.wait_joined()
        time.sleep(0.3)
        server.send(server.pub_frames[0])
        wait_for(lambda: rec.snapshot()[:1] == [1])
        for frames in server.pub_frames[1:]:  # queued while batch 1's callback waits
            server.send(frames)
        time.sleep(0.3)
        gate.set()
        wait_for(lambda: "idle" in rec.snapshot())
        time.sleep(0.3)
        assert rec.snapshot() == [1, 2, 3, 4, "idle"]
        # one poll found batch 1; batches 2-4 were read in the same run (one poll each before)
        assert len(ready_polls) == 1, ready_polls
    finally:
        sub.stop()
        server.close()


def test_recv_parts_gives_what_recv_multipart_gives():
    from engine.remote.subscriber import recv_parts

    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://test-recv-parts")
    b.connect("inproc://test-recv-parts")
    try:
        messages = [[b"x"], [b"", b""], [b"kv", (7).to_bytes(8, "big"), b"\x93" * 5000], [b"a", b"", b"c", b"d"]]
        for m in messages:
            a.send_multipart(m)
            a.send_multipart(m)
        for m in messages:
            assert recv_parts(b) == b.recv_multipart() == m
        try:
            recv_parts(b, zmq.NOBLOCK)
        except zmq.Again:
            pass
        else:
            raise AssertionError("nothing was queued")
    finally:
        a.close(0)
        b.close(0)
