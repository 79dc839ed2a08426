"""Chain interning for the replay kernel: every distinct block hash of a trace as a dense id.

Two blocks have the same digest exactly when they have the same parent digest, the same
content (a Mooncake hash id, or the same token ids) and, for a first block, the same salt
(DESIGN 4.1's chain). So the kernel keys a block by (parent id, item, tag) in an
open-addressing table and never computes a digest; `engine.core.columnar` computes the
real digests of the ids it shows, once each.
"""

from __future__ import annotations

import numpy as np

# The compiled table lives in engine.kernel.loop with the rest of the kernel's compiled
# code: numba caches a function by its own file's stamp, so a helper in another file could
# change under a caller loaded from the cache (see engine.kernel.jit).
from engine.kernel.loop import (
    KIND_EXTERNAL, KIND_TOKENS, _intern_into, _rehash, find_key, intern_chains, intern_dense,
)

__all__ = ["KIND_EXTERNAL", "KIND_TOKENS", "Interner", "find_key", "intern_chains", "intern_trace", "root_tag",
           "split_tag"]


def root_tag(kind, salt_id, model_id):
    """The tag of a request's first block: its kind, salt and model (ids; -1: none).
    Works on ints and on int64 arrays alike; `split_tag` takes it apart."""
    return kind + 2 * (salt_id + 2) + (model_id + 1) * (1 << 33)


def split_tag(tag: int) -> tuple[int, int, int]:
    """(kind, salt id, model id) of a root tag; (kind, -1, -1) for a later block's."""
    if tag < 2:
        return tag, -1, -1
    return tag % 2, ((tag >> 1) & 0xFFFFFFFF) - 2, (tag >> 33) - 1


def intern_trace(items: np.ndarray, offsets: np.ndarray, kinds: np.ndarray, root_tags: np.ndarray,
                 need_table: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`intern_chains` of a whole trace: (keys, table, k_parent, k_item, k_tag). Dense items
    (ids from 0, at most a few times as many as the blocks) go through `intern_dense`, with
    an array indexed by item instead of hash-table probes; its table of every key is built
    only when `need_table` (a replay reads it only to try other salts and models), and is
    otherwise an empty one that `find_key` answers -1 from."""
    n = len(items)
    if n and items.min() >= 0 and items.max() < 4 * n + 1024:
        keys, k_parent, k_item, k_tag = intern_dense(items, offsets, kinds, root_tags, int(items.max()) + 1)
        size = 16
        if need_table:
            while size < 2 * len(k_parent) + 16:
                size *= 2
            return keys, _rehash(k_parent, k_item, k_tag, len(k_parent), size), k_parent, k_item, k_tag
        return keys, np.full(size, -1, np.int32), k_parent, k_item, k_tag
    return intern_chains(items, offsets, kinds, root_tags)


class Interner:
    """A key table that grows across the chunks of a stream (`intern_chains` for one go)."""

    def __init__(self) -> None:
        self.table = np.full(1024, -1, np.int32)
        self.k_parent = np.zeros(256, np.int32)
        self.k_item = np.zeros(256, np.int64)
        self.k_tag = np.zeros(256, np.int64)
        self.num_keys = 0

    def intern(self, items: np.ndarray, offsets: np.ndarray, kinds: np.ndarray, root_tags: np.ndarray) -> np.ndarray:
        need = self.num_keys + len(items)
        if len(self.k_parent) < need:
            size = max(need, 2 * len(self.k_parent))
            for name in ("k_parent", "k_item", "k_tag"):
                old = getattr(self, name)
                grown = np.zeros(size, old.dtype)
                grown[:self.num_keys] = old[:self.num_keys]
                setattr(self, name, grown)
        if len(self.table) < 2 * need:
            size = len(self.table)
            while size < 2 * need:
                size *= 2
            self.table = _rehash(self.k_parent, self.k_item, self.k_tag, self.num_keys, size)
        keys = np.empty(len(items), np.int32)
        self.num_keys = _intern_into(items, offsets, kinds, root_tags, self.table, np.zeros(0, np.int32),
                                     self.k_parent, self.k_item, self.k_tag, self.num_keys, keys)
        return keys
