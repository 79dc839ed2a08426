"""The Compare window's two pools side by side: the block table of A and of B just after
the picked request, in the main block table's colours (its `compute_colors`, with the
flash of a scrubbed pool), the picked request's blocks outlined in each. A click on a
block picks the last request that held it (`sigRequestClicked(side, request id)`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.runtime.state import SCRUB_FLASH_EVENTS
from app.ui.block_grid import grid_image
from app.ui.colors import block_colors, legend_line, swatch
from app.views.pool.block_table_view import BlockTableView, cell_pixels, compute_colors, grid_shape, shown_pixels


class PoolGrid(QWidget):
    """One side's pool as a grid. `cell_colors` is the (num_blocks, 4) array drawn last;
    `outlined` the block ids of the picked request. `sigRequestClicked(request id)` after a
    click on a block some request held."""

    sigRequestClicked = Signal(str)

    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.cols = 1
        self.name = name
        self.colors = block_colors()
        self.cell_colors = np.zeros((0, 4), dtype=np.uint8)
        self.outlined: list[int] = []
        self.projection: Any = None
        self.caption = QLabel(name)
        self.caption.setTextFormat(Qt.TextFormat.RichText)
        self.caption.setWordWrap(True)
        self.glw = pg.GraphicsLayoutWidget()
        self.glw.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.glw.setMinimumHeight(80)
        self.vb = self.glw.addViewBox(lockAspect=True, invertY=True, enableMenu=False)
        self.vb.setMouseEnabled(x=False, y=False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.vb.addItem(self.image)
        self.outline = pg.ScatterPlotItem(symbol="s", size=1.0, pxMode=False, brush=None)
        self.vb.addItem(self.outline)
        self.glw.scene().sigMouseClicked.connect(self._clicked)
        self.vb.sigResized.connect(self._resized)  # the grid's shape follows the room it has
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(self.caption)
        col.addWidget(self.glw, 1)

    def apply_theme(self, name: str | None = None) -> None:
        self.colors = block_colors(name)
        self.glw.setBackground(self.colors["background"])
        self.outline.setPen(pg.mkPen(self.colors["selected"], width=2))
        if self.projection is not None:
            self._draw()

    def _resized(self, *_args: Any) -> None:
        if self.projection is not None:
            self._draw()

    def clear(self, why: str) -> None:
        self.projection = None
        self.cell_colors = np.zeros((0, 4), dtype=np.uint8)
        self.image.clear()
        self.outline.setData(x=[], y=[])
        self.caption.setText(f"<b>{self.name}</b> {why}")

    def show_pool(self, projection: Any, end_seq: int, request_id: str | None, head: str) -> None:
        """The pool `projection` (the state just after event `end_seq`), `request_id`'s blocks outlined."""
        self.projection = projection
        self._flash = end_seq - SCRUB_FLASH_EVENTS + 1  # as the main block table flashes a scrubbed pool
        self._request, self._head = request_id, head
        self._draw()

    def _draw(self) -> None:
        p = self.projection
        self.cell_colors = compute_colors(p, self.colors, self._flash)
        n = p.num_blocks
        w, h = self.vb.width(), self.vb.height()
        cols, rows = grid_shape(n, w / h if w > 1 and h > 1 else 1.6)
        self.cols = cols
        px = cell_pixels(n, shown_pixels(cols, rows, w, h))
        bg = self.colors["background"]
        background = np.array([bg.red(), bg.green(), bg.blue(), 255], dtype=np.uint8)
        self.image.setImage(grid_image(self.cell_colors, cols, rows, px, background),
                            autoLevels=False, levels=(0, 255))
        self.image.setRect(QRectF(0, 0, cols, rows))
        self.vb.setRange(QRectF(0, 0, cols, rows), padding=0.02)
        self.outlined = BlockTableView._request_blocks(p, _engine_id(p, self._request)) if self._request else []
        ids = np.array(self.outlined, dtype=np.int64)
        if len(ids):
            self.outline.setData(x=ids % cols + 0.5, y=ids // cols + 0.5)
        else:
            self.outline.setData(x=[], y=[])
        self.caption.setText(f"{self._head} · in use <b>{p.num_in_use:,}</b> · cached free "
                             f"<b>{p.num_cached_free:,}</b> · empty {p.num_empty:,} of {n:,} blocks × {p.block_size}")


    def request_of_block(self, block_id: int) -> str | None:
        """The request that last held `block_id` in the pool shown: one running with it,
        else the latest whose prompt's chain holds its hash (the id the engine used)."""
        p = self.projection
        if p is None or not 0 <= block_id < p.num_blocks:
            return None
        owners = p.owners(block_id)
        if owners:
            return owners[-1]
        h = p.hashes[block_id]
        if h is None:
            return None
        return next((r.request_id for r in reversed(p.request_records()) if h in r.block_hashes), None)

    def _clicked(self, ev: Any) -> None:
        if self.projection is None or not self.vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        pt = self.vb.mapSceneToView(ev.scenePos())
        if pt.x() < 0 or pt.y() < 0 or int(pt.x()) >= self.cols:
            return
        rid = self.request_of_block(int(pt.y()) * self.cols + int(pt.x()))
        if rid is not None:
            self.sigRequestClicked.emit(rid)


def _engine_id(p: Any, request_id: str) -> str:
    """The id the engine knew `request_id` by: itself, or "PART/id" (a demo that runs each
    part of its traffic on its own manager names its requests so)."""
    if request_id in p.requests or request_id in p.running:
        return request_id
    tail = "/" + request_id
    return next((rid for rid in p.requests if rid.endswith(tail)), request_id)


class PoolPair(QWidget):
    """A and B's pools side by side, with the block table's legend under them.
    `sigRequestClicked(side, request id)`: "a" or "b", the id as that side's rows name it."""

    sigRequestClicked = Signal(str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.a, self.b = PoolGrid("A"), PoolGrid("B")
        # a demo part's engine names its requests "PART/id"; the rows name them "id"
        self.a.sigRequestClicked.connect(lambda rid: self.sigRequestClicked.emit("a", rid.rsplit("/", 1)[-1]))
        self.b.sigRequestClicked.connect(lambda rid: self.sigRequestClicked.emit("b", rid.rsplit("/", 1)[-1]))
        self.legend = QLabel()
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.a)
        row.addWidget(self.b)
        col = QVBoxLayout(self)
        col.setContentsMargins(0, 0, 0, 0)
        col.addLayout(row, 1)
        col.addWidget(self.legend)

    def apply_theme(self, name: str | None = None) -> None:
        for g in (self.a, self.b):
            g.apply_theme(name)
        c = block_colors(name)
        entries = [("empty", "empty"), ("cached_old", "cached, free: evicted next"),
                   ("cached_new", "cached, free: freed last"), ("ref1", "in use, ref 1"),
                   ("ref2", "ref 2"), ("ref3", "ref 3+"), ("evicted", "just evicted")]
        self.legend.setText(legend_line([(swatch(c[k]), t) for k, t in entries]) +
                            "&nbsp;&nbsp;·&nbsp; the pool just after the picked request; its blocks outlined")

    def show_ends(self, run_a: Any, run_b: Any, heads: tuple[str, str]) -> None:
        """Both pools as they ended (sides without requests: two servers of a fleet)."""
        for grid, run, head in ((self.a, run_a, heads[0]), (self.b, run_b, heads[1])):
            if run.log is None or run.log.last_seq is None:
                grid.clear(f"· {run.no_log_reason or 'no pool kept for this run'}")
            else:
                grid.show_pool(run.log.live.copy(), run.log.last_seq, None, head)

    def show_request(self, run_a: Any, run_b: Any, row: dict[str, Any], heads: tuple[str, str]) -> None:
        for grid, run, rid, head in ((self.a, run_a, row["id_a"], heads[0]), (self.b, run_b, row["id_b"], heads[1])):
            if run.log is None:
                grid.clear(f"· {run.no_log_reason or 'no pool kept for this run'}")
                continue
            if rid is None or rid not in run.end_seqs:
                grid.clear("· this request is not on this side")
                continue
            seq = run.end_seqs[rid]
            grid.show_pool(run.log.state_at(seq), seq, rid, head)
