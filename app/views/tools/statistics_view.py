"""The Statistics panel: reuse-distance and block-lifetime histograms, hit rate per tenant /
model / server, the top shared prefixes and the cache killers of the shown event log,
narrowed by the app's shared filter and timeline range; every table exports as CSV.

The numbers are `engine.analysis.statistics` over the events the shared filter keeps
(`app.runtime.selection.EventFilter.match_mask`: the typed filter, inside a timeline's
range); this view only draws them. A columnar log is counted whole, from its columns
(`engine.analysis.statistics_columnar`, the mask as a row mask): an opened trace's, and a
live one's (a chat's, an attach's) as it is when asked (`LiveColumnarLog.snapshot`); a
Python `EventLog`'s last MAX_EVENTS events go through `compute`, the reference (an attach's
93,079 events: 9.3 s there, 0.17 s from the columns). They are recomputed when asked (Refresh), when the
filter or range changes, and when the log changes while the panel is visible, at most
once per second, so a replay in progress never waits on it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox, QGridLayout, QHBoxLayout, QLabel, QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from app.runtime.selection import shared_filter
from app.ui import theme
from app.ui.export import export_button
from app.ui.filter_bar import FilterBar
from app.ui.tables import data_table, fill_table
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject

MIN_INTERVAL_S = 1.0
MAX_EVENTS = 500_000  # a Python EventLog's: about 15 s of work on the worker; a longer one counts its last events
GROUPS = ("tenant", "model", "server")


def _fill(table: QTableWidget, rows: list[tuple[Any, ...]]) -> None:
    """Fractions in the "hit rate" and "share" columns as percentages, text as it is."""
    names = [table.horizontalHeaderItem(j).text() for j in range(table.columnCount())]
    fill_table(table, rows, ["%1" if n in ("hit rate", "share") else "" for n in names])


def _edge_label(v: int) -> str:
    if v >= 1 << 20:
        return f"{v >> 20}M"
    return f"{v >> 10}k" if v >= 1024 else str(v)


class StatisticsView(PanelView):
    """`stats` is the last `engine.analysis.statistics.Statistics` drawn (None before any);
    `sigComputed(stats)` fires after each one was drawn."""

    sigComputed = Signal(object)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.setObjectName("statistics_view")
        self.stats: Any = None
        self._drawn_version = -1
        self._last_compute = 0.0
        self._busy = self._again = False
        self.shared = shared_filter(ctx)
        self._shared_key: tuple[Any, ...] | None = None
        self.filter_bar = FilterBar(ctx.settings, self, "tenant:bob or kind:evicted")
        self.filter_bar.sigFilterChanged.connect(self.shared.set_filter)
        self.shared.sigChanged.connect(self._on_shared)
        self.summary = QLabel("No events yet: run a chat, open a trace or attach to a server.")
        self.summary.setObjectName("statistics_summary")
        self.summary.setWordWrap(True)
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.refresh)
        self.plots = pg.GraphicsLayoutWidget()
        self.p_reuse = self.plots.addPlot(title="reuse distance (blocks)")
        self.p_life = self.plots.addPlot(title="block lifetime")
        self.b_reuse = pg.BarGraphItem(x=[], height=[], width=0.8)
        self.b_life = pg.BarGraphItem(x=[], height=[], width=0.8)
        self.p_reuse.addItem(self.b_reuse)
        self.p_life.addItem(self.b_life)
        for p in (self.p_reuse, self.p_life):
            p.setMouseEnabled(x=False, y=False)
            p.showGrid(x=False, y=True, alpha=0.15)
            p.setLabel("left", "count")
        self.group = QComboBox()
        self.group.addItems([f"hit rate per {g}" for g in GROUPS])
        self.group.currentIndexChanged.connect(lambda _i: self._draw_groups())
        self.t_groups = data_table(("group", "requests", "prompt tokens", "cached tokens", "hit rate"))
        self.t_prefixes = data_table(("blocks", "tokens", "requests", "tokens saved", "text", "last hash"))
        self.t_killers = data_table(("token position", "requests", "share", "text", "examples"))
        tables = {"reuse distance": lambda: self._csv_table("reuse_distance"),
                  "block lifetime": lambda: self._csv_table("block_lifetime"),
                  **{f"hit rate per {g}": (lambda g=g: self._csv_table(f"hit_rate_by_{g}")) for g in GROUPS},
                  "shared prefixes": lambda: self._csv_table("shared_prefixes"),
                  "cache killers": lambda: self._csv_table("cache_killers")}
        self.export = export_button(self, plots={"histograms": lambda: self.plots}, tables=tables)

        top = QHBoxLayout()
        top.addWidget(self.filter_bar, 1)
        top.addWidget(refresh, 0, Qt.AlignmentFlag.AlignTop)
        top.addWidget(self.export, 0, Qt.AlignmentFlag.AlignTop)
        grid = QGridLayout()
        grid.addWidget(self.group, 0, 0)
        grid.addWidget(QLabel("top shared prefixes (the longest chains most requests reuse)"), 0, 1)
        grid.addWidget(self.t_groups, 1, 0)
        grid.addWidget(self.t_prefixes, 1, 1)
        grid.addWidget(QLabel("cache killers (where requests first diverge from the cache)"), 2, 0, 1, 2)
        grid.addWidget(self.t_killers, 3, 0, 1, 2)
        grid.setColumnStretch(0, 2)
        grid.setColumnStretch(1, 3)
        col = QVBoxLayout(self)
        col.addLayout(top)
        col.addWidget(self.summary)
        col.addWidget(self.plots, 3)
        col.addLayout(grid, 4)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self.refresh)
        self.state.sigChanged.connect(self._schedule)
        self.apply_theme(theme.current_theme())

    # ---- computing
    def _schedule(self) -> None:
        if self.isVisible() and self.state.version != self._drawn_version and not self._timer.isActive():
            wait = max(0.0, MIN_INTERVAL_S - (time.monotonic() - self._last_compute))
            self._timer.start(int(wait * 1000))

    def showEvent(self, event: Any) -> None:
        super().showEvent(event)
        self._schedule()

    def _decode(self) -> Any:
        tok = getattr(self.ctx.runner, "tokenizer", None)
        if tok is None:
            return None
        return lambda ids: tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _on_shared(self) -> None:
        """The shared filter or range changed (here, in another view, or its match finished)."""
        flt = self.shared.filter
        if self.filter_bar.error is None and self.filter_bar.filter.text != flt.text:
            self.filter_bar.edit.blockSignals(True)
            self.filter_bar.edit.setText(flt.text)
            self.filter_bar.edit.blockSignals(False)
            self.filter_bar.filter = flt
        key = (flt.text, self.shared.range, self.shared.pending)
        if key == self._shared_key:
            return
        if self.isVisible() or self.stats is not None:
            self.refresh()
        else:
            self._drawn_version = -1  # computed when the pane is shown

    def refresh(self) -> None:
        """Recompute on the worker from the events of the log the shared filter keeps now
        (inside its range): all of them from an opened trace's columnar log, the last
        MAX_EVENTS of a live log."""
        shared = self.shared
        self._last_compute = time.monotonic()
        self._drawn_version = self.state.version
        self._shared_key = (shared.filter.text, shared.range, shared.pending)
        if shared.pending:  # a long log is matched on the worker; its answer calls back here
            self.filter_bar.count.setText("matching\u2026")
            return
        if self._busy:
            self._again = True
            return
        self._busy, self._again = True, False
        log = self.state.log
        if getattr(log, "columnar_log", False):
            # the whole log, from its columns: an opened trace's, or what a live one (a chat,
            # an attach, appended to while the worker reads) holds now (`snapshot`)
            if getattr(log, "live_log", False):
                log = log.snapshot()
            keep = shared.match_mask()[:len(log)].copy() if shared.active else None
            matched = len(log) if keep is None else int(keep.sum())
            if self.stats is None and len(log):  # (not "no events yet" while the first count runs)
                self.summary.setText(f"Counting {matched:,} events\u2026")
            self.ctx.worker.submit(_columnar_statistics_job, log, keep, matched, len(log), self._decode(),
                                   log.live.block_size, on_done=self._computed, on_error=self._failed)
            return
        events = log.events
        total = len(events)
        if shared.active:
            positions = shared.matching_positions()
            matched = len(positions)
            kept = [events[i] for i in positions[-MAX_EVENTS:]]
        else:
            matched = total
            # references only: the worker builds the dicts
            kept = events[max(0, total - MAX_EVENTS):]
        self.ctx.worker.submit(_statistics_job, kept, matched, total, self._decode(),
                               self.state.log.live.block_size, on_done=self._computed, on_error=self._failed)

    def _computed(self, result: tuple[Any, int, int]) -> None:
        self._busy = False
        self.stats, matched, total = result
        self.filter_bar.count.setText(f"{matched:,} of {total:,}" if self.shared.active else "")
        self._draw()
        what = self.shared.describe()
        text = f"{matched:,} of {total:,} events" + (f" ({what})" if what else "") + ": "
        if self.stats.num_events < matched:
            text = f"{text}the last {self.stats.num_events:,} of them counted: "
        self.summary.setText(text + self.summary.text())
        self.sigComputed.emit(self.stats)
        if self._again:
            self.refresh()

    def _failed(self, exc: BaseException) -> None:
        self._busy = False
        self.ctx.show_error(f"The statistics could not be computed: {exc}")

    # ---- drawing
    def _csv_table(self, name: str) -> Any:
        if self.stats is None:
            return (("no statistics yet",), [])
        return self.stats.tables()[name]

    def _draw(self) -> None:
        s = self.stats
        for item, plot, hist in ((self.b_reuse, self.p_reuse, s.reuse_distance),
                                 (self.b_life, self.p_life, s.lifetime)):
            n = len(hist.counts)
            item.setOpts(x=list(range(n + 1)), height=[*hist.counts, hist.num_unbounded], width=0.8)
            # edges are powers of two: 1024 and up as 1k, 2k, ... (k = 1024), every other
            # one when there are many, so a whole trace's two dozen bins stay legible
            step = 2 if n > 12 else 1
            ticks = [(i, _edge_label(lo)) for i, lo in enumerate(hist.edges[:-1]) if i % step == 0]
            ticks.append((n, "\u221e"))  # the unbounded bar, named in the title: wide text would not fit
            plot.getAxis("bottom").setTicks([ticks])
            plot.setXRange(-0.6, n + 0.6, padding=0)
            if any(hist.counts) or hist.num_unbounded:
                plot.enableAutoRange(axis="y")
            else:  # nothing to count (no full block): an empty axis from 0, not one around it
                plot.setYRange(0, 1, padding=0)
        self.p_reuse.setTitle("reuse distance (blocks; \u221e: first access)")
        self.p_life.setTitle(f"block lifetime ({s.lifetime.unit}; \u221e: still cached)")
        self._draw_groups()
        # text before the hash, and the hash short: the text is what a reader looks for
        # Chains that share a start differ at their end: show the end of long ones.
        _fill(self.t_prefixes, [(*r[:4], r[5] if len(r[5]) <= 90 else "\u2026" + r[5][-90:], r[4][:12])
                                for r in self.stats.tables()["shared_prefixes"][1]])
        _fill(self.t_killers, self.stats.tables()["cache_killers"][1])
        reuses = len(s.reuse_distance.values)
        evictions = len(s.lifetime.values)
        text = (f"{reuses:,} reuses of a block seen before, "
                f"{s.reuse_distance.num_unbounded:,} first accesses; {evictions:,} blocks evicted, "
                f"{s.lifetime.num_unbounded:,} still cached.")
        if s.notes:
            text += " " + " ".join(n[0].upper() + n[1:] + "." for n in s.notes)
        self.summary.setText(text)

    def _draw_groups(self) -> None:
        if self.stats is None:
            return
        name = f"hit_rate_by_{GROUPS[self.group.currentIndex()]}"
        header, rows = self.stats.tables()[name]
        self.t_groups.setHorizontalHeaderItem(0, QTableWidgetItem(header[0]))
        _fill(self.t_groups, rows)

    def apply_theme(self, name: str | None = None) -> None:
        p = theme.palette(name)
        self.plots.setBackground(p["panel"])
        self.b_reuse.setOpts(brush=pg.mkBrush(p["cached"]), pen=pg.mkPen(None))
        self.b_life.setOpts(brush=pg.mkBrush(p["evicted"]), pen=pg.mkPen(None))
        for plot in (self.p_reuse, self.p_life):
            plot.titleLabel.setAttr("color", p["text"])
            plot.titleLabel.setText(plot.titleLabel.text)
            for side in ("left", "bottom"):
                plot.getAxis(side).setTextPen(p["text_dim"])
                plot.getAxis(side).setPen(p["border"])
        self.filter_bar.message.setStyleSheet(f"color: {p['miss']};")

    def show_subject(self, subject: Subject) -> None:
        self.stats = None
        self._drawn_version = -1
        for t in (self.t_groups, self.t_prefixes, self.t_killers):
            t.setRowCount(0)


def _statistics_job(events: list[Any], matched: int, total: int, decode: Any, block_size: int) -> tuple[Any, int, int]:
    from engine.analysis.statistics import compute

    return compute([e.to_dict() for e in events], decode=decode, block_size=block_size), matched, total


def _columnar_statistics_job(log: Any, keep: Any, matched: int, total: int, decode: Any,
                             block_size: int) -> tuple[Any, int, int]:
    from engine.analysis.statistics_columnar import compute_columnar

    return compute_columnar(log, keep, decode=decode, block_size=block_size), matched, total
