"""The compiled receive (`engine.remote.receive`) gives what pyzmq's receive gives.

`Receiver.read` calls libzmq's `zmq_msg_recv` from numba; what it reads must be the
messages `read_queued` reads, part for part, within the same bounds, whatever the
messages (vLLM 0.33's own PUB frames, the recorded stream's, a part larger than its
buffer, more parts than its table, empty parts). `QueuedMessages.follow_on` must count
what `VllmSubscriber._run_payloads` hands on for every broken run (a subscriber fed
`QueuedMessages`: `tests.test_subscriber_h3_runs`).
"""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from engine.remote import receive
from engine.remote.fastwire import decode_columns
from engine.remote.receive import QueuedMessages, Receiver
from engine.remote.subscriber import VllmSubscriber, read_queued
from tests.test_subscriber_h3_runs import PAYLOADS, VLLM, broken_runs, pub

pytestmark = pytest.mark.skipif(not receive.available(), reason="libzmq is not one the compiled receive finds here")


def _pairs(name: str):
    ctx = zmq.Context.instance()
    out = []
    for k in range(2):
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        a.bind(f"inproc://{name}-{k}")
        b.connect(f"inproc://{name}-{k}")
        out += [a, b]
    return out


def _messages() -> list[list[bytes]]:
    out = [pub(s) for s in range(40)] + VLLM + [[b"x"], [b"", b""], [b"a", b"", b"c", b"d", b"e"]]
    out += [[b"kv-events", (40).to_bytes(8, "big"), bytes(range(256)) * 40_000]]  # 10 MB: past the first buffer
    out += [[b"p%d" % i for i in range(1500)]]  # more parts than the first table has rows
    return out + [pub(s) for s in range(41, 90)]


def test_read_gives_what_read_queued_gives():
    messages = _messages()
    a, b, c, d = _pairs("receive-read")
    receiver = Receiver(b)
    try:
        assert receiver.read(10, 1 << 20) is None  # nothing queued
        for m in messages:
            a.send_multipart(m)
            c.send_multipart(m)
        for bounds in ((7, 1 << 30), (1000, sum(len(m[-1]) for m in messages[7:20]) - 1), (3, 1), (16, 1 << 30)):
            ref: list = []
            num = read_queued(d, ref, *bounds)
            got = receiver.read(*bounds)
            assert len(got) == num and got[:] == ref and [got[i] for i in range(num)] == ref
        ref, got = [], []
        while read_queued(d, ref, 16, 4 << 20):
            q = receiver.read(16, 4 << 20)
            got += q[:]
        assert receiver.read(16, 4 << 20) is None
        assert got == ref and sum(map(len, got)) > 1500
        assert all(type(p) is bytes for m in got for p in m)
    finally:
        receiver.close()
        for s in (a, b, c, d):
            s.close(0)


def test_a_held_buffer_is_not_written_over():
    """A read's buffer is taken again only once nothing refers to it (here: a payload view)."""
    a, b, _, _ = _pairs("receive-held")
    receiver = Receiver(b)
    try:
        a.send_multipart(pub(0))
        first = receiver.read(10, 1 << 20)
        views, addresses, sizes = first.payloads(0, 1)
        held = first.buf
        del first
        bufs = set()
        for s in range(1, 30):
            a.send_multipart(pub(s))
            got = receiver.read(10, 1 << 20)
            assert got[0] == pub(s) and got.buf is not held
            bufs.add(id(got.buf))
            del got
        assert len(bufs) == 1  # one buffer, taken again once nothing refers to it
        assert bytes(views[0]) == PAYLOADS[0] and sizes[0] == len(PAYLOADS[0])
        assert addresses[0] == np.frombuffer(views[0], np.uint8).ctypes.data
    finally:
        receiver.close()
        a.close(0)
        b.close(0)


@pytest.mark.parametrize("name", list(broken_runs()))
@pytest.mark.parametrize("topic", ["kv-events", ""])
def test_follow_on_counts_what_run_payloads_hands_on(name, topic):
    messages = broken_runs()[name]
    queued = QueuedMessages.of(messages)
    assert queued[:] == [[bytes(p) for p in m] for m in messages]
    sub = VllmSubscriber("tcp://127.0.0.1:1", lambda b: None, topic=topic, socket=False, decode=decode_columns)
    for start in range(len(messages)):
        first = int.from_bytes(messages[start][1], "big", signed=True) if len(messages[start]) > 1 else 0
        for f in (first, first + 1, 100):
            want = sub._run_payloads(messages, start, f)
            num = queued.follow_on(start, sub.topic, f)
            assert num == len(want), (name, start, f)
            views, _, sizes = queued.payloads(start, num)
            assert [bytes(v) for v in views] == want and sizes.tolist() == list(map(len, want))
