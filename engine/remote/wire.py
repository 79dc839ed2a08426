"""vLLM's KV-event wire format: ZMQ frames and msgpack batches, read and written.

Reads every layout vLLM has sent (DESIGN 9): PUB `[topic, seq, payload]`; replay replies
`[b"", topic, seq, payload]` (0.33) and `[b"", seq, payload]` (older), each with its end
marker of seq -1; batches `[ts, events, dp_rank]`; events as `"type"`-tagged maps (0.33)
or tagged arrays (older), unknown fields ignored, default-valued fields absent. Writes
vLLM 0.33's exact layout (`encode_batch`), which is what `--publish` sends. SGLang 0.5.23
sends the same layout with its own fields (`cache_salt`, signed hashes). Hashes are
kept in one canonical form: an integer hash becomes its 8 bytes, unsigned (16 hex
digits); a digest stays as its bytes (64 hex digits for SHA-256). No sockets, no Qt here.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack

END_SEQ = -1
MASK64 = (1 << 64) - 1
MEDIUM_DEFAULT = "GPU"  # vLLM's None medium is the GPU pool
_U32 = "I" if array("I").itemsize == 4 else "L"

# Field order of the array-tagged (older) events, after the tag; also the order of the
# 0.33 maps, whose required fields always appear and whose optional ones only when set.
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "locality", "session_id")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx", "kv_cache_spec_kind", "locality", "session_id")
_STORED_REQUIRED = 7  # block_hashes .. lora_name are always written by vLLM 0.33
_REMOVED_WRITTEN = 2  # 0.33's BlockRemoved has block_hashes and medium only (the rest is read, not written)


class MalformedFrame(ValueError):
    """A frame or payload that is not vLLM's wire format; the subscriber counts and skips it."""


def canonical_hash(value: Any) -> bytes:
    """A block hash as vLLM sent it (int or bytes) in Cachescope's one canonical form.

    An integer becomes its 8 bytes big-endian, taken modulo 2**64: vLLM sends the last 8
    bytes of its digest unsigned (older releases signed), SGLang the FIRST 8 bytes of its
    page digest as a signed int64; either way the 8 bytes, as 16 hex digits, are the bytes
    of the digest the server took them from. Bytes are kept as they are.
    """
    if isinstance(value, (bytes, bytearray)):
        if not 1 <= len(value) <= 64:
            raise MalformedFrame(f"a block hash of {len(value)} bytes is not a vLLM hash")
        return bytes(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not -(1 << 63) <= value <= MASK64:
            raise MalformedFrame(f"the block hash {value} does not fit 64 bits")
        return (value & MASK64).to_bytes(8, "big")
    raise MalformedFrame(f"a block hash must be bytes or an integer, not {type(value).__name__}")


def wire_hash(h: bytes) -> int | bytes:
    """The inverse of `canonical_hash`: 8 bytes go out as vLLM's unsigned int, digests as bytes."""
    return int.from_bytes(h, "big") if len(h) == 8 else h


@dataclass(slots=True)
class VllmEvent:
    """One KV event with every field vLLM 0.33 and SGLang 0.5.23 publish; kind is
    BlockStored, BlockRemoved, AllBlocksCleared, or the name of a type this reader does not
    know (kept so the pool can count it; it changes nothing). Hashes are canonical bytes. Not frozen only because a frozen
    dataclass is several times slower to build, and a server sends millions of these;
    treat it as a value. `token_bytes` is the token ids as native uint32, when decoded."""

    kind: str
    block_hashes: tuple[bytes, ...] = ()
    parent_block_hash: bytes | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None  # one entry per block, as vLLM publishes it
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    locality: str | None = None
    session_id: str | None = None
    token_bytes: bytes = field(default=b"", compare=False, repr=False)
    # SGLang's BlockStored names the tenant itself; vLLM puts the salt in `extra_keys`.
    cache_salt: str | None = None
    ownership: str | None = None  # the offloading connector's owner of a self-describing store
    lookahead_token_ids: tuple[Any, ...] | None = None  # speculative tokens past the block
    kv_cache_spec_sliding_window: int | None = None


@dataclass(slots=True, frozen=True)
class VllmBatch:
    """One EventBatch: `seq` from its frame, `ts` seconds since the epoch, the dp rank."""

    seq: int
    ts: float
    events: tuple[VllmEvent, ...]
    data_parallel_rank: int | None = None


# Extra keys are a tuple per block of short tuples (LoRA name, multimodal hashes, salt):
# a few levels at most. Deeper nesting is not a server's; it is refused before it can
# recurse far, and a non-finite float (which no JSON line can carry) is refused too.
MAX_EXTRA_DEPTH = 16


def _tupled(value: Any, depth: int = 0) -> Any:
    if isinstance(value, (list, tuple)):
        if depth >= MAX_EXTRA_DEPTH:
            raise MalformedFrame(f"extra_keys are nested more than {MAX_EXTRA_DEPTH} levels deep")
        return tuple(_tupled(v, depth + 1) for v in value)
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        raise MalformedFrame("extra_keys hold a number that is not finite (NaN or infinity)")
    if isinstance(value, dict):
        raise MalformedFrame("extra_keys hold a map; vLLM publishes lists")
    return value


def _check(value: Any, typ: type, name: str) -> Any:
    if value is not None and type(value) is not typ:
        if typ is str and type(value) is bytes:
            return value.decode("utf-8", "replace")
        raise MalformedFrame(f"{name} must be {'an integer' if typ is int else 'a string'}, not {type(value).__name__}")
    return value


def _hashes(raw: Any) -> tuple[bytes, ...]:
    if type(raw) is not list and type(raw) is not tuple:
        raise MalformedFrame("block_hashes must be a list")
    try:
        # The common case in one C-speed pass: unsigned 64-bit integers (vLLM's default).
        out = tuple([h.to_bytes(8, "big") for h in raw if type(h) is int])
    except OverflowError:  # a signed hash from an older release, or one too large
        out = ()
    if len(out) == len(raw):
        return out
    return tuple(canonical_hash(h) for h in raw)  # bytes digests, or the careful path


def decode_event(obj: Any) -> VllmEvent:
    """One event from a `"type"`-tagged map or a tagged array; unknown fields are ignored."""
    if type(obj) is dict:
        kind = obj.get("type")
        fields = obj
    elif isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], str):
        kind = obj[0]
        names = STORED_FIELDS if kind == "BlockStored" else REMOVED_FIELDS if kind == "BlockRemoved" else ()
        fields = dict(zip(names, obj[1:]))
    else:
        raise MalformedFrame(f"an event must be a tagged array or a map, not {type(obj).__name__}")
    get = fields.get
    if kind == "AllBlocksCleared":
        return VllmEvent("AllBlocksCleared", medium=_check(get("medium"), str, "medium"))
    if kind not in ("BlockStored", "BlockRemoved"):
        if type(kind) is not str or not 0 < len(kind) <= 100:
            raise MalformedFrame("an event has no type name")
        return VllmEvent(kind)  # a type a newer server added: counted by the pool, never fatal
    hashes = _hashes(get("block_hashes") or ())
    medium = _check(get("medium"), str, "medium")
    group_idx = _check(get("group_idx"), int, "group_idx")
    spec = _check(get("kv_cache_spec_kind"), str, "kv_cache_spec_kind")
    locality = _check(get("locality"), str, "locality")
    session_id = _check(get("session_id"), str, "session_id")
    if kind == "BlockRemoved":
        return VllmEvent("BlockRemoved", hashes, None, (), 0, None, medium, None, None, group_idx, spec, locality,
                         session_id, ownership=_check(get("ownership"), str, "ownership"))
    parent = get("parent_block_hash")
    tokens = get("token_ids") or ()
    if type(tokens) is not list and type(tokens) is not tuple:
        raise MalformedFrame(f"token_ids must be a list of integers, not {type(tokens).__name__}")
    try:
        # array() checks every id is an int in 0 .. 2**32-1 in C; the pool keeps these bytes.
        token_bytes = array(_U32, tokens).tobytes()
    except (TypeError, OverflowError):
        raise MalformedFrame("token_ids must be a list of integers from 0 to 2**32 - 1") from None
    block_size = _check(get("block_size"), int, "block_size") or 0
    if block_size < 0:
        raise MalformedFrame("block_size must not be negative")
    extra = get("extra_keys")
    lookahead = get("lookahead_token_ids")
    window = _check(get("kv_cache_spec_sliding_window"), int, "kv_cache_spec_sliding_window")
    return VllmEvent("BlockStored", hashes, canonical_hash(parent) if parent is not None else None, tuple(tokens),
                     block_size, _check(get("lora_id"), int, "lora_id"), medium, _check(get("lora_name"), str, "lora_name"),
                     _tupled(extra) if isinstance(extra, (list, tuple)) else None, group_idx, spec, locality, session_id,
                     token_bytes, _check(get("cache_salt"), str, "cache_salt"), _check(get("ownership"), str, "ownership"),
                     _tupled(lookahead) if isinstance(lookahead, (list, tuple)) else None, window)


def decode_batch(seq: int, payload: bytes) -> VllmBatch:
    """Decode one msgpack EventBatch; raises MalformedFrame with a sentence on a bad payload."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types
        raise MalformedFrame(f"batch {seq} is not valid msgpack ({type(exc).__name__})") from None
    if isinstance(obj, dict):  # a map-encoded batch (never sent by 0.33, accepted anyway)
        ts, events, rank = obj.get("ts", 0.0), obj.get("events", []), obj.get("data_parallel_rank")
    elif isinstance(obj, (list, tuple)) and len(obj) >= 2:
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) > 2 else None
    else:
        raise MalformedFrame(f"batch {seq} is not an EventBatch")
    if not isinstance(events, (list, tuple)):
        raise MalformedFrame(f"batch {seq} has no event list")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts != ts or ts in (float("inf"), float("-inf")):
        raise MalformedFrame(f"batch {seq} has no finite timestamp")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise MalformedFrame(f"batch {seq} has a bad data-parallel rank")
    return VllmBatch(seq, float(ts), tuple(decode_event(e) for e in events), rank)


def _seq(frame: bytes, signed: bool) -> int:
    if len(frame) != 8:
        raise MalformedFrame(f"a sequence frame has {len(frame)} bytes, not 8")
    return int.from_bytes(frame, "big", signed=signed)


def parse_pub(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """`[topic, seq, payload]` from the PUB socket -> (topic, seq, payload)."""
    if len(frames) != 3:
        raise MalformedFrame(f"a PUB message has 3 frames, not {len(frames)}")
    seq = _seq(frames[1], signed=True)
    if seq < 0:
        raise MalformedFrame(f"a published batch has the negative sequence number {seq}")
    return bytes(frames[0]), seq, bytes(frames[2])


def parse_replay(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """A replay reply (DEALER side) -> (seq, payload), or None for the end marker.

    vLLM 0.33 answers `[b"", topic, seq, payload]`, older releases `[b"", seq, payload]`.
    """
    if len(frames) == 4 and frames[0] == b"":
        seq_frame, payload = frames[2], frames[3]
    elif len(frames) == 3 and frames[0] == b"":
        seq_frame, payload = frames[1], frames[2]
    else:
        raise MalformedFrame(f"a replay reply has 3 or 4 frames starting with an empty one, not {len(frames)}")
    seq = _seq(seq_frame, signed=True)
    if seq == END_SEQ:
        return None
    if seq < 0:
        raise MalformedFrame(f"a replayed batch has the negative sequence number {seq}")
    return seq, bytes(payload)


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def _event_obj(e: VllmEvent) -> dict[str, Any]:
    """vLLM 0.33's map for one event: type first, required fields always, optional when set."""
    if e.kind == "AllBlocksCleared":
        return {"type": "AllBlocksCleared"}
    if e.kind == "BlockRemoved":
        names, required = REMOVED_FIELDS[:_REMOVED_WRITTEN], _REMOVED_WRITTEN
    elif e.kind == "BlockStored":
        names, required = STORED_FIELDS, _STORED_REQUIRED
    else:
        raise ValueError(f"unknown KV event type {e.kind!r}")
    out: dict[str, Any] = {"type": e.kind}
    for i, name in enumerate(names):
        value = getattr(e, name)
        if name == "block_hashes":
            value = [wire_hash(h) for h in value]
        elif name == "parent_block_hash" and value is not None:
            value = wire_hash(value)
        elif name == "token_ids":
            value = list(value)
        elif name == "medium" and value is None:
            value = MEDIUM_DEFAULT
        elif name == "extra_keys" and value is not None:
            value = _listed(value)
        if i < required or value is not None:
            out[name] = value
    return out


def _listed(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_listed(v) for v in value]
    return value


def _pack_event(obj: dict[str, Any], packer: msgpack.Packer, has_optional: bool) -> bytes:
    # msgspec writes a struct with omit_defaults behind a 16-bit map header (it patches the
    # count in afterwards) and one without optional fields behind the smallest header; the
    # fixture frames show both, so the bytes equal vLLM's.
    n = len(obj)
    head = b"\xde" + n.to_bytes(2, "big") if has_optional else packer.pack_map_header(n)
    return head + b"".join(packer.pack(k) + packer.pack(v) for k, v in obj.items())


def encode_batch(ts: float, events: Sequence[VllmEvent], data_parallel_rank: int = 0,
                 array_events: bool = False) -> bytes:
    """One EventBatch payload byte for byte as vLLM 0.33 writes it (`array_events`: the
    tagged arrays of older releases)."""
    packer = msgpack.Packer(use_bin_type=True)
    parts = [packer.pack_array_header(3), packer.pack(float(ts)), packer.pack_array_header(len(events))]
    for e in events:
        d = _event_obj(e)
        if array_events:
            names = STORED_FIELDS if e.kind == "BlockStored" else REMOVED_FIELDS if e.kind == "BlockRemoved" else ()
            parts.append(packer.pack([e.kind, *(d.get(n) for n in names)]))
        else:
            parts.append(_pack_event(d, packer, e.kind == "BlockStored"))
    parts.append(packer.pack(data_parallel_rank))
    return b"".join(parts)
