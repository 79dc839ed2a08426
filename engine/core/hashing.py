"""Chained block hashes over a canonical byte encoding (DESIGN 4.1), and vLLM's own schemes.

`h[i] = H(h[i-1] || tokens of block i || extra keys of block i)`. Cachescope's encoding is
fixed (little-endian uint32 token ids; block size and salt in block 0), never Python's
`hash()`, so digests are stable across processes and versions (vLLM's CVE-2025-25183 came
from `hash()`). `vllm-sha256` and `vllm-sha256-cbor` reproduce vLLM's `hash_block_tokens`
byte for byte (DESIGN 9), and `sglang-sha256` SGLang 0.5.23's page hash (DESIGN 10), so a
prompt can be checked against a live server's pool. Plain Python: no torch, no Qt.
"""

from __future__ import annotations

import copy
import hashlib
import os
import pickle
import struct
import sys
from array import array
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import xxhash

HASH_NAMES = ("sha256", "xxh3", "vllm-sha256", "vllm-sha256-cbor", "sglang-sha256")
VLLM_HASHES = ("vllm-sha256", "vllm-sha256-cbor")
SGLANG_HASH = "sglang-sha256"
# The schemes whose digests equal a serving engine's (what `attach --probe` can use).
SERVER_HASHES = (*VLLM_HASHES, SGLANG_HASH)
# SGLang seeds a salted request's first page with SHA-256 of this prefix and the salt
# (`mem_cache/utils.py: compute_node_event_hash_values`); an unsalted one has no prior.
SGLANG_SALT_PREFIX = b"sglang-cache-salt-v1\0"
# vLLM's root parent ("NONE_HASH") is its hash function applied to this string, or to
# PYTHONHASHSEED when the server was started with one.
VLLM_NONE_HASH_SEED = "vllm-none-hash"
_TAG_EXTERNAL = b"X"
_PACK_U64 = struct.Struct("<Q").pack
_LITTLE = sys.byteorder == "little"
_U32 = "I" if array("I").itemsize == 4 else "L"


def _encode_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32: 64 bytes for a 16-token block, one SHA-256 round less than int64."""
    try:
        arr = array(_U32, token_ids)
    except OverflowError:
        raise ValueError("token ids must be between 0 and 2**32 - 1") from None
    if not _LITTLE:  # pragma: no cover - big-endian hosts
        arr.byteswap()
    return arr.tobytes()


@lru_cache(maxsize=64)
def _splitter(count: int, size: int) -> struct.Struct:
    return struct.Struct(f"{size}s" * count)


def _blocks_of(raw: bytes, size: int, start: int) -> tuple[bytes, ...]:
    """`raw[start:]` cut into blocks of `size` bytes, in one C call (a slice per block in
    Python costs about a tenth of a block's SHA-256)."""
    return _splitter((len(raw) - start) // size, size).unpack_from(raw, start)


def _encode_text(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff\xff\xff"
    raw = value.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw


def _cbor_head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes((major << 5 | value,))
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if value < 1 << (8 * size):
            return bytes((major << 5 | info,)) + value.to_bytes(size, "big")
    raise ValueError(f"{value} does not fit a CBOR integer")


def cbor_canonical(value: object) -> bytes:
    """Canonical CBOR (RFC 8949 4.2.1) of the values a vLLM block hash input holds.

    Equal to `cbor2.dumps(value, canonical=True)` for None, bool, int, str, bytes and
    tuples/lists of them (checked against vLLM's recorded digests); written out here so
    the hot path needs no extra package and no per-call option parsing.
    """
    if value is None:
        return b"\xf6"
    if value is True or value is False:
        return b"\xf5" if value else b"\xf4"
    if isinstance(value, int):
        return _cbor_head(0, value) if value >= 0 else _cbor_head(1, -1 - value)
    if isinstance(value, bytes):
        return _cbor_head(2, len(value)) + value
    if isinstance(value, str):
        raw = value.encode("utf-8")
        return _cbor_head(3, len(raw)) + raw
    if isinstance(value, (tuple, list)):
        return _cbor_head(4, len(value)) + b"".join(cbor_canonical(v) for v in value)
    raise ValueError(f"cannot encode a {type(value).__name__} in a vLLM block hash")


def vllm_digest(scheme: str, value: object) -> bytes:
    """vLLM's `sha256` (pickle protocol 5) or `sha256_cbor` digest of one Python value."""
    if scheme == "vllm-sha256":
        return hashlib.sha256(pickle.dumps(value, protocol=5)).digest()
    if scheme == "vllm-sha256-cbor":
        return hashlib.sha256(cbor_canonical(value)).digest()
    raise ValueError(f"unknown vLLM hash {scheme!r}; choose one of {', '.join(VLLM_HASHES)}")


def event_hash(digest: bytes) -> int:
    """The integer vLLM's KV events carry for a digest: its last 8 bytes, unsigned."""
    return int.from_bytes(digest[-8:], "big")


def sglang_event_hash(digest: bytes) -> int:
    """The integer SGLang's KV events carry for a page digest: its FIRST 8 bytes as a
    signed int64 (`mem_cache/utils.py: hash_str_to_int64`)."""
    return int.from_bytes(digest[:8], "big", signed=True)


def sglang_salt_root(salt: str) -> bytes:
    """The prior digest of a salted request's first page in SGLang's event hashes."""
    return hashlib.sha256(SGLANG_SALT_PREFIX + salt.encode("utf-8")).digest()


@dataclass(slots=True)
class BlockHasher:
    """Computes the hash chain of a request's full blocks.

    `algorithm` is "sha256" (default, 32-byte digests) or "xxh3" (xxh3-128, 16 bytes,
    several times faster, not collision resistant against an adversary). The root value is
    random per hasher unless `seed` is given; `model_id` is folded into the root, which
    gives every block the model identity as an extra key at no per-block cost.

    "vllm-sha256" and "vllm-sha256-cbor" hash `(parent, tuple(token_ids), extra_keys)` as
    vLLM does, from the root `H(hash_seed or "vllm-none-hash")`; `seed` and `model_id`
    play no part (vLLM has neither), and a salt is block 0's `(("cache_salt", salt),)`.

    "sglang-sha256" is SGLang's page hash: `SHA-256(prior digest || token ids as uint32
    little-endian)`, no prior on an unsalted first page, `sglang_salt_root(salt)` on a
    salted one (an empty salt is no salt, as SGLang's `cache_salt or None`). `event_int`
    and `event_key` say how each server's events name a digest.
    """

    algorithm: str = "sha256"
    seed: int | None = None
    model_id: str = ""
    hash_seed: str | None = None  # vLLM schemes: the server's PYTHONHASHSEED, if it had one
    root: bytes = field(init=False)

    def __post_init__(self) -> None:
        if self.algorithm not in HASH_NAMES:
            raise ValueError(f"unknown hash {self.algorithm!r}; choose one of {', '.join(HASH_NAMES)}")
        if self.algorithm in VLLM_HASHES:
            self.root = vllm_digest(self.algorithm, VLLM_NONE_HASH_SEED if self.hash_seed is None else self.hash_seed)
            return
        if self.hash_seed is not None:
            raise ValueError("a hash seed (PYTHONHASHSEED) only applies to the vllm-* hashes")
        if self.algorithm == SGLANG_HASH:
            self.root = b""  # no prior digest on an unsalted first page
            return
        if self.seed is None:
            base = os.urandom(32)
        else:
            base = b"cachescope-root\x00" + struct.pack("<q", int(self.seed))
        self.root = self._digest(base + _encode_text(self.model_id))

    def for_model(self, model: str) -> BlockHasher:
        """This hasher with `model` folded into its chain root: a request's model as the
        first key of its cache (a cache is keyed to its model). Every block of the chain
        differs from the model-less one and from any other model's; this hasher itself,
        used for requests without a model, is unchanged."""
        keyed = copy.copy(self)
        if self.algorithm in VLLM_HASHES:
            keyed.root = vllm_digest(self.algorithm, (self.root, "cachescope-model", model))
        else:
            keyed.root = self._digest(self.root + b"cachescope-model\x00" + _encode_text(model))
        return keyed

    def event_int(self, digest: bytes) -> int:
        """The integer the server's KV events carry for `digest` (vLLM: last 8 bytes
        unsigned; SGLang: first 8 bytes signed; Cachescope's own: vLLM's rule)."""
        return sglang_event_hash(digest) if self.algorithm == SGLANG_HASH else event_hash(digest)

    def event_key(self, digest: bytes) -> bytes:
        """`digest` as a remote pool keys it (`engine.remote.wire.canonical_hash` of the
        event's integer): the 8 bytes the server's events carry."""
        return digest[:8] if self.algorithm == SGLANG_HASH else digest[-8:]

    def _sglang_prior(self, parent: bytes | None, salt: str | None) -> bytes:
        if parent is not None:
            return parent
        return sglang_salt_root(salt) if salt else b""

    def _vllm_block(self, parent: bytes | None, token_ids: Sequence[int], extra: object) -> bytes:
        for t in token_ids:
            if not 0 <= t < 1 << 32:
                raise ValueError("token ids must be between 0 and 2**32 - 1")
        return vllm_digest(self.algorithm, (self.root if parent is None else parent, tuple(token_ids), extra))

    def _digest(self, data: bytes) -> bytes:
        if self.algorithm == "sha256":
            return hashlib.sha256(data).digest()
        return xxhash.xxh3_128_digest(data)

    def _first_block_extra(self, block_size: int, salt: str | None) -> bytes:
        # Block 0 carries the extra keys: the block size and the salt. Later blocks are
        # bound to both through the chain, so they hash only parent || tokens.
        return struct.pack("<I", block_size) + _encode_text(salt)

    def hash_block(self, parent: bytes | None, token_ids: Sequence[int], salt: str | None = None) -> bytes:
        """Digest of one block of token ids; `salt` is given for block 0 only (parent None)."""
        if self.algorithm in VLLM_HASHES:
            return self._vllm_block(parent, token_ids, (("cache_salt", salt),) if parent is None and salt else None)
        if self.algorithm == SGLANG_HASH:
            return hashlib.sha256(self._sglang_prior(parent, salt) + _encode_tokens(token_ids)).digest()
        if parent is None:
            return self._digest(self.root + _encode_tokens(token_ids)
                                + self._first_block_extra(len(token_ids), salt))
        return self._digest(parent + _encode_tokens(token_ids))

    def hash_external(self, parent: bytes | None, external_id: int, salt: str | None = None) -> bytes:
        """Digest of a block known only by an external id (a Mooncake `hash_ids` entry)."""
        if self.algorithm in VLLM_HASHES:
            # vLLM has no external ids; a tagged extra key keeps them apart from token blocks.
            extra = (("external_id", int(external_id)),) + ((("cache_salt", salt),) if parent is None and salt else ())
            return vllm_digest(self.algorithm, (self.root if parent is None else parent, (), extra))
        if self.algorithm == SGLANG_HASH:
            # SGLang has no external ids either: a tagged page keeps them apart from token pages.
            return hashlib.sha256(self._sglang_prior(parent, salt) + _TAG_EXTERNAL
                                  + struct.pack("<Q", external_id)).digest()
        # Unsigned: Mooncake and vLLM ids use all 64 bits; below 2**63 the bytes equal the
        # signed encoding earlier releases wrote, so stored hashes do not change.
        body = _TAG_EXTERNAL + struct.pack("<Q", external_id)
        if parent is None:
            return self._digest(self.root + body + _encode_text(salt))
        return self._digest(parent + body)

    def hash_chain(self, token_ids: Sequence[int], block_size: int, salt: str | None = None,
                   parent: bytes | None = None, start_block: int = 0) -> list[bytes]:
        """Hashes of every full block of `token_ids`, from `start_block` on.

        The same digests as `hash_block` per block; the request is encoded once and sliced,
        which is what makes this path faster than pickling a tuple per block.
        """
        n_full = len(token_ids) // block_size
        if start_block >= n_full:
            return []
        if self.algorithm in VLLM_HASHES:
            out: list[bytes] = []
            for i in range(start_block, n_full):
                parent = self.hash_block(parent, token_ids[i * block_size:(i + 1) * block_size],
                                         salt if parent is None else None)
                out.append(parent)
            return out
        stop = n_full * block_size
        whole = start_block == 0 and stop == len(token_ids)
        raw = _encode_tokens(token_ids if whole else token_ids[start_block * block_size:stop])
        step = 4 * block_size
        if self.algorithm == SGLANG_HASH:
            sha = hashlib.sha256
            prior = self._sglang_prior(parent, salt)
            out = []
            for chunk in _blocks_of(raw, step, 0):
                prior = sha(prior + chunk).digest()
                out.append(prior)
            return out
        digest = self._digest
        hashes: list[bytes] = []
        pos = 0
        if parent is None:
            parent = digest(self.root + raw[:step] + self._first_block_extra(block_size, salt))
            hashes.append(parent)
            pos = step
        append = hashes.append
        chunks = _blocks_of(raw, step, pos)
        if self.algorithm == "sha256":
            sha = hashlib.sha256
            for chunk in chunks:
                parent = sha(parent + chunk).digest()
                append(parent)
        else:
            xxh = xxhash.xxh3_128_digest
            for chunk in chunks:
                parent = xxh(parent + chunk)
                append(parent)
        return hashes

    def hash_external_chain(self, external_ids: Sequence[int], salt: str | None = None) -> list[bytes]:
        """`hash_external` along `external_ids`, each block's parent the one before it."""
        if not external_ids:
            return []
        if self.algorithm not in ("sha256", "xxh3"):
            hashes: list[bytes] = []
            parent: bytes | None = None
            for i, ext in enumerate(external_ids):
                parent = self.hash_external(parent, ext, salt if i == 0 else None)
                hashes.append(parent)
            return hashes
        # Cachescope's own schemes, the same bytes as `hash_external` without its per-block
        # dispatch: `parent || "X" || id as uint64 little-endian`.
        last = self.hash_external(None, external_ids[0], salt)
        hashes = [last]
        append = hashes.append
        pack, tag = _PACK_U64, _TAG_EXTERNAL
        if self.algorithm == "sha256":
            sha = hashlib.sha256
            for i in range(1, len(external_ids)):
                last = sha(last + (tag + pack(external_ids[i]))).digest()
                append(last)
        else:
            xxh = xxhash.xxh3_128_digest
            for i in range(1, len(external_ids)):
                last = xxh(last + (tag + pack(external_ids[i])))
                append(last)
        return hashes
