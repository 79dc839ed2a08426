"""Chained block hashes over a canonical byte encoding (DESIGN 4.1).

`h[i] = H(h[i-1] || tokens of block i || extra keys of block i)`. The encoding is fixed
little-endian int64 token ids with length prefixes, never Python's `hash()` or pickle,
so digests are stable across processes and versions (vLLM's CVE-2025-25183 came from
`hash()`). Plain Python: no torch, no Qt.
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
_TAG_TOKENS = b"T"
_TAG_EXTERNAL = b"X"
_LITTLE = sys.byteorder == "little"


def _encode_tokens(token_ids: Sequence[int]) -> bytes:
    arr = array("q", token_ids)
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

    def hash_block(self, parent: bytes | None, token_ids: Sequence[int], salt: str | None = None) -> bytes:
        """Digest of one block of token ids; `salt` is given for block 0 only."""
        prefix = self.root if parent is None else parent
        extra = _encode_text(salt) if parent is None else b""
        return self._digest(prefix + _TAG_TOKENS + struct.pack("<I", len(token_ids))
                            + _encode_tokens(token_ids) + extra)

    def hash_external(self, parent: bytes | None, external_id: int, salt: str | None = None) -> bytes:
        """Digest of a block known only by an external id (a Mooncake `hash_ids` entry)."""
        prefix = self.root if parent is None else parent
        extra = _encode_text(salt) if parent is None else b""
        return self._digest(prefix + _TAG_EXTERNAL + struct.pack("<q", external_id) + extra)

    def hash_chain(self, token_ids: Sequence[int], block_size: int, salt: str | None = None,
                   parent: bytes | None = None, start_block: int = 0) -> list[bytes]:
        """Hashes of every full block of `token_ids`, from `start_block` on."""
        hashes: list[bytes] = []
        n_full = len(token_ids) // block_size
        for i in range(start_block, n_full):
            parent = self.hash_block(parent, token_ids[i * block_size:(i + 1) * block_size],
                                     salt if i == 0 else None)
            hashes.append(parent)
        return hashes

    def hash_external_chain(self, external_ids: Sequence[int], salt: str | None = None) -> list[bytes]:
        hashes: list[bytes] = []
        parent: bytes | None = None
        for i, ext in enumerate(external_ids):
            parent = self.hash_external(parent, ext, salt if i == 0 else None)
            hashes.append(parent)
        return hashes
