"""One vLLM KV-event stream over ZMQ: the SUB socket, the replay refill, the sequence rules.

`VllmSubscriber` owns its sockets and one background thread. It hands each batch, in
sequence order, to `on_batch`, refills gaps from the replay socket, counts what it could
not get (`missed`), what it could not read (`malformed`), and server restarts; none of
these stops it. Health is a plain `StreamHealth`. No Qt here.

A replay answer is read to its end marker however long it takes; `refill_timeout` bounds
silence, not the answer. One cut short is asked again from the first batch still missing;
only batches the server's answer skips (it no longer buffers them) are missed.

No single frame can steer the sequence (DESIGN 9, issue 24): a number far past what the
stream could have produced since its last batch (`MAX_BATCHES_PER_S`) is malformed, not a
gap; only a return to 0 is a restart (or `RESTART_RUN` consecutive numbers below the last,
which a restarted server whose batch 0 was lost sends and one forged frame cannot); a
replay answer is checked against what was asked, and what it sends out of order is held
and delivered, never counted as missed; the topic must equal `topic` exactly (ZMQ only
matches its prefix). With `demux`, one bound socket carries many servers (llm-d's
centralized mode): each topic `kv@<pod>@<model>` is a stream of its own, with its own
sequence, gaps and restarts.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from engine.core.errors import InputError
from engine.core.threads import lower_priority
from engine.remote.fleet import server_of_topic
from engine.remote.receive import QueuedMessages
from engine.remote.wire import MalformedFrame, VllmBatch, parse_pub, parse_replay, seq_frame

_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]*\]|[^:/\[\]]+):(?P<port>[^:/]+)$")
# vLLM numbers batches one by one from 0, one per engine step (milliseconds at least). A
# first number past MAX_FIRST_SEQ, or a jump past what MAX_BATCHES_PER_S could have sent
# since the last batch, is a corrupt or forged frame, not a gap.
MAX_FIRST_SEQ = 1 << 40
MAX_BATCHES_PER_S = 100_000
# Consecutive live numbers below the last one that make a restart without a batch 0.
RESTART_RUN = 3
# What an out-of-order replay answer may hold back before the lowest is delivered.
MAX_PENDING_REPLIES = 1024
MAX_PENDING_BYTES = 256 << 20
# Streams one bound socket may carry (llm-d's centralized mode: one per pod).
MAX_TOPIC_STREAMS = 4096
DEFAULT_MAX_FRAME_BYTES = 64 << 20
# One replay answer is at most the server's buffer (vLLM keeps 10,000 batches by default);
# one that runs past this many frames is not a vLLM server's, and is cut short.
MAX_REPLAY_FRAMES = 1 << 20
# Live frames read in one run before the monitor, the stop flag and the join are looked at
# again (a ZMQ disconnect is noticed at most this many frames late; `_reconnect` reads what
# is queued before it disconnects anyway), and the frame bytes a run reads at most.
DRAIN_FRAMES = 256
DRAIN_BYTES = 4 << 20


def check_endpoint(endpoint: str, bind: bool = False) -> str:
    """`endpoint` if ZMQ can use it (tcp with a port 1-65535, ipc, inproc); else InputError."""
    if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise InputError(f"{endpoint!r} is not a ZMQ endpoint such as tcp://127.0.0.1:5557")
    if endpoint.startswith("tcp://"):
        m = _TCP.match(endpoint)
        if m is None:
            raise InputError(f"{endpoint!r} is not host:port, as in tcp://127.0.0.1:5557")
        port = m.group("port")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise InputError(f"{endpoint!r}: the port must be a number from 1 to 65535")
        if m.group("host") == "*" and not bind:
            raise InputError(f"{endpoint!r} is a wildcard: connect to the server's address "
                             "(tcp://HOST:PORT), or bind it with --bind")
    elif len(endpoint) <= len("ipc://"):
        raise InputError(f"{endpoint!r} names no socket")
    return endpoint


def endpoint_for_rank(endpoint: str, rank: int) -> str:
    """The endpoint data-parallel rank `rank` uses: vLLM adds the rank to a tcp port and
    appends `_dp{rank}` to an ipc or inproc path."""
    if rank == 0:
        return endpoint
    m = _TCP.match(endpoint)
    if m is not None:
        port = int(m.group("port")) + rank
        if port > 65535:
            raise InputError(f"{endpoint!r} + rank {rank} is past port 65535")
        return f"tcp://{m.group('host')}:{port}"
    return f"{endpoint}_dp{rank}"


@dataclass(slots=True)
class StreamHealth:
    """What a stream has delivered and lost. `lag_s` is now minus the last batch's server
    time (clock skew included); `refilled` counts batches fetched from the replay socket."""

    source: str
    rank: int = 0
    batches: int = 0
    refilled: int = 0
    missed: int = 0
    malformed: int = 0
    restarts: int = 0
    last_seq: int | None = None
    lag_s: float | None = None
    last_error: str | None = None

    def copy(self) -> StreamHealth:
        return dataclasses.replace(self)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def total_health(streams: list[StreamHealth], source: str = "all streams") -> StreamHealth:
    """Several streams' health as one (what a status bar shows for every rank): the counts
    add up, `lag_s` is the freshest stream's, `last_error` the last stream's that has one;
    `last_seq` stays None, as each stream numbers its own batches."""
    total = StreamHealth(source)
    for s in streams:
        total.batches += s.batches
        total.refilled += s.refilled
        total.missed += s.missed
        total.malformed += s.malformed
        total.restarts += s.restarts
        total.last_error = s.last_error or total.last_error
    lags = [s.lag_s for s in streams if s.lag_s is not None]
    total.lag_s = min(lags) if lags else None
    return total


def recv_parts(sock, flags: int = 0) -> list[bytes]:
    """`sock.recv_multipart(flags)`, with each part's `more` flag read off its frame: pyzmq's
    recv_multipart asks `getsockopt(RCVMORE)` after every part, which builds an enum each time
    (a third of the receive's CPU for a vLLM frame of three parts)."""
    frame = sock.recv(flags, copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = sock.recv(flags, copy=False)
        parts.append(frame.bytes)
    return parts


def read_queued(sock, messages: list[list[bytes]], max_messages: int, max_bytes: int) -> int:
    """Append the messages queued on `sock` to `messages`, each as `recv_parts` reads it, up
    to `max_messages` or until their last parts reach `max_bytes`; how many were appended.
    The three receives of a vLLM frame are most of it (a zmq Frame each, ~0.6-1 us: its
    `more` is the cheap way to know a message's end; `getsockopt(RCVMORE)` costs ~1.3 us)."""
    from zmq import NOBLOCK, Again

    recv = sock.recv
    num, num_bytes = 0, 0
    try:
        while num < max_messages and num_bytes < max_bytes:
            frame = recv(NOBLOCK, copy=False)
            parts = [frame.bytes]
            while frame.more:  # the parts of a message are queued together: never Again here
                frame = recv(NOBLOCK, copy=False)
                parts.append(frame.bytes)
            messages.append(parts)
            num_bytes += len(parts[-1])
            num += 1
    except Again:
        pass
    return num


def _numbered(frames: list[bytes], topic: bytes, seq: int) -> bool:
    """Whether a PUB message is three frames, of `topic` (any, if empty), numbered `seq`."""
    return (len(frames) == 3 and len(frames[1]) == 8 and (not topic or frames[0] == topic)
            and int.from_bytes(frames[1], "big", signed=True) == seq)


class VllmSubscriber:
    """Subscribes to one vLLM endpoint (one rank) on a background thread.

    Callbacks run on that thread: `on_batch(batch)` for each batch in sequence order,
    `on_restart(seq)` before the first batch of a restarted server (the caller starts a
    fresh pool), `on_notice(kind, message)` for refills, misses and malformed frames, and
    `on_health(health)` after each of these with a copy of the counters, and `on_idle()`
    once the frames queued on its sockets are all handled, before it blocks waiting for
    more (and once more when it stops): a consumer that holds batches to apply many at
    once applies them there, so nothing it holds waits for the next frame. With
    `on_batches(batches)` and no `on_health`, queued live batches that simply follow on
    are handed over as one list, in order, instead of one `on_batch` each.
    `refill_timeout` is the longest silence (no frame) of the replay socket in one answer.

    `demux(topic)` (bind mode, llm-d's centralized mode) makes the stream of a topic of the
    form `kv@<pod>@<model>` the first time one arrives, a socket-less subscriber
    (`socket=False`) this one feeds from its thread; other topics are this stream's own.
    """

    def __init__(self, endpoint: str, on_batch: Callable[[VllmBatch], None], *, replay_endpoint: str | None = None,
                 topic: str = "", bind: bool = False, rank: int = 0, source: str | None = None,
                 on_restart: Callable[[int], None] | None = None,
                 on_notice: Callable[[str, str], None] | None = None,
                 on_health: Callable[[StreamHealth], None] | None = None,
                 refill_timeout: float = 2.0, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 clock: Callable[[], float] = time.time,
                 demux: Callable[[bytes], VllmSubscriber | None] | None = None, socket: bool = True,
                 decode: Callable[[int, bytes], object] | None = None,
                 on_idle: Callable[[], None] | None = None,
                 on_batches: Callable[[list], None] | None = None, nice: int = 0,
                 on_frames: Callable[[int, list[bytes]], None] | None = None) -> None:
        check_endpoint(endpoint, bind)
        if replay_endpoint is not None:
            check_endpoint(replay_endpoint)
        if not refill_timeout > 0 or refill_timeout == float("inf"):
            raise InputError("the refill timeout must be a positive number of seconds")
        import zmq  # imported here so that decoding recorded batches needs no ZMQ

        self._zmq = zmq
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.bind = bind
        self.on_batch = on_batch
        self.on_batches = on_batches
        self.on_restart = on_restart
        self.on_notice = on_notice
        self.on_health = on_health
        self.on_idle = on_idle
        # the payloads of the batches about to be delivered (the first's seq, then each, in
        # order): what `attach --record` keeps (`engine.analysis.remote_capture`)
        self.on_frames = on_frames
        self._busy = False  # a batch was delivered since `on_idle` was last called
        self.refill_timeout = refill_timeout
        self.max_frame_bytes = max_frame_bytes
        self.clock = clock
        self.health = StreamHealth(source or endpoint, rank)
        # The last seq seen on the PUB socket itself: PUB delivers in order, so only a lower
        # number there means a restart (replayed batches may run ahead of queued live ones).
        self._live_seq: int | None = None
        self._last_at = time.monotonic()  # when the last batch was delivered
        self._low: list[list[bytes]] = []  # live frames below the last seq: a restart, if RESTART_RUN in a row
        self._held: deque[list[bytes]] = deque()  # live frames read, not handled yet
        self._demux = demux
        self.streams: dict[bytes, VllmSubscriber] = {}  # demux: topic -> its stream
        self.num_other_topics = 0  # frames whose topic only began with ours (ZMQ's prefix match)
        self._stop = threading.Event()
        # The fast reader's compiled skim, before any socket buffers frames: about 0.6 s
        # from the disk cache, once per process (15 s the first time on a new machine).
        # Imported here, not with this module, so numba loads with the first subscriber
        # and not with the app's window.
        from engine.remote import fastwire

        fastwire.warm_up()
        # `decode(seq, payload)` makes what `on_batch` gets: a VllmBatch by default, or
        # `fastwire.decode_columns`' ColumnarBatch for a columnar pool
        self._decode = decode or fastwire.decode_batch
        # a run of frames in one call when the decoder is fastwire's columns (`_follow_on`)
        self._decode_run = fastwire.decode_columns_many if self._decode is fastwire.decode_columns else None
        self.nice = nice  # its thread's priority below the starter's (`engine.core.threads`): a window's GUI thread
        self._ctx = zmq.Context.instance()
        self.num_reconnects = 0
        self._thread = threading.Thread(target=self._run, name=f"vllm-sub {endpoint}", daemon=True)
        self._sub = None
        self._monitor = None
        self._receiver = None  # the compiled receive of the SUB socket (`engine.remote.receive`), where it runs
        if not socket:  # a stream fed by another subscriber's socket (demux)
            return
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        try:
            if bind:
                self._sub.bind(endpoint)
            else:
                self._sub.connect(endpoint)
        except zmq.ZMQError as exc:
            self._sub.close(linger=0)
            raise InputError(f"cannot {'bind' if bind else 'connect to'} {endpoint}: {exc}") from None
        # A frame past MAXMSGSIZE makes ZMQ drop the connection and not come back; watching
        # for disconnects lets us connect again, so one oversized frame never ends the stream.
        self._monitor = None if bind else self._sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        from engine.remote import receive

        if receive.warm_up():  # (loaded from numba's cache once per process, as the skim above)
            self._receiver = receive.Receiver(self._sub)

    @property
    def last_seq(self) -> int | None:
        return self.health.last_seq

    def start(self) -> VllmSubscriber:
        if self._sub is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and close the sockets; calling it again does nothing."""
        self._stop.set()
        if self._sub is None or self._sub.closed:
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self._monitor is not None:
            self._sub.disable_monitor()
            self._monitor.close(linger=0)
        if self._receiver is not None and not self._thread.is_alive():
            self._receiver.close()  # (a thread that did not stop may still be reading with it)
        self._sub.close(linger=0)

    # ---- the sequence rules ----------------------------------------------------------

    def handle(self, frames: list[bytes]) -> None:
        """One PUB message. Public so tests and recorded captures can drive the rules."""
        try:
            topic, seq, payload = parse_pub(frames)
        except MalformedFrame as exc:
            self._malformed(str(exc))
            return
        if self._demux is not None and server_of_topic(topic) is not None:
            self._route(topic, frames)
            return
        if topic != self.topic and self.topic:
            self.num_other_topics += 1  # ZMQ matched a prefix of ours: another stream's frame
            return
        last = self.health.last_seq
        if last is None and seq > MAX_FIRST_SEQ:
            self._malformed(f"the first sequence number {seq} is past any a server reaches ({MAX_FIRST_SEQ})")
            return
        if last is not None and seq - last > self._max_jump():
            self._malformed(f"sequence {seq} jumps {seq - last} past {last}, more than the stream could have "
                            "sent since its last batch")
            return
        live = self._live_seq
        if last is not None and seq <= last:
            # vLLM numbers from 0 again only when the server restarted: its pool is gone. PUB
            # delivers in order, so only a number below a live one tells (replayed batches
            # may run ahead of live ones still queued).
            if seq == 0 and live is not None:
                self._drop_low(last)
                self._restart(last, seq)
                last = None
            elif live is not None and seq < live and self._low_run(frames, seq, last):
                held, self._low = self._low, []
                self._restart(last, seq)
                for frames_ in held[:-1]:  # the run that showed the restart, oldest first
                    self.handle(frames_)
                last = self.health.last_seq
            else:
                return  # already delivered from the replay socket, or held as a possible restart
        elif self._low:
            self._drop_low(last)
        expected = 0 if last is None else last + 1
        if seq > expected and not self._refill(expected, seq):
            return  # stopping: the gap is neither filled nor missed
        if self._deliver(seq, payload):
            self._live_seq = seq

    def _max_jump(self) -> int:
        """The furthest a stream can have numbered on since its last batch was delivered."""
        return int(MAX_BATCHES_PER_S * (time.monotonic() - self._last_at + 1.0))

    def _low_run(self, frames: list[bytes], seq: int, last: int) -> bool:
        """Hold a live frame numbered below the last; True once RESTART_RUN in a row came
        (each one more than the one before): a restarted server whose batch 0 was lost."""
        if self._low and parse_pub(self._low[-1])[1] + 1 != seq:
            self._drop_low(last)
        self._low.append(frames)
        return len(self._low) >= RESTART_RUN

    def _drop_low(self, last: int) -> None:
        """Held numbers below the last that no restart followed: forged or corrupt frames."""
        for frames in self._low:
            self._malformed(f"sequence {parse_pub(frames)[1]} went back below {last} without returning to 0")
        self._low = []

    def _restart(self, last: int, seq: int) -> None:
        self.health.restarts += 1
        self.health.last_seq = None
        self._live_seq = None
        self._notice("restart", f"{self.endpoint}: the sequence went from {last} back to {seq}: "
                                "the server restarted; starting a fresh pool")
        if self.on_restart is not None:
            self.on_restart(seq)

    def _route(self, topic: bytes, frames: list[bytes]) -> None:
        """A frame of one pod's topic on a shared (bound) socket, to that pod's stream."""
        stream = self.streams.get(topic)
        if stream is None:
            if len(self.streams) >= MAX_TOPIC_STREAMS:
                self._malformed(f"more than {MAX_TOPIC_STREAMS} topics on one socket")
                return
            stream = self._demux(topic) if self._demux is not None else None
            if stream is None:
                self.num_other_topics += 1
                return
            self.streams[topic] = stream
        stream.handle(frames)

    def _deliver(self, seq: int, payload: bytes, replayed: bool = False) -> bool:
        try:
            batch = self._decode(seq, payload)
        except MalformedFrame as exc:
            # The sequence does not move on: a corrupt frame's number cannot be trusted.
            self._malformed(str(exc))
            return False
        if self.on_frames is not None:
            self.on_frames(seq, [payload])
        self.on_batch(batch)
        if replayed:
            self.health.refilled += 1
        self._count(seq, batch.ts, 1)
        self._report()
        return True

    def _count(self, seq: int, ts: float, num: int) -> None:
        """`num` batches delivered, the last numbered `seq` and sent at `ts`."""
        self._busy = True
        h = self.health
        h.batches += num
        h.last_seq = seq
        h.lag_s = self.clock() - ts
        self._last_at = time.monotonic()

    def _refill(self, start: int, upto: int) -> bool:
        """Fetch batches `start..upto-1` from the replay socket, asking again from the first
        one still missing while each answer brings new batches; count what stays missing.
        False only when stopping (nothing is counted then)."""
        got = 0
        answer = None
        while self.replay_endpoint is not None and start < upto:
            answer = self._fetch(start, upto)
            got += answer.num_delivered
            start = answer.next_seq
            if self._stop.is_set():
                return False
            if answer.complete or start >= upto or not answer.can_ask_again:
                break
        if got:
            self._notice("refilled", f"{self.endpoint}: refilled {got} batch(es) from the replay socket")
        lost = upto - start
        if lost > 0:
            if self.replay_endpoint is None:
                why = "no replay socket"
            elif answer.complete:
                why = "the server no longer buffers them"
            elif answer.num_frames == 0:
                why = f"the replay socket sent nothing for {self.refill_timeout:g} s"
            else:
                why = "the replay answer was cut short"
            self.health.missed += lost
            self.health.last_seq = upto - 1  # what is missed stays missed; the stream goes on
            self._notice("missed", f"{self.endpoint}: {lost} batch(es) before {upto} are lost ({why})")
        return True

    def _fetch_buffer(self) -> bool:
        """On joining, fetch everything the server still buffers, so an idle server's pool
        shows at once, asking again from the first batch still missing while each answer
        brings new ones. False when the replay socket did not answer (it is asked again)."""
        start = 0 if self.health.last_seq is None else self.health.last_seq + 1
        got = 0
        num_missed = self.health.missed
        while True:
            answer = self._fetch(start, None)
            got += answer.num_delivered
            start = answer.next_seq
            if answer.complete or self._stop.is_set() or not answer.can_ask_again:
                break
        if got:
            self._notice("refilled", f"{self.endpoint}: fetched {got} buffered batch(es) from the replay socket")
        if got or self.health.missed != num_missed:
            self._report()
        return answer.complete or answer.num_frames > 0

    def _fetch(self, start: int, upto: int | None) -> _Answer:
        """Ask the replay socket once, from `start`, and deliver its batches in order (below
        `upto`, which the live stream has). Batches the answer skips are missed: the server
        no longer buffers them.

        The wait is on silence (no frame for `refill_timeout`), never on the whole answer,
        and it does not count the time `on_batch` takes, so a slow consumer gets what a
        fast one gets. An answer is at most the server's buffer; one that keeps sending
        without bringing a new batch, or past `MAX_REPLAY_FRAMES`, is cut short, so a
        replay socket that never ends does not hold the live stream hostage."""
        zmq = self._zmq
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes)
        answer = _Answer(start)
        # Joining, the first live frame tells where the answer can stop; it is kept for `_run`.
        peek = upto is None and not self._held
        if upto is None and self._held:
            upto = self._held_seq()
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart((b"", seq_frame(start)))
            quiet_since = progress_at = time.monotonic()
            while not self._stop.is_set():
                if peek and self._sub.poll(0):
                    self._held.append(recv_parts(self._sub))
                    peek = False
                    upto = self._held_seq()  # the answer is complete once it reaches this
                if not sock.poll(int(min(self.refill_timeout, 0.1) * 1000) + 1):
                    if time.monotonic() - quiet_since >= self.refill_timeout:
                        # Asking again is worth it only if this answer brought something new.
                        answer.can_ask_again = answer.num_delivered > 0
                        if answer.num_frames:  # silence is a server not up yet; this one stopped
                            then = (f"asking again from {answer.next_seq}" if answer.can_ask_again
                                    else "refill cut short")
                            self._notice("refill_timeout", f"{self.replay_endpoint}: no frame for "
                                         f"{self.refill_timeout:g} s after {answer.num_delivered} new batch(es); "
                                         f"{then}")
                        break
                    continue
                frames = recv_parts(sock)
                answer.num_frames += 1
                if self._take_reply(frames, answer, upto):
                    break
                quiet_since = time.monotonic()  # after on_batch returned: its time is not silence
                if answer.delivered_last:
                    progress_at = quiet_since
                elif quiet_since - progress_at >= self.refill_timeout:
                    self._notice("refill_timeout", f"{self.replay_endpoint}: {self.refill_timeout:g} s of "
                                                   "frames without a new batch; refill cut short")
                    break
                if answer.num_frames >= MAX_REPLAY_FRAMES:
                    self._notice("refill_timeout", f"{self.replay_endpoint}: the answer ran past "
                                                   f"{MAX_REPLAY_FRAMES} frames; refill cut short")
                    break
        finally:
            sock.close(linger=0)
        if not self._stop.is_set():
            self._flush(answer)
        return answer

    def _take_reply(self, frames: list[bytes], answer: _Answer, upto: int | None) -> bool:
        """One replay frame into `answer`; True when the answer is complete."""
        answer.delivered_last = False
        try:
            reply = parse_replay(frames)
        except MalformedFrame as exc:
            self._malformed(str(exc))
            return False
        if reply is None:
            answer.complete = True
            return True
        seq, payload = reply
        # Checked before the live frame's number ends the answer: one forged reply far past
        # it must not end the answer there and leave the batches after it unread.
        if seq > self._reply_bound(answer, upto):
            self._malformed(f"replayed sequence {seq} is past anything the stream could have sent "
                            f"(asked from {answer.asked})")
            return False
        if upto is not None and seq >= upto:
            answer.complete = True
            return True  # the live stream has these
        if seq < answer.asked:
            self._malformed(f"the replay socket answered batch {seq} to a request from {answer.asked}")
            return False
        if seq < answer.next_seq or seq in answer.pending:
            return False  # already delivered or held (vLLM's answer only goes forward)
        if seq > answer.next_seq:
            # Held until the answer ends or fills the gap: vLLM answers in order, so what it
            # skips it no longer has, but a batch an answer sends late is still delivered.
            answer.pending[seq] = payload
            answer.pending_bytes += len(payload)
            while len(answer.pending) > MAX_PENDING_REPLIES or answer.pending_bytes > MAX_PENDING_BYTES:
                self._deliver_pending(answer, min(answer.pending))
            answer.delivered_last = True
            return False
        self._deliver_replayed(answer, seq, payload)
        self._drain(answer)
        return False

    def _reply_bound(self, answer: _Answer, upto: int | None) -> int:
        """The highest number a replay answer can honestly send: what the stream could have
        numbered since the batch the answer is at, or (a first join from 0, nothing known
        yet) `MAX_FIRST_SEQ`; and never far past the live frame `upto`, when one is known."""
        bound = MAX_FIRST_SEQ if self.health.last_seq is None and answer.asked == 0 else \
            answer.next_seq + self._max_jump()
        if upto is not None:
            bound = min(bound, upto + self._max_jump())
        return bound

    def _deliver_replayed(self, answer: _Answer, seq: int, payload: bytes) -> None:
        if self._deliver(seq, payload, replayed=True):
            answer.num_delivered += 1
            answer.delivered_last = True
        # A malformed batch is skipped: the server sent it and will send it no better.
        answer.next_seq = max(answer.next_seq, seq + 1)

    def _drain(self, answer: _Answer) -> None:
        """Deliver held batches that now follow on."""
        while answer.next_seq in answer.pending:
            seq = answer.next_seq
            payload = answer.pending.pop(seq)
            answer.pending_bytes -= len(payload)
            self._deliver_replayed(answer, seq, payload)

    def _deliver_pending(self, answer: _Answer, seq: int) -> None:
        """Deliver held batch `seq`; the ones before it that the answer never sent are missed
        (the server no longer buffers them, or sent them malformed)."""
        lost = seq - answer.next_seq
        if lost > 0:
            self.health.missed += lost
            self.health.last_seq = seq - 1  # counted once: nobody asks for these again
            self._notice("missed", f"{self.endpoint}: {lost} batch(es) from {answer.next_seq} are lost "
                                   "(the server no longer buffers them)")
            answer.next_seq = seq
        payload = answer.pending.pop(seq)
        answer.pending_bytes -= len(payload)
        self._deliver_replayed(answer, seq, payload)
        self._drain(answer)

    def _flush(self, answer: _Answer) -> None:
        """The answer ended: deliver what it held, in order."""
        while answer.pending:
            self._deliver_pending(answer, min(answer.pending))

    def _held_seq(self) -> int | None:
        """The seq of the first live frame held back while joining (None if unreadable)."""
        try:
            return parse_pub(self._held[0])[1]
        except MalformedFrame:
            return None  # `handle` counts it when it gets there

    def _reconnect(self) -> None:
        """The connection dropped: read every frame the socket still holds, then connect again.

        Never `zmq_disconnect` a SUB that holds queued frames: libzmq (4.1 to 4.3.5; open as
        zeromq/libzmq#2163) terminates the pipe under them, and reading the next multipart
        message then aborts the process in fq.cpp (`!_more`). That is what a publisher
        closing under a subscriber that was behind used to do: the monitor saw the
        disconnect, we disconnected with its last batches queued, and the next
        `recv_multipart` aborted (or, when it did not, batches were lost and came out of
        order). The dropped pipe gets no more frames, so once it is drained nothing is
        left for the disconnect to cut; a frame of a connection libzmq made again in the
        meantime is the one case left, as rare as a server coming back within the drain."""
        self.num_reconnects += 1
        sub = self._sub
        while not self._stop.is_set() and sub.poll(0):
            self.handle(recv_parts(sub))
        sub.disconnect(self.endpoint)
        sub.connect(self.endpoint)
        self._notice("reconnected", f"{self.endpoint}: the connection dropped (the server went away, or a frame "
                                    f"was over {self.max_frame_bytes} bytes); connecting again")

    def _malformed(self, message: str) -> None:
        self.health.malformed += 1
        self.health.last_error = message
        self._notice("malformed", f"{self.endpoint}: skipped a malformed frame: {message}")
        self._report()

    def _notice(self, kind: str, message: str) -> None:
        if self.on_notice is not None:
            self.on_notice(kind, message)

    def _report(self) -> None:
        if self.on_health is not None:
            self.on_health(self.health.copy())

    def _run(self) -> None:
        lower_priority(self.nice)
        zmq = self._zmq
        sub = self._sub
        # Until the replay socket has answered (a server that is not up yet) and while nothing
        # came live, ask it again every second.
        joining = self.replay_endpoint is not None
        next_ask = 0.0
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if joining and time.monotonic() >= next_ask:
                    joining = self._live_seq is None and not self._fetch_buffer()
                    next_ask = time.monotonic() + 1.0
                if self._held:  # live frames read while the join was being fetched
                    self.handle(self._held.popleft())
                    continue
                ready = dict(poller.poll(0))
                if not ready:
                    self._idle()
                    ready = dict(poller.poll(100))
                if self._monitor is not None and self._monitor in ready:
                    self._monitor.recv_multipart()
                    self._reconnect()
                    continue
                if sub in ready:
                    self._drain_sub(sub)
            except Exception as exc:  # noqa: BLE001 - a callback failed; report it and keep reading
                if isinstance(exc, zmq.ContextTerminated):
                    break
                self._error(exc)
        try:
            self._idle()  # stopping: what the consumer holds is applied, not dropped
        except Exception as exc:  # noqa: BLE001
            self._error(exc)

    def _drain_sub(self, sub) -> None:
        """Handle the frames queued on the SUB socket, up to DRAIN_FRAMES, without a poll
        between them (a zmq poll of the two sockets cost more than decoding a frame): read
        what is queued (at most DRAIN_BYTES at once), handle it (`handle_many`), and again
        while frames keep coming. The monitor, the stop flag and the join are looked at
        again after each DRAIN_FRAMES."""
        num_read = 0
        receiver = self._receiver
        while num_read < DRAIN_FRAMES and not self._stop.is_set():
            if receiver is not None:  # one compiled call, the GIL let go (`engine.remote.receive`)
                messages = receiver.read(DRAIN_FRAMES - num_read, DRAIN_BYTES)
                if messages is None:
                    return
            else:
                messages = []
                if not read_queued(sub, messages, DRAIN_FRAMES - num_read, DRAIN_BYTES):
                    return
            num_read += len(messages)
            self.handle_many(messages)

    def handle_many(self, messages: list[list[bytes]] | QueuedMessages) -> None:
        """PUB messages in the order they came, each as `handle` takes it; but a run of them
        that simply follows on (this stream's topic, each the number after the last batch,
        each well-formed) is decoded and delivered at once: one hand-off to `on_batches`
        (when set, and nobody listens per batch on `on_health`) and one count of the run.
        Whatever else (the first batch, a gap, a number back or far ahead, a malformed
        frame, another topic, a shared socket's pods) goes through `handle`. What is not
        handled (stopping, or a callback raised) is kept, first in line, for `_run`.
        `messages` may be what a compiled receive read (`QueuedMessages`): its runs are
        decoded where they lie in its buffer."""
        i, num = 0, len(messages)
        try:
            while i < num and not self._stop.is_set():
                batches, payloads = self._follow_on(messages, i)
                if not batches:
                    i += 1
                    self.handle(messages[i - 1])
                    continue
                if self.on_frames is not None:  # (the run's payloads, as bytes)
                    self.on_frames(self.health.last_seq + 1, [bytes(p) for p in payloads[:len(batches)]])
                if self.on_batches is not None and self.on_health is None:
                    i += len(batches)
                    self.on_batches(batches)
                    self._count(self.health.last_seq + len(batches), batches[-1].ts, len(batches))
                    self._live_seq = self.health.last_seq
                else:
                    for batch in batches:
                        i += 1
                        self.on_batch(batch)
                        self._count(self.health.last_seq + 1, batch.ts, 1)
                        self._live_seq = self.health.last_seq
                        self._report()
        finally:
            if i < num:
                self._held.extendleft(reversed(messages[i:]))

    def _follow_on(self, messages: list[list[bytes]] | QueuedMessages, start: int) -> tuple[list, list]:
        """The batches of messages[start:] that follow on from the last one, decoded, up to
        the first that does not (the rules `handle` applies to each frame all pass for
        these: the next number is neither a gap, nor back, nor a jump), and the payloads of
        the run (bytes, or views of a `QueuedMessages`' buffer). With fastwire's columns
        for decoder (a columnar pool's attachment) the run is decoded by one call
        (`decode_columns_many`, from the buffer where the payloads lie); if a frame of it
        is malformed, the frames before it one at a time."""
        last = self.health.last_seq
        if last is None or self._low or self._demux is not None:
            return [], []
        at = None
        if isinstance(messages, QueuedMessages):
            num = messages.follow_on(start, self.topic, last + 1)
            if not num:
                return [], []
            payloads, *where = messages.payloads(start, num)
            at = tuple(where)
        else:
            payloads = self._run_payloads(messages, start, last + 1)
            if not payloads:
                return [], []
        if self._decode_run is not None:  # the run in one compiled call, as bench attach times it
            try:
                return self._decode_run(last + 1, payloads, at), payloads
            except MalformedFrame:
                pass  # one of them is: those before it, one at a time
        batches = []
        for j, payload in enumerate(payloads):
            try:
                batches.append(self._decode(last + 1 + j, bytes(payload)))
            except MalformedFrame:
                break  # `handle` counts it
        return batches, payloads

    def _run_payloads(self, messages: list[list[bytes]], start: int, first: int) -> list[bytes]:
        """The payloads of messages[start:] up to the first that is not a frame of this
        stream's topic numbered on from `first` (`first`, `first` + 1, ...), as bytes. A run
        whose first and last frames follow on (the usual one) is checked at once: lengths
        and types by set, topics counted, the numbers read as one big-endian array and
        compared with the run's range; any other frame by frame up to the first that does
        not follow on."""
        topic = self.topic
        run = messages[start:] if start else messages
        num = len(run)
        if not num or not _numbered(run[0], topic, first):
            return []  # a frame `handle` must look at: one look, not a pass over the rest
        if num > 1 and _numbered(run[-1], topic, first + num - 1) and set(map(len, run)) == {3}:
            topics, numbers, payloads = zip(*run)
            if ((not topic or topics.count(topic) == num) and set(map(len, numbers)) == {8}
                    and set(map(type, payloads)) == {bytes}):
                wrong = np.flatnonzero(np.frombuffer(b"".join(numbers), ">i8") != np.arange(first, first + num))
                return list(payloads[:wrong[0]] if len(wrong) else payloads)
        payloads = []
        for frames in run:
            if not _numbered(frames, topic, first + len(payloads)):
                break
            payloads.append(bytes(frames[2]))
        return payloads

    def _idle(self) -> None:
        """Nothing queued: tell the consumer of each stream that got batches since the last
        time (this one's, and each stream this socket feeds)."""
        for stream in list(self.streams.values()):
            stream._idle()
        if self._busy:
            self._busy = False
            if self.on_idle is not None:
                self.on_idle()

    def _error(self, exc: BaseException) -> None:
        self.health.last_error = f"{type(exc).__name__}: {exc}"
        self._notice("error", f"{self.endpoint}: {self.health.last_error}")


@dataclass(slots=True)
class _Answer:
    """What one replay request brought. `next_seq` is the first batch still missing;
    `complete`: the end marker came, or a batch the live stream has; `can_ask_again`: it
    stopped in silence after bringing new batches (asking again from `next_seq` may bring
    the rest)."""

    next_seq: int
    asked: int = -1  # the seq asked for (set from next_seq)
    pending: dict[int, bytes] = field(default_factory=dict)  # sent ahead of a gap, held
    pending_bytes: int = 0
    num_delivered: int = 0
    num_frames: int = 0
    complete: bool = False
    can_ask_again: bool = False
    delivered_last: bool = False

    def __post_init__(self) -> None:
        if self.asked < 0:
            self.asked = self.next_seq
