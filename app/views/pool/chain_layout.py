"""The layout of the hash chain view, without Qt widgets: cached hashes as a radix tree of
collapsed runs (rows and depths), and the greedy placement that keeps labels from overlapping.

`build_tree` reads every cached block's hash and parent at once (`chain_table`, the
projection's array accessors) and lays the tree out in one compiled pass over arrays;
`build_tree_reference` is the same layout read block by block, which it is held to.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PySide6.QtCore import QRectF

from engine.core.projection import PoolProjection

GROUP_GAP = 2.0
ORPHANS = "(parent evicted)"


@dataclass(slots=True)
class Segment:
    """A run of cached hashes where each has exactly one child (collapsed when drawn)."""

    hashes: list[bytes]
    depth: int  # depth of the first hash
    parent: int | None  # index of the parent segment
    children: list[int] = field(default_factory=list)
    y: float = 0.0


class ChainTree:
    """The laid-out tree, as arrays: node `i` is the hash `hashes[i]`; segment `s` holds the
    nodes `flat[seg_start[s]:seg_start[s] + seg_len[s]]`, root first, from x `seg_depth[s]`
    at row `seg_y[s]` under segment `seg_parent[s]` (-1: a top-level run). `segments` and
    `positions` (hash -> (x, y)) read the arrays as `Segment`s and a mapping, made when asked."""

    def __init__(self, hashes: list[bytes] | None = None, flat: np.ndarray | None = None,
                 seg_start: np.ndarray | None = None, seg_len: np.ndarray | None = None,
                 seg_depth: np.ndarray | None = None, seg_parent: np.ndarray | None = None,
                 seg_y: np.ndarray | None = None, groups: list[tuple[str, float]] | None = None,
                 blocks: np.ndarray | None = None) -> None:
        z = np.zeros(0, np.int64)
        self.hashes = hashes or []
        self.blocks = z if blocks is None else blocks  # node -> the block its hash's first holder is
        self.flat = z if flat is None else flat
        self.seg_start = z if seg_start is None else seg_start
        self.seg_len = z if seg_len is None else seg_len
        self.seg_depth = z if seg_depth is None else seg_depth
        self.seg_parent = z if seg_parent is None else seg_parent
        self.seg_y = np.zeros(0) if seg_y is None else seg_y
        self.groups = groups or []  # (label, y of its first root)
        n = len(self.hashes)
        seg_of_flat = np.repeat(np.arange(len(self.seg_len)), self.seg_len)
        offset = np.arange(len(self.flat)) - np.repeat(self.seg_start, self.seg_len)
        self.node_x = np.full(n, np.nan)
        self.node_y = np.full(n, np.nan)
        self.node_seg = np.full(n, -1, np.int64)
        self.node_x[self.flat] = (self.seg_depth[seg_of_flat] + offset).astype(float)
        self.node_y[self.flat] = self.seg_y[seg_of_flat]
        self.node_seg[self.flat] = seg_of_flat
        self.seg_children = np.bincount(self.seg_parent[self.seg_parent >= 0], minlength=len(self.seg_len)) \
            if len(self.seg_len) else z
        self._segments: list[Segment] | None = None
        self._index: dict[bytes, int] | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.flat)

    @property
    def num_segments(self) -> int:
        return len(self.seg_len)

    def first_nodes(self) -> np.ndarray:
        return self.flat[self.seg_start]

    def last_nodes(self) -> np.ndarray:
        return self.flat[self.seg_start + self.seg_len - 1]

    def node_of(self, h: bytes) -> int:
        """The node of hash `h` in the drawn tree, -1 if it is not drawn."""
        if self._index is None:
            self._index = {self.hashes[i]: i for i in self.flat.tolist()}
        return self._index.get(h, -1)

    @property
    def positions(self) -> _Positions:
        return _Positions(self)

    @property
    def segments(self) -> list[Segment]:
        if self._segments is None:
            hs, flat = self.hashes, self.flat.tolist()
            kids: list[list[int]] = [[] for _ in range(self.num_segments)]
            for s, par in enumerate(self.seg_parent.tolist()):
                if par >= 0:
                    kids[par].append(s)
            self._segments = [Segment([hs[i] for i in flat[a:a + n]], d, None if par < 0 else par, kids[s], y)
                              for s, (a, n, d, par, y) in enumerate(zip(
                                  self.seg_start.tolist(), self.seg_len.tolist(), self.seg_depth.tolist(),
                                  self.seg_parent.tolist(), self.seg_y.tolist()))]
        return self._segments


class _Positions(Mapping[bytes, tuple[float, float]]):
    """hash -> (x, y) of its node, for the hashes the tree draws (in segment order)."""

    def __init__(self, tree: ChainTree) -> None:
        self._tree = tree

    def __getitem__(self, h: bytes) -> tuple[float, float]:
        i = self._tree.node_of(h)
        if i < 0:
            raise KeyError(h)
        return float(self._tree.node_x[i]), float(self._tree.node_y[i])

    def __contains__(self, h: object) -> bool:
        return isinstance(h, bytes) and self._tree.node_of(h) >= 0

    def __iter__(self) -> Iterator[bytes]:
        hs = self._tree.hashes
        return (hs[i] for i in self._tree.flat.tolist())

    def __len__(self) -> int:
        return self._tree.num_nodes


def chain_table(p: Any, only: set[bytes] | None = None) -> tuple[list[bytes], np.ndarray, list[bytes | None]]:
    """Every cached hash of `p` (or those in `only`) in `by_hash` order, the block of its
    first holder, and that block's parent hash: read for all blocks at once."""
    by = p.by_hash
    if only is None:
        hashes = list(by)
        first = np.fromiter((v[0] for v in by.values()), np.int64, len(hashes))
    else:
        hashes = [h for h in by if h in only]
        first = np.fromiter((by[h][0] for h in hashes), np.int64, len(hashes))
    return hashes, first, p.parents_of(first)


def build_tree(p: Any, breaks: set[bytes] | None = None, only: set[bytes] | None = None,
               compiled: bool = True) -> ChainTree:
    """Lay out every cached hash of `p` (or those in `only`); a hash in `breaks` starts its own
    segment. The layout runs over arrays (compiled by numba when it is there) and gives what
    `build_tree_reference` gives."""
    fast = getattr(p, "chain_index", None)
    got = fast() if fast is not None and only is None else None
    if got is not None:  # a journal-fed pool: hashes and parents as arrays, no dict of them
        hashes, first, par, has_parent = got
        index: dict[bytes, int] | None = None
    else:
        hashes, first, parents = chain_table(p, only)
        index = {h: i for i, h in enumerate(hashes)}
        par = np.fromiter((-1 if q is None else index.get(q, -1) for q in parents), np.int64, len(hashes))
        has_parent = np.fromiter((q is not None for q in parents), np.bool_, len(hashes))
    n = len(hashes)
    brk = np.zeros(n, np.bool_)
    if breaks:
        if index is None:
            index = {h: i for i, h in enumerate(hashes)} if len(breaks) > 8 else None
        for h in breaks:
            i = index.get(h) if index is not None else next((k for k, x in enumerate(hashes) if x == h), None)
            if i is not None:
                brk[i] = True
    roots = np.flatnonzero(par < 0)
    # a root's group: what block_of_hash's block says (its parent evicted, else its salt)
    if getattr(p, "first_holder_shown", False):
        shown = first[roots].tolist()
    else:
        shown = [p.block_of_hash(hashes[i]) for i in roots.tolist()]
    tops = [k for k, (i, b) in enumerate(zip(roots.tolist(), shown))
            if b is not None and not (has_parent[i] if b == first[i] else p.parents[b] is not None)]
    labels = [ORPHANS if b is not None else "no tenant" for b in shown]
    for k, salt in zip(tops, p.salts_of(np.asarray([shown[k] for k in tops], np.int64))):
        labels[k] = f"tenant {salt}" if salt is not None else "no tenant"
    order = sorted(set(labels), key=lambda g: (g == ORPHANS, g))
    code = {g: k for k, g in enumerate(order)}
    root_group = np.full(n, -1, np.int64)
    root_group[roots] = [code[g] for g in labels]
    loop = _compiled_layout() if compiled else None
    flat, seg_start, seg_len, seg_depth, seg_parent, seg_y, group_y = (loop or _layout)(
        par, brk, root_group, len(order), GROUP_GAP)
    return ChainTree(hashes, flat, seg_start, seg_len, seg_depth, seg_parent, seg_y,
                     [(g, float(y)) for g, y in zip(order, group_y.tolist())], first)


def _layout(par, brk, root_group, num_groups, gap):  # pragma: no cover - compiled
    """`build_tree_reference`'s walk over arrays: per group, depth first from its roots
    (node order), each run of single children one segment; leaves take consecutive rows in
    the order they are made, a parent sits midway between its first and last child."""
    n = len(par)
    kid_start = np.zeros(n + 1, np.int64)
    for i in range(n):
        if par[i] >= 0:
            kid_start[par[i] + 1] += 1
    for i in range(n):
        kid_start[i + 1] += kid_start[i]
    fill = kid_start[:n].copy()
    kids = np.zeros(max(1, kid_start[n]), np.int64)
    for i in range(n):
        if par[i] >= 0:
            kids[fill[par[i]]] = i
            fill[par[i]] += 1
    flat = np.zeros(n, np.int64)
    seg_start = np.zeros(n, np.int64)
    seg_len = np.zeros(n, np.int64)
    seg_depth = np.zeros(n, np.int64)
    seg_parent = np.zeros(n, np.int64)
    seg_y = np.zeros(n, np.float64)
    first_kid = np.full(n, -1, np.int64)
    last_kid = np.full(n, -1, np.int64)
    group_y = np.zeros(num_groups, np.float64)
    st_node = np.zeros(n, np.int64)
    st_depth = np.zeros(n, np.int64)
    st_seg = np.zeros(n, np.int64)
    num_segs = 0
    flat_n = 0
    next_y = 1.0
    for g in range(num_groups):
        group_first = next_y
        top = 0
        for i in range(n - 1, -1, -1):
            if par[i] < 0 and root_group[i] == g:
                st_node[top] = i
                st_depth[top] = 0
                st_seg[top] = -1
                top += 1
        begin = num_segs
        while top > 0:
            top -= 1
            h = st_node[top]
            depth = st_depth[top]
            ps = st_seg[top]
            s = num_segs
            num_segs += 1
            seg_start[s] = flat_n
            flat[flat_n] = h
            flat_n += 1
            last = h
            while kid_start[last + 1] - kid_start[last] == 1:
                kid = kids[kid_start[last]]
                if brk[kid] or brk[last]:
                    break
                flat[flat_n] = kid
                flat_n += 1
                last = kid
            seg_len[s] = flat_n - seg_start[s]
            seg_depth[s] = depth
            seg_parent[s] = ps
            if ps >= 0:
                if first_kid[ps] < 0:
                    first_kid[ps] = s
                last_kid[ps] = s
            end_depth = depth + seg_len[s]
            for k in range(kid_start[last + 1] - 1, kid_start[last] - 1, -1):
                st_node[top] = kids[k]
                st_depth[top] = end_depth
                st_seg[top] = s
                top += 1
        for s in range(begin, num_segs):
            if first_kid[s] < 0:
                seg_y[s] = next_y
                next_y += 1.0
        for s in range(num_segs - 1, begin - 1, -1):
            if first_kid[s] >= 0:
                seg_y[s] = (seg_y[first_kid[s]] + seg_y[last_kid[s]]) / 2
        group_y[g] = group_first
        next_y += gap
    return (flat[:flat_n], seg_start[:num_segs], seg_len[:num_segs], seg_depth[:num_segs], seg_parent[:num_segs],
            seg_y[:num_segs], group_y)


_COMPILED: list[Any] = []


def _compiled_layout() -> Any:
    """`_layout` compiled by numba (cached on disk), or None without numba."""
    if not _COMPILED:
        try:
            from numba import njit
        except ImportError:
            return None
        _COMPILED.append(njit(cache=True, nogil=True)(_layout))
    return _COMPILED[0]


def warm_up() -> None:
    """Load (or compile, the first time on a machine) the compiled layout here, on the
    calling thread, and not at a hash chain view's first rebuild on the GUI thread."""
    with _WARM_LOCK:
        loop = _compiled_layout()
        if loop is not None:
            z = np.zeros(1, np.int64)
            loop(np.full(1, -1, np.int64), np.zeros(1, np.bool_), z, 1, GROUP_GAP)


_WARM_LOCK = threading.Lock()
_WARMING: list[threading.Thread] = []


def warm_up_in_background() -> None:
    """`warm_up` once per process on a thread of its own (the cyclic collector paused on it,
    as `app.runtime.jobs.collector_paused` says why)."""
    if _WARMING:
        return

    def run() -> None:
        from app.runtime.jobs import collector_paused

        with collector_paused():
            warm_up()

    t = threading.Thread(target=run, name="chain-layout-warm-up", daemon=True)
    _WARMING.append(t)
    t.start()


def _group_label(p: PoolProjection, h: bytes) -> str:
    b = p.block_of_hash(h)
    parent = p.parents[b] if b is not None else None
    if parent is not None:
        return ORPHANS
    salt = p.salts[b] if b is not None else None
    return f"tenant {salt}" if salt is not None else "no tenant"


def build_tree_reference(p: PoolProjection, breaks: set[bytes] | None = None,
                         only: set[bytes] | None = None) -> list[Segment]:
    """The layout read block by block with dicts (the reference `build_tree`'s arrays are
    held to): the segments, each with its hashes, depth, parent, children and row; and the
    group rows as `groups`, an attribute of the list."""
    breaks = breaks or set()
    parent_of: dict[bytes, bytes | None] = {}
    for h, holders in p.by_hash.items():
        if only is None or h in only:
            parent_of[h] = p.parents[holders[0]]
    children: dict[bytes, list[bytes]] = {}
    roots: list[bytes] = []
    for h, parent in parent_of.items():
        if parent is not None and parent in parent_of:
            children.setdefault(parent, []).append(h)
        else:
            roots.append(h)
    groups: dict[str, list[bytes]] = {}
    for h in roots:
        groups.setdefault(_group_label(p, h), []).append(h)

    segments: list[Segment] = []
    group_rows: list[tuple[str, float]] = []
    next_y = 1.0  # room above the first group for its label
    order = sorted(groups, key=lambda g: (g == ORPHANS, g))
    for label in order:
        group_first = next_y
        top_level: list[int] = []
        # Depth-first with an explicit stack: chains can be thousands of blocks long.
        stack: list[tuple[bytes, int, int | None]] = [(h, 0, None) for h in reversed(groups[label])]
        while stack:
            h, depth, parent_seg = stack.pop()
            seg = Segment([h], depth, parent_seg)
            while True:
                kids = children.get(seg.hashes[-1], ())
                if len(kids) == 1 and kids[0] not in breaks and seg.hashes[-1] not in breaks:
                    seg.hashes.append(kids[0])
                    continue
                break
            index = len(segments)
            segments.append(seg)
            if parent_seg is None:
                top_level.append(index)
            else:
                segments[parent_seg].children.append(index)
            end_depth = depth + len(seg.hashes)
            for kid in reversed(children.get(seg.hashes[-1], ())):
                stack.append((kid, end_depth, index))
        # y: leaves take consecutive rows, a parent sits at the middle of its children
        next_y = _assign_rows(segments, top_level, next_y)
        group_rows.append((label, group_first))
        next_y += GROUP_GAP
    out = _SegmentList(segments)
    out.groups = group_rows
    return out


class _SegmentList(list):
    groups: list[tuple[str, float]]


def _assign_rows(segments: list[Segment], top_level: list[int], next_y: float) -> float:
    # Post-order without recursion: children get rows before their parent.
    stack: list[tuple[int, bool]] = [(i, False) for i in reversed(top_level)]
    while stack:
        index, done = stack.pop()
        seg = segments[index]
        if not seg.children:
            seg.y = next_y
            next_y += 1.0
        elif done:
            seg.y = (segments[seg.children[0]].y + segments[seg.children[-1]].y) / 2
        else:
            stack.append((index, True))
            stack.extend((c, False) for c in reversed(seg.children))
    return next_y


def fit_labels(boxes: list[QRectF], bounds: QRectF, taken: list[QRectF], limit: int) -> list[int]:
    """Greedy placement: the indices of `boxes` (pixels, best first) that lie inside `bounds`
    and overlap neither `taken` nor each other, at most `limit`. `taken` grows in place."""
    cell = 64.0
    grid: dict[tuple[int, int], list[QRectF]] = {}

    def cells(r: QRectF) -> list[tuple[int, int]]:
        return [(i, j) for i in range(int(r.left() // cell), int(r.right() // cell) + 1)
                for j in range(int(r.top() // cell), int(r.bottom() // cell) + 1)]

    for r in taken:
        for c in cells(r):
            grid.setdefault(c, []).append(r)
    chosen: list[int] = []
    for i, box in enumerate(boxes):
        if len(chosen) >= limit:
            break
        if not bounds.contains(box):
            continue
        near = cells(box)
        if any(box.intersects(other) for c in near for other in grid.get(c, ())):
            continue
        chosen.append(i)
        taken.append(box)
        for c in near:
            grid.setdefault(c, []).append(box)
    return chosen
