"""The subscriber thread's bulk paths give what frame by frame gives.

`read_queued` reads a run of queued messages in one call, each as `recv_multipart` would;
`VllmSubscriber._run_payloads` checks a run's topics and numbers at once (set, count, one
array) and hands on what the per-frame check hands on, for runs broken in every way the
rules look at; `_Held.add_many` applies the batches in the groups adding them one by one
makes. The frames are the recorded stream's and vLLM 0.33's own.
"""

from __future__ import annotations

import pytest
import zmq

from engine.bench.attach import recorded_stream
from engine.remote import attachment
from engine.remote.fastwire import decode_columns, decode_columns_many
from engine.remote.receive import QueuedMessages
from engine.remote.subscriber import VllmSubscriber, read_queued
from tests.test_subscriber_runs import Log, counts, subscriber
from tests.test_vllm_attach import fixture_frames

TOPIC = b"kv-events"
PAYLOADS = recorded_stream(12_000, gpu_blocks=600, seed=7)[0]
VLLM = fixture_frames(0, "pub") + fixture_frames(1, "pub")  # vLLM 0.33's own PUB frames (two topics)


def pub(seq: int, payload: bytes | None = None, topic: bytes = TOPIC) -> list[bytes]:
    return [topic, seq.to_bytes(8, "big", signed=True), PAYLOADS[seq] if payload is None else payload]


def per_frame(sub: VllmSubscriber, messages: list, start: int, first: int) -> list[bytes]:
    """The check frame by frame, as `_follow_on` made it before the run was checked at once."""
    payloads = []
    for frames in messages[start:]:
        if len(frames) != 3 or len(frames[1]) != 8 or (sub.topic and frames[0] != sub.topic):
            break
        if int.from_bytes(frames[1], "big", signed=True) != first + len(payloads):
            break
        payloads.append(bytes(frames[2]))
    return payloads


def broken_runs() -> dict[str, list[list[bytes]]]:
    run = [pub(s) for s in range(100, 164)]
    out = {"whole": run}
    out["swapped (the last still follows on)"] = run[:20] + [run[21], run[20]] + run[22:]
    out["a gap"] = run[:30] + run[31:]
    out["another topic"] = run[:10] + [pub(110, topic=TOPIC + b"-other")] + run[10:]
    out["another topic in its place"] = run[:10] + [pub(110, topic=TOPIC + b"-other")] + run[11:]
    out["vLLM's frame of another topic, numbered on"] = run[:5] + [[VLLM[-1][0], (105).to_bytes(8, "big"),
                                                                    VLLM[-1][2]]] + run[5:]
    out["two frames"] = run[:40] + [run[40][:2]] + run[41:]
    out["four frames"] = run[:3] + [run[3] + [b""]] + run[4:]
    out["a 7-byte number"] = run[:50] + [[TOPIC, (150).to_bytes(7, "big"), PAYLOADS[150]]] + run[51:]
    out["a 9-byte number"] = run[:50] + [[TOPIC, (150).to_bytes(9, "big"), PAYLOADS[150]]] + run[51:]
    out["a negative number"] = run[:7] + [[TOPIC, (-1).to_bytes(8, "big", signed=True), PAYLOADS[107]]] + run[8:]
    out["a bytearray payload"] = run[:12] + [[TOPIC, run[12][1], bytearray(run[12][2])]] + run[13:]
    out["the first is back"] = [pub(99)] + run
    out["one"] = run[:1]
    out["a restart at the end"] = run + [pub(0), pub(1)]
    out["another topic as long"] = run[:10] + [pub(110, topic=b"kv-eventz")] + run[11:]
    return out


@pytest.mark.parametrize("name", list(broken_runs()))
@pytest.mark.parametrize("topic", ["kv-events", ""])
def test_a_run_is_checked_at_once_as_frame_by_frame(name, topic):
    messages = broken_runs()[name]
    sub = VllmSubscriber("tcp://127.0.0.1:1", lambda b: None, topic=topic, socket=False, decode=decode_columns)
    for start in range(len(messages)):
        first = int.from_bytes(messages[start][1], "big", signed=True) if len(messages[start]) > 1 else 0
        for f in (first, first + 1, 100):
            got = sub._run_payloads(messages, start, f)
            assert got == per_frame(sub, messages, start, f), (name, start, f)
            assert all(type(p) is bytes for p in got)


@pytest.mark.parametrize("read_as", ["lists", "compiled receive"])
def test_handle_many_of_broken_runs_gives_what_handle_gives(read_as):
    """Every broken run after a good start, read 256 and 5 at a time (as `read_queued`'s
    lists, or as the compiled receive's `QueuedMessages`, decoded where they lie): the
    batches (bytes payloads), their order, notices and counters of handling each frame alone."""
    wrap = list if read_as == "lists" else QueuedMessages.of
    messages = [pub(s) for s in range(100)]
    for run in broken_runs().values():
        messages += run
    for read in (256, 5):
        one, many = Log(), Log()
        alone = subscriber(one, runs=False)
        for frames in messages:
            alone.handle(frames)
        sub = subscriber(many, runs=True)
        payloads: list = []
        sub._decode_run = lambda first, ps, at=None: (payloads.extend(ps), decode_columns_many(first, ps, at))[1]
        for i in range(0, len(messages), read):
            sub.handle_many(wrap(messages[i:i + read]))
        assert many.entries == one.entries
        assert counts(sub) == counts(alone)
        assert max(many.runs) >= min(read, 160)
        assert all(type(p) is (bytes if read_as == "lists" else memoryview) for p in payloads)


def _socket_pair(name: str):
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind(f"inproc://{name}")
    b.connect(f"inproc://{name}")
    return a, b


def test_read_queued_reads_what_recv_multipart_reads():
    messages = [pub(s) for s in range(40)] + VLLM + [[b"x"], [b"", b""], [b"a", b"", b"c", b"d", b"e"]]
    messages += [pub(s) for s in range(40, 90)]
    a, b = _socket_pair("h3-read-queued")
    c, d = _socket_pair("h3-read-queued-ref")
    try:
        assert read_queued(b, [], 10, 1 << 20) == 0  # nothing queued
        for m in messages:
            a.send_multipart(m)
            c.send_multipart(m)
        got: list = []
        assert read_queued(b, got, 7, 1 << 30) == 7  # at most 7
        limit = sum(len(m[-1]) for m in messages[7:20]) - 1  # the 20th message's part reaches it
        assert read_queued(b, got, 1000, limit) == 13
        while read_queued(b, got, 16, 1 << 30):
            pass
        assert got == [d.recv_multipart() for _ in messages] == messages
        assert all(type(p) is bytes for m in got for p in m)
    finally:
        for s in (a, b, c, d):
            s.close(0)


class _Pool:
    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def apply_many(self, batches) -> None:
        self.calls.append([b.seq for b in batches])


def _groups(batches, sizes) -> list[list[int]]:
    """The groups `_Held` applied batch by batch before runs were held a part at a time."""
    out, held, nbytes = [], [], 0
    for b in batches:
        held.append(b.seq)
        nbytes += len(b.payload or b"")
        if len(held) >= attachment.HOLD_FRAMES or nbytes >= attachment.HOLD_BYTES:
            out.append(held)
            held, nbytes = [], 0
    if held:
        out.append(held)
    return out


@pytest.mark.parametrize("hold_bytes", [4 << 20, 30_000])
def test_held_runs_are_applied_in_the_groups_of_one_by_one(monkeypatch, hold_bytes):
    import threading

    monkeypatch.setattr(attachment, "HOLD_SECONDS", 1e9)  # no flush by the clock
    monkeypatch.setattr(attachment, "HOLD_BYTES", hold_bytes)
    batches = decode_columns_many(0, PAYLOADS[:700])
    assert max(len(b.payload) for b in batches) < 30_000 < sum(len(b.payload) for b in batches[:64])
    sizes = (1, 3, 64, 100, 256, 7, 63, 65, 2)
    pool = _Pool()
    held = attachment._Held(pool, threading.RLock())
    at = i = 0
    while at < len(batches):
        held.add_many(batches[at:at + sizes[i % len(sizes)]])
        at += sizes[i % len(sizes)]
        i += 1
    held.flush()
    want = _groups(batches, sizes)
    assert pool.calls == want
    assert len(batches) == 700 and len(want) > 10 and (max(map(len, want)) == 64) == (hold_bytes > 1 << 20)
