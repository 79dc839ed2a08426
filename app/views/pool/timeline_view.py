"""Timelines of the pool over event seq: blocks in use / cached free / empty, max ref count,
and evictions per step, with markers for refused requests and cache resets.

Curves come from `EventLog.series` (one sample per event), reduced to the pixels the plot
has (each bin's lowest and highest sample, as a peak downsampling; again for the range
shown after a zoom), and are updated in place; a cursor marks the event the views show,
and clicking a plot scrubs there. The plot helpers
it shares with other views (`CountAxis`, `PlotStack`) live in `app.ui.plots`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.ui import theme
from app.ui.colors import block_colors, legend_line, swatch
from app.ui.export import export_button, header_row
from app.ui.plots import CURVE_BINS, PlotStack, peak_reduce
from app.ui.widgets import PanelView
from app.views.pool.remote_plots import RemoteTimeline, show_remote
from engine.core.columnar import Consecutive
from engine.core.columnar_log import LogSeries

if TYPE_CHECKING:
    from app.runtime.context import AppContext

NUM_BINS = 120
# Redrawing 100K-point curves costs tens of ms: while live, at most this often.
MIN_REDRAW_MS = 150


def eviction_bins(seq: np.ndarray, series: Any, num_bins: int = NUM_BINS) -> tuple[np.ndarray, np.ndarray, float]:
    """Evictions per bin of seq: (bin centres, counts, bin width), from the series' counts
    between the bins' edges (`evicted_between`: a live server's log counts them from its rows)."""
    if len(seq) == 0:
        return np.zeros(0), np.zeros(0), 1.0
    lo, hi = float(seq[0]), float(seq[-1]) + 1.0
    bins = max(1, min(num_bins, len(seq)))
    edges = np.linspace(lo, hi, bins + 1)
    idx = np.searchsorted(seq, edges, side="left")  # samples before each edge
    counts = np.asarray(series.evicted_between(idx), np.int64)
    width = (hi - lo) / bins
    return edges[:-1] + width / 2, counts.astype(float), width


def _values(column: Any) -> np.ndarray:
    """A series column as numpy: a columnar log's as it is (its seqs may be a `Consecutive`,
    which the reduction and the bins index and search as the array it stands for, not made
    whole); a live EventLog's typed array copied (a view would export its buffer, and the
    log could not grow it any more)."""
    return column if isinstance(column, (np.ndarray, Consecutive)) else np.array(column)


class TimelineView(PanelView):
    """Three linked plots over event seq; reads `ctx.state.log.series`."""

    # A remote pool's plots (cached blocks per tier, stores and removals per second) replace
    # the ref counts and evictions this dock is named for (`show_remote`).
    REMOTE_TITLE = "Cached blocks and rates"

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("timeline_view")
        self._drawn = (-1, -1)
        self.title = QLabel()
        self.title.setObjectName("timeline_summary")
        self.title.setTextFormat(Qt.TextFormat.RichText)
        self.title.setWordWrap(True)  # the summary doubles as the legend: it wraps, never widens the dock
        self.glw = PlotStack("event seq")
        h_blocks, self.p_blocks = self.glw.add(stretch=3)
        h_used, self.p_used = self.glw.add(stretch=2)
        h_ref, self.p_ref = self.glw.add(stretch=2)
        h_evict, self.p_evict = self.glw.add(stretch=2)
        self.headers = [h_blocks, h_used, h_ref, h_evict]
        self.plots = [self.p_blocks, self.p_used, self.p_ref, self.p_evict]
        # a short dock drops the max-ref row first (the summary has it), then the in-use row
        self.glw.priority = [0, 3, 1, 2]
        self.glw.show_rows([True, True, True, True])
        for p in self.plots:
            p.showGrid(x=True, y=True, alpha=0.15)
            p.setMouseEnabled(x=True, y=False)
        self.bin_width = 1
        self.eviction_counts = np.zeros(0)

        # The blocks row is scaled to the blocks that hold something, not to the pool: a pool
        # of 16K blocks would flatten a chat's few dozen to a line at zero. The pool's size
        # is a dashed line when it is in view, else a note in the corner.
        self.c_cached = self.p_blocks.plot(name="cached, free", fillLevel=0)
        self.c_used = self.p_blocks.plot(name="in use", fillLevel=0)
        self.pool_line = pg.InfiniteLine(angle=0, movable=False)
        self.p_blocks.addItem(self.pool_line, ignoreBounds=True)
        self.pool_label = pg.TextItem(anchor=(1, 0))
        self.p_blocks.addItem(self.pool_label, ignoreBounds=True)
        self.p_blocks.vb.sigRangeChanged.connect(self._place_pool_label)
        self.pool_size = 0
        self.c_in_use = self.p_used.plot(fillLevel=0)
        self.refusals = pg.ScatterPlotItem(symbol="t", size=11, name="refused")
        self.resets = pg.ScatterPlotItem(symbol="d", size=11, name="reset")
        self.p_blocks.addItem(self.refusals)
        self.p_blocks.addItem(self.resets)
        self.c_ref = self.p_ref.plot(stepMode=None)
        self.bars = pg.BarGraphItem(x=[], height=[], width=1.0)
        self.p_evict.addItem(self.bars)
        self.no_evictions = pg.TextItem("no evictions", anchor=(0, 0.5))
        self.p_evict.addItem(self.no_evictions, ignoreBounds=True)
        for curve in (self.c_cached, self.c_used, self.c_in_use, self.c_ref):
            curve.setClipToView(True)
        # x and the columns the curves' y are made of, every event (the log's own arrays:
        # the cached curve, in use + cached free, is made for each reduction, not kept)
        self._full: tuple[Any, ...] | None = None
        self._reduced_for: tuple[float, float] | None = None
        self.p_blocks.vb.sigXRangeChanged.connect(self._on_x_range)
        self.cursors = [pg.InfiniteLine(angle=90, movable=False) for _ in self.plots]
        for p, line in zip(self.plots, self.cursors):
            p.addItem(line, ignoreBounds=True)
        self.glw.scene().sigMouseClicked.connect(self._on_click)
        self._throttle = QTimer(self)
        self._throttle.setSingleShot(True)
        self._throttle.timeout.connect(self.refresh)
        self._last_series_draw = 0.0

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.export = export_button(self, plots={"Ref counts and evictions": lambda: self.glw},
                                    tables={"Pool over events": self.series_table})
        layout.addLayout(header_row(self.title, self.export))
        layout.addWidget(self.glw, 1)
        # A remote vLLM pool has no requests or ref counts: its own plots take this place.
        self.remote_view = RemoteTimeline(self.state)
        self.remote_view.hide()
        layout.addWidget(self.remote_view, 1)
        self.state.sigChanged.connect(self.refresh)
        self.state.sigReset.connect(self._on_reset)
        self.apply_theme()

    def apply_theme(self, name: str | None = None) -> None:
        self.remote_view.apply_theme(name)
        c = block_colors(name)
        p = theme.palette(name)
        self.colors, self.palette = c, p
        self.glw.setBackground(p["panel"])

        def fill(col: Any) -> Any:
            q = pg.mkColor(col)
            q.setAlpha(170)
            return pg.mkBrush(q)

        dark = (name or theme.current_theme()) == "dark"
        # empty blocks are drawn a shade off the background so the pool's size still shows
        self.empty_color = c["empty"].lighter(140) if dark else c["empty"].darker(125)
        self.pool_line.setPen(pg.mkPen(self.empty_color, width=1.5, style=Qt.PenStyle.DashLine))
        self.pool_label.setColor(p["text_dim"])
        self.c_in_use.setPen(pg.mkPen(c["ref1"], width=1))  # a 1.5 px antialiased zigzag cost 10x to stroke
        self.c_in_use.setBrush(fill(c["ref1"]))
        self.c_cached.setPen(pg.mkPen(c["cached_new"], width=1))
        self.c_cached.setBrush(fill(c["cached_new"]))
        self.c_used.setPen(pg.mkPen(c["ref1"], width=1))
        self.c_used.setBrush(fill(c["ref1"]))
        self.refusals.setBrush(pg.mkBrush(p["miss"]))
        self.refusals.setPen(pg.mkPen(None))
        self.resets.setBrush(pg.mkBrush(p["warn"]))
        self.resets.setPen(pg.mkPen(None))
        self.c_ref.setPen(pg.mkPen(c["ref3"], width=1))
        self.bars.setOpts(brush=pg.mkBrush(c["evicted"]), pen=pg.mkPen(None))
        self.no_evictions.setColor(p["text_dim"])
        for line in self.cursors:
            line.setPen(pg.mkPen(p["text"], width=1, style=Qt.PenStyle.DashLine))
        for plot in self.plots:
            for side in ("left", "bottom"):
                plot.getAxis(side).setTextPen(p["text_dim"])
                plot.getAxis(side).setPen(p["text_dim"])
        self._set_headers()
        self._drawn = (-1, -1)
        self.refresh(force=True)

    def _set_headers(self) -> None:
        dim = self.palette["text_dim"]
        per = "per event" if self.bin_width == 1 else f"per {self.bin_width:,} events"
        texts = ("blocks<br><span style='font-size:8pt'>holding data</span>", "in use",
                 "max ref count", f"evicted<br><span style='font-size:8pt'>{per}</span>")
        for header, text in zip(self.headers, texts):
            header.setText(text, color=dim, size="9pt")

    def _on_reset(self) -> None:
        # A new engine numbers its events from the start again: a zoom or pan into the
        # last log would leave the new one outside the view.
        self.glw.show_all()
        self._drawn = (-1, -1)
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        """Model to view: curves up to the newest event, cursor at the shown one."""
        if show_remote(self):
            return
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
        # integers as the log keeps them: only the reduced curves become floats
        x = _values(s.seq)
        used = _values(s.in_use)
        cached_free = _values(s.cached_free)
        max_ref = _values(s.max_ref)
        if isinstance(s, LogSeries):
            # a finished log's series, which does not grow: read again at each reduction (it
            # keeps some as their changes and makes them whole when read), not held whole here
            self._full = (x, s)
        else:
            self._full = (x, (cached_free, used, max_ref))
        if not len(x):
            # nothing to range over (a usage log, a fresh engine): an empty axis from 0, not
            # the last log's, and the auto range still on for the events to come
            self.glw.set_x_range(0.0, 1.0)
            self.glw.show_all()
        self._set_curves(float(x[0]) if len(x) else 0.0, float(x[-1]) if len(x) else 0.0,
                         (cached_free, used, max_ref))
        self.pool_size = self.state.projection.num_blocks
        held = float((used + cached_free).max()) if len(x) else 0.0
        # 0-based counts scaled to the data; a little room on top for the markers. The pool
        # line joins the view only when it is near the data (else it would flatten it again).
        top = max(1.0, held)
        if self.pool_size and self.pool_size <= held * 1.25:
            top = float(self.pool_size)
        self.blocks_top = top * 1.1
        self.p_blocks.setYRange(0, self.blocks_top, padding=0)
        self.pool_line.setValue(self.pool_size)
        self.pool_line.setVisible(0 < self.pool_size <= self.blocks_top)
        self.pool_label.setText(f"pool {self.pool_size:,} blocks" if self.pool_size else "")
        self._place_pool_label()
        self.p_used.setYRange(0, max(1.0, float(used.max()) if len(used) else 0.0) * 1.15, padding=0)
        ref_x = np.array(s.refusal_seqs, dtype=float)
        self.refusals.setData(x=ref_x, y=np.full(len(ref_x), top * 1.04))
        reset_x = np.array(s.reset_seqs, dtype=float)
        self.resets.setData(x=reset_x, y=np.full(len(reset_x), top * 1.04))
        self.p_ref.setYRange(0, max(1.0, float(max_ref.max()) if len(max_ref) else 0.0) * 1.15, padding=0)
        centres, counts, width = eviction_bins(x, s)
        self.eviction_counts = counts
        self.bars.setOpts(x=centres, height=counts, width=width * 0.9)
        most = float(counts.max()) if len(counts) else 0.0
        self.p_evict.setYRange(0, max(1.0, most) * 1.1, padding=0)
        self.no_evictions.setVisible(most == 0)
        self.no_evictions.setPos(float(x[0]) if len(x) else 0.0, 0.5)
        bin_width = max(1, round(width))
        if bin_width != self.bin_width:
            self.bin_width = bin_width
            self._set_headers()

    def _set_curves(self, lo: float, hi: float, read: tuple[Any, Any, Any] | None = None) -> None:
        """The curves' data: the whole series reduced to the bins of [lo, hi] (`read`: the
        counts, as the draw has just read them)."""
        if self._full is None:
            return
        x, counts = self._full
        if read is None:
            read = counts if isinstance(counts, tuple) else (
                _values(counts.cached_free), _values(counts.in_use), _values(counts.max_ref))
        cached_free, used, max_ref = read
        self._reduced_for = (lo, hi)
        xs, ys = peak_reduce(x, used + cached_free, lo, hi)
        self.c_cached.setData(xs.astype(float), ys.astype(float))
        xs, ys = (a.astype(float) for a in peak_reduce(x, used, lo, hi))
        self.c_used.setData(xs, ys)
        self.c_in_use.setData(xs, ys)
        xs, ys = peak_reduce(x, max_ref, lo, hi)
        self.c_ref.setData(xs.astype(float), ys.astype(float))

    def _on_x_range(self, _vb: Any, rng: Any) -> None:
        """A zoom or pan: reduce again for the range now shown (when it is a part of the log)."""
        if self._full is None or len(self._full[0]) <= 2 * CURVE_BINS + 2:
            return
        lo, hi = float(rng[0]), float(rng[1])
        x = self._full[0]
        lo, hi = max(lo, float(x[0])), min(hi, float(x[-1]))
        old = self._reduced_for
        if old is not None and abs((hi - lo) - (old[1] - old[0])) <= 0.25 * (old[1] - old[0]) \
                and old[0] <= lo and hi <= old[1]:
            return  # still inside what was reduced, at about the same scale
        width = max(hi - lo, 1.0)
        self._set_curves(lo - width / 2, hi + width / 2)  # some room to pan before the next

    def series_table(self) -> tuple[list[str], Any]:
        """One row per event: the counts the plots draw (for the CSV export)."""
        s = self.state.log.series
        return (["seq", "in_use", "cached_free", "empty", "max_ref", "evicted_so_far"],
                zip(s.seq, s.in_use, s.cached_free, s.empty, s.max_ref, s.evicted))

    def _place_pool_label(self, *_: Any) -> None:
        (x0, x1), (y0, y1) = self.p_blocks.vb.viewRange()
        self.pool_label.setPos(x1, y1)

    def _update_title(self) -> None:
        p = self.state.projection
        c = p.counters
        col, pal = self.colors, self.palette
        self.title.setText(legend_line([
            (swatch(col["ref1"]), f"in use <b>{p.num_in_use:,}</b>"),
            (swatch(col["cached_new"]), f"cached free <b>{p.num_cached_free:,}</b>"),
            (swatch(self.empty_color), f"empty <b>{p.num_empty:,}</b>"),
            (swatch(col["ref3"], "▬"), f"max ref <b>{p.max_ref_count}</b>"),
            (swatch(col["evicted"]), f"evicted <b>{c.num_evicted_blocks:,}</b>"),
            (swatch(pal["miss"], "▼"), f"refused <b>{c.num_refused_requests:,}</b>"),
            (swatch(pal["warn"], "◆"), f"resets <b>{p.num_resets}</b>")]))

    def _on_click(self, ev: Any) -> None:
        """View to model: a click on a plot scrubs to the nearest event at or before it."""
        if ev.button() != Qt.MouseButton.LeftButton or not len(self.state.log.seqs):
            return
        for p in self.plots:
            if p.vb.sceneBoundingRect().contains(ev.scenePos()):
                x = p.vb.mapSceneToView(ev.scenePos()).x()
                self.scrub_to_x(x)
                return

    def scrub_to_x(self, x: float) -> None:
        seqs = self.state.log.seqs
        i = max(0, self.state.log.count_upto(int(np.floor(x))) - 1)
        self.state.scrub_to(int(seqs[i]))
