"""A columnar stream holds its decoded batches across idle moments of its socket, up to
HOLD_SECONDS, so a fleet's stream at a few hundred frames a second applies several frames
a compiled call; its subscriber calls again until then, and at stopping applies the rest."""

from __future__ import annotations

import threading
import time

import zmq

from engine.bench.attach import recorded_stream
from engine.remote import AttachOptions, Attachment, fastwire
from engine.remote.attachment import HOLD_FRAMES, HOLD_SECONDS, _Held
from engine.remote.colpool import ColumnarPool
from tests.test_colpool import state
from tests.test_vllm_attach import free_ports, wait_for, wait_for_subscriber


class _Sub:
    stopping = False


def _held(pool: ColumnarPool) -> tuple[_Held, list[int]]:
    held = _Held(pool, threading.RLock())
    held.subscriber = _Sub()
    runs: list[int] = []
    real = pool.apply_many
    pool.apply_many = lambda batches: (runs.append(len(batches)), real(batches))[1]
    return held, runs


def test_idle_holds_a_young_batch_and_says_how_long():
    payloads, _, _ = recorded_stream(200, gpu_blocks=100, seed=1)
    pool = ColumnarPool("t")
    held, runs = _held(pool)
    assert held.idle() is None  # nothing held
    held.add(fastwire.decode_columns(0, payloads[0]))
    left = held.idle()
    assert left is not None and 0 < left <= HOLD_SECONDS and runs == [] and pool.num_batches == 0
    held.add(fastwire.decode_columns(1, payloads[1]))
    time.sleep(HOLD_SECONDS)
    assert held.idle() is None and runs == [2] and pool.num_batches == 2  # the oldest waited long enough
    held.add(fastwire.decode_columns(2, payloads[2]))
    held.subscriber.stopping = True
    assert held.idle() is None and runs == [2, 1]  # stopping: applied at once, however young


def test_a_stream_at_fleet_rate_applies_several_frames_a_call():
    """Frames 4 ms apart (a socket that runs dry between each): held across the idle
    moments, applied a few at a time, the pool that of applying them one by one; the last
    ones applied without another frame coming, and a stop applies what is still held."""
    payloads, _, _ = recorded_stream(1_500, gpu_blocks=300, seed=4)
    payloads = payloads[:100]
    one = ColumnarPool("t")
    for seq, p in enumerate(payloads):
        one.apply(fastwire.decode_columns(seq, p))
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    port = free_ports()
    pub.bind(f"tcp://127.0.0.1:{port}")
    att = Attachment(AttachOptions((f"tcp://127.0.0.1:{port}",), columnar=True))
    runs: list[int] = []
    try:
        att.start()
        pool = att.pools[0]
        real = pool.apply_many
        pool.apply_many = lambda batches: (runs.append(len(batches)), real(batches))[1]
        wait_for_subscriber(pub)
        for seq, p in enumerate(payloads):
            pub.send_multipart([b"", seq.to_bytes(8, "big"), p])
            time.sleep(0.004)
        wait_for(lambda: att.pools[0].num_batches == len(payloads), timeout=30)
        with att.lock:
            same = state(att.pools[0]) == state(one)  # now: state() holds some of the pool's own dicts
        # a last frame, then stop at once: the stop applies it
        extra = recorded_stream(50, gpu_blocks=300, seed=8)[0][0]
        pub.send_multipart([b"", len(payloads).to_bytes(8, "big"), extra])
        wait_for(lambda: att.health()[0].batches == len(payloads) + 1, timeout=30)
    finally:
        att.stop()
        pub.close(linger=0)
    assert same
    assert sum(runs) == len(payloads) + 1 and max(runs) <= HOLD_FRAMES
    assert sum(1 for r in runs if r > 1) >= 5  # held across idle moments, several frames a call
    assert att.pools[0].num_batches == len(payloads) + 1
