"""Typed engine events and the bus that numbers and delivers them.

Every state change of the engine is one event with a monotonically increasing `seq` and a
wall-clock `time`. Events are emitted synchronously on the thread that called the engine
method which caused them (in the app: the model worker thread; headless: the caller's
thread). The Qt layer turns them into signals in `app.runtime.bridge`; nothing here knows Qt.

`BlockStored`, `BlockEvicted` and `CacheReset` map one to one onto vLLM's `BlockStored`,
`BlockRemoved` and `AllBlocksCleared` KV-cache events.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

Listener = Callable[["Event"], None]


@dataclass(slots=True, frozen=True, kw_only=True)
class Event:
    """Base of all events. `seq` orders them; `time` is seconds since the epoch."""

    kind: ClassVar[str] = "event"
    seq: int
    time: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: digests as hex, tuples as lists, with a `kind` key."""
        cls = type(self)
        names = _FIELD_NAMES.get(cls)
        if names is None:
            names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
        out: dict[str, Any] = {"kind": self.kind}
        for name in names:
            value = getattr(self, name)
            if name == "remote" and value is None:
                continue  # the embedded engine's events stay as they were
            out[name] = value if value is None or type(value) in _PLAIN else _jsonable(value)
        return out


# Field names per event class, filled on first use: dataclasses.fields() is slow in the
# store's hot path (a recorded replay writes about a million events).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_PLAIN = (int, float, str, bool)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (tuple, list)):
        if all(type(v) in _PLAIN for v in value):
            return list(value)
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


@dataclass(slots=True, frozen=True, kw_only=True)
class MissInfo:
    """Why the first missing block of a request missed (decided by `PrefixCacheManager.lookup`)."""

    reason: str  # new_content | evicted | salt | partial_block | last_token
    first_miss_block: int
    divergence_token: int | None = None
    evicted_by_seq: int | None = None  # seq of the BlockEvicted event, for `evicted`
    other_salt: str | None = None  # the salt the tokens are cached under, for `salt`


@dataclass(slots=True, frozen=True, kw_only=True)
class RemoteInfo:
    """Where a remote (vLLM) block event came from and what vLLM said about the block.

    Set on BlockStored, BlockEvicted and CacheReset built from a vLLM KV-event stream
    (`engine.remote`); None for the embedded engine's own events. `medium` is the tier
    (GPU, CPU, STORAGE; vLLM's None is GPU); `batch_seq` is the sequence number of the
    vLLM batch; `extra_keys` is what vLLM published for this block (the salt untagged).
    """

    source: str  # the endpoint, with the data-parallel rank when there are several
    rank: int = 0
    batch_seq: int = -1
    batch_time: float = 0.0
    medium: str = "GPU"
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    lora_id: int | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    locality: str | None = None
    session_id: str | None = None
    block_size: int | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class RequestStarted(Event):
    kind: ClassVar[str] = "request_started"
    request_id: str
    num_prompt_tokens: int
    salt: str | None


@dataclass(slots=True, frozen=True, kw_only=True)
class LookupDone(Event):
    """The prefix-cache lookup of one request: its full-block hashes and what hit."""

    kind: ClassVar[str] = "lookup"
    request_id: str
    block_hashes: tuple[bytes, ...]
    num_hit_blocks: int
    num_cached_tokens: int
    num_prompt_tokens: int
    miss: MissInfo


@dataclass(slots=True, frozen=True, kw_only=True)
class BlocksAllocated(Event):
    """Blocks taken for a request: hits (shared) and fresh ones, in block-table order."""

    kind: ClassVar[str] = "blocks_allocated"
    request_id: str
    block_ids: tuple[int, ...]
    num_hit_blocks: int


@dataclass(slots=True, frozen=True, kw_only=True)
class BlockStored(Event):
    """A full block got its hash and became findable (vLLM: BlockStored)."""

    kind: ClassVar[str] = "block_stored"
    request_id: str
    block_id: int
    block_hash: bytes
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    salt: str | None
    external_id: int | None = None  # a Mooncake hash id, for block-level traces
    remote: RemoteInfo | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class RefCountsChanged(Event):
    """New ref counts of the listed blocks, after a hit, allocation or finish."""

    kind: ClassVar[str] = "ref_counts_changed"
    request_id: str
    block_ids: tuple[int, ...]
    ref_counts: tuple[int, ...]


@dataclass(slots=True, frozen=True, kw_only=True)
class BlocksFreed(Event):
    """Blocks whose ref count fell to zero, appended to the free queue in this order."""

    kind: ClassVar[str] = "blocks_freed"
    request_id: str
    block_ids: tuple[int, ...]


@dataclass(slots=True, frozen=True, kw_only=True)
class BlockEvicted(Event):
    """A free cached block was taken for new data; its old hash is gone (vLLM: BlockRemoved)."""

    kind: ClassVar[str] = "block_evicted"
    block_id: int
    block_hash: bytes
    by_request_id: str
    remote: RemoteInfo | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class RequestRefused(Event):
    kind: ClassVar[str] = "request_refused"
    request_id: str
    num_blocks_needed: int
    num_blocks_available: int


@dataclass(slots=True, frozen=True, kw_only=True)
class RequestFinished(Event):
    kind: ClassVar[str] = "request_finished"
    request_id: str
    num_tokens_with_kv: int
    aborted: bool = False


@dataclass(slots=True, frozen=True, kw_only=True)
class CacheReset(Event):
    """Every cached hash was dropped (vLLM: AllBlocksCleared)."""

    kind: ClassVar[str] = "cache_reset"
    num_blocks_cleared: int
    remote: RemoteInfo | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class SemanticLookup(Event):
    """A semantic-cache lookup: neighbours with cosine scores and the decision taken."""

    kind: ClassVar[str] = "semantic_lookup"
    prompt: str
    neighbours: tuple[tuple[int, float], ...]  # (entry id, score), best first
    decision: str  # hit | miss | guarded_miss
    threshold: float
    flags: tuple[str, ...] = ()
    tenant: str | None = None
    guard: bool = False  # guarded mode: a flagged neighbour is not served
    entry_id: int | None = None  # the entry served on a hit
    neighbour_flags: tuple[tuple[str, ...], ...] = ()  # risk flags of each neighbour, same order


@dataclass(slots=True, frozen=True, kw_only=True)
class SemanticStored(Event):
    kind: ClassVar[str] = "semantic_stored"
    entry_id: int
    prompt: str
    tenant: str | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class SemanticEvicted(Event):
    kind: ClassVar[str] = "semantic_evicted"
    entry_id: int
    reason: str  # lru | ttl | removed


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        RequestStarted, LookupDone, BlocksAllocated, BlockStored, RefCountsChanged,
        BlocksFreed, BlockEvicted, RequestRefused, RequestFinished, CacheReset,
        SemanticLookup, SemanticStored, SemanticEvicted,
    )
}


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from `Event.to_dict()` output (used by the store and replays)."""
    cls = EVENT_TYPES[data["kind"]]
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = data.get(f.name)
        if f.name in ("block_hash", "parent_hash") and isinstance(value, str):
            value = bytes.fromhex(value)
        elif f.name == "block_hashes":
            value = tuple(bytes.fromhex(v) for v in value)
        elif f.name == "miss" and isinstance(value, dict):
            value = MissInfo(**value)
        elif f.name == "remote" and isinstance(value, dict):
            value = RemoteInfo(**{**value, "extra_keys": _tupled(value.get("extra_keys"))})
        elif f.name == "neighbours":
            value = tuple((int(a), float(b)) for a, b in value)
        elif f.name == "neighbour_flags" and value is not None:
            value = tuple(tuple(v) for v in value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    return cls(**kwargs)


def _tupled(value: Any) -> Any:
    """JSON lists back to the tuples an event holds (extra keys nest them)."""
    if isinstance(value, list):
        return tuple(_tupled(v) for v in value)
    return value


@dataclass(slots=True)
class EventBus:
    """Numbers events and hands them to listeners, synchronously, in subscription order.

    Emitters check `active` first so that a headless replay with nobody listening pays
    nothing for event objects. Listeners run on the emitting thread and must be quick;
    the app's bridge only appends to a buffer.
    """

    clock: Callable[[], float] = time.time
    _listeners: list[Listener] = field(default_factory=list)
    _next_seq: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def active(self) -> bool:
        return bool(self._listeners)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(event)` for every later event; returns a function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def next_seq(self) -> int:
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            return seq

    def emit(self, cls: type[Event], **fields: Any) -> Event | None:
        """Build an event of `cls` with the next sequence number and deliver it."""
        if not self._listeners:
            return None
        event = cls(seq=self.next_seq(), time=self.clock(), **fields)
        for listener in tuple(self._listeners):
            listener(event)
        return event
