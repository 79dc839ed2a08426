"""The Compare window: two runs on one aligned request axis, A in one colour and B in another.

Paired metrics (A, B, B - A, with sizes in tokens where pool or block sizes differ), the
running hit rates overlaid, per-request deltas as bars (B reused more: up, less: down), the
pools' in-use and cached-free shares overlaid, the cost per turn a hosted API would bill,
the two request tables and the two block tables side by side; picking a request in any of
them picks it everywhere. The comparison runs on the context's worker
(`engine.analysis.compare`); this window only draws its result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox, QFileDialog, QGridLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QSplitter,
    QTableWidget, QTabWidget, QVBoxLayout, QWidget,
)

from app.ui import theme
from app.ui.colors import legend_line, swatch
from app.ui.export import export_button
from app.ui.tables import cell, data_table, fill_table
from app.views.compare.pool_pair import PoolPair

if TYPE_CHECKING:
    from app.runtime.context import AppContext

METRICS = (("requests", "requests"), ("prompt tokens", "prompt_tokens"), ("cached tokens", "cached_tokens"),
           ("computed tokens", "computed_tokens"), ("hit rate", "hit_rate"), ("cached per request", "cached_per_request"),
           ("stored blocks", "stored_blocks"), ("evicted blocks", "evicted_blocks"), ("refused", "refused_requests"),
           # normalized: the same memory reads the same whatever the block size
           ("pool (tokens)", "pool_tokens"), ("stored tokens", "stored_tokens"), ("evicted tokens", "evicted_tokens"),
           ("cost (USD)", "cost_usd"), ("cost without cache (USD)", "cost_without_cache_usd"))
USD = ("cost_usd", "cost_without_cache_usd")
COST_PROVIDER = "anthropic"  # the price tables of engine/analysis/billing.py; the CLI's --cost picks another
SIDE_COLUMNS = ("#", "id", "prompt", "cached", "hit rate", "miss reason")
MAX_TABLE_ROWS = 20_000  # the tables show the first rows of a huge trace; plots and JSON keep all


def _normalized(totals: dict[str, Any], config: dict[str, Any], cost: dict[str, Any] | None) -> dict[str, Any]:
    """The side's totals with block counts in tokens and its bill's totals beside them."""
    out = dict(totals)
    bs, cap = config.get("block_size"), config.get("capacity_blocks")
    out["pool_tokens"] = cap * bs if cap is not None and bs else None
    for key in ("stored", "evicted"):
        n = totals.get(f"{key}_blocks")
        out[f"{key}_tokens"] = n * bs if n is not None and bs else None
    for key in USD:
        out[key] = cost[key] if cost else None
    return out


class _Side(QWidget):
    """One side's input: a file (or session:ID / run:ID), its block size and pool size."""

    def __init__(self, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.spec = QLineEdit()
        self.spec.setPlaceholderText(f"{name}: a trace, conversation or session file, session:ID, run:ID, "
                                     f"run:ID@SERVER or demo:NAME[:PART]")
        browse = QPushButton("Open…")
        browse.clicked.connect(self._browse)
        self.block_size = QSpinBox()
        self.block_size.setRange(1, 4096)
        self.block_size.setValue(16)
        self.block_size.setPrefix("block ")
        self.capacity = QSpinBox()
        self.capacity.setRange(0, 2_000_000_000)
        self.capacity.setSpecialValueText("pool: all fits")
        self.capacity.setSuffix(" tokens")
        self.capacity.setToolTip("pool size in tokens (the same memory at any block size); 0: the whole run fits")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        label = QLabel(name)
        label.setObjectName(f"compare_label_{name.lower()}")
        row.addWidget(label)
        row.addWidget(self.spec, 1)
        row.addWidget(browse)
        row.addWidget(self.block_size)
        row.addWidget(self.capacity)
        self.spec.textChanged.connect(self._replayed)

    def _replayed(self, text: str) -> None:
        """A recorded run or a demo keeps its own block and pool sizes: nothing to set."""
        replayed = not text.strip().startswith(("run:", "demo:"))
        for w in (self.block_size, self.capacity):
            w.setEnabled(replayed)
            w.setToolTip("" if replayed else "a recorded run or a demo is shown with its own block and pool sizes")

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a run to compare", "",
                                              "Traces and sessions (*.jsonl *.json);;All files (*)")
        if path:
            self.spec.setText(path)

    def options(self, hash_name: str, limit: int) -> Any:
        from engine.analysis.compare import SideOptions

        cap = self.capacity.value()
        return SideOptions(block_size=self.block_size.value(), capacity_tokens=cap or None, hash=hash_name,
                           limit=limit or None)


class CompareWindow(QWidget):
    """`sigCompared(Comparison)` after a comparison was drawn; `sigPicked(position)` after a
    request was picked (in a table or a plot)."""

    sigCompared = Signal(object)
    sigPicked = Signal(int)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.ctx = ctx
        self.setObjectName("compare_window")
        self.setWindowTitle("Compare two runs — Cachescope")
        self.comparison: Any = None
        self.cost: dict[str, Any] | None = None
        self.totals: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        self.doc: dict[str, Any] = {}
        self.rows: list[dict[str, Any]] = []
        self.picked: int | None = None
        self.side_a, self.side_b = _Side("A"), _Side("B")
        self.hash = QComboBox()
        from engine.core.hashing import HASH_NAMES

        self.hash.addItems(list(HASH_NAMES))
        self.limit = QSpinBox()
        self.limit.setRange(0, 100_000_000)
        self.limit.setSpecialValueText("all requests")
        self.limit.setPrefix("first ")
        self.run_button = QPushButton("Compare")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self.run_compare)
        self.summary = QLabel("Pick two runs: the same trace at two block sizes, a prompt before and after an edit, "
                              "two recorded runs.")
        self.summary.setObjectName("compare_summary")
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setWordWrap(True)
        self.metrics = data_table(("metric", "A", "B", "B - A"))
        self.metrics.setRowCount(len(METRICS))
        self.metrics.setMinimumWidth(500)  # B - A of a million-block pool fits
        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setMinimumWidth(320)  # titles never widen the window past the screen
        self.p_rate = self.plots.addPlot(row=0, col=0, title="running hit rate")
        self.p_pool = self.plots.addPlot(row=0, col=1, title="pool, share in use")
        self.p_delta = self.plots.addPlot(row=1, col=0, title="cached tokens, B - A, per request")
        self.p_cost = self.plots.addPlot(row=1, col=1, title="cost per turn (USD)")
        for plot in (self.p_delta, self.p_pool, self.p_cost):
            plot.setXLink(self.p_rate)
        self.p_rate.setYRange(0, 1, padding=0.02)
        self.p_pool.setYRange(0, 1, padding=0.02)
        self.c_a = self.p_rate.plot(name="A")
        self.c_b = self.p_rate.plot(name="B")
        # in use solid, cached free dotted; A and B in their colours
        self.pool_a = {k: self.p_pool.plot(name=f"A {k}") for k in ("in_use", "cached_free")}
        self.pool_b = {k: self.p_pool.plot(name=f"B {k}") for k in ("in_use", "cached_free")}
        self.cost_a = self.p_cost.plot(name="A")
        self.cost_b = self.p_cost.plot(name="B")
        self.b_more = pg.BarGraphItem(x=[], height=[], width=0.9)
        self.b_less = pg.BarGraphItem(x=[], height=[], width=0.9)
        self.p_delta.addItem(self.b_more)
        self.p_delta.addItem(self.b_less)
        self.all_plots = (self.p_rate, self.p_delta, self.p_pool, self.p_cost)
        self.lines = [pg.InfiniteLine(angle=90, movable=False) for _ in self.all_plots]
        for plot, line in zip(self.all_plots, self.lines):
            plot.addItem(line)
            line.hide()
            plot.showGrid(x=False, y=True, alpha=0.15)
            plot.setMouseEnabled(x=True, y=False)
            plot.scene().sigMouseClicked.connect(lambda ev, plot=plot: self._plot_clicked(plot, ev))
        self.p_delta.setLabel("bottom", "request (aligned)")
        self.p_cost.setLabel("bottom", "request (aligned)")
        self.table_a = data_table(SIDE_COLUMNS)
        self.table_b = data_table(SIDE_COLUMNS)
        self.pools = PoolPair()
        self.pools.sigRequestClicked.connect(self._pool_clicked)
        for t in (self.table_a, self.table_b):
            t.itemSelectionChanged.connect(lambda t=t: self._table_picked(t))
        self.detail = QLabel("")
        self.detail.setObjectName("compare_detail")
        self.detail.setTextFormat(Qt.TextFormat.RichText)
        self.export = export_button(self, plots={"compare plots": lambda: self.plots},
                                    tables={"per-request deltas": self._delta_table,
                                            "paired metrics": self._metrics_table})

        opts = QHBoxLayout()
        opts.addWidget(QLabel("hash"))
        opts.addWidget(self.hash)
        opts.addWidget(self.limit)
        opts.addStretch(1)
        opts.addWidget(self.run_button)
        opts.addWidget(self.export)
        upper = QSplitter(Qt.Orientation.Horizontal)
        upper.addWidget(self.metrics)
        upper.addWidget(self.plots)
        upper.setStretchFactor(1, 1)
        upper.setSizes([510, 770])
        requests = QWidget()
        grid = QGridLayout(requests)
        grid.setContentsMargins(0, 0, 0, 0)
        self.head_a, self.head_b = QLabel("A"), QLabel("B")
        for h in (self.head_a, self.head_b):
            h.setTextFormat(Qt.TextFormat.RichText)
        grid.addWidget(self.head_a, 0, 0)
        grid.addWidget(self.head_b, 0, 1)
        grid.addWidget(self.table_a, 1, 0)
        grid.addWidget(self.table_b, 1, 1)
        self.tabs = QTabWidget()
        self.tabs.addTab(requests, "requests")
        self.tabs.addTab(self.pools, "block tables")
        lower = QWidget()
        lower_col = QVBoxLayout(lower)
        lower_col.setContentsMargins(0, 0, 0, 0)
        lower_col.addWidget(self.tabs, 1)
        lower_col.addWidget(self.detail)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(upper)
        split.addWidget(lower)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        col = QVBoxLayout(self)
        col.addWidget(self.side_a)
        col.addWidget(self.side_b)
        col.addLayout(opts)
        col.addWidget(self.summary)
        col.addWidget(split, 1)
        ctx.sigThemeChanged.connect(self.apply_theme)
        self.apply_theme(theme.current_theme())
        self.resize(1280, 800)

    # ---- running
    def set_sides(self, a: str, b: str, block_size_a: int | None = None, block_size_b: int | None = None) -> None:
        self.side_a.spec.setText(a)
        self.side_b.spec.setText(b)
        if block_size_a:
            self.side_a.block_size.setValue(block_size_a)
        if block_size_b:
            self.side_b.block_size.setValue(block_size_b)

    def run_compare(self) -> None:
        from engine.core.errors import InputError

        a, b = self.side_a.spec.text().strip(), self.side_b.spec.text().strip()
        if not a or not b:
            self.ctx.show_error("Pick both runs to compare: A and B.")
            return
        try:
            oa = self.side_a.options(self.hash.currentText(), self.limit.value())
            ob = self.side_b.options(self.hash.currentText(), self.limit.value())
        except InputError as exc:
            self.ctx.show_error(str(exc))
            return
        db = str(self.ctx.store.path) if self.ctx.store is not None and self.ctx.store.path else None
        self.run_button.setEnabled(False)
        self.summary.setText("Running both sides…" if "demo:" in a + b else "Replaying both runs…")
        model = getattr(self.ctx, "loaded", None)  # the app's loaded model spares the demos a second load
        self.ctx.worker.submit(_compare_job, a, b, oa, ob, db, model, on_done=self.show_comparison,
                               on_error=self._failed)

    def _failed(self, exc: BaseException) -> None:
        self.run_button.setEnabled(True)
        self.summary.setText("The comparison failed.")
        self.ctx.show_error(str(exc) if str(exc) else f"The comparison failed ({type(exc).__name__}).")

    # ---- drawing
    def show_comparison(self, result: Any) -> None:
        """Draw `result`: a `Comparison`, or (comparison, cost per turn) as the worker gives."""
        from engine.analysis.compare import hit_rate_curve, pool_curves

        comparison, cost = result if isinstance(result, tuple) else (result, None)
        self.run_button.setEnabled(True)
        self.comparison, self.cost = comparison, cost
        doc = self.doc = comparison.to_dict()
        self.rows = doc["requests"]
        ta = _normalized(doc["a"]["totals"], doc["a"]["config"], cost["a"] if cost else None)
        tb = _normalized(doc["b"]["totals"], doc["b"]["config"], cost["b"] if cost else None)
        self.totals = (ta, tb)
        for i, (label, key) in enumerate(METRICS):
            fmt = "%" if key == "hit_rate" else "usd" if key in USD else ""
            va, vb = ta[key], tb[key]
            delta = round(vb - va, 8) if isinstance(va, (int, float)) and isinstance(vb, (int, float)) else None
            self.metrics.setItem(i, 0, cell(label))
            self.metrics.setItem(i, 1, cell(va, fmt))
            self.metrics.setItem(i, 2, cell(vb, fmt))
            self.metrics.setItem(i, 3, cell(delta, {"%": "+%", "usd": "+usd"}.get(fmt, "+")))
        ya, yb = hit_rate_curve(comparison.a), hit_rate_curve(comparison.b)
        self.c_a.setData(np.arange(len(ya)), np.asarray(ya))
        self.c_b.setData(np.arange(len(yb)), np.asarray(yb))
        self._draw_pool_curves(pool_curves(comparison.a), pool_curves(comparison.b))
        self._draw_costs(cost)
        delta = np.array([r["cached_delta"] or 0 for r in self.rows], dtype=float)
        x = np.arange(len(delta))
        more, less = delta > 0, delta < 0
        # At trace scale a request is far below a pixel: bars keep about a pixel's width.
        width = max(0.9, len(delta) / 900)
        self.b_more.setOpts(x=x[more], height=delta[more], width=width)
        self.b_less.setOpts(x=x[less], height=delta[less], width=width)
        self.p_rate.setXRange(-0.5, max(len(self.rows), 1) - 0.5, padding=0.01)
        differ = int(more.sum() + less.sum())
        self.p_delta.setTitle(f"cached tokens, B - A ({differ:,} differ)" if differ else
                              "cached tokens, B - A: no request differs")
        self._fill_tables()
        self._draw_labels(doc)
        if self.rows:
            self.pick(next((i for i, r in enumerate(self.rows) if r["cached_delta"]), 0))
        else:  # servers of a fleet: blocks, no requests to pick
            self.pools.show_ends(comparison.a, comparison.b, (self._head("a", doc), self._head("b", doc)))
            self.tabs.setCurrentWidget(self.pools)
            blocks = doc.get("blocks")
            if blocks is not None:
                self.detail.setText(f"blocks held at the end: A <b>{blocks['held_a']:,}</b>, B <b>{blocks['held_b']:,}"
                                    f"</b>, both {blocks['held_by_both']:,}, only A {blocks['only_a']:,}, only B "
                                    f"{blocks['only_b']:,}")
        self.sigCompared.emit(comparison)

    def _draw_labels(self, doc: dict[str, Any]) -> None:
        """The headers and the summary line, whose swatches carry the theme's colours."""
        ta, tb, d = doc["a"]["totals"], doc["b"]["totals"], doc["delta"]
        s = doc["summary"]
        p = self.palette
        self.head_a.setText(self._head("a", doc))
        self.head_b.setText(self._head("b", doc))
        self.summary.setText(legend_line([
            (swatch(p["accent"]), f"A hit rate <b>{ta['hit_rate']:.2%}</b>"),
            (swatch(p["computed"]), f"B hit rate <b>{tb['hit_rate']:.2%}</b>"),
            ("", f"B reuses {abs(d['cached_tokens']):,} tokens <b>{s['b_reuses']}</b>"),
            (swatch(p["cached"]), f"more on {s['b_reuses_more']:,} requests"),
            (swatch(p["miss"]), f"less on {s['b_reuses_less']:,}"),
            ("", f"the same on {s['same']:,} (aligned by {doc['aligned_by']})")]))

    def _draw_pool_curves(self, ca: dict[str, list[float]] | None, cb: dict[str, list[float]] | None) -> None:
        for curves, data in ((self.pool_a, ca), (self.pool_b, cb)):
            for key, item in curves.items():
                ys = np.asarray(data[key]) if data else np.zeros(0)
                item.setData(np.arange(len(ys)), ys)
        missing = [s for s, c in (("A", ca), ("B", cb)) if c is None]
        self.p_pool.setTitle("pool: peak in use \u2014, cached free \u2508"
                             + (f" (none for {' and '.join(missing)})" if missing else ""))

    def _draw_costs(self, cost: dict[str, Any] | None) -> None:
        rows = cost["requests"] if cost else []
        for item, side in ((self.cost_a, "a"), (self.cost_b, "b")):
            ys = np.array([r[f"cost_usd_{side}"] if r[f"cost_usd_{side}"] is not None else np.nan for r in rows],
                          dtype=float)
            item.setData(np.arange(len(ys)), ys, connect="finite")
        if cost is None:
            self.p_cost.setTitle("cost per turn: not computed")
        elif cost["unknown"]:
            self.p_cost.setTitle(f"cost per turn: not known for {' and '.join(cost['unknown'])}")
        elif cost["cost_delta_usd"] is None:
            self.p_cost.setTitle(f"cost per turn: no price for {cost['model']} in the rules")
        else:
            self.p_cost.setTitle(f"cost per turn, USD (B - A {cost['cost_delta_usd']:+.4f})")

    def _fill_tables(self) -> None:
        rows = self.rows[:MAX_TABLE_ROWS]
        for t, side in ((self.table_a, "a"), (self.table_b, "b")):
            fill_table(t, [(r["position"], r[f"id_{side}"], r[f"prompt_tokens_{side}"], r[f"cached_tokens_{side}"],
                            r[f"hit_rate_{side}"], r[f"miss_reason_{side}"]) for r in rows],
                       ("", "text", "", "", "%", "text"))

    def _head(self, side: str, doc: dict[str, Any]) -> str:
        c = doc[side]["config"]
        colour = self.palette["accent" if side == "a" else "computed"]
        bs, cap = c.get("block_size"), c.get("capacity_blocks")
        size = f" · block size {bs}" if bs else ""
        size += f" · pool {cap:,} blocks" if cap else ""
        return f"{swatch(colour)} <b>{side.upper()}</b> {doc[side]['label']}{size}"

    # ---- linked selection
    def pick(self, position: int | None) -> None:
        """Pick the request at aligned `position` in both tables and both plots."""
        if position is None or not self.rows:
            return
        position = max(0, min(int(position), len(self.rows) - 1))
        self.picked = position
        for line in self.lines:
            line.setValue(position)
            line.show()
        for t in (self.table_a, self.table_b):
            t.blockSignals(True)
            if position < t.rowCount():
                t.selectRow(position)
                t.scrollToItem(t.item(position, 0))
            t.blockSignals(False)
        r = self.rows[position]
        if r["cached_delta"] is None:
            text = f"request {position}: only on one side"
        else:
            text = (f"request {position} (<b>{r['id_a']}</b> / <b>{r['id_b']}</b>): A cached "
                    f"{r['cached_tokens_a']:,} of {r['prompt_tokens_a']:,} ({r['miss_reason_a']}), B cached "
                    f"{r['cached_tokens_b']:,} of {r['prompt_tokens_b']:,} ({r['miss_reason_b']}): B reuses "
                    f"{abs(r['cached_delta']):,} tokens <b>{r['b_reuses']}</b>")
        if self.cost is not None:
            c = self.cost["requests"][position]
            if c["cost_delta_usd"] is not None:
                text += (f"; billed A ${c['cost_usd_a']:.6f}, B ${c['cost_usd_b']:.6f} "
                         f"({c['cost_delta_usd']:+.6f})")
        self.detail.setText(text)
        self.pools.show_request(self.comparison.a, self.comparison.b, r,
                                (self._head("a", self.doc), self._head("b", self.doc)))
        self.sigPicked.emit(position)

    def _table_picked(self, table: QTableWidget) -> None:
        rows = table.selectionModel().selectedRows()
        if rows:
            self.pick(rows[0].row())

    def _pool_clicked(self, side: str, request_id: str) -> None:
        """A block clicked in one pool: pick the request that last held it."""
        key = f"id_{side}"
        position = next((i for i, r in enumerate(self.rows) if str(r[key]) == request_id), None)
        if position is not None:
            self.pick(position)

    def _plot_clicked(self, plot: Any, ev: Any) -> None:
        if not self.rows or not plot.sceneBoundingRect().contains(ev.scenePos()):
            return
        x = plot.vb.mapSceneToView(ev.scenePos()).x()
        self.pick(int(round(x)))

    # ---- export
    def _delta_table(self) -> Any:
        if not self.rows:
            return (("no comparison yet",), [])
        rows = self.rows
        if self.cost is not None:
            rows = [{**r, **{k: c[k] for k in ("cost_usd_a", "cost_usd_b", "cost_delta_usd")}}
                    for r, c in zip(rows, self.cost["requests"])]
        header = tuple(rows[0])
        return header, [tuple(r[k] for k in header) for r in rows]

    def _metrics_table(self) -> Any:
        if self.comparison is None:
            return (("no comparison yet",), [])
        ta, tb = self.totals
        return (("metric", "A", "B", "B - A"),
                [(label, ta[k], tb[k], round(tb[k] - ta[k], 8) if ta[k] is not None and tb[k] is not None else None)
                 for label, k in METRICS])

    def apply_theme(self, name: str | None = None) -> None:
        p = theme.palette(name)
        self.palette = p
        self.plots.setBackground(p["panel"])
        # B dashed over A: where the two runs agree both stay visible
        self.c_a.setPen(pg.mkPen(p["accent"], width=4))
        self.c_b.setPen(pg.mkPen(p["computed"], width=2, style=Qt.PenStyle.DashLine))
        for curves, colour, width in ((self.pool_a, p["accent"], 3), (self.pool_b, p["computed"], 2)):
            curves["in_use"].setPen(pg.mkPen(colour, width=width))
            curves["cached_free"].setPen(pg.mkPen(colour, width=width, style=Qt.PenStyle.DotLine))
        self.cost_a.setPen(pg.mkPen(p["accent"], width=3))
        self.cost_b.setPen(pg.mkPen(p["computed"], width=2, style=Qt.PenStyle.DashLine))
        self.pools.apply_theme(name)
        self.b_more.setOpts(brush=pg.mkBrush(p["cached"]), pen=pg.mkPen(None))
        self.b_less.setOpts(brush=pg.mkBrush(p["miss"]), pen=pg.mkPen(None))
        for line in self.lines:
            line.setPen(pg.mkPen(p["text_dim"], width=1, style=Qt.PenStyle.DashLine))
        for plot in self.all_plots:
            plot.titleLabel.setAttr("color", p["text"])
            plot.titleLabel.setText(plot.titleLabel.text)
            for side in ("left", "bottom"):
                plot.getAxis(side).setTextPen(p["text_dim"])
                plot.getAxis(side).setPen(p["border"])
        if self.comparison is not None:
            self._draw_labels(self.doc)  # the plots restyled in place; the tables need nothing
            if self.picked is not None:
                self.pick(self.picked)  # the block tables in the theme's colours


def _compare_job(a: str, b: str, oa: Any, ob: Any, db: str | None, model: Any = None) -> tuple[Any, Any]:
    """Both sides replayed (or run, for demos) with their logs kept, and the cost per turn."""
    from engine.analysis.billing import provider_rules
    from engine.analysis.compare import compare, cost_per_turn
    demos = None
    if a.startswith("demo:") or b.startswith("demo:"):  # the demos import torch: only when asked
        from app.views.compare.demo_sides import demo_runs

        demos = demo_runs(model)
    comparison = compare(a, b, oa, ob, db, demos=demos, keep_logs=True)
    for run in (comparison.a, comparison.b):
        warm = getattr(run.log, "warm", None)
        if warm is not None:
            warm()  # a kernel side's columnar log: its series, pool and indexes here, not on the first paint
    return comparison, cost_per_turn(comparison, provider_rules(COST_PROVIDER))
