"""`VllmSubscriber.handle_many`: queued live frames handed on as runs, by the same rules.

A run of frames read at once that simply follows on is decoded, handed to `on_batches` as
one list and counted once; a frame the rules must look at (a gap, a restart, a jump, a
malformed frame, another topic) goes through `handle` as before. Whatever the mix, the
batches, their order against notices and restarts, and the counters are those of handling
each frame alone; gaps are still asked of the replay socket.
"""

from __future__ import annotations

import pytest

from engine.bench.attach import recorded_stream
from engine.remote import AttachOptions, Attachment
from engine.remote.colpool import ColumnarPool
from engine.remote.fastwire import decode_columns
from engine.remote.subscriber import VllmSubscriber
from engine.remote.wire import END_SEQ
from tests.test_colpool import state
from tests.test_vllm_attach import FixtureServer, wait_for

TOPIC = b"kv-events"
PAYLOADS = recorded_stream(3_000, gpu_blocks=400, seed=5)[0]


def pub(seq: int, payload: bytes | None = None, topic: bytes = TOPIC) -> list[bytes]:
    return [topic, seq.to_bytes(8, "big", signed=True), PAYLOADS[seq] if payload is None else payload]


def mixed_stream() -> list[list[bytes]]:
    """Runs that follow on, broken by every case the sequence rules look at."""
    out = [pub(s) for s in range(40)]
    out.append(pub(40, b"\xc1 is never msgpack"))  # malformed: the sequence stays at 39
    out += [pub(s) for s in range(41, 50)]  # batch 40 missed (no replay socket)
    out.append(pub(50, topic=TOPIC + b"-other"))  # another stream's topic, our prefix
    out += [pub(s) for s in range(50, 60)]
    out.append(pub(59 + 10**9, PAYLOADS[60]))  # a jump no server makes: malformed
    out.append(pub(60)[:2])  # two frames: malformed
    out += [pub(s) for s in range(60, 80)]
    out += [pub(s) for s in range(20)]  # the server restarted: a fresh pool
    out += [pub(s) for s in range(25, 31)]  # 20-24 missed
    out.append(pub(28))  # back below the live 30: held as a possible restart, then malformed
    out += [pub(s) for s in range(31, 40)]
    return out


class Log:
    def __init__(self) -> None:
        self.entries: list[tuple] = []
        self.runs: list[int] = []

    def batch(self, batch) -> None:
        self.entries.append(("batch", batch.seq, batch.ts, len(batch)))

    def batches(self, batches) -> None:
        self.runs.append(len(batches))
        for batch in batches:
            self.batch(batch)

    def notice(self, kind: str, message: str) -> None:
        self.entries.append(("notice", kind))

    def restart(self, seq: int) -> None:
        self.entries.append(("restart", seq))


def subscriber(log: Log, runs: bool, **kw) -> VllmSubscriber:
    return VllmSubscriber("tcp://127.0.0.1:1", log.batch, topic="kv-events", socket=False, decode=decode_columns,
                          on_notice=log.notice, on_restart=log.restart,
                          on_batches=log.batches if runs else None, **kw)


def counts(sub: VllmSubscriber) -> tuple:
    h = sub.health
    return h.batches, h.refilled, h.missed, h.malformed, h.restarts, h.last_seq, sub.num_other_topics


@pytest.mark.parametrize("read", [256, 7, 1])
def test_runs_give_what_frame_by_frame_gives(read):
    messages = mixed_stream()
    one, many = Log(), Log()
    alone = subscriber(one, runs=False)
    for frames in messages:
        alone.handle(frames)
    sub = subscriber(many, runs=True)
    for i in range(0, len(messages), read):  # as `_drain_sub` reads them: `read` at a time
        sub.handle_many(messages[i:i + read])
    assert many.entries == one.entries
    assert counts(sub) == counts(alone)
    # 40 + 9 + 10 + 20 before the restart, 20 + 6 + 9 after; 40 and 20-24 lost
    assert counts(sub) == (114, 0, 6, 4, 1, 39, 1)
    kinds = [e[1] for e in one.entries if e[0] == "notice"]
    assert kinds == ["malformed", "missed", "malformed", "malformed", "restart", "missed", "malformed"]
    if read > 1:  # the runs were handed on as lists, never a batch the rules had to look at
        assert max(many.runs) > 1 and sum(many.runs) < 114
    else:
        assert set(many.runs) <= {1}


def test_a_health_listener_still_hears_every_batch():
    heard = []
    log = Log()
    sub = subscriber(log, runs=True, on_health=heard.append)
    sub.handle_many([pub(s) for s in range(12)])
    assert [h.batches for h in heard] == list(range(1, 13)) and heard[-1].last_seq == 11
    assert log.runs == []  # one by one, so each copy follows its batch


def test_frames_read_but_not_handled_are_kept_first_in_line():
    log = Log()
    sub = subscriber(log, runs=True)
    sub.handle_many([pub(0)])

    def fails(batches) -> None:
        raise RuntimeError("the consumer failed")
    sub.on_batches = fails
    messages = [pub(s) for s in range(1, 5)] + [pub(5, b"\xc1")] + [pub(s) for s in range(6, 9)]
    with pytest.raises(RuntimeError):
        sub.handle_many(messages)
    assert list(sub._held) == messages[4:]  # the run 1-4 went to the consumer, not counted
    assert sub.health.batches == 1 and sub.health.last_seq == 0


class RecordedServer(FixtureServer):
    """Publishes recorded frames; its replay socket answers any batch published so far."""

    def __init__(self) -> None:
        super().__init__()
        self.published = set()
        self.replay_frames = [[b"", TOPIC, s.to_bytes(8, "big"), p] for s, p in enumerate(PAYLOADS)]
        self.replay_frames.append([b"", TOPIC, END_SEQ.to_bytes(8, "big", signed=True), b""])


def _applied(att) -> int | None:
    """The last batch applied to the attachment's first pool."""
    with att.lock:
        return att.pools[0].last_batch_seq


def test_a_queued_burst_with_a_gap_and_a_malformed_frame_over_zmq():
    """Columnar pools through real sockets: gaps are refilled from the replay socket, a
    malformed frame is counted once, each notice finds the pool with every batch before it
    applied, and the pool is the pool of applying every batch one by one."""
    num = 160
    server = RecordedServer()
    seen: list[tuple[str, int]] = []
    att = Attachment(AttachOptions((server.endpoint,), (server.replay_endpoint,), topic="kv-events",
                                   columnar=True, refill_timeout=2.0),
                     on_notice=lambda pool, kind, message: seen.append((kind, pool.last_batch_seq)))
    try:
        att.start()
        sub = att.subscribers[0]
        runs: list[int] = []
        real = sub.on_batches
        sub.on_batches = lambda batches: (runs.append(len(batches)), real(batches))[1]
        server.wait_joined()
        wait_for(lambda: server.num_replay_requests >= 1)  # joined: asked for the buffer (empty)
        for seq in range(num):
            if seq == 90:
                server.send(pub(seq, b"\xc1 not a batch"))
            else:
                server.send(pub(seq), drop=60 <= seq < 70)  # 60-69 only in the server's buffer
        wait_for(lambda: att.health()[0].last_seq == num - 1, timeout=30)
        # the stream's last batches are held until it is idle (engine.remote.attachment): read
        # the pool once it has them all (read at once, a loaded run found 11 blocks missing)
        wait_for(lambda: _applied(att) == num - 1, timeout=30)
        with att.lock:
            got = state(att.pools[0])
        h = att.health()[0]
    finally:
        att.stop()
        server.close()
    # 60-69 and the malformed 90 refilled from the server's buffer: nothing lost
    assert (h.batches, h.refilled, h.missed, h.malformed, h.restarts) == (num, 11, 0, 1, 0)
    assert server.num_replay_requests == 3  # joining, the gap at 60, the one at 90
    # each notice found every batch before it applied: 90 malformed after 89, the refills
    assert [k for k in seen if k[0] != "refilled"] == [("malformed", 89)]
    assert [k for k in seen if k[0] == "refilled"] == [("refilled", 69), ("refilled", 90)]
    assert max(runs) > 1
    one = ColumnarPool("t")
    for seq in range(num):
        one.apply(decode_columns(seq, PAYLOADS[seq]))
    assert got == state(one)
