"""The Sweeps panel: hit rate against block size and against pool capacity, for any trace.

Each sweep runs on the context's worker (`engine.analysis.sweep`); the plots only draw its points.
"""

from __future__ import annotations

import math
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QFileDialog, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout, QWidget,
)

from app import theme


def _ints(text: str, what: str) -> list[int]:
    from engine.core.errors import InputError

    try:
        values = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise InputError(f"{what}: {text!r} is not a comma-separated list of whole numbers") from None
    if not values or min(values) < 1:
        raise InputError(f"{what}: give whole numbers of at least 1, such as 1,2,4,8")
    return values


class SweepView(QWidget):
    """Pick a trace and the values to try; `sigSweepDone(dict)` carries the sweep JSON."""

    sigSweepDone = Signal(dict)

    def __init__(self, ctx: Any, tokenizer: Any = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        from engine.analysis.sweep import DEFAULT_BLOCK_SIZES, DEFAULT_CAPACITIES

        self.ctx = ctx
        self.tokenizer = tokenizer
        self.result: dict[str, Any] | None = None

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
        row2 = QHBoxLayout()
        for label, w in (("block sizes", self.block_sizes), ("capacities (blocks)", self.capacities),
                         ("at block size", self.block_size), ("requests", self.limit)):
            row2.addWidget(QLabel(label))
            row2.addWidget(w)
        row2.addWidget(self.run_button)
        self.status = QLabel("Open a trace and run a sweep.")
        self.status.setWordWrap(True)

        pen = pg.mkPen(theme.color("accent"), width=2)
        brush = pg.mkBrush(theme.color("cached"))
        self.plot_bs = pg.PlotWidget(title="hit rate vs block size")
        self.plot_cap = pg.PlotWidget(title="hit rate vs capacity")
        self.plot_bs.setLabel("bottom", "block size (tokens, log2)")
        self.plot_cap.setLabel("bottom", "capacity (blocks, log2)")
        # Created once; each sweep calls setData.
        self.curve_bs = self.plot_bs.plot([], [], pen=pen, symbol="o", symbolBrush=brush, symbolSize=8)
        self.curve_cap = self.plot_cap.plot([], [], pen=pen, symbol="o", symbolBrush=brush, symbolSize=8)
        for plot in (self.plot_bs, self.plot_cap):
            plot.setLabel("left", "hit rate")
            plot.setYRange(0, 1)
            plot.showGrid(x=True, y=True, alpha=0.25)
        plots = QHBoxLayout()
        plots.addWidget(self.plot_bs)
        plots.addWidget(self.plot_cap)

        layout = QVBoxLayout(self)
        layout.addLayout(row1)
        layout.addLayout(row2)
        layout.addWidget(self.status)
        layout.addLayout(plots, 1)

    # ---------------------------------------------------------------- model -> view
    def set_trace(self, path: str) -> None:
        self.trace.setText(str(path))

    def show_result(self, result: dict[str, Any]) -> None:
        self.result = result
        bs = [p for p in result["points"] if p["series"] == "block_size"]
        cap = [p for p in result["points"] if p["series"] == "capacity"]
        self.curve_bs.setData([math.log2(p["block_size"]) for p in bs], [p["hit_rate"] for p in bs])
        self.curve_cap.setData([math.log2(p["capacity_blocks"]) for p in cap], [p["hit_rate"] for p in cap])
        for plot, points, key in ((self.plot_bs, bs, "block_size"), (self.plot_cap, cap, "capacity_blocks")):
            ticks = [(math.log2(p[key]), str(p[key])) for p in points]
            plot.getAxis("bottom").setTicks([ticks] if ticks else None)
        self.plot_bs.setTitle("hit rate vs block size" if bs else "hit rate vs block size (fixed by the trace)")
        self.plot_cap.setTitle(f"hit rate vs capacity (block size {result['block_size']})")
        text = (f"{result['requests']} requests ({result['kind']}), {result['total_tokens']} tokens; block-size "
                f"series in a pool of {result['capacity_tokens']} tokens")
        if result["notes"]:
            text += " · " + " ".join(result["notes"])
        self.status.setText(text)
        self.sigSweepDone.emit(result)

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
        self.status.setText("running…")
        self.ctx.worker.submit(self._job, path, sizes, caps, self.block_size.value(), self.limit.value(),
                               on_done=self._done, on_error=self._failed)

    def _job(self, path: str, sizes: list[int], caps: list[int], block_size: int, limit: int) -> dict[str, Any]:
        from engine.analysis.sweep import load_sweep_requests, sweep

        def tokenizer() -> Any:
            if self.tokenizer is None:
                from engine.model.loader import load_tokenizer

                self.tokenizer = load_tokenizer(getattr(self.ctx, "model_name", None))
            return self.tokenizer

        reqs, kind = load_sweep_requests(path, tokenizer)
        result = sweep(reqs[:limit] if limit else reqs, sizes, caps, block_size=block_size, trace=path)
        result["kind"] = kind
        return result

    def _done(self, result: dict[str, Any]) -> None:
        self.run_button.setEnabled(True)
        self.show_result(result)

    def _failed(self, exc: BaseException) -> None:
        self.run_button.setEnabled(True)
        self.status.setText("the sweep failed")
        self.ctx.show_error(str(exc))
