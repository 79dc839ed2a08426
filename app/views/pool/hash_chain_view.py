"""The hash chains: every cached prefix as one radix tree, left to right, grouped by tenant.

Each node is a cached block hash; runs of single-child nodes are drawn as one segment. At
trace scale (thousands of runs) only the labels that fit are drawn, laid out in pixels so
none overlap; the view zooms, can show only one request's path, and finds a block by hash
or token text. The chosen request's path is drawn over everything (reused part, computed
part, a cross where it left the cached tree). Built from `ctx.state.projection` only.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, QTimer
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSizePolicy, QVBoxLayout, QWidget,
)

from app.ui import theme
from app.ui.export import export_button
from app.runtime.remote import decode_tokens, view_tokenizer
from app.views.pool.chain_layout import ChainTree, Segment, build_tree, fit_labels, warm_up_in_background
from app.ui.colors import block_colors, swatch
from app.ui.plots import CountAxis
from engine.core.projection import PoolProjection, RequestRecord
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext

__all__ = ["ChainTree", "HashChainView", "Segment", "build_tree"]  # the layout lives in chain_layout

MAX_LABELS = 60  # run labels drawn at most; the densest trees show the longest runs that fit
MAX_LABEL_CANDIDATES = 4000  # runs tried for a label, longest first (the rest are too short to win)
MAX_LABEL_TRIES = 8 * MAX_LABELS  # of those, the ones in view measured for a place
LABEL_DECODES = 24  # leaves' token text decoded per label layout at most (the rest at the next one)
MAX_NODE_MARKERS = 20_000  # run-end markers drawn at most: those in view, one per pixel
LABEL_PAD_PX = 3
MAX_TEXT_SEARCH_BLOCKS = 50_000  # blocks decoded for a token-text search
MIN_REBUILD_MS = 250  # rebuilding a big tree every frame would stall the window


class HashChainView(PanelView):
    """The radix tree of cached prefixes with one request's path and divergence point.

    `label_rects` holds the pixel boxes of the labels drawn last (none overlap); `matches`
    the hashes the last search found.
    """

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("hash_chain_view")
        self.tree = ChainTree()
        self._tree_projection: Any = None  # the projection `tree` was laid out from
        self.request_id: str | None = None  # None = the last request
        self.only_request = False
        self.path_record: RequestRecord | None = None
        self.path_hashes: list[bytes] = []  # the shown request's hashes still in the tree
        self.divergence_block: int | None = None
        self.matches: list[bytes] = []
        self.match_index = -1
        self._query = ""  # the search the matches are for (lower case)
        self._query_text = ""
        self.label_rects: list[QRectF] = []
        self.label_texts: list[str] = []
        self._runs = np.zeros(0, np.int64)  # segments worth a label, longest first
        self._decoded: dict[bytes, str] = {}  # token text per hash, for the search
        self._leaf_text: dict[bytes, str] = {}  # token text per hash, for tips and a remote pool's leaves
        self._drawn_version = -1
        self._last_build = 0.0
        self._build_seconds = 0.0
        self._stale = False
        self._range_shape: tuple[int, float, float] | None = None

        self.request_box = QComboBox()
        self.request_box.setObjectName("chain_request")
        self.request_box.setMinimumWidth(140)
        self.only_box = QCheckBox("only this request")
        self.only_box.setObjectName("chain_only")
        self.only_box.setToolTip("draw only the chosen request's path through the cache")
        self.search = QLineEdit()
        self.search.setObjectName("chain_search")
        self.search.setPlaceholderText("find: hash prefix or token text (Enter: next)")
        self.search.setClearButtonEnabled(True)
        fit = QPushButton("Fit")
        fit.setToolTip("show the whole tree (wheel or drag to zoom and pan)")
        to_path = QPushButton("Zoom to path")
        to_path.setToolTip("zoom onto the chosen request's path")
        self.summary = QLabel()
        self.summary.setObjectName("chain_summary")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
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
        # run ends: cached blocks, and blocks in use (two items, each one brush: no brush per point)
        self.nodes = pg.ScatterPlotItem(size=7, hoverable=True, tip=lambda x, y, data: self.tip_for(data))
        self.nodes_used = pg.ScatterPlotItem(size=7, hoverable=True, tip=lambda x, y, data: self.tip_for(data))
        self._ends = (np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, bool))  # x, y, block, in use
        self._text_width: dict[str, int] = {}
        self.found = pg.ScatterPlotItem(size=16, symbol="o")
        self.cross = pg.ScatterPlotItem(symbol="x", size=18)
        self.cross_label = pg.TextItem(anchor=(0, -0.2))
        # the chosen path, its cross and the search hits are drawn over the whole tree
        for item, z in ((self.edges, 0), (self.nodes, 1), (self.nodes_used, 1), (self.path_hit, 10),
                        (self.path_new, 10),
                        (self.found, 11), (self.cross, 12), (self.cross_label, 13)):
            item.setZValue(z)
            self.plot.addItem(item)
        self.run_labels = [pg.TextItem(anchor=(0, 0.5)) for _ in range(MAX_LABELS)]
        self.group_labels: list[pg.TextItem] = []
        for label in self.run_labels:
            label.setZValue(5)
            label.hide()
            self.plot.addItem(label, ignoreBounds=True)
        self.export = export_button(self, plots={"Hash chains": lambda: self.plot},
                                    tables={"Cached runs": self.runs_table})

        bar = QHBoxLayout()
        bar.addWidget(QLabel("path of"))
        bar.addWidget(self.request_box, 1)
        bar.addWidget(self.only_box)
        bar.addWidget(self.export)
        bar2 = QHBoxLayout()
        bar2.addWidget(self.search, 1)
        bar2.addWidget(fit)
        bar2.addWidget(to_path)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(bar)
        layout.addLayout(bar2)
        layout.addWidget(self.summary)
        layout.addWidget(self.plot, 1)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(lambda: self.refresh())  # throttled: past its wait now
        self._label_timer = QTimer(self)  # one label layout per burst of zoom or pan steps
        self._label_timer.setSingleShot(True)
        self._label_timer.setInterval(30)
        self._label_timer.timeout.connect(self._on_view_moved)
        self.plot.getViewBox().sigRangeChanged.connect(lambda *_: self._label_timer.start())
        self.plot.getViewBox().sigResized.connect(lambda *_: self._label_timer.start())
        self.request_box.activated.connect(self._on_request_chosen)
        self.only_box.toggled.connect(self.set_only_request)
        self.search.returnPressed.connect(lambda: self.find(self.search.text()))
        self.search.textChanged.connect(lambda text: text or self.find(""))
        fit.clicked.connect(self.fit_all)
        to_path.clicked.connect(self.zoom_to_path)
        self.nodes.sigClicked.connect(self._on_node_clicked)
        self.nodes_used.sigClicked.connect(self._on_node_clicked)
        self.state.sigChanged.connect(self.refresh)
        self.state.sigReset.connect(self._on_reset)
        warm_up_in_background()  # the compiled layout, loaded before the first big tree
        self.apply_theme()

    def apply_theme(self, name: str | None = None) -> None:
        self.colors = block_colors(name)
        self.palette = theme.palette(name)
        self.plot.setBackground(self.palette["panel"])
        self.path_hit.setPen(pg.mkPen(self.palette["cached"], width=4))
        self.path_new.setPen(pg.mkPen(self.palette["computed"], width=4))
        self.found.setPen(pg.mkPen(self.palette["warn"], width=2.5))
        self.found.setBrush(pg.mkBrush(None))
        self.cross.setPen(pg.mkPen(self.palette["miss"], width=3))
        self.cross.setBrush(pg.mkBrush(self.palette["miss"]))
        self.cross_label.setColor(self.palette["miss"])
        # labels sit on a veil of the background so they stay readable over dense edges
        veil = pg.mkColor(self.palette["panel"])
        veil.setAlpha(210)
        for label in self.run_labels + self.group_labels + [self.cross_label]:
            label.fill = pg.mkBrush(veil)
        for label in self.run_labels:
            label.setColor(self.palette["text_dim"])
        for axis in ("bottom",):
            self.plot.getAxis(axis).setTextPen(self.palette["text_dim"])
            self.plot.getAxis(axis).setPen(self.palette["text_dim"])
        self.refresh(force=True)

    def _on_reset(self) -> None:
        self._decoded = {}
        self._leaf_text = {}
        self.matches, self.match_index = [], -1
        if self.is_shown():
            self.refresh(force=True)
        else:  # a hidden tab lays out a whole pool's tree when it is shown, not per new log
            self._drawn_version = -1
            self._stale = True

    # ------------------------------------------------------------------ inputs
    def show_request(self, request_id: str | None) -> None:
        """Highlight `request_id`'s path (None: always the latest request)."""
        self.request_id = request_id
        self.refresh(force=True)

    def set_only_request(self, only: bool) -> None:
        """Draw only the chosen request's path (True) or the whole cached tree (False)."""
        self.only_request = bool(only)
        if self.only_box.isChecked() != self.only_request:
            self.only_box.setChecked(self.only_request)
        self._range_shape = None  # a different tree: fit it
        self.refresh(force=True)

    def _on_request_chosen(self, index: int) -> None:
        self.show_request(self.request_box.itemData(index))

    def _on_node_clicked(self, _item: Any, points: Any, *_: Any) -> None:
        if len(points):
            self.ctx.selection.select(points[0].data())

    def fit_all(self) -> None:
        self._range_shape = None
        self._fit_range()

    def zoom_to_path(self) -> None:
        pts = [self.tree.positions[h] for h in self.path_hashes if h in self.tree.positions]
        if not pts:
            return
        # the whole path across, and the rows around where it left the cache (a shared root
        # can sit hundreds of rows away; its edge still shows where the path comes from)
        xs = [x for x, _ in pts]
        cy = self.cross.getData()[1][0] if len(self.cross.getData()[1]) else pts[-1][1]
        self.plot.setRange(xRange=(min(xs) - 1, max(xs) + 6), yRange=(cy - 12, cy + 12), padding=0.02)

    def find(self, text: str) -> list[bytes]:
        """Mark the cached blocks whose hash starts with `text` (hex) or whose tokens read
        `text`; each call with the same text moves to the next match and selects it."""
        query = text.strip()
        self._query_text = query
        if not query:
            self.matches, self.match_index = [], -1
            self.found.setData([], [])
            self.summary.setText(self._summary_text(self.path_record))
            return []
        key = query.lower()
        if self.matches and self._query == key:
            self.match_index = (self.match_index + 1) % len(self.matches)
        else:
            self._query = key
            self.matches = self._search(key)
            self.match_index = 0 if self.matches else -1
        pos = self.tree.positions
        self.found.setData([pos[h][0] for h in self.matches], [pos[h][1] for h in self.matches])
        if self.matches:
            x, y = pos[self.matches[self.match_index]]
            left = max(-0.5, x - 12)
            self.plot.setRange(xRange=(left, left + 40), yRange=(y - 10, y + 10), padding=0)
            self.ctx.selection.select(self.state.projection.block_of_hash(self.matches[self.match_index]))
        self.summary.setText(self._summary_text(self.path_record))
        return self.matches

    def _search(self, key: str) -> list[bytes]:
        hashes = list(self.tree.positions)
        if len(key) >= 4 and all(c in "0123456789abcdef" for c in key):
            found = [h for h in hashes if h.hex().startswith(key)]
            if found:
                return found
        tokenizer = view_tokenizer(self.ctx)  # an attached server's, else the model's
        if tokenizer is None:
            return []
        p = self.state.projection
        found = []
        for h in hashes[:MAX_TEXT_SEARCH_BLOCKS]:
            text = self._decoded.get(h)
            if text is None:
                b = p.block_of_hash(h)
                ids = p.token_ids[b] if b is not None else ()
                try:
                    text = tokenizer.decode(list(ids)).lower() if ids else ""
                except Exception:  # noqa: BLE001 - ids of another model do not decode
                    text = ""
                self._decoded[h] = text
            if key in text:
                found.append(h)
        return found

    # ------------------------------------------------------------------ drawing
    def refresh(self, force: bool = False) -> None:
        if not force and self.state.version == self._drawn_version:
            return
        if not force and not self.is_shown():
            self._stale = True  # a hidden tab rebuilds when it is shown, not per batch
            return
        # A big tree costs a fraction of a second to lay out: while events stream in, the
        # view rebuilds at most once per four build times, so it never eats the frame.
        spacing_ms = max(MIN_REBUILD_MS, 4000 * self._build_seconds)
        wait_ms = spacing_ms - (time.monotonic() - self._last_build) * 1000
        if not force and self.state.is_live and wait_ms > 0:
            if not self._timer.isActive():
                self._timer.start(int(wait_ms) + 1)
            return
        self._stale = False
        self._drawn_version = self.state.version
        started = time.monotonic()
        p = self.state.projection
        rec = self._record(p)
        breaks: set[bytes] = set()
        if rec is not None and rec.num_hit_blocks < len(rec.block_hashes):
            breaks.add(rec.block_hashes[rec.num_hit_blocks])  # the divergence stays a visible node
        only = set(rec.block_hashes) if self.only_request and rec is not None else None
        self.tree = build_tree(p, breaks, only)
        self._tree_projection = p
        self.matches = [h for h in self.matches if h in self.tree.positions]
        self._draw_tree(p)
        self._draw_path(p, rec)
        self._fill_request_box(p)
        self.layout_labels()
        self._last_build = time.monotonic()
        self._build_seconds = self._last_build - started

    def is_shown(self) -> bool:
        """True if some of the view is on screen: a dock tab behind another is "visible" to
        Qt but has nothing to show."""
        return self.isVisible() and not self.visibleRegion().isEmpty()

    def paintEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        super().paintEvent(event)
        if self._stale and not self._timer.isActive():  # its tab came forward: rebuild after this paint
            self._timer.start(0)

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if self._stale:
            self.refresh(force=True)

    def _record(self, p: PoolProjection) -> RequestRecord | None:
        rid = self.request_id if self.request_id is not None else p.last_request_id
        rec = p.requests.get(rid) if rid is not None else None
        self.path_record = rec if rec is not None and rec.miss is not None else None
        return self.path_record

    def _fit_range(self) -> None:
        t = self.tree
        shape = (t.num_segments, float((t.seg_depth + t.seg_len).max()) if t.num_segments else 0.0,
                 float(t.seg_y.max()) if t.num_segments else 0.0)
        if shape == self._range_shape:  # keep the user's zoom until the tree changes shape
            return
        self._range_shape = shape
        right = shape[1] + max(2.0, 0.12 * shape[1])  # room for the run labels
        self.plot.setRange(xRange=(-0.5, right), yRange=(-0.5, shape[2] + 1.0), padding=0.02)

    def _draw_tree(self, p: PoolProjection) -> None:
        tree = self.tree
        n = tree.num_segments
        # a run's line, and from its parent's last node to its first (arrays, one pass)
        x0 = tree.seg_depth.astype(float)
        x1 = x0 + tree.seg_len - 1
        y = tree.seg_y
        child = np.flatnonzero(tree.seg_parent >= 0)
        ex = np.empty(2 * n + 2 * len(child))
        ey = np.empty_like(ex)
        ex[0:2 * n:2], ex[1:2 * n:2] = x0, x1
        ey[0:2 * n:2], ey[1:2 * n:2] = y, y
        ex[2 * n::2], ex[2 * n + 1::2] = x0[child] - 1.0, x0[child]
        ey[2 * n::2], ey[2 * n + 1::2] = y[tree.seg_parent[child]], y[child]
        self.edges.setData(ex, ey)
        # with a path to follow the tree steps back: thinner and fainter lines
        dim = pg.mkColor(self.palette["text_dim"])
        dim.setAlpha(120 if self.path_record is not None and n > 50 else 220)
        self.edges.setPen(pg.mkPen(dim, width=1.0 if n > 200 else 1.2))
        self._fit_range()
        # markers at segment ends (a collapsed run shows only its first and last block)
        long = tree.seg_len > 1
        ends = np.concatenate([tree.first_nodes(), tree.last_nodes()[long]])
        blocks = tree.blocks[ends] if len(ends) else np.zeros(0, np.int64)
        refs = np.asarray(p.ref_counts)[blocks] if len(blocks) else np.zeros(0, np.int64)
        self._ends = (tree.node_x[ends], tree.node_y[ends], blocks, refs > 0)
        self._draw_nodes()
        # A remote pool has no requests to follow, so its leaves say what they hold as well.
        remote = getattr(self.state, "remote", None) is not None
        worth = tree.seg_len > 2
        if remote:
            worth |= tree.seg_children == 0
        runs = np.flatnonzero(worth)
        self._runs = runs[np.argsort(-tree.seg_len[runs], kind="stable")][:MAX_LABEL_CANDIDATES]
        while len(self.group_labels) < len(tree.groups):
            t = pg.TextItem(anchor=(0, 0.5), fill=self.run_labels[0].fill)
            t.setZValue(6)
            self.plot.addItem(t, ignoreBounds=True)
            self.group_labels.append(t)
        for t, (label, y) in zip(self.group_labels, tree.groups):
            t.setText(label)
            t.setColor(self.palette["text"])
            t.setPos(0, y - 0.9)
        for t in self.group_labels[len(tree.groups):]:
            t.hide()

    def _draw_nodes(self) -> None:
        """The run-end markers in view (a margin around it), at most one per pixel and
        MAX_NODE_MARKERS; redrawn when the view pans or zooms."""
        x, y, blocks, used = self._ends
        vb = self.plot.getViewBox()
        rect = vb.viewRect()
        keep = np.flatnonzero((x >= rect.left() - 1) & (x <= rect.right() + 1) & (y >= rect.top() - 1)
                              & (y <= rect.bottom() + 1))
        if len(keep) > 1 and vb.width() > 1 and vb.height() > 1:  # one marker a pixel (in use first)
            px = ((x[keep] - rect.left()) * vb.width() / max(rect.width(), 1e-9)).astype(np.int64)
            py = ((y[keep] - rect.top()) * vb.height() / max(rect.height(), 1e-9)).astype(np.int64)
            order = np.argsort(~used[keep], kind="stable")
            cell = (px * 65_536 + py)[order]
            _, first = np.unique(cell, return_index=True)
            keep = np.sort(keep[order[first]])[:MAX_NODE_MARKERS]
        size = 7 if len(keep) < 300 else 5 if len(keep) < 3000 else 3
        for item, mask, color in ((self.nodes, ~used[keep], "cached_new"), (self.nodes_used, used[keep], "ref1")):
            at = keep[mask]
            item.setData(x=x[at], y=y[at], brush=pg.mkBrush(self.colors[color]), pen=pg.mkPen(None),
                         data=blocks[at].tolist(), size=size)

    def tip_for(self, block_id: int | None) -> str:
        p = self.state.projection
        if block_id is None or not 0 <= block_id < p.num_blocks:
            return ""
        h = p.hashes[block_id]
        node = self.tree.node_of(h) if h is not None else -1
        seg = int(self.tree.node_seg[node]) if node >= 0 else -1
        run = f"\nrun of {int(self.tree.seg_len[seg]):,} blocks" if seg >= 0 else ""
        text = self._block_text(block_id)
        text = f"\n“{text}”" if text else ""
        return (f"block {block_id} · {h.hex()[:12] if h else '-'} · ref {p.ref_counts[block_id]}{run}{text}"
                "\nclick for its details")

    def _block_text(self, block_id: int | None) -> str | None:
        """A block's tokens as text (the attached server's tokenizer, else the model's), cached."""
        p = self.state.projection
        if block_id is None or not p.token_ids[block_id]:
            return None
        h = p.hashes[block_id]
        text = self._leaf_text.get(h)
        if text is None:
            text = decode_tokens(self.ctx, p.token_ids[block_id])
            if text is None:
                return None
            text = self._leaf_text[h] = text.replace("\n", "⏎")
        return text

    def _decode_leaves(self, blocks: np.ndarray) -> None:
        """The token text of leaf blocks not decoded yet, LABEL_DECODES at most (their tokens
        read at once); a label without its text gets it at a later layout."""
        p = self._tree_projection  # the blocks are the tree's: the projection it was laid out from
        if view_tokenizer(self.ctx) is None or p is None:
            return
        blocks = blocks[blocks < p.num_blocks]
        hashes = p.digests_of(blocks)
        # a block that holds no hash now (None: the tree came from an earlier state) has no label
        todo = [i for i, h in enumerate(hashes) if h is not None and h not in self._leaf_text][:LABEL_DECODES]
        if not todo:
            return
        for i, ids in zip(todo, p.tokens_of(blocks[todo])):
            text = decode_tokens(self.ctx, ids) if ids else None
            self._leaf_text[hashes[i]] = "" if text is None else text.replace("\n", "⏎")  # "": none to show

    def _on_view_moved(self) -> None:
        self._draw_nodes()
        self.layout_labels()

    def layout_labels(self) -> None:
        """Place the labels that fit the current zoom: group titles, the cross's note, then
        run lengths longest first; a label that would overlap one already placed is left out."""
        vb = self.plot.getViewBox()
        rect = vb.viewRect()
        width, height = vb.width(), vb.height()
        if width <= 1 or height <= 1 or rect.width() <= 0 or rect.height() <= 0:
            return
        sx, sy = width / rect.width(), height / rect.height()
        fm = QFontMetrics(self.run_labels[0].textItem.font())
        text_h = fm.height() + 2 * LABEL_PAD_PX

        widths = self._text_width

        def box(x: float, y: float, text: str, ax: float, ay: float) -> QRectF:
            w = widths.get(text)
            if w is None:
                w = widths[text] = fm.horizontalAdvance(text) + 2 * LABEL_PAD_PX
            px, py = (x - rect.left()) * sx, (y - rect.top()) * sy
            return QRectF(px - ax * w, py - ay * text_h, w, text_h)

        bounds = QRectF(0, 0, width, height)
        taken: list[QRectF] = []
        texts: list[str] = []
        note = self.cross_label.textItem.toPlainText()
        if note:
            # under the cross, or above it where the cross sits at the bottom edge
            cx, cy = self.cross_label.pos().x(), self.cross_label.pos().y()
            anchor = (0, -0.2)
            b = box(cx, cy, note, *anchor)
            if b.bottom() > height:
                anchor = (0, 1.2)
                b = box(cx, cy, note, *anchor)
            if b.right() > width:
                anchor = (1, anchor[1])
                b = box(cx, cy, note, *anchor)
            self.cross_label.setAnchor(anchor)
            taken.append(b)
            texts.append(note)
        # the path's nodes in view are kept clear of labels, so the chosen path stays readable
        for h in self.path_hashes:
            x, y = self.tree.positions[h]
            if rect.contains(x, y):
                px, py = (x - rect.left()) * sx, (y - rect.top()) * sy
                taken.append(QRectF(px - 4, py - 4, 8, 8))
        for t, (label, y) in zip(self.group_labels, self.tree.groups):
            gx = max(0.0, rect.left() + LABEL_PAD_PX / sx)
            b = box(gx, y - 0.9, label, 0, 0.5)
            if b.top() < 0 <= b.bottom():  # the first group's title sits at the top edge: keep it in
                b.translate(0, -b.top())
            t.setPos(gx, rect.top() + b.center().y() / sy)
            ok = bool(fit_labels([b], bounds, taken, 1))
            t.setVisible(ok)
            if ok:
                texts.append(label)
        boxes, places = [], []
        remote = getattr(self.state, "remote", None) is not None
        x0, x1 = rect.left(), rect.right()
        t = self.tree
        runs = self._runs
        if len(runs):  # only the runs in view (arrays), longest first
            depth, length, ys = t.seg_depth[runs], t.seg_len[runs], t.seg_y[runs]
            end = depth + length - 1
            runs = runs[(end >= x0 - 1) & (depth <= x1 + 1) & (ys >= rect.top() - 1) & (ys <= rect.bottom() + 1)]
            runs = runs[:MAX_LABEL_TRIES]  # the longest in view; shorter ones would rarely win a place
        if remote and len(runs):
            self._decode_leaves(t.blocks[t.last_nodes()[runs[t.seg_children[runs] == 0]]])
        for s, depth, length, y, kids, last in zip(runs.tolist(), t.seg_depth[runs].tolist(), t.seg_len[runs].tolist(),
                                                   t.seg_y[runs].tolist(), t.seg_children[runs].tolist(),
                                                   t.last_nodes()[runs].tolist()):
            end = depth + length - 1
            text = f"{length:,} blocks" if length > 1 else "1 block"
            if not kids and remote:
                said = self._leaf_text.get(t.hashes[last])
                text += f" · …“{said[-32:]}”" if said else ""
            if kids:  # the tree goes on to the right: the count sits above the run
                x = (max(depth, x0) + min(end, x1)) / 2
                places.append((text, x, y, (0.5, 0.95)))
                boxes.append(box(x, y, text, 0.5, 0.95))
            else:
                places.append((text, end + 0.3, y, (0, 0.5)))
                boxes.append(box(end + 0.3, y, text, 0, 0.5))
        chosen = fit_labels(boxes, bounds, taken, MAX_LABELS)
        for item, i in zip(self.run_labels, chosen):
            text, x, y, anchor = places[i]
            item.setAnchor(anchor)
            item.setText(text)
            item.setPos(x, y)
            item.show()
            texts.append(text)
        for item in self.run_labels[len(chosen):]:
            item.hide()
        self.label_rects = taken
        self.label_texts = texts
        self.num_runs_labelled = len(chosen)

    def _draw_path(self, p: PoolProjection, rec: RequestRecord | None) -> None:
        pos = self.tree.positions
        self.path_hashes = []
        self.divergence_block = None
        if rec is None:
            for item in (self.path_hit, self.path_new, self.cross):
                item.setData([], [])
            self.cross_label.setText("")
            self.summary.setText(self._summary_text(None))
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
        self.summary.setText(self._summary_text(rec))

    def _summary_text(self, rec: RequestRecord | None) -> str:
        tree = self.tree
        scope = "on this request's path" if self.only_request and rec is not None else "cached"
        text = (f"{tree.num_nodes:,} {scope} blocks in {tree.num_segments:,} runs, "
                f"{len(tree.groups)} group{'s' if len(tree.groups) != 1 else ''}")
        if rec is not None:
            text += (f" · request {rec.request_id}: reused {rec.num_hit_blocks} of {len(rec.block_hashes)} "
                     f"full blocks {swatch(self.palette['cached'], '▬')}, computed the rest "
                     f"{swatch(self.palette['computed'], '▬')}")
        if self._query_text:
            if self.matches:
                text += (f" · {swatch(self.palette['warn'], '○')} match {self.match_index + 1} of "
                         f"{len(self.matches):,} for “{html.escape(self._query_text)}”")
            else:
                text += f" · no cached block matches “{html.escape(self._query_text)}”"
        if tree.num_segments > MAX_LABELS:
            text += " · labels show the longest runs that fit: zoom in for more"
        return text

    def runs_table(self) -> tuple[list[str], list[list[Any]]]:
        """Every drawn run as a table row (for the CSV export)."""
        p = self.state.projection
        rows = []
        for seg in self.tree.segments:
            first, last = seg.hashes[0], seg.hashes[-1]
            rows.append([seg.depth, seg.depth + len(seg.hashes) - 1, len(seg.hashes), first.hex(), last.hex(),
                         p.block_of_hash(first), p.block_of_hash(last), len(seg.children)])
        return (["first_position", "last_position", "num_blocks", "first_hash", "last_hash",
                 "first_block_id", "last_block_id", "num_branches"], rows)

    def _fill_request_box(self, p: PoolProjection) -> None:
        recent = getattr(p, "recent_request_ids", None)  # a columnar state: no list of every id
        wanted = [None] + (recent(40) if recent is not None else list(dict.fromkeys(reversed(p.order)))[:40])
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
