"""Chain interning for the replay kernel: every distinct block hash of a trace as a dense id.

Two blocks have the same digest exactly when they have the same parent digest, the same
content (a Mooncake hash id, or the same token ids) and, for a first block, the same salt
(DESIGN 4.1's chain). So the kernel keys a block by (parent id, item, tag) in an
open-addressing table and never computes a digest; `engine.core.columnar` computes the
real digests of the ids it shows, once each.
"""

from __future__ import annotations

import numpy as np
from numba import njit

KIND_EXTERNAL, KIND_TOKENS = 0, 1

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xC2B2AE3D27D4EB4F)
_M3 = np.uint64(0x165667B19E3779F9)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def root_tag(kind, salt_id, model_id):
    """The tag of a request's first block: its kind, salt and model (ids; -1: none).
    Works on ints and on int64 arrays alike; `split_tag` takes it apart."""
    return kind + 2 * (salt_id + 2) + (model_id + 1) * (1 << 33)


def split_tag(tag: int) -> tuple[int, int, int]:
    """(kind, salt id, model id) of a root tag; (kind, -1, -1) for a later block's."""
    if tag < 2:
        return tag, -1, -1
    return tag % 2, ((tag >> 1) & 0xFFFFFFFF) - 2, (tag >> 33) - 1


@njit(cache=True, inline="always")
def _slot(parent: np.int64, item: np.int64, tag: np.int64, mask: np.uint64) -> np.uint64:
    x = np.uint64(parent + 1) * _M1 ^ np.uint64(item) * _M2 ^ np.uint64(tag) * _M3
    x = (x ^ (x >> _S30)) * _MIX1
    x = (x ^ (x >> _S27)) * _MIX2
    return (x ^ (x >> _S31)) & mask


@njit(cache=True)
def find_key(table, k_parent, k_item, k_tag, parent, item, tag):
    """The id of chain block (parent, item, tag), or -1 if no request of the trace has it."""
    mask = np.uint64(table.shape[0] - 1)
    s = _slot(parent, item, tag, mask)
    while True:
        k = table[s]
        if k < 0:
            return -1
        if k_parent[k] == parent and k_item[k] == item and k_tag[k] == tag:
            return k
        s = (s + np.uint64(1)) & mask


@njit(cache=True)
def _intern_into(items, offsets, kinds, root_tags, table, k_parent, k_item, k_tag, n_keys, keys):
    """Intern every request's blocks (`intern_chains`' layout) into a table that holds
    `n_keys` keys already and has room for all the new ones; the ids go to `keys`.
    Returns the number of keys held now. One loop for one-shot and growing tables."""
    mask = np.uint64(table.shape[0] - 1)
    for r in range(offsets.shape[0] - 1):
        parent = -1
        for j in range(offsets[r], offsets[r + 1]):
            item = items[j]
            tag = root_tags[r] if parent < 0 else kinds[r]
            s = _slot(parent, item, tag, mask)
            while True:
                k = table[s]
                if k < 0:
                    k = n_keys
                    table[s] = k
                    k_parent[k] = parent
                    k_item[k] = item
                    k_tag[k] = tag
                    n_keys += 1
                    break
                if k_parent[k] == parent and k_item[k] == item and k_tag[k] == tag:
                    break
                s = (s + np.uint64(1)) & mask
            keys[j] = k
            parent = k
    return n_keys


@njit(cache=True)
def intern_chains(items, offsets, kinds, root_tags):
    """Key ids for every block of every request, and the key table (parent, item, tag).

    `items[offsets[r]:offsets[r + 1]]` are request r's block items in chain order.
    """
    n = items.shape[0]
    cap = 16
    while cap < 2 * n + 16:
        cap *= 2
    table = np.full(cap, -1, np.int32)
    k_parent = np.empty(n, np.int32)
    k_item = np.empty(n, np.int64)
    k_tag = np.empty(n, np.int64)
    keys = np.empty(n, np.int32)
    n_keys = _intern_into(items, offsets, kinds, root_tags, table, k_parent, k_item, k_tag, 0, keys)
    return keys, table, k_parent[:n_keys].copy(), k_item[:n_keys].copy(), k_tag[:n_keys].copy()


@njit(cache=True)
def _rehash(k_parent, k_item, k_tag, n_keys, size):
    table = np.full(size, -1, np.int32)
    mask = np.uint64(size - 1)
    for k in range(n_keys):
        s = _slot(k_parent[k], k_item[k], k_tag[k], mask)
        while table[s] >= 0:
            s = (s + np.uint64(1)) & mask
        table[s] = k
    return table


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
        self.num_keys = _intern_into(items, offsets, kinds, root_tags, self.table, self.k_parent, self.k_item,
                                     self.k_tag, self.num_keys, keys)
        return keys
