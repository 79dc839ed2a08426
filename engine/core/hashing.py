"""Chained block hashes over a canonical byte encoding (DESIGN 4.1).

`h[i] = H(h[i-1] || tokens of block i || extra keys of block i)`. The encoding is fixed
(little-endian uint32 token ids; block size and salt in block 0), never Python's `hash()`
or pickle, so digests are stable across processes and versions (vLLM's CVE-2025-25183
came from `hash()`). Plain Python: no torch, no Qt.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
from array import array
from dataclasses import dataclass, field
from typing import Sequence

import xxhash

HASH_NAMES = ("sha256", "xxh3")
_TAG_EXTERNAL = b"X"
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


def _encode_text(value: str | None) -> bytes:
    if value is None:
        return b"\xff\xff\xff\xff"
    raw = value.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw


@dataclass(slots=True)
class BlockHasher:
    """Computes the hash chain of a request's full blocks.

    `algorithm` is "sha256" (default, 32-byte digests) or "xxh3" (xxh3-128, 16 bytes,
    several times faster, not collision resistant against an adversary). The root value is
    random per hasher unless `seed` is given; `model_id` is folded into the root, which
    gives every block the model identity as an extra key at no per-block cost.
    """

    algorithm: str = "sha256"
    seed: int | None = None
    model_id: str = ""
    root: bytes = field(init=False)

    def __post_init__(self) -> None:
        if self.algorithm not in HASH_NAMES:
            raise ValueError(f"unknown hash {self.algorithm!r}; choose one of {', '.join(HASH_NAMES)}")
        if self.seed is None:
            base = os.urandom(32)
        else:
            base = b"cachescope-root\x00" + struct.pack("<q", int(self.seed))
        self.root = self._digest(base + _encode_text(self.model_id))

    @property
    def digest_size(self) -> int:
        return 32 if self.algorithm == "sha256" else 16

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
        if parent is None:
            return self._digest(self.root + _encode_tokens(token_ids)
                                + self._first_block_extra(len(token_ids), salt))
        return self._digest(parent + _encode_tokens(token_ids))

    def hash_external(self, parent: bytes | None, external_id: int, salt: str | None = None) -> bytes:
        """Digest of a block known only by an external id (a Mooncake `hash_ids` entry)."""
        body = _TAG_EXTERNAL + struct.pack("<q", external_id)
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
        raw = _encode_tokens(token_ids[start_block * block_size:n_full * block_size])
        step = 4 * block_size
        digest = self._digest
        hashes: list[bytes] = []
        pos = 0
        if parent is None:
            parent = digest(self.root + raw[:step] + self._first_block_extra(block_size, salt))
            hashes.append(parent)
            pos = step
        append = hashes.append
        chunks = [raw[j:j + step] for j in range(pos, len(raw), step)]
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
        hashes: list[bytes] = []
        parent: bytes | None = None
        for i, ext in enumerate(external_ids):
            parent = self.hash_external(parent, ext, salt if i == 0 else None)
            hashes.append(parent)
        return hashes
