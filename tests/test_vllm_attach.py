"""Attaching to vLLM through real ZMQ sockets on loopback, with frames recorded from vLLM 0.33.

`FixtureServer` plays `tests/data/vllm/vllm_zmq_frames.jsonl` byte for byte: the PUB frames
on an XPUB socket (wire-identical to PUB; it also tells us when the subscriber has joined,
so no test sleeps on PUB/SUB's slow join) and the replay replies on a ROUTER, in vLLM
0.33's four-frame layout or the older three-frame one. Every loop is bounded.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import pytest
import zmq

from _ports import free_ports  # noqa: F401  (tests/ is on sys.path; other test files import it from here)
from engine.core.errors import InputError
from engine.remote import AttachOptions, Attachment, StreamHealth, total_health
from engine.remote.pool import RemotePool
from engine.remote.wire import canonical_hash, decode_batch

DATA = Path(__file__).resolve().parent / "data" / "vllm"


def fixture_frames(rank: int, sock: str) -> list[list[bytes]]:
    out = []
    for line in (DATA / "vllm_zmq_frames.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["rank"] == rank and row["socket"] == sock:
            out.append([base64.b64decode(f) for f in row["frames"]])
    return out


def wait_for_subscriber(xpub, timeout: float = 10.0) -> None:
    """Until an XPUB socket hears a subscription (b"\\x01" + topic); unsubscriptions are skipped."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not xpub.poll(int(left * 1000) + 1):
            raise AssertionError("no subscriber joined")
        if xpub.recv_multipart()[0][:1] == b"\x01":
            return


class FixtureServer:
    """A vLLM server that only knows how to say what vLLM 0.33 once said."""

    def __init__(self, rank: int = 0, port: int | None = None, replay_port: int | None = None,
                 old_layout: bool = False, connect: str | None = None, endless_replay: bool = False) -> None:
        self.ctx = zmq.Context.instance()
        self.pub_frames = fixture_frames(rank, "pub")
        self.replay_frames = fixture_frames(rank, "replay")
        self.old_layout = old_layout
        self.endless_replay = endless_replay
        self.port = port or free_ports()
        self.replay_port = replay_port or free_ports()
        self.pub = self.ctx.socket(zmq.XPUB)
        if connect:
            self.pub.connect(connect)
        else:
            self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self.num_replay_requests = 0
        self.published = {0}  # batch 0 went out before any test subscriber joined
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def wait_joined(self, timeout: float = 10.0) -> None:
        wait_for_subscriber(self.pub, timeout)

    def send(self, frames: list[bytes], drop: bool = False) -> None:
        """Publish `frames` (`drop`: into the buffer only, as if lost on the way)."""
        if len(frames) == 3 and len(frames[1]) == 8:
            self.published.add(int.from_bytes(frames[1], "big"))
        if not drop:
            self.pub.send_multipart(frames)

    def _reply(self, frames: list[bytes]) -> list[bytes]:
        if self.old_layout:  # [b"", topic, seq, payload] -> [b"", seq, payload]
            return [frames[0], frames[2], frames[3]]
        return frames

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            client, _empty, start = self.router.recv_multipart()
            self.num_replay_requests += 1
            start_seq = int.from_bytes(start, "big")
            *batches, end = self.replay_frames
            if self.endless_replay:  # batch 0 over and over, never the end marker
                batches = batches[:1]
            while True:
                for frames in batches:
                    seq = int.from_bytes(frames[2], "big")
                    if seq >= start_seq and seq in self.published:
                        self.router.send_multipart([client, *self._reply(frames)])
                if not self.endless_replay or self._stop.is_set():
                    break
            self.router.send_multipart([client, *self._reply(end)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.pub.close(linger=0)
        self.router.close(linger=0)


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


class Collected:
    def __init__(self) -> None:
        self.batches: list[tuple[str, int]] = []
        self.notices: list[tuple[str, str]] = []
        self.events: list = []
        self.health: list = []

    def on_batch(self, pool, batch, events) -> None:
        self.batches.append((pool.source, batch.seq))
        self.events.extend(events)

    def on_notice(self, pool, kind, message) -> None:
        self.notices.append((kind, message))


def attach(server_or_endpoint, replay: str | None, **kw) -> tuple[Attachment, Collected]:
    """Attach and, with a replay socket, wait until the buffer fetched on joining (batch 0)
    is in, so what each test sends next arrives live."""
    got = Collected()
    endpoint = server_or_endpoint if isinstance(server_or_endpoint, str) else server_or_endpoint.endpoint
    att = Attachment(AttachOptions((endpoint,), (replay,) if replay else (), **kw),
                     on_batch=got.on_batch, on_notice=got.on_notice, on_health=got.health.append)
    att.events.subscribe(lambda e: None)
    att.start()
    if replay:
        wait_for(lambda: len(got.batches) >= len(att.pools), timeout=20)
    return att, got


H = canonical_hash  # fixture hashes as the pool keys them
A, B = H(1403909460543360175), H(1643945449041937783)
SALTED = (H(14725353451287653808), H(11679162194730534105))


@pytest.mark.parametrize("old_layout", [False, True])
def test_late_join_fetches_the_buffer_and_keeps_every_field(old_layout):
    server = FixtureServer(old_layout=old_layout)
    att, got = attach(server, server.replay_endpoint)
    try:
        server.wait_joined()
        for frames in server.pub_frames[:3]:  # seq 1..3; seq 0 went out before we joined
            server.send(frames)
        wait_for(lambda: len(got.batches) == 4)
        pool = att.pools[0]
        with att.lock:
            assert [s for _, s in got.batches] == [0, 1, 2, 3]
            assert set(pool.tiers["GPU"]) == {A, *SALTED} and set(pool.tiers["CPU"]) == {B}
            assert pool.tiers["GPU"][SALTED[1]].tenant == "tenant-a"  # inherited from block 0
            assert pool.tiers["CPU"][B].token_ids == tuple(range(17, 33))
        h = att.subscribers[0].health
        assert (h.batches, h.refilled, h.missed, h.malformed, h.restarts) == (4, 1, 0, 0, 0)
        assert got.health[-1] == h and got.health[-1] is not h  # copies, for another thread to keep
        assert [x.batches for x in got.health] == [1, 1, 2, 3, 4] and h.lag_s is not None
        stored = [e for e in got.events if e.kind == "block_stored"]
        first = next(e for e in stored if e.remote.session_id == "sess-1")
        assert (first.remote.group_idx, first.remote.kv_cache_spec_kind, first.remote.medium) == (0, "full_attention", "GPU")
        assert first.block_hash.hex() == "16d077ad0843c577" and first.parent_hash == A
        salted = [e for e in stored if e.salt == "tenant-a"]
        assert [e.block_hash for e in salted] == list(SALTED) and salted[0].remote.extra_keys == (("tenant-a",), None)
        cpu = next(e for e in stored if e.remote.medium == "CPU")
        assert cpu.remote.locality == "LOCAL"
        server.send(server.pub_frames[3])  # AllBlocksCleared
        wait_for(lambda: len(got.batches) == 5)
        with att.lock:
            assert pool.num_cached == 0 and pool.removal_of(A) is not None
    finally:
        att.stop()
        att.stop()  # twice is harmless (the app stops on detach and on errors)
        server.close()


def test_a_gap_is_refilled_and_what_the_server_lost_is_missed():
    server = FixtureServer()
    att, got = attach(server, server.replay_endpoint)
    try:
        server.wait_joined()
        server.send(server.pub_frames[0])  # seq 1
        server.send(server.pub_frames[1], drop=True)  # seq 2 never reaches us
        server.send(server.pub_frames[2])  # seq 3: refills 2
        wait_for(lambda: len(got.batches) == 4)
        assert [s for _, s in got.batches] == [0, 1, 2, 3]
        assert att.subscribers[0].health.refilled == 2 and att.subscribers[0].health.missed == 0
        assert any(kind == "refilled" for kind, _ in got.notices)
    finally:
        att.stop()
        server.close()
    # Without a replay socket the same stream loses batches 0 and 2: counted, never 0.
    server = FixtureServer()
    att, got = attach(server, None)
    try:
        server.wait_joined()
        server.send(server.pub_frames[0])
        server.send(server.pub_frames[2])
        wait_for(lambda: len(got.batches) == 2)
        h = att.subscribers[0].health
        assert (h.batches, h.missed, h.last_seq) == (2, 2, 3)
    finally:
        att.stop()
        server.close()


def test_a_restart_starts_a_fresh_pool():
    server = FixtureServer()
    att, got = attach(server, server.replay_endpoint)
    try:
        server.wait_joined()
        for frames in server.pub_frames[:3]:
            server.send(frames)
        wait_for(lambda: len(got.batches) == 4)
        topic = server.pub_frames[0][0]
        batch0 = server.replay_frames[0][3]
        server.send([topic, (0).to_bytes(8, "big"), batch0])  # seq 0 again: the server started over
        server.send(server.pub_frames[0])
        wait_for(lambda: att.subscribers[0].health.restarts == 1 and [s for _, s in got.batches][-2:] == [0, 1])
        with att.lock:
            assert set(att.pools[0].cached_hashes()) == {A, B}  # batches 0 and 1 of the new server
        assert any(kind == "restart" for kind, _ in got.notices)
        assert any(e.kind == "cache_reset" for e in got.events)
    finally:
        att.stop()
        server.close()


def test_one_lower_number_is_no_restart_but_a_run_of_them_is():
    """A restarted server whose batch 0 went before we reconnected sends 1, 2, 3 below our
    last: three in a row are a restart (batch 0 refilled from its replay socket); one
    forged lower number is malformed and changes nothing."""
    server = FixtureServer()
    att, got = attach(server, server.replay_endpoint)
    try:
        server.wait_joined()
        for frames in server.pub_frames[:3]:
            server.send(frames)
        wait_for(lambda: len(got.batches) == 4)
        server.send(server.pub_frames[0])  # seq 1 alone: forged
        topic, _, payload = server.pub_frames[2]
        server.send([topic, (4).to_bytes(8, "big"), payload])  # the stream goes on
        wait_for(lambda: att.subscribers[0].health.last_seq == 4)
        h = att.subscribers[0].health
        assert (h.restarts, h.malformed, h.missed) == (0, 1, 0)
        for frames in server.pub_frames[:3]:  # 1, 2, 3: the server started over
            server.send(frames)
        wait_for(lambda: att.subscribers[0].health.restarts == 1 and att.subscribers[0].health.last_seq == 3)
        assert [s for _, s in got.batches][-4:] == [0, 1, 2, 3]  # batch 0 from the replay socket
        fresh = RemotePool("fresh")
        for frames in server.replay_frames[:4]:
            fresh.apply(decode_batch(int.from_bytes(frames[2], "big"), frames[3]))
        with att.lock:
            assert att.pools[0].cached_hashes() == fresh.cached_hashes() and fresh.num_cached > 0
    finally:
        att.stop()
        server.close()


def test_garbage_is_counted_and_skipped_without_moving_the_sequence():
    server = FixtureServer()
    att, got = attach(server, server.replay_endpoint)
    try:
        server.wait_joined()
        topic, _, payload = server.pub_frames[0]
        server.send(server.pub_frames[0])
        server.send([topic, b"\x00\x02", payload])  # a sequence frame of 2 bytes
        server.send([topic, (2).to_bytes(8, "big"), b"\xc1 not msgpack"])  # an undecodable payload
        server.send([topic, (2**63 - 7).to_bytes(8, "big"), b"\x93"])  # a wild sequence number
        server.send([topic, (2).to_bytes(8, "big"), b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x91\x81\xa4type\x07\x00"])
        server.send([topic])  # one frame
        server.send(server.pub_frames[1])  # the real seq 2
        server.send(server.pub_frames[2])
        wait_for(lambda: len(got.batches) == 4)
        h = att.subscribers[0].health
        assert [s for _, s in got.batches] == [0, 1, 2, 3]
        assert (h.malformed, h.missed, h.last_seq) == (5, 0, 3)
    finally:
        att.stop()
        server.close()


def test_bind_for_a_server_that_connects():
    port = free_ports()
    got = Collected()
    att = Attachment(AttachOptions((f"tcp://*:{port}",), bind=True), on_batch=got.on_batch).start()
    server = FixtureServer(connect=f"tcp://127.0.0.1:{port}")
    try:
        server.wait_joined()
        for frames in server.pub_frames:
            server.send(frames)
        wait_for(lambda: len(got.batches) == 4)
        assert att.subscribers[0].health.missed == 1  # batch 0 only the replay had
    finally:
        att.stop()
        server.close()


def test_data_parallel_ranks_get_one_pool_each_and_a_combined_view():
    port, replay = free_ports(2), free_ports(2)
    servers = [FixtureServer(rank=r, port=port + r, replay_port=replay + r) for r in (0, 1)]
    att, got = attach(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}", data_parallel_size=2)
    try:
        for s in servers:
            s.wait_joined()
        servers[0].send(servers[0].pub_frames[0])
        servers[1].send(servers[1].pub_frames[0])
        wait_for(lambda: len(got.batches) == 4)
        with att.lock:
            r0, r1 = att.pools
            assert (r0.rank, r1.rank) == (0, 1) and r1.source.endswith("rank 1")
            digests = {bytes.fromhex("7b255da405e1d722823892e4fef187b4d8ac78215d7f0dd2137bb037547f4caf"),
                       bytes.fromhex("8e717becdc2054b7a3223b7b844f462c0db0ac86287b752b16d077ad0843c577")}
            assert r1.cached_hashes() == digests and r0.cached_hashes() == {A, B}
            assert att.combined.num_cached == 4
            # rank 0 names the blocks by their 8-byte tails, rank 1 by the digests: one block each way
            assert len(att.combined.find(next(iter(digests)))) == 2
        ranks = {e.remote.rank for e in got.events}
        assert ranks == {0, 1}
    finally:
        att.stop()
        for s in servers:
            s.close()


def test_options_round_trip_through_json():
    opts = AttachOptions(("tcp://10.0.0.5:5557",), ("tcp://10.0.0.5:5558",), "kv-events", 4, False, 1.5)
    assert AttachOptions.from_dict(json.loads(json.dumps(opts.to_dict()))) == opts
    assert [s.endpoint for s in opts.streams()][-1] == "tcp://10.0.0.5:5560"
    assert [s.replay_endpoint for s in opts.streams()][-1] == "tcp://10.0.0.5:5561"
    with pytest.raises(InputError):
        AttachOptions.from_dict({"endpoints": ["tcp://10.0.0.5:5557"], "data_parallel_size": "2"})


def test_total_health_adds_the_counts_and_keeps_the_freshest_lag():
    a = StreamHealth("r0", 0, batches=4, refilled=1, missed=2, malformed=0, restarts=1, last_seq=3, lag_s=0.5)
    b = StreamHealth("r1", 1, batches=6, refilled=0, missed=1, malformed=2, restarts=0, last_seq=5, lag_s=0.2,
                     last_error="bad frame")
    total = total_health([a, b], "vLLM")
    assert (total.batches, total.refilled, total.missed, total.malformed, total.restarts) == (10, 1, 3, 2, 1)
    assert total.lag_s == 0.2 and total.last_error == "bad frame" and total.last_seq is None
    assert total_health([], "vLLM") == StreamHealth("vLLM")


def test_bad_options_are_one_sentence():
    with pytest.raises(InputError, match="65535"):
        AttachOptions(("tcp://127.0.0.1:999999",))
    with pytest.raises(InputError, match="wildcard"):
        AttachOptions(("tcp://*:5557",))
    with pytest.raises(InputError, match="past port 65535"):
        AttachOptions(("tcp://127.0.0.1:65535",), data_parallel_size=2)
    with pytest.raises(InputError, match="not a ZMQ endpoint"):
        AttachOptions(("localhost:5557",))
    with pytest.raises(InputError, match="must differ"):
        AttachOptions(("tcp://127.0.0.1:5557",), ("tcp://127.0.0.1:5557",))
    port = free_ports()
    holder = zmq.Context.instance().socket(zmq.PUB)
    holder.bind(f"tcp://127.0.0.1:{port}")
    try:
        with pytest.raises(InputError, match="cannot bind"):
            Attachment(AttachOptions((f"tcp://127.0.0.1:{port}",), bind=True)).start()
    finally:
        holder.close(linger=0)


def test_an_endless_replay_socket_is_cut_at_the_refill_timeout():
    server = FixtureServer(endless_replay=True)
    att, got = attach(server, server.replay_endpoint, refill_timeout=0.5)
    try:
        server.wait_joined()
        server.send(server.pub_frames[0])
        wait_for(lambda: any(s == 1 for _, s in got.batches), timeout=20)
        assert any(kind == "refill_timeout" for kind, _ in got.notices)
        assert [s for _, s in got.batches] == [0, 1]
    finally:
        att.stop()
        server.close()


def test_a_frame_past_the_size_limit_is_never_read_whole():
    server = FixtureServer()
    att, got = attach(server, server.replay_endpoint, max_frame_bytes=4096)
    try:
        server.wait_joined()
        topic, seq, _ = server.pub_frames[0]
        server.pub.send_multipart([topic, seq, b"\x00" * 100_000])  # ZMQ drops the connection instead
        # The subscriber connects again; until it has, PUB drops what is sent (bounded retries).
        for _ in range(200):
            server.send(server.pub_frames[0])
            if len(got.batches) == 2:
                break
            time.sleep(0.05)
        wait_for(lambda: [s for _, s in got.batches] == [0, 1])
        assert att.subscribers[0].num_reconnects >= 1 and any(k == "reconnected" for k, _ in got.notices)
    finally:
        att.stop()
        server.close()


def test_attaching_before_the_server_is_up():
    port, replay_port = free_ports(), free_ports()
    got = Collected()
    att = Attachment(AttachOptions((f"tcp://127.0.0.1:{port}",), (f"tcp://127.0.0.1:{replay_port}",),
                                   refill_timeout=0.5), on_batch=got.on_batch, on_notice=got.on_notice).start()
    try:
        time.sleep(1.0)  # the replay socket has been asked and did not answer
        server = FixtureServer(port=port, replay_port=replay_port)
        try:
            wait_for(lambda: [s for _, s in got.batches] == [0], timeout=20)  # asked again, answered
            server.wait_joined()
            server.send(server.pub_frames[0])
            wait_for(lambda: [s for _, s in got.batches] == [0, 1])
            assert not any(kind == "refill_timeout" for kind, _ in got.notices)
        finally:
            server.close()
    finally:
        att.stop()


def test_the_status_bar_gives_a_lag_in_the_unit_that_reads():
    from app.runtime.remote import lag_text, status_text

    assert [lag_text(s) for s in (0.25, 45, 600, 163_962, 3 * 86_400)] == ["250 ms", "45.0 s", "10.0 min", "45.5 h", "3.0 d"]
    line = status_text(StreamHealth("r0", 0, batches=1_783, lag_s=163_962.0))
    assert line == "vLLM · 1,783 batches · 0 missed · lag 45.5 h"
    assert status_text(StreamHealth("r0", 0)).endswith("lag —")


def test_the_status_bar_names_refilled_and_malformed_batches_once_there_are_any():
    from app.runtime.remote import status_text

    health = StreamHealth("r0", 0, batches=9, refilled=2, missed=1, malformed=3, lag_s=0.25)
    assert status_text(health) == "vLLM · 9 batches · 2 refilled · 1 missed · 3 malformed · lag 250 ms"
    assert status_text(StreamHealth("r0", 0, batches=9), full=True) == \
        "vLLM · 9 batches · 0 refilled · 0 missed · 0 malformed · lag —"
