"""`VllmSubscriber.on_idle`: called once the queued frames are handled, never in a run of them.

A consumer that holds batches to apply many at once (a columnar pool applies a run of
frames in one compiled call) applies what it holds there, so these tests pin down when it
comes: after the last batch of a burst, not between batches that were already queued, not
while nothing arrives, and once more when the subscriber stops.
"""

from __future__ import annotations

import threading
import time

from engine.remote.subscriber import VllmSubscriber
from tests.test_vllm_attach import FixtureServer, wait_for


class Recorder:
    def __init__(self) -> None:
        self.log: list[object] = []
        self.lock = threading.Lock()

    def batch(self, batch) -> None:
        with self.lock:
            self.log.append(batch.seq)

    def idle(self) -> None:
        with self.lock:
            self.log.append("idle")

    def snapshot(self) -> list[object]:
        with self.lock:
            return list(self.log)


def test_idle_comes_after_a_burst_and_at_stop_never_inside_a_queued_run():
    server = FixtureServer()
    rec = Recorder()
    sub = VllmSubscriber(server.endpoint, rec.batch, topic="kv-events", on_idle=rec.idle).start()
    try:
        server.wait_joined()
        time.sleep(0.3)
        assert rec.snapshot() == []  # nothing delivered: no idle call while idle
        # batches 1-4 arrive while the subscriber is busy in its first batch's callback:
        # it sees them queued and handles them before it says idle
        gate = threading.Event()
        first = rec.batch

        def slow(batch) -> None:
            first(batch)
            if batch.seq == 1:
                gate.wait(5)
        sub.on_batch = slow
        server.send(server.pub_frames[0])
        wait_for(lambda: rec.snapshot()[:1] == [1])
        for frames in server.pub_frames[1:]:
            server.send(frames)
        time.sleep(0.3)  # all of them queued on the SUB socket
        gate.set()
        wait_for(lambda: "idle" in rec.snapshot())
        time.sleep(0.3)
        got = rec.snapshot()
        # batch 0 went out before we joined (no replay socket here): missed
        assert got == [1, 2, 3, 4, "idle"], got
    finally:
        sub.stop()
        server.close()


def test_stopping_calls_idle_for_what_the_consumer_still_holds():
    server = FixtureServer()
    held: list[int] = []
    flushed: list[list[int]] = []

    def hold(batch) -> None:
        held.append(batch.seq)

    def flush() -> None:
        if held:
            flushed.append(list(held))
            held.clear()
    sub = VllmSubscriber(server.endpoint, hold, topic="kv-events", on_idle=flush).start()
    try:
        server.wait_joined()
        for frames in server.pub_frames:
            server.send(frames)
        wait_for(lambda: sub.health.last_seq == 4)
    finally:
        sub.stop()
        server.close()
    assert held == [] and sum(flushed, []) == [1, 2, 3, 4]
