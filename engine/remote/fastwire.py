"""The fast reader of vLLM's and SGLang's KV-event batches; `engine.remote.wire` stays the reference.

`decode_batch(seq, payload)` returns what `wire.decode_batch` returns for the same payload
(the same events, hashes, counters once applied, and the same `MalformedFrame` for a bad
one), reached differently:

- The batch is decoded by msgspec (the library vLLM and SGLang publish with) into typed
  Structs, a tagged union on `"type"` (vLLM 0.33's map events), with `msgspec.Raw` for
  `block_hashes`, `token_ids` and the free-form fields: msgspec checks every typed field
  in C and makes no Python object per element of the raw ones.
- One compiled pass over the frame (`_skim`, numba, cached on disk like `engine.kernel`;
  `warm_up` compiles or loads it) decodes the token ids of every store into one shared
  uint32 array, and finds each event's hash array: vLLM's unsigned 64-bit integers
  (`0xcf` + 8 bytes) and SGLang's signed ones (`0xd3` + 8 bytes) ARE the 8 canonical
  bytes (`wire.canonical_hash`: the value modulo 2**64, big-endian), and a SHA-256
  digest (`0xc4 0x20` + 32 bytes) is its 32. So a hash is one slice of the frame (a fixed
  8- or 32-byte key, what the pool's tiers are keyed by), and an event's `token_bytes`
  is its slice of the shared array, `token_ids` left empty: no Python int is made per
  token id or per hash.

Why this route and not a compiled decoder of the whole frame: msgspec already checks
every typed field in C with vLLM's own schema, so only the two large homogeneous fields
need custom code, and both are simple byte layouts; the rest of a batch (a few strings
and small ints per event) costs little. Anything outside the fast path's narrow subset
(older tagged-array events, map-encoded batches, a field this reader does not know, a
hash that is not 8 or 32 bytes, a token id written in a signed or oversized format, a
string sent as bytes, any type mismatch) is decoded by the reference reader instead,
which also words the `MalformedFrame`; so the fast path can never accept what the reference refuses, and a
malformed frame is counted exactly as before. `cachescope bench attach` measures it
beside the reference and msgpack's own unpack of the same frames; the first compile of
`_skim` takes about 15 s on a loaded 2-core machine, once (the disk cache serves later
processes).
"""

from __future__ import annotations

import math
import threading
from functools import partial
from itertools import repeat
from operator import is_
from typing import Any, Union

import msgspec
import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from engine.core.growth import unheld
from engine.remote import wire
from engine.remote.wire import MalformedFrame, VllmBatch, VllmEvent, _tupled, canonical_hash, encode_batch

_NIL = msgspec.Raw(b"\xc0")


class _Stored(msgspec.Struct, tag="BlockStored", tag_field="type", forbid_unknown_fields=True):
    block_hashes: msgspec.Raw = _NIL
    parent_block_hash: Union[int, bytes, None] = None
    token_ids: msgspec.Raw = _NIL
    block_size: Union[int, None] = None
    lora_id: Union[int, None] = None
    medium: Union[str, None] = None
    lora_name: Union[str, None] = None
    extra_keys: msgspec.Raw = _NIL
    group_idx: Union[int, None] = None
    kv_cache_spec_kind: Union[str, None] = None
    locality: Union[str, None] = None
    session_id: Union[str, None] = None
    cache_salt: Union[str, None] = None
    ownership: Union[str, None] = None
    lookahead_token_ids: msgspec.Raw = _NIL
    kv_cache_spec_sliding_window: Union[int, None] = None


class _Removed(msgspec.Struct, tag="BlockRemoved", tag_field="type", forbid_unknown_fields=True):
    block_hashes: msgspec.Raw = _NIL
    medium: Union[str, None] = None
    group_idx: Union[int, None] = None
    kv_cache_spec_kind: Union[str, None] = None
    locality: Union[str, None] = None
    session_id: Union[str, None] = None
    ownership: Union[str, None] = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", forbid_unknown_fields=True):
    medium: Union[str, None] = None


class _Batch(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    ts: float
    events: list[Union[_Stored, _Removed, _Cleared]]
    data_parallel_rank: Union[int, None] = None


_decoder = msgspec.msgpack.Decoder(_Batch)


class _Slow(Exception):
    """The payload is outside the fast path's subset: the reference reader decides."""


_TOKEN_KEY = np.frombuffer(b"token_ids", np.uint8)
_HASH_KEY = np.frombuffer(b"block_hashes", np.uint8)


@njit(cache=True)
def _head(buf, p):  # pragma: no cover - compiled
    """(bytes of the header at p, items that follow it, bytes of payload after the header);
    items: 1 per array element, 2 per map pair; -1 bytes: not msgpack or past the end."""
    n = len(buf)
    if p >= n:
        return -1, 0, 0
    b = buf[p]
    if b <= 0x7F or b >= 0xE0 or b == 0xC0 or b == 0xC2 or b == 0xC3:
        return 1, 0, 0
    if 0x80 <= b <= 0x8F:
        return 1, 2 * (b & 0x0F), 0
    if 0x90 <= b <= 0x9F:
        return 1, b & 0x0F, 0
    if 0xA0 <= b <= 0xBF:
        return 1, 0, b & 0x1F
    if b == 0xCC or b == 0xD0:
        return 1, 0, 1
    if b == 0xCD or b == 0xD1:
        return 1, 0, 2
    if b == 0xCE or b == 0xD2 or b == 0xCA:
        return 1, 0, 4
    if b == 0xCF or b == 0xD3 or b == 0xCB:
        return 1, 0, 8
    if 0xD4 <= b <= 0xD8:
        return 2, 0, 1 << (b - 0xD4)
    w = 1 << ((b - 0xC4) % 3) if 0xC4 <= b <= 0xC9 else (1 << ((b - 0xD9) % 3) if 0xD9 <= b <= 0xDB else
                                                          (2 if b == 0xDC or b == 0xDE else 4))
    if b == 0xC1 or p + 1 + w > n:
        return -1, 0, 0
    size = np.int64(0)
    for j in range(w):
        size = (size << 8) | buf[p + 1 + j]
    if b == 0xDC or b == 0xDD:
        return 1 + w, size, 0
    if b == 0xDE or b == 0xDF:
        return 1 + w, 2 * size, 0
    if 0xC7 <= b <= 0xC9:
        return 2 + w, 0, size
    return 1 + w, 0, size


@njit(cache=True)
def _skip(buf, p):  # pragma: no cover - compiled
    """The offset past the value at p, or -1."""
    pending = 1
    while pending:
        h, items, size = _head(buf, p)
        if h < 0:
            return -1
        p += h + size
        pending += items - 1
    return p if p <= len(buf) else -1


@njit(cache=True)
def _is_key(buf, p, h, size, key):  # pragma: no cover - compiled
    b = buf[p]
    if size != len(key) or not (0xA0 <= b <= 0xBF or 0xD9 <= b <= 0xDB):
        return False
    for j in range(size):
        if buf[p + h + j] != key[j]:
            return False
    return True


@njit(cache=True)
def _skim(buf, token_key, hash_key):  # pragma: no cover - compiled
    """Walk one EventBatch `[ts, [event map, ...], rank]`: every event's token ids into one
    uint32 array and where its hashes lie. Returns (tokens, rows, ok); rows[i] = (first
    token, token count, offset of the first hash's bytes, hash count, hash width 8 or 32,
    or 0 when absent or nil). ok is False when anything is outside the fast subset:
    token ids not positive fixint/uint8/16/32, hashes not all uint64/int64 or all 32-byte
    bins, an event that is not a map, bytes that are not msgpack."""
    empty = np.empty((0, 5), np.int64)
    h, items, size = _head(buf, 0)  # the batch array (msgspec has checked its shape)
    if h < 0 or size or items < 2:
        return np.empty(0, np.uint32), empty, False
    p = _skip(buf, h)  # the timestamp
    if p < 0:
        return np.empty(0, np.uint32), empty, False
    h, m, size = _head(buf, p)
    if h < 0 or size or not (0x90 <= buf[p] <= 0x9F or buf[p] == 0xDC or buf[p] == 0xDD):
        return np.empty(0, np.uint32), empty, False
    p += h
    tokens = np.empty(len(buf), np.uint32)
    rows = np.zeros((m, 5), np.int64)
    k = 0
    for i in range(m):
        h, pairs, size = _head(buf, p)
        if h < 0 or size or not (0x80 <= buf[p] <= 0x8F or buf[p] == 0xDE or buf[p] == 0xDF):
            return np.empty(0, np.uint32), empty, False
        p += h
        for _ in range(pairs // 2):
            h, items, size = _head(buf, p)
            if h < 0 or p + h + size > len(buf):
                return np.empty(0, np.uint32), empty, False
            is_tokens = _is_key(buf, p, h, size, token_key)
            is_hashes = not is_tokens and _is_key(buf, p, h, size, hash_key)
            p = _skip(buf, p)
            if p < 0:
                return np.empty(0, np.uint32), empty, False
            if not is_tokens and not is_hashes:
                p = _skip(buf, p)
                if p < 0:
                    return np.empty(0, np.uint32), empty, False
                continue
            h, n, size = _head(buf, p)
            if h < 0 or size:
                return np.empty(0, np.uint32), empty, False
            b = buf[p]
            if b == 0xC0:
                p += 1
                continue
            if not (0x90 <= b <= 0x9F or b == 0xDC or b == 0xDD):
                return np.empty(0, np.uint32), empty, False
            p += h
            if is_tokens:
                rows[i, 0] = k
                rows[i, 1] = n
                for _ in range(n):
                    if p >= len(buf):
                        return np.empty(0, np.uint32), empty, False
                    b = buf[p]
                    if b < 0x80:
                        tokens[k] = b
                        p += 1
                    elif b == 0xCC and p + 2 <= len(buf):
                        tokens[k] = buf[p + 1]
                        p += 2
                    elif b == 0xCD and p + 3 <= len(buf):
                        tokens[k] = (np.uint32(buf[p + 1]) << 8) | buf[p + 2]
                        p += 3
                    elif b == 0xCE and p + 5 <= len(buf):
                        tokens[k] = (np.uint32(buf[p + 1]) << 24) | (np.uint32(buf[p + 2]) << 16) \
                            | (np.uint32(buf[p + 3]) << 8) | buf[p + 4]
                        p += 5
                    else:
                        return np.empty(0, np.uint32), empty, False
                    k += 1
            else:
                rows[i, 3] = n
                if n == 0:
                    continue
                b = buf[p]
                width = 8 if (b == 0xCF or b == 0xD3) else (32 if b == 0xC4 else 0)
                if width == 0:
                    return np.empty(0, np.uint32), empty, False
                rows[i, 2] = p + 1 if width == 8 else p + 2
                rows[i, 4] = width
                for _ in range(n):
                    if p + 1 + width > len(buf):
                        return np.empty(0, np.uint32), empty, False
                    b = buf[p]
                    if width == 8 and b != 0xCF and b != 0xD3:
                        return np.empty(0, np.uint32), empty, False
                    if width == 32 and (b != 0xC4 or buf[p + 1] != 32 or p + 34 > len(buf)):
                        return np.empty(0, np.uint32), empty, False
                    p += 9 if width == 8 else 34
    return tokens[:k], rows, True


_warm = False


def warm_up() -> None:
    """Compile (or load from the on-disk cache) the skimmer and the columns readers now, not on the first frame."""
    global _warm
    if _warm:
        return
    _warm = True
    _skim(np.frombuffer(encode_batch(0.0, [VllmEvent("BlockStored", (b"\x00" * 8,), None, (1, 200, 70000), 3)]),
                        np.uint8), _TOKEN_KEY, _HASH_KEY)
    # the columns: a frame of common events (one compiled pass) and one with an event
    # kept whole (msgspec, `_skim`, `_arrange`); a hash of 2**63 is written as a uint64
    h = (1 << 63).to_bytes(8, "big")
    decode_columns(0, encode_batch(0.0, [VllmEvent("BlockStored", (h,), None, (1, 200, 70000), 3)]))
    decode_columns(0, encode_batch(0.0, [VllmEvent("BlockStored", (h,), None, (1, 2, 3), 3, lora_name="warm-up")]))
    decode_columns_many(0, [encode_batch(0.0, [VllmEvent("BlockStored", (h,), None, (1, 200, 70000), 3)])])


def _optional(raw: msgspec.Raw) -> Any:
    """An Any-typed field (extra keys, lookahead tokens) as the reference reads it."""
    if raw is _NIL or bytes(raw) == b"\xc0":
        return None
    value = msgspec.msgpack.decode(raw)
    return _tupled(value) if isinstance(value, list) else None


def _fast(seq: int, payload: bytes) -> VllmBatch:
    try:
        b = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        raise _Slow from None
    ts, rank = b.ts, b.data_parallel_rank
    if not math.isfinite(ts) or (rank is not None and rank < 0):
        raise _Slow
    tokens, rows, ok = _skim(np.frombuffer(payload, np.uint8), _TOKEN_KEY, _HASH_KEY)
    if not ok or len(rows) != len(b.events):
        raise _Slow
    tokens = tokens.tobytes()
    events = [_event_of(e, row, payload, tokens) for e, row in zip(b.events, rows.tolist())]
    return VllmBatch(seq, float(ts), tuple(events), rank)


def decode_batch(seq: int, payload: bytes) -> VllmBatch:
    """One EventBatch, as `wire.decode_batch` gives it, without a Python object per token
    id or per hash's integer; raises the reference's MalformedFrame on a bad payload."""
    try:
        return _fast(seq, payload)
    except (_Slow, MalformedFrame, OverflowError, ValueError, TypeError, IndexError, RecursionError):
        return wire.decode_batch(seq, payload)


def same_tokens(event: VllmEvent) -> tuple[int, ...]:
    """An event's token ids, whether the reference (a tuple) or this reader (bytes) decoded it."""
    if event.token_ids or not event.token_bytes:
        return tuple(event.token_ids)
    return tuple(np.frombuffer(event.token_bytes, np.uint32).tolist())





# ---- columns: a batch as arrays, for the columnar pool (engine.remote.colpool) -----------

_K_TYPE = np.frombuffer(b"type", np.uint8)
_K_PARENT = np.frombuffer(b"parent_block_hash", np.uint8)
_K_SIZE = np.frombuffer(b"block_size", np.uint8)
_K_MEDIUM = np.frombuffer(b"medium", np.uint8)
_V_STORED = np.frombuffer(b"BlockStored", np.uint8)
_V_REMOVED = np.frombuffer(b"BlockRemoved", np.uint8)
_V_CLEARED = np.frombuffer(b"AllBlocksCleared", np.uint8)
_V_GPU = np.frombuffer(b"GPU", np.uint8)
_V_CPU = np.frombuffer(b"CPU", np.uint8)

KIND_STORED, KIND_REMOVED, KIND_CLEARED, KIND_OTHER = 0, 1, 2, 3
# columns of `ColumnarBatch.rows`
R_KIND, R_TOK0, R_NTOK, R_HASH0, R_NHASH, R_WIDTH, R_MEDIUM, R_PARENT, R_SIZE, R_RARE = range(10)
NUM_R = 10


@njit(cache=True)
def _str_is(buf, p, h, size, lit):  # pragma: no cover - compiled
    if size != len(lit):
        return False
    for j in range(size):
        if buf[p + h + j] != lit[j]:
            return False
    return True


@njit(cache=True)
def _int_at(buf, p):  # pragma: no cover - compiled
    """(ok, value as uint64 bits) of the msgpack integer at p; ok False for anything else."""
    b = buf[p]
    n = len(buf)
    if b <= 0x7F:
        return True, np.uint64(b)
    if b >= 0xE0:
        return True, np.uint64(np.int64(b) - 256)
    if b == 0xCC or b == 0xD0:
        w = 1
    elif b == 0xCD or b == 0xD1:
        w = 2
    elif b == 0xCE or b == 0xD2:
        w = 4
    elif b == 0xCF or b == 0xD3:
        w = 8
    else:
        return False, np.uint64(0)
    if p + 1 + w > n:
        return False, np.uint64(0)
    v = np.uint64(0)
    for j in range(w):
        v = (v << np.uint64(8)) | np.uint64(buf[p + 1 + j])
    if b >= 0xD0 and w < 8 and buf[p + 1] >= 0x80:  # a negative signed integer: sign-extend
        v = v | ~((np.uint64(1) << np.uint64(8 * w)) - np.uint64(1))
    return True, v


@njit(cache=True)
def _skim_columns(buf, rows, parents):  # pragma: no cover - compiled
    """Per event of an EventBatch that `_skim` has read (rows[:, :5] filled by it): its kind,
    medium (0 nil, 1 "GPU", 2 "CPU", 3 another), parent (0 nil, 1 an integer in
    `parents`, 2 anything else), block size (-1: not a plain integer of 0 or more) and
    whether it names anything beyond the common fields (rare: decoded in Python)."""
    h, items, size = _head(buf, 0)
    p = _skip(buf, h)
    h, m, size = _head(buf, p)
    p += h
    for i in range(m):
        h, pairs, size = _head(buf, p)
        p += h
        rows[i, 6] = KIND_OTHER
        for _ in range(pairs // 2):
            h, items, size = _head(buf, p)
            kp, kh, ksize = p, h, size
            p = _skip(buf, p)
            vh, vitems, vsize = _head(buf, p)
            b = buf[p]
            is_str = 0xA0 <= b <= 0xBF or 0xD9 <= b <= 0xDB
            if _str_is(buf, kp, kh, ksize, _K_TYPE):
                if is_str and _str_is(buf, p, vh, vsize, _V_STORED):
                    rows[i, 6] = KIND_STORED
                elif is_str and _str_is(buf, p, vh, vsize, _V_REMOVED):
                    rows[i, 6] = KIND_REMOVED
                elif is_str and _str_is(buf, p, vh, vsize, _V_CLEARED):
                    rows[i, 6] = KIND_CLEARED
            elif _str_is(buf, kp, kh, ksize, _K_MEDIUM):
                if b == 0xC0:
                    rows[i, 7] = 0
                elif is_str and _str_is(buf, p, vh, vsize, _V_GPU):
                    rows[i, 7] = 1
                elif is_str and _str_is(buf, p, vh, vsize, _V_CPU):
                    rows[i, 7] = 2
                else:
                    rows[i, 7] = 3
            elif _str_is(buf, kp, kh, ksize, _K_PARENT):
                if b == 0xC0:
                    rows[i, 8] = 0
                else:
                    ok, v = _int_at(buf, p)
                    if ok:
                        rows[i, 8] = 1
                        parents[i] = v
                    else:
                        rows[i, 8] = 2
            elif _str_is(buf, kp, kh, ksize, _K_SIZE):
                if b == 0xC0:
                    rows[i, 9] = 0
                else:
                    ok, v = _int_at(buf, p)
                    rows[i, 9] = np.int64(v) if ok and b != 0xD3 and np.int64(v) >= 0 and v < (1 << 40) else -1
            elif not _is_key(buf, kp, kh, ksize, _TOKEN_KEY) and not _is_key(buf, kp, kh, ksize, _HASH_KEY):
                if b != 0xC0:
                    rows[i, 10] = 1
            p = _skip(buf, p)


@njit(cache=True)
def _hash_keys(buf, rows, keys):  # pragma: no cover - compiled
    """The 8-byte hashes of every event (big-endian, as `canonical_hash` writes them) into
    `keys`, in event order; 32-byte digests are left for Python."""
    k = 0
    for i in range(len(rows)):
        n = rows[i, 3]
        if rows[i, 4] == 8:
            o = rows[i, 2]
            for _ in range(n):
                v = np.uint64(0)
                for j in range(8):
                    v = (v << np.uint64(8)) | np.uint64(buf[o + j])
                keys[k] = v
                k += 1
                o += 9
        else:
            k += n


@njit(cache=True)
def _arrange(buf, skim):  # pragma: no cover - compiled
    """`_skim`'s rows with `_skim_columns`' fields as `ColumnarBatch` rows, the parents and
    the 8-byte hash keys, in one pass; ok False for a store whose block size is not a
    plain integer of 0 or more."""
    n = len(skim)
    rows = np.zeros((n, 11), np.int64)
    rows[:, :5] = skim
    parents = np.zeros(n, np.uint64)
    _skim_columns(buf, rows, parents)
    out = np.empty((n, NUM_R), np.int64)
    total = 0
    ok = True
    for i in range(n):
        out[i, R_KIND] = rows[i, 6]
        out[i, R_TOK0] = rows[i, 0]
        out[i, R_NTOK] = rows[i, 1]
        out[i, R_NHASH] = rows[i, 3]
        out[i, R_HASH0] = total
        total += rows[i, 3]
        out[i, R_WIDTH] = rows[i, 4]
        out[i, R_MEDIUM] = rows[i, 7]
        out[i, R_PARENT] = rows[i, 8]
        out[i, R_SIZE] = rows[i, 9]
        if rows[i, 6] == KIND_STORED and rows[i, 9] < 0:
            ok = False
        rare = rows[i, 10] != 0 or rows[i, 7] == 3 or rows[i, 8] == 2 or rows[i, 4] == 32 \
            or rows[i, 6] == KIND_OTHER or rows[i, 6] == KIND_CLEARED
        out[i, R_RARE] = 1 if rare else 0
    keys = np.empty(total, np.uint64)
    _hash_keys(buf, rows, keys)
    return out, parents, keys, ok


_new_object = object.__new__  # (`ColumnarBatch.of_run`: an instance without `__init__`)
_IS_BYTES = partial(is_, bytes)  # (a type is bytes itself)


class ColumnarBatch:
    """One EventBatch as arrays (what `decode_columns` gives and `ColumnarPool.apply` takes).

    `rows[i]` (int64, `R_*` columns) says event i's kind, its token ids as a range of
    `tokens` (uint32), its hashes as a range of `keys` (uint64: an 8-byte hash's value;
    a 32-byte digest's is filled by the pool), medium, parent (in `parents`), block size
    and whether it is rare: anything beyond block hashes, parent, token ids, block size
    and a GPU or CPU medium. `events[i]` is the `VllmEvent` of each rare event (and of
    every event when the batch came from the reference reader), so nothing is decoded
    twice; `batch()` builds the whole `VllmBatch` when someone needs it."""

    __slots__ = ("seq", "ts", "data_parallel_rank", "_rows", "_parents", "_keys", "_tokens", "events", "payload",
                 "_data", "num_keys", "num_tokens", "run", "run_at")

    def __init__(self, seq: int, ts: float, rank: int | None, rows: np.ndarray, parents: np.ndarray | None,
                 keys: np.ndarray | None, tokens: np.ndarray | None, events: dict[int, VllmEvent],
                 payload: bytes | None, data: np.ndarray | None = None, num_keys: int = 0,
                 num_tokens: int = 0, run: DecodedRun | None = None, run_at: int = 0) -> None:
        self.seq, self.ts, self.data_parallel_rank = seq, ts, rank
        self._rows, self._parents, self._keys, self._tokens = rows, parents, keys, tokens
        self.events, self.payload = events, payload
        # the one-pass reader's frame: parents, hashes and token ids in one uint64 array,
        # `data` (one parent a row, then the hashes, then the token ids as uint32, two a
        # word); the three arrays are views of it, made when first read (`ColumnarPool.
        # apply_many` joins the frames' `data` and reads none of them)
        self._data, self.num_keys, self.num_tokens = data, num_keys, num_tokens
        # the `decode_columns_many` call that read it (`DecodedRun`) and its frame there (its
        # rows and data, None until first read, are views of the run's: `apply_many` reads
        # neither, and making them was a third of the call's Python); None for a batch read
        # alone or by the reference
        self.run, self.run_at = run, run_at

    @staticmethod
    def of_run(seq: int, ts: float, rank: int, payload: bytes, num_keys: int, num_tokens: int, run: DecodedRun,
               run_at: int) -> ColumnarBatch:
        """`ColumnarBatch(seq, ts, rank or None, None, None, None, None, {}, payload, None, num_keys,
        num_tokens, run, run_at)` (rank -1: none), for frame `run_at` of a `decode_columns_many`
        run: its slots set here, not through `__init__`'s 14 arguments (a run's 64 batches
        took ~30 us, a seventh of its Python)."""
        b = _new_object(ColumnarBatch)
        b.seq, b.ts, b.data_parallel_rank = seq, ts, None if rank < 0 else rank
        b._rows = b._parents = b._keys = b._tokens = b._data = None
        b.events, b.payload, b.num_keys, b.num_tokens, b.run, b.run_at = {}, payload, num_keys, num_tokens, run, run_at
        return b

    def _run_views(self) -> None:
        r0, m, d0, w = self.run.meta[self.run_at, [M_ROW0, M_ROWS, M_DATA0, M_WORDS]].tolist()
        self._rows, self._data = self.run.rows[r0:r0 + m], self.run.data[d0:d0 + w]

    @property
    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._run_views()
        return self._rows

    @rows.setter
    def rows(self, rows: np.ndarray) -> None:
        self._rows = rows

    @property
    def data(self) -> np.ndarray | None:
        if self._data is None and self.run is not None:
            self._run_views()
        return self._data

    @data.setter
    def data(self, data: np.ndarray | None) -> None:
        self._data = data

    def _views(self) -> None:
        m, nk = len(self.rows), self.num_keys
        self._parents, self._keys = self.data[:m], self.data[m:m + nk]
        self._tokens = self.data[m + nk:].view(np.uint32)[:self.num_tokens]

    @property
    def parents(self) -> np.ndarray:
        if self._parents is None:
            self._views()
        return self._parents

    @property
    def keys(self) -> np.ndarray:
        if self._keys is None:
            self._views()
        return self._keys

    @property
    def tokens(self) -> np.ndarray:
        if self._tokens is None:
            self._views()
        return self._tokens

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self) -> VllmBatch:
        """The same batch as `decode_batch` gives it (one VllmEvent per event)."""
        if self.payload is None:
            return VllmBatch(self.seq, self.ts, tuple(self.events[i] for i in range(len(self.rows))),
                             self.data_parallel_rank)
        return _fast(self.seq, bytes(self.payload))  # (a view of a receive's buffer, or bytes)


def columns_of(batch: VllmBatch) -> ColumnarBatch:
    """A batch some reader (or code) made, as columns: every event is rare, kept whole."""
    n = len(batch.events)
    rows = np.zeros((n, NUM_R), np.int64)
    rows[:, R_RARE] = 1
    return ColumnarBatch(batch.seq, batch.ts, batch.data_parallel_rank, rows, np.zeros(n, np.uint64),
                         np.zeros(0, np.uint64), np.zeros(0, np.uint32), dict(enumerate(batch.events)), None)


# One compiled pass for a frame of common events only: what `_columns` gives it, without
# msgspec. It accepts a narrower subset than msgspec's typed decode (every field that
# `_Stored`/`_Removed` declare, each at most once; no other key; the type tag a
# BlockStored or BlockRemoved; ts a finite float64; a rank nil or a positive integer below
# 2**32; hashes all uint64/int64; token ids unsigned below 2**32; a parent nil or an
# integer; a block size nil or an integer from 0 below 2**40; a medium nil, "GPU" or
# "CPU"; every other field nil; nothing after the batch). Anything else, valid or not,
# goes to `_columns` and the reference as before, so it can never accept what they refuse,
# and it gives the same columns for what it takes (tests/test_fastwire.py).

_FIELDS = ("type",) + tuple(f for f in _Stored.__struct_fields__ if f in ("block_hashes", "parent_block_hash",
                                                                            "token_ids", "block_size", "medium")) \
    + tuple(f for f in _Stored.__struct_fields__ if f not in ("block_hashes", "parent_block_hash", "token_ids",
                                                               "block_size", "medium"))
assert _FIELDS[1:6] == ("block_hashes", "parent_block_hash", "token_ids", "block_size", "medium")
assert set(_Removed.__struct_fields__) <= set(_FIELDS)
_FIELD_BYTES = np.frombuffer(b"".join(f.encode() for f in _FIELDS), np.uint8)
_FIELD_OFF = np.cumsum([0] + [len(f) for f in _FIELDS]).astype(np.int64)
_STORED_OK = sum(1 << i for i, f in enumerate(_FIELDS) if f == "type" or f in _Stored.__struct_fields__)
_REMOVED_OK = sum(1 << i for i, f in enumerate(_FIELDS) if f == "type" or f in _Removed.__struct_fields__)


def _next_fields() -> np.ndarray:
    """[kind, f]: the field vLLM writes after field f (msgspec writes a Struct's fields in
    their order, the tag first), row 0 for a store (and before the type is read), row 1 for
    a removal; column len(_FIELDS): the first (the type). `_frame_into` compares a key with
    it first and searches (`_field_id`) only when it is another: the search passed ~20
    names a stored event (a frame's read 0.0439 -> 0.0423 s for 200K recorded events)."""
    out = np.zeros((2, len(_FIELDS) + 1), np.int64)
    for row, order in enumerate((_Stored.__struct_fields__, _Removed.__struct_fields__)):
        wire = [0] + [_FIELDS.index(f) for f in order]
        out[row, wire[:-1]] = wire[1:]
    return out


_NEXT_FIELD = _next_fields()


@njit(cache=True)
def _field_id(buf, p, h, size, fb, fo):  # pragma: no cover - compiled
    for f in range(len(fo) - 1):
        a = fo[f]
        if fo[f + 1] - a == size:
            same = True
            for j in range(size):
                if buf[p + h + j] != fb[a + j]:
                    same = False
                    break
            if same:
                return f
    return -1


@njit(cache=True)
def _array_head(buf, p):  # pragma: no cover - compiled
    """(header bytes, items) of the msgpack array at p, or (-1, 0)."""
    n = len(buf)
    if p >= n:
        return -1, 0
    b = buf[p]
    if 0x90 <= b <= 0x9F:
        return 1, b & 0x0F
    if b == 0xDC and p + 3 <= n:
        return 3, (np.int64(buf[p + 1]) << 8) | buf[p + 2]
    if b == 0xDD and p + 5 <= n:
        return 5, (np.int64(buf[p + 1]) << 24) | (np.int64(buf[p + 2]) << 16) | (np.int64(buf[p + 3]) << 8) \
            | buf[p + 4]
    return -1, 0


@njit(cache=True, inline="always")
def _uint16_ids(buf, p, n, tokens, t, c):  # pragma: no cover - compiled
    """The token ids from p on written as uint16 (0xCD: vLLM's usual ones, 256..65535) into
    tokens[t:], at most c of them: (p, t) past those. Unsigned indices: numba adds no
    wraparound for a negative index to them (with it, reading the 200K recorded events' frames
    took 0.0439 s, with this and `_next_fields` 0.0385, a signed loop alone no less)."""
    q, u, stop, un = np.uint64(p), np.uint64(t), np.uint64(t + c), np.uint64(n)
    while u < stop and q + np.uint64(3) <= un and buf[q] == 0xCD:
        tokens[u] = (np.uint32(buf[q + np.uint64(1)]) << 8) | buf[q + np.uint64(2)]
        q += np.uint64(3)
        u += np.uint64(1)
    return np.int64(q), np.int64(u)


@njit(cache=True, nogil=True)
def _frame_into(buf, out_rows, r0, out_data, d0):  # pragma: no cover - compiled
    """Read an EventBatch of common events into out_rows[r0:] and out_data[d0:] (room for
    n // 18 + 1 rows and n // 18 + 1 + n // 9 + 1 + (n + 1) // 2 words, n its bytes):
    (ok, ts, rank or -1, rows, hashes, token ids, words of data, then the figures a pool
    reserves room by: the most token ids and hashes an event names, the hashes removals
    name, the largest token id). Its `data` holds one parent a row, the hashes, then the
    token ids as uint32, two a word (`ColumnarBatch.data`). ok False (and nothing else
    meaningful, the room's content undefined) for anything outside the subset above. The
    field names and masks are module constants, frozen into the compiled code: passed as
    arguments, numba's dispatcher typed all four again at every frame."""
    fb, fo, stored_ok, removed_ok, next_field = _FIELD_BYTES, _FIELD_OFF, _STORED_OK, _REMOVED_OK, _NEXT_FIELD
    n = len(buf)
    if n < 11 or not (buf[0] == 0x92 or buf[0] == 0x93) or buf[1] != 0xCB:
        return _NOT_COMMON
    has_rank = buf[0] == 0x93
    raw = np.empty(8, np.uint8)
    for j in range(8):
        raw[j] = buf[9 - j]
    ts = raw.view(np.float64)[0]
    if not np.isfinite(ts):
        return _NOT_COMMON
    p = 10
    h, m = _array_head(buf, p)
    if h < 0:
        return _NOT_COMMON
    p += h
    if m > n // 18 + 1:  # a common event takes at least 18 bytes (a map, its "type", a kind):
        return _NOT_COMMON  # a forged count, not arrays for it
    rows = out_rows[r0:r0 + m]
    rows[:] = 0
    data = out_data[d0:]
    tok_at = m + n // 9 + 1  # the parents, room for every hash the frame may hold, its token ids
    parents = data[:m]
    parents[:] = 0
    keys = data[m:tok_at]
    tokens = data[tok_at:].view(np.uint32)
    nk = 0
    ntok = 0
    most_tokens = most_hashes = removals = np.int64(0)
    for i in range(m):
        if p >= n:
            return _NOT_COMMON
        b = buf[p]
        if 0x80 <= b <= 0x8F:
            pairs = np.int64(b & 0x0F)
            p += 1
        elif b == 0xDE and p + 3 <= n:
            pairs = (np.int64(buf[p + 1]) << 8) | buf[p + 2]
            p += 3
        elif b == 0xDF and p + 5 <= n:
            pairs = (np.int64(buf[p + 1]) << 24) | (np.int64(buf[p + 2]) << 16) | (np.int64(buf[p + 3]) << 8) \
                | buf[p + 4]
            p += 5
        else:
            return _NOT_COMMON
        seen = np.int64(0)
        kind = -1
        prev = len(fo) - 1  # (`_NEXT_FIELD`'s column before the first key)
        rows[i, R_HASH0] = nk
        for _ in range(pairs):
            if p >= n:
                return _NOT_COMMON
            b = buf[p]
            if 0xA0 <= b <= 0xBF:  # a fixstr, as every field name is written: `_head`'s answer
                h, size = np.int64(1), np.int64(b & 0x1F)
            else:
                h, items, size = _head(buf, p)
            if h < 0 or not (0xA0 <= b <= 0xBF or 0xD9 <= b <= 0xDB) or p + h + size > n:
                return _NOT_COMMON
            f = next_field[1 if kind == KIND_REMOVED else 0, prev]
            a = fo[f]
            if fo[f + 1] - a != size:
                f = _field_id(buf, p, h, size, fb, fo)
            else:
                for j in range(size):
                    if buf[p + h + j] != fb[a + j]:
                        f = _field_id(buf, p, h, size, fb, fo)
                        break
            prev = f
            if f < 0 or (seen >> f) & 1:
                return _NOT_COMMON
            seen |= np.int64(1) << f
            p += h + size
            if p >= n:
                return _NOT_COMMON
            b = buf[p]
            if f == 0 or f == 5:  # type, medium: one of a few literal strings
                if f == 5 and b == 0xC0:
                    p += 1
                    continue
                if 0xA0 <= b <= 0xBF:  # a fixstr: `_head`'s answer
                    h, size = np.int64(1), np.int64(b & 0x1F)
                else:
                    h, items, size = _head(buf, p)
                if h < 0 or not (0xA0 <= b <= 0xBF or 0xD9 <= b <= 0xDB) or p + h + size > n:
                    return _NOT_COMMON
                if f == 0 and _str_is(buf, p, h, size, _V_STORED):
                    kind = KIND_STORED
                elif f == 0 and _str_is(buf, p, h, size, _V_REMOVED):
                    kind = KIND_REMOVED
                elif f == 5 and _str_is(buf, p, h, size, _V_GPU):
                    rows[i, R_MEDIUM] = 1
                elif f == 5 and _str_is(buf, p, h, size, _V_CPU):
                    rows[i, R_MEDIUM] = 2
                else:
                    return _NOT_COMMON
                p += h + size
            elif f == 1:  # block_hashes: 8-byte integers
                h, c = _array_head(buf, p)
                if h < 0 or p + h + 9 * c > n:
                    return _NOT_COMMON
                p += h
                rows[i, R_NHASH] = c
                rows[i, R_WIDTH] = 8 if c else 0
                for _ in range(c):
                    b = buf[p]
                    if b != 0xCF and b != 0xD3:
                        return _NOT_COMMON
                    v = np.uint64(0)
                    for j in range(1, 9):
                        v = (v << np.uint64(8)) | np.uint64(buf[p + j])
                    keys[nk] = v
                    nk += 1
                    p += 9
            elif f == 3:  # token_ids
                if b == 0xC0:
                    p += 1
                    continue
                h, c = _array_head(buf, p)
                if h < 0:
                    return _NOT_COMMON
                p += h
                rows[i, R_TOK0] = ntok
                rows[i, R_NTOK] = c
                end = ntok + c
                p, ntok = _uint16_ids(buf, p, n, tokens, ntok, c)
                for _ in range(end - ntok):  # the others (and any after the first of them)
                    if p >= n:
                        return _NOT_COMMON
                    b = buf[p]
                    if b < 0x80:
                        tokens[ntok] = b
                        p += 1
                    elif b == 0xCC and p + 2 <= n:
                        tokens[ntok] = buf[p + 1]
                        p += 2
                    elif b == 0xCD and p + 3 <= n:
                        tokens[ntok] = (np.uint32(buf[p + 1]) << 8) | buf[p + 2]
                        p += 3
                    elif b == 0xCE and p + 5 <= n:
                        tokens[ntok] = (np.uint32(buf[p + 1]) << 24) | (np.uint32(buf[p + 2]) << 16) \
                            | (np.uint32(buf[p + 3]) << 8) | buf[p + 4]
                        p += 5
                    else:
                        return _NOT_COMMON
                    ntok += 1
            elif f == 2 or f == 4:  # parent_block_hash, block_size: nil or an integer
                if b == 0xC0:
                    p += 1
                    continue
                ok, v = _int_at(buf, p)
                if not ok:
                    return _NOT_COMMON
                if f == 2:
                    rows[i, R_PARENT] = 1
                    parents[i] = v
                else:
                    if b == 0xD3 or np.int64(v) < 0 or v >= (1 << 40):
                        return _NOT_COMMON
                    rows[i, R_SIZE] = np.int64(v)
                h, items, size = _head(buf, p)
                p += h + size
            else:  # any other field: nil, or the event is not a common one
                if b != 0xC0:
                    return _NOT_COMMON
                p += 1
        if kind < 0 or (seen & ~(stored_ok if kind == KIND_STORED else removed_ok)) != 0:
            return _NOT_COMMON
        rows[i, R_KIND] = kind
        c = rows[i, R_NHASH]
        if kind == KIND_REMOVED:
            removals += c
        most_hashes = max(most_hashes, c)
        most_tokens = max(most_tokens, rows[i, R_NTOK])
    rank = np.int64(-1)
    if has_rank:
        if p >= n:
            return _NOT_COMMON
        b = buf[p]
        if b == 0xC0:
            p += 1
        elif b < 0x80 or b == 0xCC or b == 0xCD or b == 0xCE:
            ok, v = _int_at(buf, p)
            if not ok:
                return _NOT_COMMON
            rank = np.int64(v)
            h, items, size = _head(buf, p)
            p += h + size
        else:
            return _NOT_COMMON
    if p != n:
        return _NOT_COMMON
    packed = data[m + nk:].view(np.uint32)  # the token ids moved down to right after the hashes
    most_id = np.uint32(0)
    for j in range(ntok):
        v = tokens[j]
        packed[j] = v
        most_id = max(most_id, v)
    return True, ts, rank, m, nk, ntok, m + nk + (ntok + 1) // 2, most_tokens, most_hashes, removals, \
        np.int64(most_id)


_NOT_COMMON = (False, 0.0, -1, 0, 0, 0, 0, 0, 0, 0, 0)  # `_frame_into`'s answer for any other frame


@njit(cache=True, nogil=True)
def _common_frame(buf):  # pragma: no cover - compiled
    """(ok, ts, rank or -1, rows, data, hashes, token ids) of an EventBatch of common events
    (`_frame_into` into arrays of its own; ok False: nothing else meaningful)."""
    n = len(buf)
    m = np.int64(0)
    if n >= 11:
        m = max(_array_head(buf, 10)[1], 0)
    if m > n // 18 + 1:
        m = 0  # a forged count: `_frame_into` refuses it
    rows = np.zeros((m, NUM_R), np.int64)
    data = np.empty(m + n // 9 + 1 + (n + 1) // 2, np.uint64)
    ok, ts, rank, m, nk, ntok, w, _, _, _, _ = _frame_into(buf, rows, 0, data, 0)
    if not ok:
        return False, 0.0, -1, rows[:0], data[:0], 0, 0
    return True, ts, rank, rows, data[:w], nk, ntok


def common_columns(seq: int, payload: bytes) -> ColumnarBatch | None:
    """The columns of a frame of common events by one compiled pass, or None when the frame
    is anything else (then `decode_columns` reads it as before)."""
    ok, ts, rank, rows, data, nk, ntok = _common_frame(np.frombuffer(payload, np.uint8))
    if not ok:
        return None
    return ColumnarBatch(seq, float(ts), None if rank < 0 else int(rank), rows, None, None, None, {}, payload,
                         data, nk, ntok)


# `_common_frames`' meta columns, per frame: ok (1: a frame of common events, read), its
# rank (-1: none), its rows' start in the run's rows and their count, its hashes and token
# ids, its words' start in the run's data and their count, then `_frame_into`'s figures:
# hashes its removals name, the most token ids and hashes an event names, the largest id
M_OK, M_RANK, M_ROW0, M_ROWS, M_KEYS, M_TOKENS, M_DATA0, M_WORDS, M_REMOVALS, M_MOST_TOKENS, M_MOST_HASHES, \
    M_MOST_ID = range(12)
NUM_M = 12


def _run_room(num_frames: int, num_bytes: int) -> tuple[int, int]:
    """(rows, words) `_common_frames_at` may write for num_frames frames of num_bytes in
    all: the sum of the bounds `_frame_into` keeps to for a frame of n bytes (a row per 18
    bytes and a word per 2, plus one each), bounded by the total's (no pass over the sizes)."""
    return num_bytes // 18 + num_frames, num_bytes // 18 + num_bytes // 9 + 2 * num_frames + (num_bytes + num_frames) // 2


@intrinsic
def _bytes_at(typingctx, address):  # pragma: no cover - compiled
    """The uint8 pointer at an address (an int64), for `carray`."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.uint8)))
    return types.CPointer(types.uint8)(types.int64), codegen


@njit(cache=True, nogil=True)
def _common_frames_at(addresses, sizes, meta, tss, rows, data):  # pragma: no cover - compiled
    """`_common_frame` of each frame f, the sizes[f] bytes at addresses[f] (a bytes object's
    data the caller holds), in one call, read straight into the run's arrays (`rows` and
    `data` with `_run_room`'s room at least, `meta` and `tss` zero, a frame's row): meta[f]
    its `M_*` columns, its rows and data as `_common_frame` gives them, one frame after
    another; returns the rows and words used. A frame that is not ok has no rows nor words.
    One call for a run of frames: a call from Python with its arrays and tuple handed back
    cost ~3 us, about what reading a frame of vLLM's usual ~14 events costs; the frames
    are read where they lie (joining a run's ~225 KB into one bytes was ~5% of the call)."""
    r = np.int64(0)
    d = np.int64(0)
    for i in range(len(sizes)):
        ok, ts, rank, m, nk, ntok, w, most_tokens, most_hashes, removals, most_id = _frame_into(
            carray(_bytes_at(addresses[i]), sizes[i]), rows, r, data, d)
        meta[i, M_ROW0] = r
        meta[i, M_DATA0] = d
        if not ok:
            continue
        meta[i, M_OK] = 1
        meta[i, M_RANK] = rank
        meta[i, M_ROWS] = m
        meta[i, M_KEYS] = nk
        meta[i, M_TOKENS] = ntok
        meta[i, M_WORDS] = w
        meta[i, M_REMOVALS] = removals
        meta[i, M_MOST_TOKENS] = most_tokens
        meta[i, M_MOST_HASHES] = most_hashes
        meta[i, M_MOST_ID] = most_id
        tss[i] = ts
        r += m
        d += w
    return r, d


def _data_offset() -> int:
    """Where a bytes object's data lies from its id (CPython's header: 32 bytes on 64 bits),
    found by asking numpy where one lies."""
    probe = bytes(range(16))
    return int(np.frombuffer(probe, np.uint8).ctypes.data) - id(probe)


_BYTES_DATA = _data_offset()


class _RunRooms(threading.local):
    """The rows and data arrays `decode_columns_many` reads runs into, kept between one
    thread's calls (each thread its own: a room is never handed to two calls at once).
    Made per call, arrays of ~1 MB each for vLLM's usual run of 64 frames, glibc served
    them from the heap and gave their pages back when they were freed at its top, so the
    next call faulted them in again, zeroed. A room is taken again only when nothing else
    refers to it: the run's rows and data, and any view of them a batch, a pool or a
    reader still holds, refer to it (numpy's views keep their base), so a run in use is
    never written over; while all are in use a new one is made (at most `num_kept` are
    kept, each at most `most_bytes`). Each array of a room is `least_bytes` at least, the
    size from which the app's allocator maps an array on pages of its own
    (`app.runtime.allocator.MMAP_THRESHOLD`): rooms kept on the heap sat among the pool's
    growing arrays and moved where those grew (the attach step's faults fell by 2,900 in
    one process and rose by 700 in another); mapped apart they do not, and the pages a run
    does not reach are never touched (they cost no memory)."""

    num_kept = 4
    least_bytes = 4 << 20
    most_bytes = 24 << 20

    def __init__(self) -> None:
        self.rooms: list[tuple[np.ndarray, np.ndarray]] = []

    def take(self, num_rows: int, num_words: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows (num_rows x NUM_R int64) and words (uint64), at least, that nothing else refers to."""
        rooms = self.rooms
        small = -1
        for i, room in enumerate(rooms):
            if unheld(room[0]) and unheld(room[1]):  # (held by the room's tuple alone)
                if len(room[0]) >= num_rows and len(room[1]) >= num_words:
                    return room
                small = i
        room = (np.empty((max(num_rows + num_rows // 4, self.least_bytes // (8 * NUM_R) + 1), NUM_R), np.int64),
                np.empty(max(num_words + num_words // 4, self.least_bytes // 8 + 1), np.uint64))
        if room[0].nbytes + room[1].nbytes <= self.most_bytes:
            if small >= 0:  # outgrown: the larger one in its place
                rooms[small] = room
            elif len(rooms) < self.num_kept:
                rooms.append(room)
        return room


# the process's rooms, one set per thread (as numba keeps its compiled code per process):
# a cache of scratch arrays, nothing a caller sees
_ROOMS = _RunRooms()


class DecodedRun:
    """What one `decode_columns_many` call read by its compiled pass, shared by the run's
    batches (`ColumnarBatch.run`): `meta` (`M_*` columns a frame), times, rows and data.
    `ColumnarPool.apply_many` applies consecutive frames of one run from these arrays as
    they are: no join of the batches' views."""

    __slots__ = ("meta", "tss", "rows", "data")

    def __init__(self, meta: np.ndarray, tss: np.ndarray, rows: np.ndarray, data: np.ndarray) -> None:
        self.meta, self.tss, self.rows, self.data = meta, tss, rows, data


def decode_columns_many(first_seq: int, payloads: list[bytes], at: tuple[np.ndarray, np.ndarray] | None = None
                        ) -> list[ColumnarBatch]:
    """`[decode_columns(first_seq + i, p) for i, p in enumerate(payloads)]` (and the same
    MalformedFrame from the first bad frame), its frames of common events read by one
    compiled call (`_common_frames_at`); their rows and data are views of two arrays
    shared by the run's batches, which name it (`run`, `run_at`: the frame's index in it),
    kept for later runs once nothing refers to them (`_RunRooms`). `at`: where the
    payloads' bytes lie (addresses, sizes), for payloads that are views of one buffer
    (`engine.remote.receive.QueuedMessages.payloads`), which the batches keep."""
    if not payloads:
        return []
    n = len(payloads)
    if at is not None:
        addresses, sizes = at
        frames = payloads
    else:
        # the frames' data read where it lies: their addresses, held alive by `frames` for
        # the call (bytes themselves; any other buffer as a bytes copy)
        frames = payloads if all(map(_IS_BYTES, map(type, payloads))) else [bytes(p) for p in payloads]
        addresses = np.fromiter(map(id, frames), np.int64, n)
        addresses += _BYTES_DATA
        sizes = np.fromiter(map(len, frames), np.int64, n)
    meta = np.zeros((n, NUM_M), np.int64)
    tss = np.zeros(n, np.float64)
    rows, data = _ROOMS.take(*_run_room(n, int(sizes.sum())))
    r, d = _common_frames_at(addresses, sizes, meta, tss, rows, data)
    del frames
    run = DecodedRun(meta, tss, rows[:r], data[:d])
    if meta[:, M_OK].all():  # every frame read by the compiled pass (an attachment's usual run)
        return list(map(ColumnarBatch.of_run, range(first_seq, first_seq + n), tss.tolist(), meta[:, M_RANK].tolist(),
                        payloads, meta[:, M_KEYS].tolist(), meta[:, M_TOKENS].tolist(), repeat(run, n), range(n)))
    return [ColumnarBatch(seq, ts, None if rank < 0 else rank, None, None, None, None, {}, payload, None, nk, ntok,
                          run, at) if ok else _uncommon_columns(seq, bytes(payload))
            for at, (seq, (ok, rank, nk, ntok), ts, payload)
            in enumerate(zip(range(first_seq, first_seq + len(payloads)),
                             meta[:, [M_OK, M_RANK, M_KEYS, M_TOKENS]].tolist(), tss.tolist(), payloads))]


def _columns(seq: int, payload: bytes) -> ColumnarBatch:
    try:
        b = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        raise _Slow from None
    ts, rank = b.ts, b.data_parallel_rank
    if not math.isfinite(ts) or (rank is not None and rank < 0):
        raise _Slow
    buf = np.frombuffer(payload, np.uint8)
    tokens, skim, ok = _skim(buf, _TOKEN_KEY, _HASH_KEY)
    if not ok or len(skim) != len(b.events):
        raise _Slow
    out, parents, keys, ok = _arrange(buf, skim)
    if not ok:
        raise _Slow  # a negative or odd block size: the reference words it
    events: dict[int, VllmEvent] = {}
    rare = np.flatnonzero(out[:, R_RARE])
    if len(rare):
        tok_bytes = tokens.tobytes()
        for i in rare.tolist():
            events[i] = _event_of(b.events[i], skim[i].tolist(), payload, tok_bytes)
    return ColumnarBatch(seq, float(ts), rank, out, parents, keys, tokens, events, payload)


def _event_of(e: Any, row: list[int], payload: bytes, tokens: bytes) -> VllmEvent:
    """One msgspec-decoded event as the reference's VllmEvent (`_fast` builds every event of a batch with it)."""
    t0, nt, h0, nh, width = row
    t = type(e)
    if nh:
        step = width + 1 if width == 8 else width + 2
        hashes = tuple([payload[o:o + width] for o in range(h0, h0 + step * nh, step)])
    else:
        hashes = ()
    if t is _Removed:
        return VllmEvent("BlockRemoved", hashes, None, (), 0, None, e.medium, None, None, e.group_idx,
                         e.kv_cache_spec_kind, e.locality, e.session_id, ownership=e.ownership)
    if t is _Stored:
        size = e.block_size or 0
        if size < 0:
            raise _Slow
        parent = e.parent_block_hash
        if parent is not None:
            if type(parent) is bool:
                raise _Slow
            parent = canonical_hash(parent)
        extra = e.extra_keys
        look = e.lookahead_token_ids
        return VllmEvent("BlockStored", hashes, parent, (), size, e.lora_id, e.medium, e.lora_name,
                         None if extra is _NIL else _optional(extra), e.group_idx, e.kv_cache_spec_kind,
                         e.locality, e.session_id, tokens[4 * t0:4 * (t0 + nt)], e.cache_salt, e.ownership,
                         None if look is _NIL else _optional(look), e.kv_cache_spec_sliding_window)
    return VllmEvent("AllBlocksCleared", medium=e.medium)


def decode_columns(seq: int, payload: bytes) -> ColumnarBatch:
    """One EventBatch as columns, for `engine.remote.colpool.ColumnarPool`: no Python object
    per event of the common kind, per token id or per hash. Outside the fast subset the
    reference reader decodes it (every event then kept whole); a bad payload raises the
    reference's MalformedFrame, before anything is applied. A frame of common events only
    (vLLM's usual one) is read by one compiled pass (`common_columns`); a run of frames by
    one compiled call (`decode_columns_many`)."""
    fast = common_columns(seq, payload)
    return fast if fast is not None else _uncommon_columns(seq, payload)


def _uncommon_columns(seq: int, payload: bytes) -> ColumnarBatch:
    """`decode_columns` of a frame that is not one of common events only."""
    try:
        return _columns(seq, payload)
    except (_Slow, MalformedFrame, OverflowError, ValueError, TypeError, IndexError, RecursionError):
        return columns_of(wire.decode_batch(seq, payload))

__all__ = ["decode_batch", "decode_columns", "decode_columns_many", "columns_of", "ColumnarBatch", "same_tokens", "warm_up", "MalformedFrame"]
