"""Metrics: hit rate over time, tokens reused vs computed per request, time to first token.

Hit rate and token counts come from the projection's request records (so they follow
scrubbing); times to first token come from `PoolState.record_timing`, called by whoever
ran the request (the conversation view), with the cold time when it was measured.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app import theme
from engine.projection import RequestRecord

MAX_BARS = 400  # the most recent requests drawn as bars; older ones stay in the hit-rate curve


def request_rows(records: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cached, computed, cumulative hit rate) per request that got a lookup, in start order."""
    looked = [r for r in records if r.miss is not None]
    cached = np.array([r.num_cached_tokens for r in looked], dtype=float)
    computed = np.array([r.num_computed_tokens for r in looked], dtype=float)
    prompt = np.cumsum(cached + computed)
    rate = np.divide(np.cumsum(cached), prompt, out=np.zeros_like(prompt), where=prompt > 0)
    return cached, computed, rate


class MetricsView(QWidget):
    """Three plots over requests: cumulative hit rate, reused/computed tokens, TTFT."""

    def __init__(self, ctx: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.state = ctx.state
        self.setObjectName("metrics_view")
        self._drawn_version = -1
        self.summary = QLabel()
        self.summary.setObjectName("metrics_summary")
        self.glw = pg.GraphicsLayoutWidget()
        self.p_rate = self.glw.addPlot(row=0, col=0)
        self.p_tokens = self.glw.addPlot(row=1, col=0)
        self.p_ttft = self.glw.addPlot(row=2, col=0)
        for p, label in ((self.p_rate, "hit rate %"), (self.p_tokens, "prompt tokens"), (self.p_ttft, "TTFT ms")):
            p.setLabel("left", label)
            p.showGrid(x=False, y=True, alpha=0.15)
            p.setMenuEnabled(False)
            p.getAxis("left").setWidth(56)
        self.p_tokens.setXLink(self.p_rate)
        self.p_rate.setYRange(0, 100, padding=0.02)
        self.p_ttft.setLabel("bottom", "request (in start order)")
        self.p_tokens.addLegend(offset=(-10, 2), colCount=2)
        self.p_ttft.addLegend(offset=(-10, 2), colCount=2)
        self.c_rate = self.p_rate.plot(name="cumulative hit rate")
        self.s_rate = pg.ScatterPlotItem(size=5, name="this request")
        self.p_rate.addItem(self.s_rate)
        self.b_cached = pg.BarGraphItem(x=[], height=[], width=0.8, name="reused (cached)")
        self.b_computed = pg.BarGraphItem(x=[], y0=[], height=[], width=0.8, name="computed")
        self.p_tokens.addItem(self.b_cached)
        self.p_tokens.addItem(self.b_computed)
        self.b_warm = pg.BarGraphItem(x=[], height=[], width=0.4, name="with reuse")
        self.b_cold = pg.BarGraphItem(x=[], height=[], width=0.4, name="without reuse")
        self.p_ttft.addItem(self.b_cold)
        self.p_ttft.addItem(self.b_warm)
        self.ttft_hint = pg.TextItem("no timings yet: chat with the model to measure time to first token",
                                     anchor=(0.5, 0.5))
        self.p_ttft.addItem(self.ttft_hint)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.summary)
        layout.addWidget(self.glw, 1)
        self.state.sigChanged.connect(self.refresh)
        if hasattr(ctx, "sigThemeChanged"):
            ctx.sigThemeChanged.connect(self.apply_theme)
        self.apply_theme()

    def apply_theme(self, name: str | None = None) -> None:
        p = theme.palette(name)
        self.glw.setBackground(p["panel"])
        self.c_rate.setPen(pg.mkPen(p["accent"], width=2))
        self.s_rate.setBrush(pg.mkBrush(p["text_dim"]))
        self.s_rate.setPen(pg.mkPen(None))
        self.b_cached.setOpts(brush=pg.mkBrush(p["cached"]), pen=pg.mkPen(None))
        self.b_computed.setOpts(brush=pg.mkBrush(p["computed"]), pen=pg.mkPen(None))
        self.b_warm.setOpts(brush=pg.mkBrush(p["cached"]), pen=pg.mkPen(None))
        self.b_cold.setOpts(brush=pg.mkBrush(p["computed"]), pen=pg.mkPen(None))
        self.ttft_hint.setColor(p["text_dim"])
        self._drawn_version = -1
        self.refresh()

    def refresh(self) -> None:
        if self.state.version == self._drawn_version:
            return
        self._drawn_version = self.state.version
        proj = self.state.projection
        records = [r for r in proj.request_records() if r.miss is not None]
        cached, computed, rate = request_rows(records)
        self.cached_tokens, self.computed_tokens, self.hit_rates = cached, computed, rate
        n = len(records)
        x = np.arange(n, dtype=float)
        self.c_rate.setData(x, 100 * rate)
        per = np.divide(cached, cached + computed, out=np.zeros_like(cached), where=(cached + computed) > 0)
        self.s_rate.setData(x=x, y=100 * per)
        recent = slice(max(0, n - MAX_BARS), n)
        self.b_cached.setOpts(x=x[recent], height=cached[recent], width=0.8)
        self.b_computed.setOpts(x=x[recent], y0=cached[recent], height=computed[recent], width=0.8)
        self._draw_timings(records)
        c = proj.counters
        self.summary.setText(
            f"{c.num_requests:,} requests · hit rate {100 * c.hit_rate:.1f}% · reused {c.num_cached_tokens:,} "
            f"of {c.num_prompt_tokens:,} prompt tokens · computed {c.num_computed_tokens:,} · "
            f"stored {c.num_stored_blocks:,} blocks · evicted {c.num_evicted_blocks:,} · refused {c.num_refused_requests:,}")

    def _draw_timings(self, records: list[RequestRecord]) -> None:
        timings = self.state.timings
        rows = [(i, timings[r.request_id]) for i, r in enumerate(records) if r.request_id in timings]
        self.ttft_hint.setVisible(not rows)
        if not rows:
            self.b_warm.setOpts(x=[], height=[])
            self.b_cold.setOpts(x=[], height=[])
            return
        xs = np.array([i for i, _ in rows], dtype=float)
        warm = np.array([t.ttft_ms for _, t in rows], dtype=float)
        cold_rows = [(i, t.cold_ttft_ms) for i, t in rows if t.cold_ttft_ms is not None]
        self.b_warm.setOpts(x=xs + 0.2, height=warm, width=0.4)
        self.b_cold.setOpts(x=np.array([i for i, _ in cold_rows], dtype=float) - 0.2,
                            height=np.array([c for _, c in cold_rows], dtype=float), width=0.4)
