"""Timelines of the pool over event seq: blocks in use / cached free / empty, max ref count,
and evictions per step, with markers for refused requests and cache resets.

Curves come from `EventLog.series` (one sample per event) and are updated in place; a
cursor marks the event the views show, and clicking a plot scrubs there.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app import theme
from app.views.block_table_view import block_colors

NUM_BINS = 120
# Redrawing 100K-point curves costs tens of ms: while live, at most this often.
MIN_REDRAW_MS = 150


def eviction_bins(seq: np.ndarray, evicted_cum: np.ndarray, num_bins: int = NUM_BINS) -> tuple[np.ndarray, np.ndarray, float]:
    """Evictions per bin of seq: (bin centres, counts, bin width), from the cumulative count."""
    if len(seq) == 0:
        return np.zeros(0), np.zeros(0), 1.0
    lo, hi = float(seq[0]), float(seq[-1]) + 1.0
    bins = max(1, min(num_bins, len(seq)))
    edges = np.linspace(lo, hi, bins + 1)
    idx = np.searchsorted(seq, edges, side="left")  # samples before each edge
    cum = np.concatenate(([0], evicted_cum))
    counts = np.diff(cum[idx])
    width = (hi - lo) / bins
    return edges[:-1] + width / 2, counts.astype(float), width


class TimelineView(QWidget):
    """Three linked plots over event seq; reads `ctx.state.log.series`."""

    def __init__(self, ctx: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.state = ctx.state
        self.setObjectName("timeline_view")
        self._drawn = (-1, -1)
        self.title = QLabel()
        self.title.setObjectName("timeline_summary")
        self.glw = pg.GraphicsLayoutWidget()
        self.p_blocks = self.glw.addPlot(row=0, col=0)
        self.p_ref = self.glw.addPlot(row=1, col=0)
        self.p_evict = self.glw.addPlot(row=2, col=0)
        self.glw.ci.layout.setRowStretchFactor(0, 3)
        self.glw.ci.layout.setRowStretchFactor(1, 2)
        self.glw.ci.layout.setRowStretchFactor(2, 2)
        for p, label in ((self.p_blocks, "blocks"), (self.p_ref, "max ref count"), (self.p_evict, "evictions")):
            p.setLabel("left", label)
            p.showGrid(x=True, y=True, alpha=0.15)
            p.setMenuEnabled(False)
            p.setMouseEnabled(x=True, y=False)
            p.getAxis("left").setWidth(56)
            if p is not self.p_blocks:
                p.setXLink(self.p_blocks)
        self.p_evict.setLabel("bottom", "event seq")
        self.p_blocks.addLegend(offset=(-10, 2), colCount=5)

        self.c_total = self.p_blocks.plot(name="empty", fillLevel=0)
        self.c_cached = self.p_blocks.plot(name="cached, free", fillLevel=0)
        self.c_used = self.p_blocks.plot(name="in use", fillLevel=0)
        self.refusals = pg.ScatterPlotItem(symbol="t", size=11, name="refused")
        self.resets = pg.ScatterPlotItem(symbol="d", size=11, name="reset")
        self.p_blocks.addItem(self.refusals)
        self.p_blocks.addItem(self.resets)
        self.c_ref = self.p_ref.plot(stepMode=None)
        self.bars = pg.BarGraphItem(x=[], height=[], width=1.0)
        self.p_evict.addItem(self.bars)
        for curve in (self.c_total, self.c_cached, self.c_used, self.c_ref):
            curve.setClipToView(True)
            curve.setDownsampling(auto=True, method="peak")
        self.cursors = [pg.InfiniteLine(angle=90, movable=False) for _ in range(3)]
        for p, line in zip((self.p_blocks, self.p_ref, self.p_evict), self.cursors):
            p.addItem(line, ignoreBounds=True)
        self.glw.scene().sigMouseClicked.connect(self._on_click)
        self._throttle = QTimer(self)
        self._throttle.setSingleShot(True)
        self._throttle.timeout.connect(self.refresh)
        self._last_series_draw = 0.0

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.title)
        layout.addWidget(self.glw, 1)
        self.state.sigChanged.connect(self.refresh)
        self.state.sigReset.connect(self._on_reset)
        if hasattr(ctx, "sigThemeChanged"):
            ctx.sigThemeChanged.connect(self.apply_theme)
        self.apply_theme()

    def apply_theme(self, name: str | None = None) -> None:
        c = block_colors(name)
        p = theme.palette(name)
        self.glw.setBackground(p["panel"])

        def fill(col: Any) -> Any:
            q = pg.mkColor(col)
            q.setAlpha(170)
            return pg.mkBrush(q)

        self.c_total.setPen(pg.mkPen(c["empty"].lighter(140), width=1))
        self.c_total.setBrush(fill(c["empty"].lighter(120)))
        self.c_cached.setPen(pg.mkPen(c["cached_new"], width=1))
        self.c_cached.setBrush(fill(c["cached_new"]))
        self.c_used.setPen(pg.mkPen(c["ref1"], width=1))
        self.c_used.setBrush(fill(c["ref1"]))
        self.refusals.setBrush(pg.mkBrush(p["miss"]))
        self.refusals.setPen(pg.mkPen(None))
        self.resets.setBrush(pg.mkBrush(p["warn"]))
        self.resets.setPen(pg.mkPen(None))
        self.c_ref.setPen(pg.mkPen(c["ref3"], width=2))
        self.bars.setOpts(brush=pg.mkBrush(c["evicted"]), pen=pg.mkPen(None))
        for line in self.cursors:
            line.setPen(pg.mkPen(p["text"], width=1, style=Qt.PenStyle.DashLine))
        self._drawn = (-1, -1)
        self.refresh(force=True)

    def _on_reset(self) -> None:
        self._drawn = (-1, -1)
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        """Model to view: curves up to the newest event, cursor at the shown one."""
        n = len(self.state.log)
        key = (n, self.state.version)
        if key == self._drawn and not force:
            return
        if n != self._drawn[0] or force:
            wait_ms = MIN_REDRAW_MS - (time.monotonic() - self._last_series_draw) * 1000
            if wait_ms > 0 and not force and self._drawn[0] > 0:
                if not self._throttle.isActive():
                    self._throttle.start(int(wait_ms) + 1)
                return
            self._draw_series()
            self._last_series_draw = time.monotonic()
        self._drawn = key
        seq = self.state.current_seq
        for line in self.cursors:
            line.setVisible(seq is not None and not self.state.is_live)
            if seq is not None:
                line.setValue(seq)
        self._update_title()

    def _draw_series(self) -> None:
        s = self.state.log.series
        x = np.array(s.seq, dtype=float)
        used = np.array(s.in_use, dtype=float)
        cached = used + np.array(s.cached_free, dtype=float)
        total = cached + np.array(s.empty, dtype=float)
        self.c_total.setData(x, total)
        self.c_cached.setData(x, cached)
        self.c_used.setData(x, used)
        self.c_ref.setData(x, np.array(s.max_ref, dtype=float))
        top = float(total.max()) if len(total) else 1.0
        # headroom above the pool size keeps the legend off the curves
        self.p_blocks.setYRange(0, max(1.0, top) * 1.3, padding=0)
        ref_x = np.array(s.refusal_seqs, dtype=float)
        self.refusals.setData(x=ref_x, y=np.full(len(ref_x), top))
        reset_x = np.array(s.reset_seqs, dtype=float)
        self.resets.setData(x=reset_x, y=np.full(len(reset_x), top))
        centres, counts, width = eviction_bins(np.array(s.seq), np.array(s.evicted))
        self.eviction_counts = counts
        self.bars.setOpts(x=centres, height=counts, width=width * 0.9)
        self.p_evict.setLabel("left", f"evictions / {max(1, round(width)):,} ev")

    def _update_title(self) -> None:
        p = self.state.projection
        c = p.counters
        self.title.setText(
            f"in use {p.num_in_use:,} · cached free {p.num_cached_free:,} · empty {p.num_empty:,} · "
            f"max ref {p.max_ref_count} · evicted {c.num_evicted_blocks:,} · refused {c.num_refused_requests:,}"
            f" · resets {p.num_resets}")

    def _on_click(self, ev: Any) -> None:
        """View to model: a click on a plot scrubs to the nearest event at or before it."""
        if ev.button() != Qt.MouseButton.LeftButton or not self.state.log.seqs:
            return
        for p in (self.p_blocks, self.p_ref, self.p_evict):
            if p.vb.sceneBoundingRect().contains(ev.scenePos()):
                x = p.vb.mapSceneToView(ev.scenePos()).x()
                self.scrub_to_x(x)
                return

    def scrub_to_x(self, x: float) -> None:
        seqs = self.state.log.seqs
        i = max(0, self.state.log.count_upto(int(np.floor(x))) - 1)
        self.state.scrub_to(seqs[i])
