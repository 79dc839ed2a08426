"""The hash chains: every cached prefix as one radix tree, left to right, grouped by tenant.

Each node is a cached block hash; runs of single-child nodes are drawn as one labelled
segment. A request's path is highlighted (reused part, then computed part) and a cross
marks where it left the cached tree. Built from `ctx.state.projection` only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app import theme
from app.views.block_table_view import block_colors, swatch
from app.views.timeline_view import CountAxis
from engine.core.projection import PoolProjection, RequestRecord

MAX_LABELS = 150
MIN_REBUILD_MS = 250  # rebuilding a big tree every frame would stall the window
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


def build_tree(p: PoolProjection, breaks: set[bytes] | None = None) -> ChainTree:
    """Lay out every cached hash of `p`; a hash in `breaks` always starts its own segment."""
    breaks = breaks or set()
    parent_of: dict[bytes, bytes | None] = {}
    for h, holders in p.by_hash.items():
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


class HashChainView(QWidget):
    """The radix tree of cached prefixes with one request's path and divergence point."""

    def __init__(self, ctx: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.state = ctx.state
        self.setObjectName("hash_chain_view")
        self.tree = ChainTree([], {}, [])
        self.request_id: str | None = None  # None = the last request
        self.path_record: RequestRecord | None = None
        self.path_hashes: list[bytes] = []  # the shown request's hashes still in the tree
        self.divergence_block: int | None = None
        self._drawn_version = -1
        self._last_build = 0.0
        self._labels: list[pg.TextItem] = []
        self._range_shape: tuple[int, float, float] | None = None

        self.request_box = QComboBox()
        self.request_box.setObjectName("chain_request")
        self.request_box.setMinimumWidth(160)
        self.summary = QLabel()
        self.summary.setObjectName("chain_summary")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.plot = pg.PlotWidget(axisItems={"bottom": CountAxis("bottom")})
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        # the tree takes the room the labels leave and never asks for more (a preferred
        # height would make the dock's scroll area scroll)
        self.plot.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.plot.setMinimumHeight(120)
        self.plot.hideAxis("left")
        self.plot.invertY(True)  # the first group at the top, read like a file tree
        self.plot.setLabel("bottom", "block position in the prompt")
        self.plot.showGrid(x=True, y=False, alpha=0.12)
        self.edges = pg.PlotDataItem(connect="pairs")
        self.path_hit = pg.PlotDataItem(connect="finite")
        self.path_new = pg.PlotDataItem(connect="finite")
        self.nodes = pg.ScatterPlotItem(size=7, hoverable=True, tip=lambda x, y, data: data)
        self.cross = pg.ScatterPlotItem(symbol="x", size=18)
        self.cross_label = pg.TextItem(anchor=(0, -0.2))
        for item in (self.edges, self.path_hit, self.path_new, self.nodes, self.cross, self.cross_label):
            self.plot.addItem(item)

        bar = QHBoxLayout()
        bar.addWidget(QLabel("path of"))
        bar.addWidget(self.request_box)
        bar.addWidget(self.summary, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(bar)
        layout.addWidget(self.plot, 1)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(lambda: self.refresh(force=True))
        self.request_box.activated.connect(self._on_request_chosen)
        self.state.sigChanged.connect(self.refresh)
        self.state.sigReset.connect(lambda: self.refresh(force=True))
        if hasattr(ctx, "sigThemeChanged"):
            ctx.sigThemeChanged.connect(self.apply_theme)
        self.apply_theme()

    def apply_theme(self, name: str | None = None) -> None:
        self.colors = block_colors(name)
        self.palette = theme.palette(name)
        self.plot.setBackground(self.palette["panel"])
        self.edges.setPen(pg.mkPen(self.palette["text_dim"], width=1.2))
        self.path_hit.setPen(pg.mkPen(self.palette["cached"], width=4))
        self.path_new.setPen(pg.mkPen(self.palette["computed"], width=4))
        self.cross.setPen(pg.mkPen(self.palette["miss"], width=3))
        self.cross.setBrush(pg.mkBrush(self.palette["miss"]))
        self.cross_label.setColor(self.palette["miss"])
        self.refresh(force=True)

    # ------------------------------------------------------------------ inputs
    def show_request(self, request_id: str | None) -> None:
        """Highlight `request_id`'s path (None: always the latest request)."""
        self.request_id = request_id
        self.refresh(force=True)

    def _on_request_chosen(self, index: int) -> None:
        self.show_request(self.request_box.itemData(index))

    # ------------------------------------------------------------------ drawing
    def refresh(self, force: bool = False) -> None:
        if not force and self.state.version == self._drawn_version:
            return
        wait_ms = MIN_REBUILD_MS - (time.monotonic() - self._last_build) * 1000
        if not force and self.state.is_live and wait_ms > 0:
            if not self._timer.isActive():
                self._timer.start(int(wait_ms) + 1)
            return
        self._drawn_version = self.state.version
        self._last_build = time.monotonic()
        p = self.state.projection
        rec = self._record(p)
        breaks: set[bytes] = set()
        if rec is not None and rec.num_hit_blocks < len(rec.block_hashes):
            breaks.add(rec.block_hashes[rec.num_hit_blocks])  # the divergence stays a visible node
        self.tree = build_tree(p, breaks)
        self._draw_tree(p)
        self._draw_path(p, rec)
        self._fill_request_box(p)

    def _record(self, p: PoolProjection) -> RequestRecord | None:
        rid = self.request_id if self.request_id is not None else p.last_request_id
        rec = p.requests.get(rid) if rid is not None else None
        self.path_record = rec if rec is not None and rec.miss is not None else None
        return self.path_record

    def _draw_tree(self, p: PoolProjection) -> None:
        tree = self.tree
        segs = tree.segments
        ex: list[float] = []
        ey: list[float] = []
        for seg in segs:
            x0, x1 = float(seg.depth), float(seg.depth + len(seg.hashes) - 1)
            ex += [x0, x1]
            ey += [seg.y, seg.y]
            if seg.parent is not None:
                par = segs[seg.parent]
                ex += [x0 - 1.0, x0]
                ey += [par.y, seg.y]
        self.edges.setData(np.array(ex), np.array(ey))
        shape = (len(segs), max(ex, default=0.0), max((s.y for s in segs), default=0.0))
        if shape != self._range_shape:  # keep the user's zoom until the tree changes shape
            self._range_shape = shape
            right = shape[1] + max(2.0, 0.12 * shape[1])  # room for the run labels
            self.plot.setRange(xRange=(-0.5, right), yRange=(0.0, shape[2] + 1.0), padding=0.02)
        # markers at segment ends (a collapsed run shows only its first and last block)
        xs, ys, brushes, tips = [], [], [], []
        in_use, cached = pg.mkBrush(self.colors["ref1"]), pg.mkBrush(self.colors["cached_new"])
        for seg in segs:
            ends = [seg.hashes[0]] if len(seg.hashes) == 1 else [seg.hashes[0], seg.hashes[-1]]
            for h in ends:
                x, y = tree.positions[h]
                b = p.block_of_hash(h)
                ref = p.ref_counts[b] if b is not None else 0
                xs.append(x)
                ys.append(y)
                brushes.append(in_use if ref > 0 else cached)
                tips.append(f"block {b} · {h.hex()[:12]} · ref {ref}\nrun of {len(seg.hashes)} blocks")
        self.nodes.setData(x=xs, y=ys, brush=brushes, pen=pg.mkPen(None), data=tips)
        for label in self._labels:
            self.plot.removeItem(label)
        self._labels = []
        runs = sorted((s for s in segs if len(s.hashes) > 2), key=lambda s: -len(s.hashes))[:MAX_LABELS]
        for seg in runs:
            end = seg.depth + len(seg.hashes) - 1
            if seg.children:  # the tree goes on to the right: the count sits above the run
                t = pg.TextItem(f"{len(seg.hashes)} blocks", color=self.palette["text_dim"], anchor=(0.5, 0.95))
                t.setPos((seg.depth + end) / 2, seg.y)
            else:
                t = pg.TextItem(f"{len(seg.hashes)} blocks", color=self.palette["text_dim"], anchor=(0, 0.5))
                t.setPos(end + 0.3, seg.y)
            self.plot.addItem(t)
            self._labels.append(t)
        for label, y in tree.groups:
            t = pg.TextItem(label, color=self.palette["text"], anchor=(0, 0.5))
            t.setPos(0, y - 0.9)
            self.plot.addItem(t)
            self._labels.append(t)

    def _draw_path(self, p: PoolProjection, rec: RequestRecord | None) -> None:
        pos = self.tree.positions
        self.path_hashes = []
        self.divergence_block = None
        if rec is None:
            for item in (self.path_hit, self.path_new, self.cross):
                item.setData([], [])
            self.cross_label.setText("")
            self.summary.setText(self._summary_text(p, None))
            return
        k = rec.num_hit_blocks
        hit_x, hit_y, new_x, new_y = [], [], [], []
        for i, h in enumerate(rec.block_hashes):
            xy = pos.get(h)
            if xy is not None:
                self.path_hashes.append(h)
            x, y = xy if xy is not None else (np.nan, np.nan)
            if i < k:
                hit_x.append(x)
                hit_y.append(y)
            if i >= k - 1:  # the computed part starts where the reused part ends
                new_x.append(x)
                new_y.append(y)
        self.path_hit.setData(np.array(hit_x, dtype=float), np.array(hit_y, dtype=float))
        self.path_new.setData(np.array(new_x, dtype=float), np.array(new_y, dtype=float))
        self.divergence_block = k
        reason = rec.miss.reason.replace("_", " ") if rec.miss is not None else ""
        if k < len(rec.block_hashes) and rec.block_hashes[k] in pos:
            cx, cy = pos[rec.block_hashes[k]]
        elif k > 0 and rec.block_hashes[k - 1] in pos:
            cx, cy = pos[rec.block_hashes[k - 1]]
            cx += 0.5
        else:
            cx, cy = k - 0.5, (new_y[0] if new_y and not np.isnan(new_y[0]) else 0.0)
        self.cross.setData([cx], [cy])
        self.cross_label.setText(f"left the cache at block {k}: {reason}")
        self.cross_label.setPos(cx, cy)
        self.summary.setText(self._summary_text(p, rec))

    def _summary_text(self, p: PoolProjection, rec: RequestRecord | None) -> str:
        tree = self.tree
        text = (f"{tree.num_nodes:,} cached blocks in {len(tree.segments):,} runs, "
                f"{len(tree.groups)} group{'s' if len(tree.groups) != 1 else ''}")
        if rec is not None:
            text += (f" · request {rec.request_id}: reused {rec.num_hit_blocks} of {len(rec.block_hashes)} "
                     f"full blocks {swatch(self.palette['cached'], '▬')}, computed the rest "
                     f"{swatch(self.palette['computed'], '▬')}")
        return text

    def _fill_request_box(self, p: PoolProjection) -> None:
        wanted = [None] + list(dict.fromkeys(reversed(p.order)))[:40]
        current = [self.request_box.itemData(i) for i in range(self.request_box.count())]
        if current == wanted:
            return
        self.request_box.blockSignals(True)
        self.request_box.clear()
        for rid in wanted:
            self.request_box.addItem("latest request" if rid is None else str(rid), rid)
        i = self.request_box.findData(self.request_id)
        self.request_box.setCurrentIndex(max(0, i))
        self.request_box.blockSignals(False)
