"""Metrics: hit rate over time, tokens reused vs computed per request, time to first token.

Hit rate and token counts come from the projection's request records (so they follow
scrubbing); times to first token come from `PoolState.record_timing`, called by whoever
ran the request (the conversation view), with the cold time when it was measured.

The x axis is the request, and a range selected on it (R, or Shift+drag) selects the
events of those requests: from the first one's start to the last one's finish (or the end
of the log while it runs), through the shared filter, as the main timeline's range does. A
range set elsewhere shows on the request axis: an event at x = i - 0.5 + f, where request i
started and f is how far the event is towards the next request's start.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.ui import theme
from app.ui.export import export_button, header_row
from app.ui.colors import legend_line, swatch
from app.ui.plots import PlotStack
from app.views.pool.remote_plots import RemoteMetrics, show_remote
from engine.core.projection import RequestRecord
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext

MAX_BARS = 400  # the most recent requests drawn as bars; older ones stay in the hit-rate curve
# The most recent requests drawn as dots (a scatter item costs microseconds per point to
# set, and the plot shows the last MAX_BARS); the curve still runs over every request.
MAX_DOTS = 20_000


def request_rows(records: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cached, computed, cumulative hit rate) per request that got a lookup, in start order."""
    looked = [r for r in records if r.miss is not None]
    cached = np.array([r.num_cached_tokens for r in looked], dtype=float)
    computed = np.array([r.num_computed_tokens for r in looked], dtype=float)
    return cached, computed, _cumulative_rate(cached, computed)


def _cumulative_rate(cached: np.ndarray, computed: np.ndarray) -> np.ndarray:
    prompt = np.cumsum(cached + computed)
    return np.divide(np.cumsum(cached), prompt, out=np.zeros_like(prompt), where=prompt > 0)


class MetricsView(PanelView):
    """Three plots over requests: cumulative hit rate, reused/computed tokens, TTFT."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("metrics_view")
        self._drawn_version = -1
        self.summary = QLabel()
        self.summary.setObjectName("metrics_summary")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setWordWrap(True)  # the summary doubles as the legend: it wraps, never widens the dock
        self.glw = PlotStack("request (in start order)", header_width=92)  # ticks name request ids
        # (state version, log, starts, ends): each plotted request's first and last event seq
        self._spans: tuple[int, Any, np.ndarray, np.ndarray] | None = None
        self._finishes: tuple[Any, int, dict[str, list[int]]] | None = None  # (log, n, id -> finish seqs)
        self.glw.map_x(self.seqs_of_requests, self.x_of_seqs)
        h_rate, self.p_rate = self.glw.add(stretch=2)
        h_tokens, self.p_tokens = self.glw.add(stretch=3)
        h_ttft, self.p_ttft = self.glw.add(stretch=3)
        self.headers = [h_rate, h_tokens, h_ttft]
        for p in (self.p_rate, self.p_tokens, self.p_ttft):
            p.showGrid(x=False, y=True, alpha=0.15)
            p.setMouseEnabled(x=True, y=False)
        self.p_rate.setYRange(-6, 106, padding=0)  # the 0 % and 100 % dots stay whole
        self.p_ttft.setYRange(0, 1, padding=0)
        self.c_rate = self.p_rate.plot(name="cumulative hit rate")
        self.c_rate.setClipToView(True)  # a million requests: only the ones in view are stroked
        self.c_rate.setDownsampling(auto=True, method="peak")
        self.s_rate = pg.ScatterPlotItem(size=5, name="this request")
        self.p_rate.addItem(self.s_rate)
        # each plotted request's reused and computed tokens, in the plots' order (its own hit
        # rate and the running one are made from them when read: a float each kept 2 x 8 B a
        # request for a dot layer that draws a few hundred and a curve that keeps its own)
        self.cached_tokens = self.computed_tokens = np.zeros(0)
        self._dotted: tuple[int, int] | None = None  # the requests (first, last) the dots cover
        self.p_rate.vb.sigXRangeChanged.connect(lambda *_: self._place_dots())
        self.b_cached = pg.BarGraphItem(x=[], height=[], width=0.8, name="reused (cached)")
        self.b_computed = pg.BarGraphItem(x=[], y0=[], height=[], width=0.8, name="computed")
        self.p_tokens.addItem(self.b_cached)
        self.p_tokens.addItem(self.b_computed)
        self.b_warm = pg.BarGraphItem(x=[], height=[], width=0.4, name="with reuse")
        self.b_cold = pg.BarGraphItem(x=[], height=[], width=0.4, name="without reuse")
        self.p_ttft.addItem(self.b_cold)
        self.p_ttft.addItem(self.b_warm)
        self.ttft_hint = pg.TextItem("no timings yet: chat with the model to measure them", anchor=(0.5, 0.5))
        self.p_ttft.addItem(self.ttft_hint, ignoreBounds=True)
        self.p_ttft.vb.sigXRangeChanged.connect(self._place_hint)
        self._has_timings = False
        self._framed = -1  # the number of requests the x range was last set for
        self._fit_rows()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        self.export = export_button(self, plots={"Metrics": lambda: self.glw},
                                    tables={"Requests": self.requests_table})
        layout.addLayout(header_row(self.summary, self.export))
        layout.addWidget(self.glw, 1)
        # A remote vLLM pool has no requests or ref counts: its own plots take this place.
        self.remote_view = RemoteMetrics(self.state)
        self.remote_view.hide()
        layout.addWidget(self.remote_view, 1)
        self.state.sigReset.connect(self._reframe)
        self.state.sigChanged.connect(self.refresh)
        self.apply_theme()

    def _reframe(self) -> None:
        """A new engine or log: its latest requests come into view at the next draw."""
        self._framed = -1

    def apply_theme(self, name: str | None = None) -> None:
        self.remote_view.apply_theme(name)
        p = theme.palette(name)
        self.palette = p
        self.glw.setBackground(p["panel"])
        self.c_rate.setPen(pg.mkPen(p["accent"], width=2))
        self.s_rate.setBrush(pg.mkBrush(p["text_dim"]))
        self.s_rate.setPen(pg.mkPen(None))
        self.b_cached.setOpts(brush=pg.mkBrush(p["cached"]), pen=pg.mkPen(None))
        self.b_computed.setOpts(brush=pg.mkBrush(p["computed"]), pen=pg.mkPen(None))
        self.b_warm.setOpts(brush=pg.mkBrush(p["cached"]), pen=pg.mkPen(None))
        self.b_cold.setOpts(brush=pg.mkBrush(p["computed"]), pen=pg.mkPen(None))
        self.ttft_hint.setColor(p["text_dim"])
        for plot in (self.p_rate, self.p_tokens, self.p_ttft):
            for side in ("left", "bottom"):
                plot.getAxis(side).setTextPen(p["text_dim"])
                plot.getAxis(side).setPen(p["text_dim"])
        small = "<span style='font-size:8pt'>"
        texts = (f"hit rate %<br>{small}{swatch(p['accent'], '▬')} so far&nbsp; ● each</span>",
                 "prompt tokens",
                 f"TTFT ms<br>{small}{swatch(p['cached'])} with&nbsp; {swatch(p['computed'])} without</span>")
        for header, text in zip(self.headers, texts):
            header.setText(text, color=p["text_dim"], size="9pt")
        self._drawn_version = -1
        self.refresh()

    def _fit_rows(self) -> None:
        # Without timings (a trace) the TTFT row only holds a hint: it steps out first.
        self.glw.priority = [1, 2, 0] if self._has_timings else [1, 0, 2]
        self.glw.shown = []
        self.glw.fit()

    def _place_hint(self) -> None:
        (x0, x1), _ = self.p_ttft.vb.viewRange()
        self.ttft_hint.setPos((x0 + x1) / 2, 0.5)

    def refresh(self) -> None:
        if show_remote(self):
            return
        if self.state.version == self._drawn_version:
            return
        self._drawn_version = self.state.version
        proj = self.state.projection
        columns = getattr(proj, "request_columns", None)
        if columns is not None:  # a columnar state: the request rows as arrays, no record each
            names, cached, computed = columns()
            rate = _cumulative_rate(cached, computed)
        else:
            records = [r for r in proj.request_records() if r.miss is not None]
            cached, computed, rate = request_rows(records)
            names = [r.request_id for r in records]
        self.cached_tokens, self.computed_tokens = cached, computed
        n = len(names)
        x = np.arange(1, n + 1, dtype=float)  # requests in start order, labelled by their ids
        for plot in (self.p_rate, self.p_tokens, self.p_ttft):
            axis = plot.getAxis("bottom")
            if axis.names != names:
                axis.names = names
                axis.picture = None  # pyqtgraph caches the drawn ticks
                axis.update()
        self.c_rate.setData(x, 100 * rate)
        recent = slice(max(0, n - MAX_BARS), n)
        self.b_cached.setOpts(x=x[recent], height=cached[recent], width=0.8)
        self.b_computed.setOpts(x=x[recent], y0=cached[recent], height=computed[recent], width=0.8)
        top = float((cached + computed)[recent].max()) if n else 1.0
        self.p_tokens.setYRange(0, max(1.0, top) * 1.05, padding=0)
        if n != self._framed:
            # new requests (or a scrub) bring the latest into view; a redraw of the same
            # requests (a theme change) keeps the user's zoom and the range shown in it
            self._framed = n
            self.p_rate.setXRange(max(0.5, n - MAX_BARS + 0.5), max(1.5, n + 0.5), padding=0)
        self._place_dots(force=True)
        self._draw_timings(names)
        c = proj.counters
        p = self.palette
        self.summary.setText(legend_line([
            ("", f"<b>{c.num_requests:,}</b> requests"),
            (swatch(p["accent"], "▬"), f"hit rate <b>{100 * c.hit_rate:.1f}%</b>"),
            (swatch(p["cached"]), f"reused <b>{c.num_cached_tokens:,}</b> of {c.num_prompt_tokens:,} prompt tokens"),
            (swatch(p["computed"]), f"computed <b>{c.num_computed_tokens:,}</b>"),
            ("", f"stored {c.num_stored_blocks:,} blocks"),
            ("", f"evicted {c.num_evicted_blocks:,}"),
            ("", f"refused {c.num_refused_requests:,}")]))

    def _place_dots(self, force: bool = False) -> None:
        """Each request's own hit rate as a dot, for the requests in view and a view's width
        either side (of the last MAX_DOTS): a scatter keeps ~100 bytes a point, 1.2 MB for
        the Mooncake trace's 12K requests drawn whole; a pan within them sets nothing."""
        n = len(self.cached_tokens)
        (x0, x1), _ = self.p_rate.vb.viewRange()
        lo, hi = max(1, math.floor(x0)), min(n, math.ceil(x1))
        if not force and self._dotted is not None and self._dotted[0] <= lo and hi <= self._dotted[1]:
            return
        width = max(0, hi - lo + 1)
        first, last = max(1, lo - width), min(n, hi + width)
        self._dotted = (first, last)
        first = max(first, n - MAX_DOTS + 1)
        if first > last:
            self.s_rate.setData(x=[], y=[])
            return
        cached, computed = self.cached_tokens[first - 1:last], self.computed_tokens[first - 1:last]
        prompt = cached + computed
        per = np.divide(cached, prompt, out=np.zeros_like(cached), where=prompt > 0)  # each request's own
        self.s_rate.setData(x=np.arange(first, last + 1, dtype=float), y=100 * per)

    @property
    def hit_rates(self) -> np.ndarray:
        """The running hit rate after each plotted request (what the curve draws, in 0..1)."""
        return _cumulative_rate(self.cached_tokens, self.computed_tokens)

    # ------------------------------------------------------------------ the x axis as event seqs
    def request_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """First and last event seq of each request the plots show, in their order: its
        started event, and its finished event anywhere in the log (a scrubbed state shows a
        request whose finish comes later), or the log's last event while it has none."""
        state = self.state
        if self._spans is not None and self._spans[0] == state.version and self._spans[1] is state.log:
            return self._spans[2], self._spans[3]
        log, proj = state.log, state.projection
        last = -1 if log.last_seq is None else int(log.last_seq)
        if getattr(log, "columnar_log", False):
            # the request index's rows, no record per request (a trace of a million)
            occ = proj.looked_up()
            started, _, finished = log.request_index()
            seq, num_rows = log.columnar.col("seq"), log.columnar.num_rows
            starts = seq[started[occ]].astype(np.int64)
            done = finished[occ]
            ends = np.where(done < num_rows, seq[np.minimum(done, max(0, num_rows - 1))], last).astype(np.int64)
        else:
            records = [r for r in proj.request_records() if r.miss is not None]
            finishes = self._finish_seqs()
            starts = np.fromiter((r.started_seq for r in records), dtype=np.int64, count=len(records))
            ends = np.empty(len(records), dtype=np.int64)
            for i, r in enumerate(records):
                after = finishes.get(r.request_id, ())
                at = bisect.bisect_left(after, r.started_seq)
                ends[i] = after[at] if at < len(after) else last
        self._spans = (state.version, log, starts, ends)
        return starts, ends

    def _finish_seqs(self) -> dict[str, list[int]]:
        """The seqs of each request id's finished events in a Python event log (built once
        per length of the log; a reused id finishes more than once)."""
        log = self.state.log
        if self._finishes is None or self._finishes[0] is not log or self._finishes[1] != len(log):
            out: dict[str, list[int]] = {}
            for e in log.events:
                if e.kind == "request_finished":
                    out.setdefault(e.request_id, []).append(int(e.seq))
            self._finishes = (log, len(log), out)
        return self._finishes[2]

    def seqs_of_requests(self, lo: float, hi: float) -> tuple[int, int] | None:
        """The (first, last) event seq of the requests whose x (1, 2, ...) is in [lo, hi]:
        the first one's start to the latest finish among them; None if no request is."""
        starts, ends = self.request_spans()
        first, last = max(1, math.ceil(lo)), min(len(starts), math.floor(hi))
        if first > last:
            return None
        return int(starts[first - 1:last].min()), int(ends[first - 1:last].max())

    def x_of_seqs(self, seqs: np.ndarray) -> np.ndarray:
        """The x of each event seq: in the slot of the request started last before it, from
        i - 0.5 at that request's start towards i + 0.5 at the next one's (or the log's end)."""
        starts, _ = self.request_spans()
        seqs = np.asarray(seqs, dtype=np.int64)
        n = len(starts)
        if not n:
            return np.zeros(len(seqs))
        begin = np.maximum.accumulate(starts)  # a reused id keeps its first place: not sorted
        last = self.state.log.last_seq
        nxt = np.append(begin[1:], max(int(begin[-1]), -1 if last is None else int(last)) + 1)
        i = np.searchsorted(begin, seqs, side="right") - 1
        before = i < 0  # an event before the first request: the left edge of the first slot
        i = np.clip(i, 0, n - 1)
        width = np.maximum(nxt[i] - begin[i], 1)
        frac = np.clip((seqs - begin[i]) / width, 0.0, 1.0)
        return np.where(before, 0.5, i + 0.5 + frac)

    def requests_table(self) -> tuple[list[str], list[list[Any]]]:
        """One row per request with a lookup, as the plots number them (for the CSV export)."""
        records = [r for r in self.state.projection.request_records() if r.miss is not None]
        _, _, rate = request_rows(records)
        rows = []
        for i, (r, so_far) in enumerate(zip(records, rate)):
            t = self.state.timings.get(r.request_id)
            rows.append([i + 1, r.request_id, r.num_prompt_tokens, r.num_cached_tokens, r.num_computed_tokens,
                         round(float(so_far), 6), r.miss.reason if r.miss else "",
                         "" if t is None else t.ttft_ms, "" if t is None or t.cold_ttft_ms is None else t.cold_ttft_ms])
        return (["request", "request_id", "prompt_tokens", "cached_tokens", "computed_tokens", "hit_rate_so_far",
                 "miss_reason", "ttft_ms", "cold_ttft_ms"], rows)

    def _draw_timings(self, names: Any) -> None:
        """TTFT bars of the requests (`names`: their ids, in the plots' order) that have one."""
        timings = self.state.timings
        rows = [(i + 1, timings[rid]) for i, rid in enumerate(names) if rid in timings] if timings else []
        self.ttft_hint.setVisible(not rows)
        if bool(rows) != self._has_timings:
            self._has_timings = bool(rows)
            self._fit_rows()
        if not rows:
            self.b_warm.setOpts(x=[], height=[])
            self.b_cold.setOpts(x=[], height=[])
            self.p_ttft.setYRange(0, 1, padding=0)
            self._place_hint()
            return
        xs = np.array([i for i, _ in rows], dtype=float)
        warm = np.array([t.ttft_ms for _, t in rows], dtype=float)
        cold_rows = [(i, t.cold_ttft_ms) for i, t in rows if t.cold_ttft_ms is not None]
        cold = np.array([c for _, c in cold_rows], dtype=float)
        self.b_warm.setOpts(x=xs + 0.2, height=warm, width=0.4)
        self.b_cold.setOpts(x=np.array([i for i, _ in cold_rows], dtype=float) - 0.2, height=cold, width=0.4)
        top = max(float(warm.max()), float(cold.max()) if len(cold) else 0.0, 1.0)
        self.p_ttft.setYRange(0, top * 1.05, padding=0)
