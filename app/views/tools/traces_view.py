"""The Traces panel: a kv-cache-tester conversation (or a folder of them) as the engine
served it, and a usage log's observed caching beside the prediction.

For kv-cache-tester traces: the published Same-Model% and Cumulative% per conversation,
the blocks the engine held and its hit rate, and one row per request (stream, sub-agent,
model, blocks held) with a filter and a colour per model. For usage logs: per request the
observed and predicted cached tokens, the difference, and each unexpected miss explained.
The numbers are `engine.analysis.weka` and `engine.analysis.usage`; nothing is computed here.
Another subject (a demo, a session, a token trace) clears what the last one showed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QComboBox, QHBoxLayout, QLabel, QSizePolicy, QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from app.ui import theme
from app.ui.export import export_button, model_table
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject

INTRO = "Open a kv-cache-tester trace, a folder of them, or a usage log."
LEGEND_MARGIN_PX = 8  # the legend keeps this far inside the plot's right edge

TRACE_COLUMNS = ("trace", "requests", "sub-agent", "Same-Model%", "Cumulative%", "held%", "hit rate%", "models")
WEKA_COLUMNS = ("#", "t (s)", "model", "stream", "prompt blocks", "held", "hit%", "reason")
USAGE_COLUMNS = ("id", "prompt", "cached", "predicted", "difference", "cause", "model")
MAX_ROWS = 5000
# One colour per model, from the theme's categorical roles (the views' block colours).
_MODEL_ROLES = ("generated", "computed", "cached", "partial", "warn", "accent")


def model_colours(models: list[str], name: str | None = None) -> dict[str, QColor]:
    p = theme.palette(name)
    roles = [r for r in _MODEL_ROLES if r in p] or ["text"]
    return {m: QColor(p[roles[i % len(roles)]]) for i, m in enumerate(models)}


def _short_model(model: str) -> str:
    return model.removeprefix("claude-")


class TracesView(PanelView):
    """`show_weka(summary)` and `show_usage(result)` draw; `sigFilterChanged(model)` says
    which model the request table shows ("" for all)."""

    sigFilterChanged = Signal(str)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.weka: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.heading = QLabel(INTRO)
        self.heading.setWordWrap(True)
        self.heading.setTextFormat(Qt.TextFormat.RichText)
        self.heading.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.note = QLabel("")
        self.note.setWordWrap(True)
        self.note.setObjectName("tracesNote")
        self.note.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.model_filter = QComboBox()
        self.model_filter.addItem("every model", "")
        self.model_filter.currentIndexChanged.connect(self._filter_changed)
        self.summary = self._table(TRACE_COLUMNS)
        self.summary.setMaximumHeight(150)
        self.rows = self._table(WEKA_COLUMNS)
        self.plot = pg.PlotWidget()
        self.plot.setLabel("bottom", "request")
        self.plot.setLabel("left", "blocks held %")
        self.legend = self.plot.addLegend(offset=(10, -10), colCount=3)  # bottom left, below the ~100% points
        self._legend_columns = 1
        # The legend is as wide as its labels: re-fit its columns whenever the plot's room changes.
        self.plot.plotItem.vb.sigResized.connect(self._fit_legend)
        self._scatter: dict[str, pg.ScatterPlotItem] = {}
        # Created once; a usage log shows them, a kv-cache-tester trace empties them.
        self._lines = {k: self.plot.plot([], []) for k in ("observed", "predicted")}
        self._line_labels = {"observed": "observed cached", "predicted": "predicted cached"}
        bar = QHBoxLayout()
        bar.addWidget(self.heading, 1)
        bar.addWidget(QLabel("model"))
        bar.addWidget(self.model_filter)
        self.export = export_button(self, plots={"Traces plot": lambda: self.plot},
                                    tables={"Requests": lambda: model_table(self.rows.model()),
                                            "Summary": lambda: model_table(self.summary.model())})
        bar.addWidget(self.export)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.rows)
        split.addWidget(self.plot)
        split.setSizes([620, 420])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(bar)
        layout.addWidget(self.summary)
        layout.addWidget(self.note)
        layout.addWidget(split, 1)
        self.apply_theme()

    @staticmethod
    def _table(columns: tuple[str, ...]) -> QTableWidget:
        t = QTableWidget(0, len(columns))
        t.setHorizontalHeaderLabels(columns)
        t.verticalHeader().setVisible(False)
        t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        t.horizontalHeader().setStretchLastSection(True)
        return t

    def apply_theme(self, name: str | None = None) -> None:
        p = theme.palette(name)
        self.plot.setBackground(p["panel"])
        for side in ("left", "bottom"):
            self.plot.getAxis(side).setTextPen(p["text_dim"])
            self.plot.getAxis(side).setPen(p["text_dim"])
        self.plot.plotItem.legend.setLabelTextColor(p["text"])
        for _, label in self.plot.plotItem.legend.items:  # the colour takes at the next setText
            label.setText(label.text)
        self._lines["observed"].setPen(pg.mkPen(theme.color("cached", name), width=2))
        self._lines["predicted"].setPen(pg.mkPen(theme.color("computed", name), width=2, style=Qt.PenStyle.DashLine))
        if self.weka is not None:
            self.show_weka(self.weka)
        elif self.usage is not None:
            self.show_usage(self.usage)

    def show_subject(self, subject: Subject) -> None:
        """Forget the last trace or log; a kv-cache-tester trace opened now fills the panel
        when its replay is done (`show_weka`)."""
        self.weka, self.usage = None, None
        self._clear_plot()
        for line in self._lines.values():
            line.setData([], [])
        self.summary.setRowCount(0)
        self.summary.show()
        self.rows.setRowCount(0)
        self.model_filter.blockSignals(True)
        self.model_filter.clear()
        self.model_filter.addItem("every model", "")
        self.model_filter.blockSignals(False)
        self.note.setText("")
        source = subject.source or ""
        if subject.kind == "trace" and (source.endswith(".json") or Path(source).is_dir()):
            self.heading.setText(f"Replaying <b>\u201c{subject.title}\u201d</b>: its kv-cache-tester summary "
                                 f"appears here when the replay is done.")
        elif subject.kind == "usage":
            self.heading.setText(f"Reading the usage log <b>\u201c{subject.title}\u201d</b>: each request, its cached "
                                 f"tokens observed beside the engine's prediction, appears here once it is compared.")
        elif subject.kind == "trace":
            self.heading.setText(f"<b>\u201c{subject.title}\u201d</b> is not a kv-cache-tester trace: its bill is "
                                 f"in the Billing panel, its hit rate against block size and capacity in Sweep. {INTRO}")
        else:
            self.heading.setText(INTRO)

    def _fit_legend(self, *_: Any) -> None:
        """As many columns as fit inside the plot (one when even two would be cut at the
        right edge), the legend kept on the plot's left, clear of the axis."""
        if not self.legend.items:
            return
        room = self.plot.plotItem.vb.width() - 2 * LEGEND_MARGIN_PX
        widths = [sample.boundingRect().width() + label.boundingRect().width() + 12
                  for sample, label in self.legend.items]
        columns = 1
        for n in range(self._legend_columns, 0, -1):
            rows = [widths[i::n] for i in range(n)]  # pyqtgraph fills row by row: column c holds items c, c+n, ...
            if sum(max(col, default=0) for col in rows) <= room:
                columns = n
                break
        if columns != self.legend.columnCount:
            self.legend.setColumnCount(columns)

    # ---------------------------------------------------------------- kv-cache-tester
    def _clear_plot(self) -> None:
        """Take the last table's points and legend off the plot."""
        for item in self._scatter.values():
            self.plot.removeItem(item)
        self._scatter = {}
        self.legend.clear()

    def show_weka(self, summary: dict[str, Any]) -> None:
        self.weka, self.usage = summary, None
        traces, t, cfg = summary["traces"], summary["totals"], summary["config"]
        models = sorted({r["model"] for r in summary["requests"]})
        self.colours = model_colours(models)
        self.heading.setText(
            f"<b>{len(traces)} kv-cache-tester trace{'s' if len(traces) != 1 else ''}</b>: {t['requests']:,} requests "
            f"({t['subagent_requests']:,} of sub-agents), {len(models)} model{'s' if len(models) != 1 else ''}, "
            f"blocks of {cfg['block_size']} · engine hit rate <b>{t['hit_rate']:.1f}%</b>, blocks held "
            f"<b>{t['unbounded_held_pct']:.1f}%</b> · cache "
            f"{'keyed by model' if cfg['keyed_by_model'] else 'shared across models'}")
        self.note.setText("Same-Model% and Cumulative% by kv-cache-tester's definition (per model; first request of "
                          "each model and sub-agent requests left out); held%: the blocks an unbounded engine cache "
                          f"held for the same requests. Note: {summary['note']}.")
        self.summary.setColumnCount(len(TRACE_COLUMNS))
        self.summary.setHorizontalHeaderLabels(TRACE_COLUMNS)
        self.summary.setRowCount(len(traces))
        for i, r in enumerate(traces):
            values = (r["trace"], r["requests"], r["subagent_requests"], f"{r['same_model_pct']:.1f}",
                      f"{r['cumulative_pct']:.1f}", f"{r['unbounded_held_pct']:.1f}", f"{r['engine_hit_rate_pct']:.1f}",
                      ", ".join(_short_model(m) for m in r["models"]))
            for j, v in enumerate(values):
                self.summary.setItem(i, j, QTableWidgetItem(str(v)))
        self.summary.resizeColumnsToContents()
        self.summary.show()
        self.model_filter.blockSignals(True)
        self.model_filter.clear()
        self.model_filter.addItem("every model", "")
        for m in models:
            self.model_filter.addItem(_short_model(m), m)
        self.model_filter.blockSignals(False)
        self.model_filter.setEnabled(True)
        self.plot.setLabel("left", "blocks held %")
        for line in self._lines.values():
            line.setData([], [])
        self._draw_weka_rows()

    def _draw_weka_rows(self) -> None:
        assert self.weka is not None
        only = self.model_filter.currentData() or ""
        rows = [(i, r) for i, r in enumerate(self.weka["requests"]) if not only or r["model"] == only]
        shown = rows[:MAX_ROWS]
        self.rows.setUpdatesEnabled(False)
        self.rows.setColumnCount(len(WEKA_COLUMNS))
        self.rows.setHorizontalHeaderLabels(WEKA_COLUMNS)
        self.rows.setRowCount(len(shown))
        for k, (i, r) in enumerate(shown):
            pct = 100 * r["held_blocks"] / r["prompt_blocks"] if r["prompt_blocks"] else 0.0
            stream = r["stream"] + (" (sub-agent)" if r["subagent"] else "")
            values = (i, f"{r['time']:.0f}", _short_model(r["model"]), stream, r["prompt_blocks"], r["held_blocks"],
                      f"{pct:.1f}", "refused" if r["refused"] else (r["miss_reason"] or ""))
            for j, v in enumerate(values):
                item = QTableWidgetItem(str(v))
                if j == 2:
                    item.setForeground(QBrush(self.colours[r["model"]]))
                self.rows.setItem(k, j, item)
        self.rows.setUpdatesEnabled(True)
        self.rows.resizeColumnsToContents()
        self._clear_plot()
        self._legend_columns = 2
        self.legend.setColumnCount(2)
        # bottom left of the view box (not of the plot item: its offset then counts from the
        # view's own corner, so the axis width cannot push it past the right edge)
        self.legend.setParentItem(self.plot.plotItem.vb)
        self.legend.anchor(itemPos=(0, 1), parentPos=(0, 1), offset=(LEGEND_MARGIN_PX, -LEGEND_MARGIN_PX))
        by_model: dict[str, tuple[list[float], list[float]]] = {}
        for i, r in rows:
            xs, ys = by_model.setdefault(r["model"], ([], []))
            xs.append(i)
            ys.append(100 * r["held_blocks"] / r["prompt_blocks"] if r["prompt_blocks"] else 0.0)
        for m, (xs, ys) in by_model.items():
            item = pg.ScatterPlotItem(x=np.array(xs, float), y=np.array(ys, float), size=6, pen=None,
                                      brush=pg.mkBrush(self.colours[m]))
            self.plot.addItem(item)
            self.legend.addItem(item, _short_model(m))
            self._scatter[m] = item
        self.plot.setYRange(0, 105, padding=0)
        self.plot.enableAutoRange(axis="x")
        self._fit_legend()

    def _filter_changed(self, _: int) -> None:
        if self.weka is not None:
            self._draw_weka_rows()
        self.sigFilterChanged.emit(self.model_filter.currentData() or "")

    # ---------------------------------------------------------------- usage logs
    def show_usage(self, result: dict[str, Any]) -> None:
        self.usage, self.weka = result, None
        rows, t = result["requests"], result["totals"]
        self.heading.setText(
            f"<b>Usage log</b> ({', '.join(result['apis'])}): {t['requests']} requests · cached tokens observed "
            f"<b>{t['observed_cached_tokens']:,}</b>, predicted <b>{t['predicted_cached_tokens']:,}</b> · "
            f"{t['matching_requests']} of {t['requests']} agree · {t['unexpected_misses']} unexpected misses")
        misses = [r for r in rows if r["cause"]]
        lines = [f"{r['id']}: {r['cause']['cause']} at token {r['cause']['first_divergent_token']} against "
                 f"{r['cause']['against']} ({r['cause']['detail']})" for r in misses]
        self.note.setText(f"Predicted by {result['predicted_by']}. "
                          + (" ".join(result["notes"][:1]) + " " if result["notes"] else "")
                          + ("Mismatches and misses: " + "; ".join(lines) if lines else "No unexpected miss."))
        self.summary.hide()
        self.model_filter.setEnabled(False)
        self.rows.setUpdatesEnabled(False)
        self.rows.setColumnCount(len(USAGE_COLUMNS))
        self.rows.setHorizontalHeaderLabels(USAGE_COLUMNS)
        self.rows.setRowCount(min(len(rows), MAX_ROWS))
        warn = QBrush(theme.color("evicted"))
        for i, r in enumerate(rows[:MAX_ROWS]):
            c = r["cause"]
            values = (r["id"], r["observed"]["prompt_tokens"], r["observed"]["cached_tokens"],
                      r["predicted"]["cached_tokens"], r["difference"],
                      f"{c['cause']} at token {c['first_divergent_token']}" if c else "", r["model"] or "")
            for j, v in enumerate(values):
                item = QTableWidgetItem(str(v))
                if c and j == 5:
                    item.setToolTip(c["detail"])
                if (j == 4 and r["difference"]) or (j == 5 and c):
                    item.setForeground(warn)
                self.rows.setItem(i, j, item)
        self.rows.setUpdatesEnabled(True)
        self.rows.resizeColumnsToContents()
        self._clear_plot()
        self._legend_columns = 1
        self.legend.setColumnCount(1)
        self.legend.setParentItem(self.plot.plotItem.vb)
        self.legend.anchor(itemPos=(0, 0), parentPos=(0, 0), offset=(LEGEND_MARGIN_PX, LEGEND_MARGIN_PX))  # top left
        for key, line in self._lines.items():
            self.legend.addItem(line, self._line_labels[key])
        x = np.arange(len(rows), dtype=float)
        self._lines["observed"].setData(x, np.array([r["observed"]["cached_tokens"] for r in rows], float),
                                        symbol="o", symbolSize=7, symbolBrush=theme.color("cached"))
        self._lines["predicted"].setData(x, np.array([r["predicted"]["cached_tokens"] for r in rows], float),
                                         symbol="x", symbolSize=9, symbolBrush=theme.color("computed"))
        self.plot.setLabel("left", "cached tokens")
        self.plot.enableAutoRange()
