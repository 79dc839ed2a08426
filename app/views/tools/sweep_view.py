"""The Sweeps panel: hit rate against block size and against pool capacity, for any trace,
with refused requests plotted as their own series.

It follows the current subject: with a trace open, its path is the trace to sweep and the
panel offers to run it (a sweep replays the trace once per point, so it starts on a click,
not on every File > Open); another subject clears the last sweep. Each sweep runs on the
context's worker (`engine.analysis.sweep.sweep_file`, what `cachescope sweep FILE` runs);
the plots only draw its points.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QBoxLayout, QFileDialog, QGridLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSizePolicy, QSpinBox,
    QVBoxLayout, QWidget,
)

from app.ui import theme
from app.ui.export import export_button
from app.ui.plots import CountAxis
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject

INTRO = "Open a trace and run a sweep."


def _ints(text: str, what: str) -> list[int]:
    from engine.core.errors import InputError

    try:
        values = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise InputError(f"{what}: {text!r} is not a comma-separated list of whole numbers") from None
    if not values or min(values) < 1:
        raise InputError(f"{what}: give whole numbers of at least 1, such as 1,2,4,8")
    return values


NARROW_PX = 760  # below this width the two plots stack instead of sitting side by side


class SweepView(PanelView):
    """Pick a trace and the values to try; `sigSweepDone(dict)` carries the sweep JSON.

    Hit rates count a refused request's prompt tokens as missed (as the CLI's `hit_rate`);
    the capacity plot also draws the served-only hit rate and the share of requests refused,
    so a pool too small to serve a request shows as refusals, not as a better rate.
    """

    sigSweepDone = Signal(dict)
    _sigProgress = Signal(int, int, int)  # generation, points done, points: worker -> GUI thread

    def __init__(self, ctx: AppContext, tokenizer: Any = None, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        from engine.analysis.sweep import DEFAULT_BLOCK_SIZES, DEFAULT_CAPACITIES

        self.tokenizer = tokenizer
        self.result: dict[str, Any] | None = None
        # Bumped when the subject changes: a sweep still on the worker for the last one is dropped.
        self._generation = 0
        self._sigProgress.connect(self._progress, Qt.ConnectionType.QueuedConnection)
        self.setObjectName("sweep_view")

        self.trace = QLineEdit()
        self.trace.setPlaceholderText("token-level or Mooncake trace, or a conversation file")
        self.trace.returnPressed.connect(self.run_sweep)
        browse = QPushButton("Open…")
        browse.clicked.connect(self._browse)
        self.block_sizes = QLineEdit(",".join(map(str, DEFAULT_BLOCK_SIZES)))
        self.capacities = QLineEdit(",".join(map(str, DEFAULT_CAPACITIES)))
        self.block_size = QSpinBox()
        self.block_size.setRange(1, 4096)
        self.block_size.setValue(16)
        self.block_size.setToolTip("block size held fixed while the capacity varies")
        self.limit = QSpinBox()
        self.limit.setRange(0, 10_000_000)
        self.limit.setSpecialValueText("all")
        self.limit.setToolTip("use only the first N requests (0: all)")
        self.run_button = QPushButton("Run sweep")
        self.run_button.clicked.connect(self.run_sweep)

        row1 = QHBoxLayout()
        row1.addWidget(QLabel("trace"))
        row1.addWidget(self.trace, 1)
        row1.addWidget(browse)
        # Two rows of label/field pairs: one row of eight cut the fields to "uto" in a
        # 640-pixel dock; the fields stretch, the labels keep their text.
        grid = QGridLayout()
        grid.setHorizontalSpacing(8)
        for i, (label, w) in enumerate((("block sizes", self.block_sizes), ("capacities (blocks)", self.capacities),
                                        ("at block size", self.block_size), ("requests", self.limit))):
            grid.addWidget(QLabel(label), i // 2, 2 * (i % 2))
            grid.addWidget(w, i // 2, 2 * (i % 2) + 1)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        grid.addWidget(self.run_button, 0, 4, 2, 1)
        self.status = QLabel(INTRO)
        self.status.setObjectName("sweep_status")
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.RichText)
        # a wrapped label must not ask for its one-line width, or the dock scrolls sideways
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.status.setMinimumWidth(120)

        self.plot_bs = pg.PlotWidget(axisItems={"left": CountAxis("left")})
        self.plot_cap = pg.PlotWidget(axisItems={"left": CountAxis("left")})
        self.plot_bs.setTitle("hit rate vs block size")
        self.plot_cap.setTitle("hit rate vs capacity")
        self.plot_bs.setLabel("bottom", "block size (tokens)")
        self.plot_cap.setLabel("bottom", "capacity (blocks)")
        # Created once; each sweep calls setData.
        self.curve_bs = self.plot_bs.plot([], [], symbol="o", symbolSize=7, name="hit rate")
        self.curve_cap = self.plot_cap.plot([], [], symbol="o", symbolSize=7, name="hit rate (refused = missed)")
        self.curve_served = self.plot_cap.plot([], [], symbol="t", symbolSize=7, name="served requests only")
        self.curve_refused = self.plot_cap.plot([], [], symbol="x", symbolSize=9, name="requests refused")
        self.legend = self.plot_cap.addLegend(offset=(6, 4), labelTextSize="8pt", colCount=3)
        for item in (self.curve_cap, self.curve_served, self.curve_refused):
            self.legend.addItem(item, item.name())
        self.bs_note = pg.TextItem(anchor=(0.5, 0.5))
        self.plot_bs.addItem(self.bs_note, ignoreBounds=True)
        for plot in (self.plot_bs, self.plot_cap):
            plot.setMinimumHeight(200)  # a short dock scrolls rather than flattening the plots
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.setLabel("left", "%")
            plot.setYRange(0, 105, padding=0)
            plot.setMouseEnabled(x=False, y=False)
            plot.showGrid(x=True, y=True, alpha=0.2)
        # the data's top (in %) of each plot; the y range adds the legend's room above it
        self._ytop = {self.plot_bs: 100.0, self.plot_cap: 100.0}
        for plot in (self.plot_bs, self.plot_cap):
            plot.plotItem.vb.sigResized.connect(lambda *_, plot=plot: self._fit_y(plot))
        self.plots_box = QBoxLayout(QBoxLayout.Direction.LeftToRight)
        self.plots_box.addWidget(self.plot_bs)
        self.plots_box.addWidget(self.plot_cap)

        self.export = export_button(self, plots={"Hit rate vs block size": lambda: self.plot_bs,
                                                 "Hit rate vs capacity": lambda: self.plot_cap},
                                    tables={"Sweep points": self.points_table})
        row1.addWidget(self.export)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(row1)
        layout.addLayout(grid)
        layout.addWidget(self.status)
        layout.addLayout(self.plots_box, 1)
        self.apply_theme()
        for plot in (self.plot_bs, self.plot_cap):
            self._fit_y(plot)
        self._show_bs_note("run a sweep to see the hit rate against block size")

    def apply_theme(self, name: str | None = None) -> None:
        p = theme.palette(name)
        self.palette = p
        for plot in (self.plot_bs, self.plot_cap):
            plot.setBackground(p["panel"])
            plot.setTitle(plot.plotItem.titleLabel.text, color=p["text"], size="10pt")
            for side in ("left", "bottom"):
                plot.getAxis(side).setTextPen(p["text_dim"])
                plot.getAxis(side).setPen(p["text_dim"])
                plot.getAxis(side).label.setDefaultTextColor(pg.mkColor(p["text_dim"]))
        for curve, key, style in ((self.curve_bs, "accent", Qt.PenStyle.SolidLine),
                                  (self.curve_cap, "accent", Qt.PenStyle.SolidLine),
                                  (self.curve_served, "cached", Qt.PenStyle.DashLine),
                                  (self.curve_refused, "miss", Qt.PenStyle.SolidLine)):
            curve.setPen(pg.mkPen(p[key], width=2, style=style))
            curve.setSymbolBrush(pg.mkBrush(p[key]))
            curve.setSymbolPen(pg.mkPen(p[key]))
        self.legend.setLabelTextColor(p["text"])
        for _, label in self.legend.items:  # the colour takes at the next setText
            label.setText(label.text)
        self.bs_note.setColor(p["text_dim"])
        if self.result is not None:
            self._set_titles(self.result)

    def _fit_y(self, plot: pg.PlotWidget) -> None:
        """The y range: the data's top plus the legend's height in the plot's own pixels (a
        capped 105% drew the legend over a 100% refusal), ticked at round percentages up to
        the top, never past 100."""
        top, vb = self._ytop[plot], plot.plotItem.vb
        legend = plot.plotItem.legend
        room = legend.boundingRect().height() + 10 if legend is not None and legend.items else 8.0
        share = min(0.5, room / vb.height()) if vb.height() > 0 else 0.3
        plot.setYRange(0, top / (1.0 - share), padding=0)
        step = next(s for s in (1, 2, 5, 10, 20, 25) if top / s <= 8)
        ticks = [(v, f"{v:g}") for v in (i * step for i in range(int(top // step) + 1))]
        plot.getAxis("left").setTicks([ticks])

    def resizeEvent(self, event: QResizeEvent) -> None:
        narrow = event.size().width() < NARROW_PX
        self.plots_box.setDirection(QBoxLayout.Direction.TopToBottom if narrow else QBoxLayout.Direction.LeftToRight)
        super().resizeEvent(event)

    # ---------------------------------------------------------------- model -> view
    def set_trace(self, path: str) -> None:
        self.trace.setText(str(path))

    def show_subject(self, subject: Subject) -> None:
        """Forget the last sweep; an opened trace becomes the trace to sweep, offered, not run."""
        self._generation += 1
        self.run_button.setEnabled(True)
        self.clear()
        if subject.kind == "trace" and subject.source:
            self.set_trace(subject.source)
            self.status.setText(f"The trace <b>\u201c{subject.title}\u201d</b> is open: <b>Run sweep</b> replays it "
                                f"once per block size and capacity below (on the worker; the window stays usable).")
            return
        self.set_trace("")
        self.status.setText(f"{subject.describe()[0].upper()}{subject.describe()[1:]} is not a trace to sweep. "
                            f"{INTRO}")

    def clear(self) -> None:
        """No sweep: empty curves, plain titles, the block-size note."""
        self.result = None
        for curve in (self.curve_bs, self.curve_cap, self.curve_served, self.curve_refused):
            curve.setData([], [])
        for plot, title in ((self.plot_bs, "hit rate vs block size"), (self.plot_cap, "hit rate vs capacity")):
            plot.getAxis("bottom").setTicks(None)
            self._ytop[plot] = 100.0
            self._fit_y(plot)
            plot.setTitle(title, color=self.palette["text"], size="10pt")
        self.plot_bs.setVisible(True)
        self._show_bs_note("run a sweep to see the hit rate against block size")
        self.status.setText(INTRO)

    def _show_bs_note(self, text: str) -> None:
        self.bs_note.setText(text)
        self.bs_note.setVisible(bool(text))
        self.bs_note.setPos(0.5, 52)
        self.plot_bs.setXRange(0, 1, padding=0)

    def _set_titles(self, result: dict[str, Any]) -> None:
        has_bs = any(p["series"] == "block_size" for p in result["points"])
        col = self.palette["text"]
        self.plot_bs.setTitle("hit rate vs block size" if has_bs else "hit rate vs block size: fixed by the trace",
                              color=col, size="10pt")
        fixed = ", fixed by the trace's 512-token hash ids" if result.get("kind") == "mooncake" else ""
        self.plot_cap.setTitle(f"hit rate vs capacity (block size {result['block_size']}{fixed})",
                               color=col, size="10pt")

    def show_result(self, result: dict[str, Any]) -> None:
        self.result = result
        bs = [p for p in result["points"] if p["series"] == "block_size"]
        cap = [p for p in result["points"] if p["series"] == "capacity"]
        num = max(1, result["requests"])
        self.curve_bs.setData([math.log2(p["block_size"]) for p in bs], [100 * p["hit_rate"] for p in bs])
        xs = [math.log2(p["capacity_blocks"]) for p in cap]
        self.curve_cap.setData(xs, [100 * p["hit_rate"] for p in cap])
        self.curve_served.setData(xs, [100 * p.get("served_hit_rate", p["hit_rate"]) for p in cap])
        self.curve_refused.setData(xs, [100 * p["refused_requests"] / num for p in cap])
        # y follows the data (hit rates of a few percent are not drawn flat against a 0-100 axis),
        # with room above for the legend
        for plot, values in ((self.plot_bs, [100 * p["hit_rate"] for p in bs]),
                             (self.plot_cap, [100 * max(p["hit_rate"], p.get("served_hit_rate", 0.0),
                                                        p["refused_requests"] / num) for p in cap])):
            self._ytop[plot] = min(100.0, max(5.0, 1.1 * max(values, default=0.0)))
            self._fit_y(plot)
        for plot, points, key in ((self.plot_bs, bs, "block_size"), (self.plot_cap, cap, "capacity_blocks")):
            ticks = [(math.log2(p[key]), f"{p[key]:,}") for p in points]
            plot.getAxis("bottom").setTicks([ticks] if ticks else None)
            if points:
                plot.setXRange(min(t for t, _ in ticks) - 0.3, max(t for t, _ in ticks) + 0.3, padding=0)
        if bs:
            self._show_bs_note("")
        elif result["kind"] == "mooncake":
            self._show_bs_note("A Mooncake trace names 512-token blocks by hash id only,\n"
                               "so its block size cannot vary: see the capacity plot.")
        else:
            self._show_bs_note("no block sizes were asked for")
        # an axis with nothing to show gives its room to the capacity plot; the note stays
        # readable in the title of the plot that is left
        self.plot_bs.setVisible(bool(bs))
        self._set_titles(result)
        refused = sum(p["refused_requests"] for p in cap)
        text = f"{result['requests']:,} requests ({result['kind']}), {result['total_tokens']:,} tokens"
        if bs:  # a block-level trace has no block-size series to describe
            text += f" · block-size series in a pool of {result['capacity_tokens']:,} tokens"
        if refused:
            worst = max(cap, key=lambda p: p["refused_requests"])
            text += (f" · refused requests count as missed: {worst['refused_requests']:,} of {num:,} "
                     f"refused at {worst['capacity_blocks']:,} blocks")
        if result["notes"]:
            text += " · " + " ".join(result["notes"])
        self.status.setText(text)
        self.sigSweepDone.emit(result)

    def points_table(self) -> tuple[list[str], list[list[Any]]]:
        """The sweep's points as a table (for the CSV export)."""
        points = (self.result or {}).get("points", [])
        header = ["series", "block_size", "capacity_blocks", "hit_rate", "served_hit_rate", "cached_tokens",
                  "prompt_tokens", "refused_requests", "refused_tokens", "evicted_blocks"]
        return header, [[p.get(k, "") for k in header] for p in points]

    # ---------------------------------------------------------------- view -> model
    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a trace", "", "Traces and conversations (*.jsonl *.json);;All files (*)")
        if path:
            self.set_trace(path)
            self.run_sweep()

    def run_sweep(self) -> None:
        path = self.trace.text().strip()
        if not path:
            return
        try:
            sizes = _ints(self.block_sizes.text(), "block sizes")
            caps = _ints(self.capacities.text(), "capacities")
        except ValueError as exc:
            self.ctx.show_error(str(exc))
            return
        self.run_button.setEnabled(False)
        self.status.setText(f"sweeping {Path(path).name}… (on the worker: the window stays usable)")
        generation = self._generation
        self.ctx.worker.submit(self._job, path, sizes, caps, self.block_size.value(), self.limit.value(), generation,
                               on_done=lambda result: self._done(result, generation),
                               on_error=lambda exc: self._failed(exc, generation))

    def _job(self, path: str, sizes: list[int], caps: list[int], block_size: int, limit: int,
             generation: int = -1) -> dict[str, Any]:
        from app.runtime.context import JobCancelled

        def progress(done: int, total: int) -> None:  # worker thread, after each point
            if generation >= 0 and generation != self._generation:
                raise JobCancelled("another subject was opened")  # frees the worker for it
            self._sigProgress.emit(generation, done, total)

        def tokenizer() -> Any:
            if self.tokenizer is None:
                from engine.model.loader import load_tokenizer

                self.tokenizer = load_tokenizer(self.ctx.model_name)
            return self.tokenizer

        from engine.analysis.sweep import sweep_file

        return sweep_file(path, sizes, caps, block_size, limit=limit or None, tokenizer_loader=tokenizer,
                          progress=progress)

    def _progress(self, generation: int, done: int, total: int) -> None:
        if generation == self._generation and not self.run_button.isEnabled():
            self.status.setText(f"sweeping {Path(self.trace.text()).name}: {done} of {total} points replayed "
                                f"(on the worker: the window stays usable)")

    def _done(self, result: dict[str, Any], generation: int | None = None) -> None:
        if generation is not None and generation != self._generation:
            return  # swept for a subject that is no longer open
        self.run_button.setEnabled(True)
        self.show_result(result)

    def _failed(self, exc: BaseException, generation: int | None = None) -> None:
        if generation is not None and generation != self._generation:
            return  # a cancelled sweep of the last subject among them
        self.run_button.setEnabled(True)
        self.status.setText("the sweep failed")
        self.ctx.show_error(str(exc))
