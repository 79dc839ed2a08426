"""Keeping a vLLM attach in the session store (`attach --record`), so it opens later offline.

A capture is a `trace` session (settings `{"source": "vllm-attach", ...}`) with one run of
kind `attach` whose `frames` are each delivered batch's msgpack payload as the server sent
it, in the order the streams delivered them, with the stream (its pool's source, server
and rank), batch number and arrival time, and a row without payload where a server
restarted (`Store.frames(run_id)`). Kept as sent, not as Cachescope events: a tenth of the
bytes, written at the rate frames come, and opened through the same columnar route as a
live attach (`app.runtime.captures`). Captures written before frames hold the converted
events instead (`Store.events(run_id)`), and still open. Uses only the store's public API
and its writer thread. No Qt here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from engine.remote.attachment import AttachOptions

SOURCE = "vllm-attach"


@dataclass(slots=True)
class Recorder:
    """Open with `start(attachment)` (before the attachment starts), close with
    `finish(totals)`; the attachment's subscriber threads hand it their frames (`frames`,
    `restart`), which the store's writer thread writes, so a burst never blocks a stream."""

    db: str | None
    options: AttachOptions
    title: str | None = None
    block_size: int | None = None  # the servers' block size, if known: the session's
    session_id: int = -1
    run_id: int = -1
    num_frames: int = 0  # batches recorded (restarts not counted)
    num_restarts: int = 0
    _store: Any = None
    _writer: Any = None
    _idx: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, attachment: Any) -> Recorder:
        from engine.store.database import Store
        from engine.store.writer import StoreWriter

        if attachment.started:
            raise RuntimeError("start the recorder before the attachment: its first frames would be lost")
        self._store = Store(self.db)
        opts = self.options
        settings = {"source": SOURCE, "endpoints": list(opts.endpoints), "replay_endpoints": list(opts.replay_endpoints),
                    "topic": opts.topic, "data_parallel_size": opts.data_parallel_size, "bind": opts.bind,
                    "servers": list(opts.servers), "ranks": list(opts.ranks)}
        title = self.title or f"vLLM {', '.join(opts.endpoints)} {time.strftime('%Y-%m-%d %H:%M:%S')}"
        # vLLM's default prefix_caching_hash_algo: what a probe of this capture should assume.
        self.session_id = self._store.create_session(title, "trace", hash="vllm-sha256", source_format=SOURCE,
                                                     settings=settings)
        self.run_id = self._store.create_run(self.session_id, "attach", settings)
        self._writer = StoreWriter(self._store)
        attachment.recorder = self
        return self

    def frames(self, pool: Any, first: int, payloads: list[bytes]) -> None:
        """A stream's batches `first`, `first` + 1, ... as delivered (any subscriber thread)."""
        self._write(pool, [(first + j, p) for j, p in enumerate(payloads)])

    def restart(self, pool: Any, seq: int) -> None:
        """A stream's server restarted: its pool starts afresh, numbering from `seq`."""
        self._write(pool, [(seq, None)])

    def _write(self, pool: Any, items: list[tuple[int, bytes | None]]) -> None:
        now = time.time()
        source, server, rank = pool.source, pool.server or "", int(pool.rank)
        with self._lock:  # one order across streams: `idx`
            if self._writer is None:
                return  # finished: a stream still stopping
            at = self._idx
            self._idx += len(items)
            self._writer.record_frames(self.run_id, [(at + j, source, server, rank, seq, now, payload)
                                                     for j, (seq, payload) in enumerate(items)])
            if items[0][1] is None:
                self.num_restarts += 1
            else:
                self.num_frames += len(items)

    def finish(self, totals: dict[str, Any], block_size: int | None = None) -> None:
        """Close the recording: what is queued written, the run finished with `totals` (its
        streams' stored and removed counts summed), the session's block size set."""
        def close(store: Any) -> None:
            if block_size or self.block_size:
                store.update_session(self.session_id, block_size=block_size or self.block_size)
            streams = totals.get("streams", [])
            # The same total names as a replay's, so `sessions show` counts a capture too.
            store.finish_run(self.run_id, {**totals, "frames": self.num_frames, "restarts": self.num_restarts,
                                           "stored_blocks": sum(s.get("stored", 0) for s in streams),
                                           "evicted_blocks": sum(s.get("removed", 0) for s in streams)})
        self._end(close)

    def discard(self) -> None:
        """Drop the recording and its session (an attach that never started)."""
        self._end(lambda store: store.delete_session(self.session_id))

    def _end(self, last: Any) -> None:
        """Stop taking frames, write what is queued, `last(store)`, close the store; once."""
        if self._store is None:
            return
        try:
            with self._lock:
                writer, self._writer = self._writer, None
            writer.stop()
            last(self._store)
        finally:
            self._store.close()
            self._store = None


def recorded_events(store: Any, run_id: int) -> list[Any]:
    """A capture's events, as the reference pools (`engine.remote.pool.RemotePool`, one per
    stream, numbered on one bus as an attachment numbers them) make them of its frames; a
    capture from before frames: the events it kept. What the CLI's comparisons read
    (`run:ID`, `run:ID@SERVER`); the app opens frames through its columnar route instead.
    A frame that does not decode raises InputError naming the run, stream and batch."""
    if not store.num_frames(run_id):
        return store.events(run_id)
    from engine.core.errors import InputError
    from engine.core.events import EventBus
    from engine.remote.fastwire import decode_batch
    from engine.remote.pool import RemotePool
    from engine.remote.wire import MalformedFrame

    events: list[Any] = []
    bus = EventBus()
    bus.subscribe(events.append)
    pools: dict[tuple[str, str, int], RemotePool] = {}
    for rows in store.frames(run_id):
        for source, server, rank, seq, _, payload in rows:
            pool = pools.get((source, server, rank))
            if pool is None:
                pool = pools[(source, server, rank)] = RemotePool(source, rank, bus, server=server)
            if payload is None:
                pool.reset(seq)
                continue
            try:
                batch = decode_batch(seq, payload)
            except MalformedFrame as exc:  # a damaged file (the recorder kept only frames that decoded)
                raise InputError(f"run {run_id}: {source}'s recorded {exc}; the database is damaged") from None
            pool.apply(batch)
    return events

