"""Reading a running vLLM server's KV-cache events (`--kv-events-config`, ZMQ PUB).

Wire format (vLLM's ZmqEventPublisher): multipart `[topic, 8-byte big-endian seq,
msgpack(EventBatch)]` on the PUB socket; an optional ROUTER replay socket answers a
request `[b"", start_seq]` with `[b"", seq, payload]` frames and an end marker of seq -1.
Batches are either array-like (`[ts, [events], dp_rank?]`, events tagged
`["BlockStored", ...]`) or, in newer releases, maps (`{"ts", "events": [{"type": ...}]}`);
both are read. Events become Cachescope's own `BlockStored`, `BlockEvicted` and
`CacheReset`, so the same views show a remote pool. No Qt here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import msgpack

from engine.core.errors import InputError
from engine.core.events import BlockEvicted, BlockStored, CacheReset, EventBus

END_SEQ = -1
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                  "lora_name", "extra_keys", "group_idx")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


@dataclass(slots=True, frozen=True)
class RemoteEvent:
    """One vLLM KV event, normalised: kind is BlockStored, BlockRemoved or AllBlocksCleared."""

    kind: str
    block_hashes: tuple[bytes, ...] = ()
    parent_block_hash: bytes | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    medium: str | None = None


@dataclass(slots=True, frozen=True)
class RemoteBatch:
    seq: int
    ts: float
    events: tuple[RemoteEvent, ...]
    data_parallel_rank: int | None = None


def hash_bytes(value: Any) -> bytes:
    """vLLM block hashes are bytes in recent releases and (signed) ints in older ones."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, int) and not isinstance(value, bool):
        size = max(8, (value.bit_length() + 8) // 8)
        return value.to_bytes(size, "big", signed=True)
    raise ValueError(f"a block hash must be bytes or an integer, not {type(value).__name__}")


def _event_from(obj: Any) -> RemoteEvent:
    if isinstance(obj, dict):
        kind = obj.get("type")
        fields = obj
    elif isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], str):
        kind = obj[0]
        names = _STORED_FIELDS if kind == "BlockStored" else _REMOVED_FIELDS if kind == "BlockRemoved" else ()
        fields = dict(zip(names, obj[1:]))
    else:
        raise ValueError(f"an event must be a tagged array or a map, not {obj!r:.60}")
    if kind == "AllBlocksCleared":
        return RemoteEvent("AllBlocksCleared")
    if kind not in ("BlockStored", "BlockRemoved"):
        raise ValueError(f"unknown KV event type {kind!r}")
    hashes = tuple(hash_bytes(h) for h in fields.get("block_hashes") or ())
    if kind == "BlockRemoved":
        return RemoteEvent("BlockRemoved", hashes, medium=fields.get("medium"))
    parent = fields.get("parent_block_hash")
    tokens = tuple(int(t) for t in fields.get("token_ids") or ())
    return RemoteEvent("BlockStored", hashes, hash_bytes(parent) if parent is not None else None, tokens,
                       int(fields.get("block_size") or 0), fields.get("medium"))


def decode_batch(seq: int, payload: bytes) -> RemoteBatch:
    """Decode one msgpack EventBatch; raises ValueError with a sentence on a bad payload."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ValueError(f"batch {seq} is not valid msgpack ({exc})") from None
    if isinstance(obj, dict):
        ts, events, rank = obj.get("ts", 0.0), obj.get("events", []), obj.get("data_parallel_rank")
    elif isinstance(obj, (list, tuple)) and len(obj) >= 2:
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) > 2 else None
    else:
        raise ValueError(f"batch {seq} is not an EventBatch")
    if not isinstance(events, (list, tuple)):
        raise ValueError(f"batch {seq} has no event list")
    return RemoteBatch(seq, float(ts or 0.0), tuple(_event_from(e) for e in events), rank)


def encode_batch(ts: float, events: list[RemoteEvent], array_like: bool = True) -> bytes:
    """The inverse of `decode_batch`, used by tests and demos to play a vLLM server."""
    out: list[Any] = []
    for e in events:
        if e.kind == "AllBlocksCleared":
            out.append(["AllBlocksCleared"] if array_like else {"type": "AllBlocksCleared"})
        elif e.kind == "BlockRemoved":
            out.append(["BlockRemoved", list(e.block_hashes), e.medium] if array_like else
                       {"type": "BlockRemoved", "block_hashes": list(e.block_hashes), "medium": e.medium})
        else:
            fields = [list(e.block_hashes), e.parent_block_hash, list(e.token_ids), e.block_size, None, e.medium]
            out.append(["BlockStored", *fields] if array_like else
                       {"type": "BlockStored", **dict(zip(_STORED_FIELDS, fields))})
    return msgpack.packb([ts, out] if array_like else {"ts": ts, "events": out}, use_bin_type=True)


@dataclass(slots=True)
class RemotePool:
    """Turns remote batches into Cachescope events on a bus and keeps a few counters."""

    events: EventBus
    endpoint: str = ""
    num_batches: int = 0
    num_stored: int = 0
    num_removed: int = 0
    num_gaps_refilled: int = 0
    num_missed: int = 0
    cached: set[bytes] = field(default_factory=set)

    def apply(self, batch: RemoteBatch) -> None:
        self.num_batches += 1
        bus = self.events
        rid = f"{self.endpoint}#{batch.seq}"
        for e in batch.events:
            if e.kind == "BlockStored":
                bs = e.block_size or (len(e.token_ids) // max(len(e.block_hashes), 1))
                parent = e.parent_block_hash
                for i, h in enumerate(e.block_hashes):
                    tokens = e.token_ids[i * bs:(i + 1) * bs] if bs else ()
                    bus.emit(BlockStored, request_id=rid, block_id=-1, block_hash=h, parent_hash=parent,
                             token_ids=tuple(tokens), salt=None)
                    self.cached.add(h)
                    self.num_stored += 1
                    parent = h
            elif e.kind == "BlockRemoved":
                for h in e.block_hashes:
                    bus.emit(BlockEvicted, block_id=-1, block_hash=h, by_request_id=rid)
                    self.cached.discard(h)
                    self.num_removed += 1
            else:
                bus.emit(CacheReset, num_blocks_cleared=len(self.cached))
                self.cached.clear()


class VllmSubscriber:
    """Subscribes to one vLLM KV-event endpoint on a background thread.

    Each batch in sequence order is handed to `on_batch` (on the subscriber thread). A gap
    in sequence numbers is refilled from the replay endpoint when one is given; batches
    the server no longer buffers are counted in `num_missed`.
    """

    def __init__(self, endpoint: str, on_batch: Callable[[RemoteBatch], None], replay_endpoint: str | None = None,
                 topic: str = "", on_error: Callable[[Exception], None] | None = None) -> None:
        if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise InputError(f"{endpoint!r} is not a ZMQ endpoint such as tcp://127.0.0.1:5557")
        import zmq  # imported here so that reading recorded batches needs no ZMQ

        self._zmq = zmq
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.on_batch = on_batch
        self.on_error = on_error
        self.last_seq: int | None = None
        self.num_gaps_refilled = 0
        self.num_missed = 0
        self._stop = threading.Event()
        self._ctx = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self._sub.connect(endpoint)
        self._thread = threading.Thread(target=self._run, name=f"vllm-sub {endpoint}", daemon=True)

    def start(self) -> VllmSubscriber:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sub.close(linger=0)

    def _deliver(self, seq: int, payload: bytes) -> None:
        if self.last_seq is not None and seq <= self.last_seq:
            return  # already seen (replay overlap)
        self.on_batch(decode_batch(seq, payload))
        self.last_seq = seq

    def _refill(self, start: int, upto: int) -> None:
        """Ask the replay socket for batches from `start`; deliver those before `upto`."""
        zmq = self._zmq
        sock = self._ctx.socket(zmq.DEALER)
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart((b"", start.to_bytes(8, "big")))
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            while True:
                if not poller.poll(2000):
                    break
                frames = sock.recv_multipart()
                if len(frames) != 3:
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq == END_SEQ:
                    break
                if seq < upto:
                    self._deliver(seq, frames[2])
        finally:
            sock.close(linger=0)

    def _run(self) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not poller.poll(100):
                    continue
                frames = self._sub.recv_multipart()
                if len(frames) != 3:
                    continue
                seq = int.from_bytes(frames[1], "big")
                if self.last_seq is None and seq > 0 and self.replay_endpoint:
                    # Joined late: fetch what the server still buffers so the pool view
                    # starts from the oldest batch it can have.
                    self._refill(0, seq)
                    self.num_gaps_refilled += 1
                expected = 0 if self.last_seq is None else self.last_seq + 1
                if seq > expected and self.last_seq is not None:
                    if self.replay_endpoint:
                        self._refill(expected, seq)
                        self.num_gaps_refilled += 1
                    gap = seq - (self.last_seq + 1)
                    if gap > 0:
                        self.num_missed += gap
                        self.last_seq = seq - 1
                self._deliver(seq, frames[2])
            except Exception as exc:  # noqa: BLE001 - reported, the subscriber keeps going
                if self.on_error is not None:
                    self.on_error(exc)
