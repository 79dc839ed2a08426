"""Attaching to a deployment: every server, endpoint and data-parallel rank, one pool each.

`Attachment` starts one `VllmSubscriber` per (endpoint, rank), applies batches to that
rank's `RemotePool` under one lock, numbers all converted events on one `EventBus` (so
"removed at event N" means one thing across ranks and servers), and reports batches,
health and notices through plain callbacks. A bound endpoint (llm-d's centralized mode)
gets one more stream and pool per topic `kv@<pod>@<model>` as pods appear. `fleet()` is
every server's pools as an `engine.remote.fleet.Fleet`. The app wraps it in Qt signals;
the CLI prints. No Qt.

Columnar pools (`AttachOptions(columnar=True)`) with nobody listening per batch
(`on_batch` None) hold each stream's decoded batches (handed over a run of queued frames
at a time: the subscriber's `on_batches`) and apply them many at once
(`ColumnarPool.apply_many`: one compiled call per run): when the stream has no frame
queued any more (the subscriber's `on_idle`), when HOLD_FRAMES batches or HOLD_BYTES of
frames are held or the oldest has waited HOLD_SECONDS, and always before a restart or a
notice of that stream is handled, so the pool sees every batch in order and a notice
finds the pool as it was when the notice came. A reader under `lock` may thus see a
stream's last few batches (at most those bounds) not applied yet while frames keep coming.
"""

from __future__ import annotations

import math
import operator
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from engine.core.errors import InputError
from engine.core.events import Event, EventBus
from engine.remote.fleet import Fleet, server_of_topic
from engine.remote.pool import CombinedPool, RemotePool
from engine.remote.subscriber import (
    DEFAULT_MAX_FRAME_BYTES, StreamHealth, VllmSubscriber, check_endpoint, endpoint_for_rank,
)
from engine.remote.wire import VllmBatch

MAX_DATA_PARALLEL = 1024
HOLD_FRAMES = 64  # batches a columnar stream holds at most before applying them
HOLD_BYTES = 4 << 20  # frame bytes held at most
HOLD_SECONDS = 0.002  # the longest a held batch waits while frames keep coming
_PAYLOAD = operator.attrgetter("payload")


class _Held:
    """The decoded batches of one columnar stream not applied yet; touched only on the
    thread of that stream's subscriber (a demuxed stream's: its socket's), applied under
    the attachment's lock."""

    __slots__ = ("pool", "lock", "batches", "nbytes", "since")

    def __init__(self, pool: Any, lock: threading.RLock) -> None:
        self.pool, self.lock = pool, lock
        self.batches: list[Any] = []
        self.nbytes = 0
        self.since = 0.0

    def add(self, batch: Any) -> None:
        self.add_many([batch])

    def add_many(self, batches: list[Any]) -> None:
        """Batches that follow on, in order (a run the subscriber read at once), applied
        as `add` would apply them one by one: held a part at a time, each part what fills
        HOLD_FRAMES (one by one only in a part that would reach HOLD_BYTES)."""
        now = time.monotonic()
        if not self.batches:
            self.since = now
        at = 0
        while at < len(batches):
            part = batches[at:at + max(1, HOLD_FRAMES - len(self.batches))]
            at += len(part)
            nbytes = sum(map(len, filter(None, map(_PAYLOAD, part))))
            if self.nbytes + nbytes < HOLD_BYTES:
                self.batches += part
                self.nbytes += nbytes
                if len(self.batches) >= HOLD_FRAMES:
                    self.flush()
                    self.since = now
                continue
            for batch in part:
                self.batches.append(batch)
                self.nbytes += len(batch.payload or b"")
                if len(self.batches) >= HOLD_FRAMES or self.nbytes >= HOLD_BYTES:
                    self.flush()
                    self.since = now
        if self.batches and now - self.since >= HOLD_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.batches:
            batches, self.batches, self.nbytes = self.batches, [], 0
            with self.lock:
                self.pool.apply_many(batches)


@dataclass(slots=True, frozen=True)
class AttachOptions:
    """What to attach to. `replay_endpoints[i]` belongs to `endpoints[i]`; with
    `data_parallel_size` N, rank r uses both ports plus r (vLLM's rule). `bind` binds the
    SUB sockets (for a server whose endpoint names a concrete host, which then connects).
    `refill_timeout` is how long a replay answer may stay silent (no frame) before it is
    cut short and asked again; it does not bound a long answer that keeps coming.
    `servers[i]` names the server of `endpoints[i]` (default: the endpoint; endpoints with
    one name are that server's ranks), `ranks[i]` its data-parallel rank when the ranks
    are listed one by one (as `/server_info` describes them) instead of `data_parallel_size`."""

    endpoints: tuple[str, ...]
    replay_endpoints: tuple[str, ...] = ()
    topic: str = ""
    data_parallel_size: int = 1
    bind: bool = False
    refill_timeout: float = 2.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_removed: int = 200_000
    servers: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    # Pools in arrays (`engine.remote.colpool.ColumnarPool`, fed by `fastwire.decode_columns`)
    # instead of the reference `RemotePool`: the same counts, tiers and fleet answers, but no
    # Cachescope event per block on `Attachment.events`. A choice of the caller, not a
    # remembered setting (not in to_dict).
    columnar: bool = False

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise InputError("give at least one endpoint, such as tcp://127.0.0.1:5557")
        if len(self.servers) > len(self.endpoints) or len(self.ranks) > len(self.endpoints):
            raise InputError("give at most one server name and one rank per endpoint")
        for name in self.servers:
            if not isinstance(name, str) or not name or len(name) > 200 or any(c.isspace() for c in name):
                raise InputError(f"{name!r} is not a server name (one word, at most 200 characters)")
        for r in self.ranks:
            if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < MAX_DATA_PARALLEL:
                raise InputError(f"a rank must be from 0 to {MAX_DATA_PARALLEL - 1}, not {r!r}")
        if self.ranks and self.data_parallel_size > 1:
            raise InputError("list the ranks one by one or give a data-parallel size, not both")
        if len(self.replay_endpoints) > len(self.endpoints):
            raise InputError("give at most one replay endpoint per event endpoint")
        if not isinstance(self.data_parallel_size, int) or not 1 <= self.data_parallel_size <= MAX_DATA_PARALLEL:
            raise InputError(f"the data-parallel size must be from 1 to {MAX_DATA_PARALLEL}")
        if not (isinstance(self.refill_timeout, (int, float)) and math.isfinite(self.refill_timeout)
                and self.refill_timeout > 0):
            raise InputError("the refill timeout must be a positive number of seconds")
        for e in self.endpoints:
            check_endpoint(e, self.bind)
        for e, r in zip(self.endpoints, self.replay_endpoints):
            if r == "":  # this endpoint has no replay socket (the ones after it may)
                continue
            check_endpoint(r)
            if r == e:
                raise InputError(f"the replay endpoint {r} must differ from its event endpoint "
                                 "(vLLM binds them to two ports)")
        for spec in self.streams():  # every rank's port must exist too
            check_endpoint(spec.endpoint, self.bind)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (what the app remembers between runs)."""
        return {"endpoints": list(self.endpoints), "replay_endpoints": list(self.replay_endpoints),
                "topic": self.topic, "data_parallel_size": self.data_parallel_size, "bind": self.bind,
                "refill_timeout": self.refill_timeout, "servers": list(self.servers), "ranks": list(self.ranks)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttachOptions:
        """The inverse of `to_dict`; unknown keys are ignored, bad values raise InputError."""
        if not isinstance(data, dict):
            raise InputError("attach settings must be an object")
        try:
            return cls(tuple(data.get("endpoints") or ()), tuple(data.get("replay_endpoints") or ()),
                       str(data.get("topic", "")), data.get("data_parallel_size", 1), bool(data.get("bind", False)),
                       data.get("refill_timeout", 2.0), servers=tuple(data.get("servers") or ()),
                       ranks=tuple(data.get("ranks") or ()))
        except TypeError as exc:
            raise InputError(f"attach settings are not valid ({exc})") from None

    def server_of(self, i: int) -> str:
        return self.servers[i] if i < len(self.servers) else self.endpoints[i]

    def streams(self) -> list[StreamSpec]:
        out = []
        many = self.data_parallel_size > 1
        num_listed: dict[str, int] = {}
        for i in range(len(self.ranks)):
            num_listed[self.server_of(i)] = num_listed.get(self.server_of(i), 0) + 1
        for i, endpoint in enumerate(self.endpoints):
            replay = (self.replay_endpoints[i] if i < len(self.replay_endpoints) else None) or None
            server = self.server_of(i)
            if i < len(self.ranks):  # one rank listed on its own
                rank = self.ranks[i]
                name = f"{server} rank {rank}" if num_listed[server] > 1 else server
                out.append(StreamSpec(name, endpoint, replay, rank, server))
                continue
            for rank in range(self.data_parallel_size):
                ep = endpoint_for_rank(endpoint, rank)
                name = f"{server} rank {rank}" if many else server
                out.append(StreamSpec(name, ep, endpoint_for_rank(replay, rank) if replay else None, rank, server))
        return out


@dataclass(slots=True, frozen=True)
class StreamSpec:
    """One stream: its name (the pool's source), endpoints, rank, and the server it belongs to."""

    name: str
    endpoint: str
    replay_endpoint: str | None
    rank: int
    server: str = ""


BatchListener = Callable[[RemotePool, VllmBatch, list[Event]], None]
HealthListener = Callable[[StreamHealth], None]
NoticeListener = Callable[[RemotePool, str, str], None]


@dataclass(slots=True)
class Attachment:
    """A running attach. Callbacks run on subscriber threads while `lock` is held:
    `on_batch(pool, batch, events)` after each batch is applied (events: the Cachescope
    events it produced, empty if nobody listens on `events`), `on_health(health)`, and
    `on_notice(pool, kind, message)` with kind refilled | missed | malformed | restart |
    refill_timeout | reconnected | joined (a pod's first frame on a bound endpoint) | error. Read `pools`/`combined` from other threads only under `lock`.
    """

    options: AttachOptions
    on_batch: BatchListener | None = None
    on_health: HealthListener | None = None
    on_notice: NoticeListener | None = None
    events: EventBus = field(default_factory=EventBus)
    lock: threading.RLock = field(default_factory=threading.RLock)
    pools: list[RemotePool] = field(default_factory=list)
    subscribers: list[VllmSubscriber] = field(default_factory=list)
    combined: CombinedPool = field(init=False)
    started: bool = False
    # With `options.columnar`: each pool journals its block operations (`ColumnarPool(journal=True)`,
    # as `engine.remote.overlay.journal_pool_class` makes it, with each journal row's batch
    # time) for a reader that takes them under `lock` (`take_journal`), as the app's live log does.
    journal: bool = False
    # Steps below the starting thread's priority its subscriber threads run at (Linux; see
    # `engine.core.threads`): the app's window keeps them below its GUI thread.
    nice: int = 0
    # Told each stream's frames as they are delivered, `frames(pool, first_seq, payloads)`,
    # and its restarts, `restart(pool, seq)`, on the stream's thread (set before `start`):
    # `engine.analysis.remote_capture.Recorder` keeps them (`attach --record`).
    recorder: Any = None

    def __post_init__(self) -> None:
        self.combined = CombinedPool(self.pools)

    def start(self) -> Attachment:
        """Open every socket (errors raise InputError, nothing left open), then start reading."""
        if self.started:
            return self
        try:
            for spec in self.options.streams():
                pool = self._pool_class()(spec.name, spec.rank, self.events, self.options.max_removed,
                                          server=spec.server)
                held = self._held_of(pool)
                sub = VllmSubscriber(
                    spec.endpoint, self._batch_handler(pool, held), replay_endpoint=spec.replay_endpoint,
                    topic=self.options.topic, bind=self.options.bind, rank=spec.rank, source=spec.name,
                    on_restart=self._restart_handler(pool, held), on_notice=self._notice_handler(pool, held),
                    on_health=self._health_handler(), refill_timeout=self.options.refill_timeout,
                    max_frame_bytes=self.options.max_frame_bytes,
                    demux=self._demux_handler(spec) if self.options.bind else None, decode=self._decoder(),
                    on_idle=held.flush if held is not None else None,
                    on_batches=held.add_many if held is not None else None, nice=self.nice,
                    on_frames=self._frames_handler(pool))
                self.pools.append(pool)
                self.subscribers.append(sub)
        except BaseException:
            self.stop()
            raise
        for sub in self.subscribers:
            sub.start()
        self.started = True
        return self

    def stop(self) -> None:
        for sub in self.subscribers:
            sub.stop()

    def _pool_class(self) -> Any:
        if self.options.columnar:
            from engine.remote.colpool import ColumnarPool, warm_up

            warm_up()  # compiled (or loaded from numba's cache) before any socket buffers frames
            if self.journal:
                from engine.remote.overlay import journal_pool_class

                return journal_pool_class()
            return ColumnarPool
        return RemotePool

    def _decoder(self) -> Callable[[int, bytes], Any] | None:
        if self.options.columnar:
            from engine.remote.fastwire import decode_columns

            return decode_columns
        return None

    def __enter__(self) -> Attachment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def health(self, timeout: float = -1) -> list[StreamHealth] | None:
        """Each stream's health, copied under `lock`; None if the lock was not had within
        `timeout` seconds (-1: wait; a subscriber holds it while it applies a run of frames)."""
        if not self.lock.acquire(timeout=timeout):
            return None
        try:
            return [s.health.copy() for s in self.subscribers]
        finally:
            self.lock.release()

    def fleet(self) -> Fleet:
        """Every server's pools (call under `lock` while attached). A bound endpoint whose
        frames all came on pods' own topics is left out: its pods are the servers."""
        with self.lock:
            fleet = Fleet()
            for pool, sub in zip(self.pools, self.subscribers):
                if sub.streams and not pool.num_batches and not sub.health.malformed:
                    continue
                fleet.add(pool.server or pool.source, pool)
            return fleet

    # ---- callbacks from subscriber threads ---------------------------------------------

    def _held_of(self, pool: Any) -> _Held | None:
        """Where a columnar stream holds its batches, or None: applied one by one (the
        reference pools, or someone listens per batch)."""
        return _Held(pool, self.lock) if self.options.columnar and self.on_batch is None else None

    def _batch_handler(self, pool: RemotePool, held: _Held | None = None) -> Callable[[VllmBatch], None]:
        if held is not None:
            return held.add

        def on_batch(batch: VllmBatch) -> None:
            with self.lock:
                events = pool.apply(batch)
                if self.on_batch is not None:
                    self.on_batch(pool, batch, events)
        return on_batch

    def _demux_handler(self, spec: StreamSpec) -> Callable[[bytes], VllmSubscriber | None]:
        """A new pod's topic on a bound endpoint: its own pool and stream (on the socket's thread)."""
        many = self.options.data_parallel_size > 1

        def make(topic: bytes) -> VllmSubscriber | None:
            pod = server_of_topic(topic)
            if pod is None:
                return None
            name = f"{pod} rank {spec.rank}" if many else pod
            with self.lock:
                pool = self._pool_class()(name, spec.rank, self.events, self.options.max_removed, server=pod)
                held = self._held_of(pool)
                sub = VllmSubscriber(
                    spec.endpoint, self._batch_handler(pool, held), topic=topic.decode("utf-8", "replace"),
                    bind=True, rank=spec.rank, source=name, on_restart=self._restart_handler(pool, held),
                    on_notice=self._notice_handler(pool, held), on_health=self._health_handler(),
                    refill_timeout=self.options.refill_timeout, max_frame_bytes=self.options.max_frame_bytes,
                    socket=False, decode=self._decoder(), on_idle=held.flush if held is not None else None,
                    on_batches=held.add_many if held is not None else None, nice=self.nice,
                    on_frames=self._frames_handler(pool))
                sub.topic = topic  # exactly the pod's topic, whatever its bytes
                self.pools.append(pool)
                self.subscribers.append(sub)
            self._notice_handler(pool)("joined", f"{spec.endpoint}: {pod} publishes on topic "
                                                 f"{topic.decode('utf-8', 'replace')!r}")
            return sub
        return make

    def _frames_handler(self, pool: RemotePool) -> Callable[[int, list[bytes]], None] | None:
        """The subscriber's frames callback: the recorder's, for this stream; None without one."""
        recorder = self.recorder
        if recorder is None:
            return None
        return lambda first, payloads: recorder.frames(pool, first, payloads)

    def _restart_handler(self, pool: RemotePool, held: _Held | None = None) -> Callable[[int], None]:
        def on_restart(seq: int) -> None:
            if self.recorder is not None:
                self.recorder.restart(pool, seq)
            if held is not None:
                held.flush()  # the batches before the restart, then the reset
            with self.lock:
                events = pool.reset(seq)
                if self.on_batch is not None and events:
                    self.on_batch(pool, VllmBatch(seq, 0.0, ()), events)
        return on_restart

    def _notice_handler(self, pool: RemotePool, held: _Held | None = None) -> Callable[[str, str], None]:
        def on_notice(kind: str, message: str) -> None:
            if held is not None:
                held.flush()  # a notice finds the pool with every batch before it
            if self.on_notice is not None:
                with self.lock:
                    self.on_notice(pool, kind, message)
        return on_notice

    def _health_handler(self) -> Callable[[StreamHealth], None] | None:
        """The subscriber's health callback; None when nobody listens (`on_health` is read
        at `start`): then a subscriber copies no health per batch."""
        if self.on_health is None:
            return None

        def on_health(health: StreamHealth) -> None:
            if self.on_health is not None:
                with self.lock:
                    self.on_health(health)
        return on_health
