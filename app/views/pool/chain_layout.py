"""The layout of the hash chain view, without Qt widgets: cached hashes as a radix tree of
collapsed runs (rows and depths), and the greedy placement that keeps labels from overlapping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(slots=True)
class ChainTree:
    """The laid-out tree: segments, and per hash its (x, y) position."""

    segments: list[Segment]
    positions: dict[bytes, tuple[float, float]]
    groups: list[tuple[str, float]]  # (label, y of its first root)

    @property
    def num_nodes(self) -> int:
        return len(self.positions)


def _group_label(p: PoolProjection, h: bytes) -> str:
    b = p.block_of_hash(h)
    parent = p.parents[b] if b is not None else None
    if parent is not None:
        return ORPHANS
    salt = p.salts[b] if b is not None else None
    return f"tenant {salt}" if salt is not None else "no tenant"


def build_tree(p: PoolProjection, breaks: set[bytes] | None = None, only: set[bytes] | None = None) -> ChainTree:
    """Lay out every cached hash of `p` (or those in `only`); a hash in `breaks` starts its own segment."""
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
    positions: dict[bytes, tuple[float, float]] = {}
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
    for seg in segments:
        for i, h in enumerate(seg.hashes):
            positions[h] = (float(seg.depth + i), seg.y)
    return ChainTree(segments, positions, group_rows)


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
