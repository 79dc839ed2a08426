"""Publishing our embedded engine's pool the way vLLM 0.33 publishes its own.

`VllmPublisher` is a ZmqEventPublisher twin: a PUB socket (bound for a wildcard or ipc
endpoint, connected for a concrete host, as vLLM does), sequence numbers from 0, a
bounded buffer served on a ROUTER replay socket (`[b"", topic, seq, payload]` per batch,
then the end marker). `EnginePublisher` turns engine events into vLLM events: a run of
BlockStored events of one request chained by parent becomes one BlockStored, as vLLM
sends it. Tools written for vLLM can read Cachescope with these. No Qt here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from engine.core.errors import InputError
from engine.core.events import BlockEvicted, BlockStored, CacheReset, Event, EventBus, RequestFinished, RequestRefused
from engine.remote.subscriber import check_endpoint
from engine.remote.wire import END_SEQ, VllmEvent, encode_batch, seq_frame


def _binds(endpoint: str) -> bool:
    return "*" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class VllmPublisher:
    """PUB + optional ROUTER replay, with vLLM's framing. `publish` is called from one thread."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                 buffer_steps: int = 10_000, data_parallel_rank: int = 0, int_hashes: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        check_endpoint(endpoint, bind=_binds(endpoint))
        if replay_endpoint is not None:
            check_endpoint(replay_endpoint, bind=True)
        import zmq

        self._zmq = zmq
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.rank = data_parallel_rank
        self.int_hashes = int_hashes
        self.clock = clock
        self.next_seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        ctx = zmq.Context.instance()
        self._pub = ctx.socket(zmq.PUB)
        self._router = None
        try:
            if _binds(endpoint):
                self._pub.bind(endpoint)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint is not None:
                self._router = ctx.socket(zmq.ROUTER)
                self._router.bind(replay_endpoint)
        except zmq.ZMQError as exc:
            self.close()
            raise InputError(f"cannot publish on {endpoint}: {exc}") from None
        self._thread = None
        if self._router is not None:
            self._thread = threading.Thread(target=self._serve_replay, name="vllm-replay", daemon=True)
            self._thread.start()

    def publish(self, events: list[VllmEvent], ts: float | None = None) -> int:
        """Send one batch; returns its sequence number."""
        payload = encode_batch(self.clock() if ts is None else ts, events, self.rank)
        seq = self.next_seq
        self.next_seq += 1
        with self._lock:
            self._buffer.append((seq, payload))
        self._pub.send_multipart((self.topic, seq_frame(seq), payload))
        return seq

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._pub.close(linger=0)
        if self._router is not None:
            self._router.close(linger=0)

    def _serve_replay(self) -> None:
        router = self._router
        while not self._stop.is_set():
            if not router.poll(50):
                continue
            frames = router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue  # not a replay request; vLLM ignores these too
            client, start = frames[0], int.from_bytes(frames[2], "big")
            with self._lock:
                buffered = [item for item in self._buffer if item[0] >= start]
            for seq, payload in buffered:
                router.send_multipart((client, b"", self.topic, seq_frame(seq), payload))
            router.send_multipart((client, b"", b"", seq_frame(END_SEQ), b""))


class EnginePublisher:
    """Listens on an engine's bus and publishes its stored/removed/cleared blocks.

    Events are gathered into one batch per finished (or refused) request, as vLLM sends one
    per scheduler step, and `flush()` sends what is left. Hashes go out as vLLM's default
    integer form (the digest's last 8 bytes) unless `int_hashes` is False.
    """

    def __init__(self, publisher: VllmPublisher, bus: EventBus, block_size: int, max_batch: int = 1000) -> None:
        self.publisher = publisher
        self.block_size = block_size
        self.max_batch = max_batch
        self.num_batches = 0
        self.num_events = 0
        self._pending: list[dict] = []
        self._unsubscribe = bus.subscribe(self._on_event)

    def _hash(self, h: bytes) -> bytes:
        return h[-8:] if self.publisher.int_hashes else h

    def _on_event(self, event: Event) -> None:
        if isinstance(event, BlockStored):
            if event.remote is not None:
                return
            h, parent = self._hash(event.block_hash), event.parent_hash
            last = self._pending[-1] if self._pending else None
            if (last is not None and last["kind"] == "BlockStored" and last["request"] == event.request_id
                    and parent is not None and last["hashes"][-1] == self._hash(parent)):
                last["hashes"].append(h)
                last["tokens"].extend(event.token_ids)
                last["extra"].append(None)
            else:
                self._pending.append({"kind": "BlockStored", "request": event.request_id, "hashes": [h],
                                      "parent": self._hash(parent) if parent is not None else None,
                                      "tokens": list(event.token_ids),
                                      "extra": [(event.salt,) if event.salt and parent is None else None]})
        elif isinstance(event, BlockEvicted):
            if event.remote is None:
                last = self._pending[-1] if self._pending else None
                if last is not None and last["kind"] == "BlockRemoved":
                    last["hashes"].append(self._hash(event.block_hash))
                else:
                    self._pending.append({"kind": "BlockRemoved", "hashes": [self._hash(event.block_hash)]})
        elif isinstance(event, CacheReset):
            if event.remote is None:
                self._pending.append({"kind": "AllBlocksCleared"})
        elif isinstance(event, (RequestFinished, RequestRefused)):
            self.flush()
        if len(self._pending) >= self.max_batch:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        out = []
        for p in self._pending:
            if p["kind"] == "BlockStored":
                extra = tuple(p["extra"]) if any(x is not None for x in p["extra"]) else None
                out.append(VllmEvent("BlockStored", tuple(p["hashes"]), p["parent"], tuple(p["tokens"]),
                                     self.block_size, medium="GPU", extra_keys=extra))
            elif p["kind"] == "BlockRemoved":
                out.append(VllmEvent("BlockRemoved", tuple(p["hashes"]), medium="GPU"))
            else:
                out.append(VllmEvent("AllBlocksCleared"))
        self._pending.clear()
        self.publisher.publish(out)
        self.num_batches += 1
        self.num_events += len(out)

    def close(self) -> None:
        self.flush()
        self._unsubscribe()
