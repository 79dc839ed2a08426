"""The Billing panel: what a hosted API would charge for a session or trace, request by request.

It follows the current subject: an opened trace is billed (as `cachescope billing FILE`
bills it: a request that names its model is priced by that model's rules), and any other
subject clears the bill of the one before. A usage log's cost per turn is drawn by
`show_usage`, under the provider the log names. Loading (tokenising) and billing run on
the context's worker; the numbers are `engine.analysis.billing`. A bill in progress says how
far it is and stops at Cancel (the panel's, or the window's while it runs); the table reads
the bill's rows through a model, so a bill of 12,000 requests shows every row at once.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QResizeEvent, QShowEvent
from PySide6.QtWidgets import (
    QComboBox, QDoubleSpinBox, QFileDialog, QGridLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton,
    QSizePolicy, QSplitter, QVBoxLayout, QWidget,
)

from app.runtime.context import CancelToken, JobCancelled
from app.runtime.jobs import collector_paused
from app.ui import theme
from engine.core.errors import InputError
from app.ui.export import export_button, model_table
from app.ui.plots import CountAxis
from app.ui.tables import rows_table
from app.ui.widgets import PanelView

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject
    from engine.analysis.billing import Progress

COLUMNS = ("#", "id", "prompt", "read", "write", "uncached", "cost", "without cache", "notes")
USAGE_COLUMNS = ("#", "id", "cached", "predicted", "cost", "predicted cost")
# A trace the panel bills by itself (the one just opened) is billed only up to this many
# requests: a bill keeps a row per request, and a million rows cost gigabytes. A larger
# one is billed when the user asks (Enter in the source field), as `cachescope billing FILE` does.
AUTO_BILL_MAX_REQUESTS = 200_000


INTRO = "Open a conversation or trace to see its bill."
PER_REQUEST = "per request"  # the model box's first item: each request priced by the model it names


def _money(v: float | None) -> str:
    return "n/a" if v is None else f"${v:.6f}"


def saving_words(fraction: float) -> str:
    """What caching does to the bill, in words: "saves 12.5%", or "costs 25.0% more" when the
    writes cost more than the reads save (never "saves -25.0%")."""
    if fraction < 0:
        return f"costs <b>{-fraction:.1%}</b> more"
    return f"saves <b>{fraction:.1%}</b>"


# The provider a usage log's API bills under (a vLLM log is a server's: no provider).
USAGE_PROVIDERS = {"openai": "openai", "anthropic": "anthropic"}


def bill_cells(row: dict[str, Any]) -> tuple[Any, ...]:
    """A bill row's cells, in COLUMNS' order (made when the table draws the row)."""
    return (row["index"], row["id"], row["prompt_tokens"], row["read_tokens"], row["write_tokens"],
            row["uncached_tokens"], _money(row["cost_usd"]), _money(row["cost_without_cache_usd"]),
            "; ".join(row["notes"]))


def _notes_tip(row: dict[str, Any], column: int) -> str | None:
    return "\n".join(row["notes"]) if column == len(COLUMNS) - 1 and row["notes"] else None


class BillRun:
    """One bill on the worker. Its own token is the panel's Cancel; while it runs it is also
    the window's cancellable job (`window_job`), when no other job holds the window's Cancel.
    The job checks both every `PROGRESS_EVERY` requests read or billed."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.token = CancelToken()
        self.window_job: CancelToken | None = None

    @property
    def cancelled(self) -> bool:
        return self.token.cancelled or (self.window_job is not None and self.window_job.cancelled)


class BillingView(PanelView):
    """Pick a source, provider and model; `sigBillDone(dict)` carries the billing JSON."""

    # object, not dict: a dict is copied into a QVariantMap on every emit (0.34 s for a bill of 12,031 rows)
    sigBillDone = Signal(object)
    _sigStarted = Signal(object)  # BillRun: worker -> GUI thread, as its job starts
    _sigProgress = Signal(object, int, int)  # BillRun, requests done, in all (0: still reading)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        from engine.analysis.billing import PROVIDERS, load_rules

        self.rules_data = load_rules()
        self.result: dict[str, Any] | None = None
        self._requests: tuple[str, list[Any], str] | None = None  # (source, requests, token-count note)
        # Bumped when the subject changes: a bill still on the worker for the last one is dropped.
        self._generation = 0
        self._follow: str | None = None  # the opened trace to bill once the panel is shown
        # (provider, model) the user had before a usage log set the log's, and what it set:
        # the next subject gets the user's back unless the user changed them meanwhile
        self._before_usage: tuple[tuple[str, str, str], tuple[str, str, str]] | None = None
        # (provider, model, breakpoints) before the first of a run of demos: a demo sets its own
        # (the breakpoint demo's "-1"), and the next subject that is not a demo gets these back
        self._before_demo: tuple[str, str, str] | None = None
        self._run: BillRun | None = None  # the bill on the worker now, if any
        self._sigStarted.connect(self._started, Qt.ConnectionType.QueuedConnection)
        self._sigProgress.connect(self._progress, Qt.ConnectionType.QueuedConnection)

        self.source = QLineEdit()
        self.source.setPlaceholderText("conversation file, token-level or Mooncake trace, or a session id")
        self.source.returnPressed.connect(self.recompute)
        browse = QPushButton("Open…")
        browse.clicked.connect(self._browse)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("billing_cancel")
        self.cancel_button.setToolTip("stop the bill that is running")
        self.cancel_button.clicked.connect(lambda _checked=False: self.cancel())
        self.cancel_button.hide()
        self.provider = QComboBox()
        self.provider.addItems(PROVIDERS)
        self.model = QComboBox()
        self.breakpoints = QLineEdit("auto")
        self.breakpoints.setMinimumWidth(60)
        self.breakpoints.setToolTip("'auto' (the last block) or block indices such as 0,-1")
        self.ttl = QComboBox()
        self.ttl.addItems(["5m", "1h"])
        self.price = QDoubleSpinBox()
        self.price.setRange(0.0, 1000.0)
        self.price.setDecimals(3)
        self.price.setSpecialValueText("rules file")
        self.price.setPrefix("$")
        self.price.setSuffix(" /Mtok")
        self._fill_models()
        self.provider.currentTextChanged.connect(self._provider_changed)
        for w in (self.model, self.ttl):
            w.currentTextChanged.connect(self.rebill)
        self.breakpoints.editingFinished.connect(self.rebill)
        self.price.valueChanged.connect(self.rebill)

        row1 = QHBoxLayout()
        row1.addWidget(QLabel("source"))
        row1.addWidget(self.source, 1)
        row1.addWidget(browse)
        row1.addWidget(self.cancel_button)
        # Label/field pairs in a grid that reflows from one row to three as the dock narrows:
        # one fixed row of ten cut "auto" to "uto" in a 640-pixel dock.
        self.controls = QGridLayout()
        self.controls.setHorizontalSpacing(8)
        self._pairs = [(QLabel(label), w) for label, w in (
            ("provider", self.provider), ("model", self.model), ("breakpoints", self.breakpoints),
            ("TTL", self.ttl), ("base price", self.price))]
        self._per_row = 0
        self._reflow(5)

        self.total_label = QLabel(INTRO)
        self.total_label.setObjectName("billingTotals")
        self.total_label.setWordWrap(True)
        self.rules_label = QLabel("")
        self.rules_label.setWordWrap(True)
        for label in (self.total_label, self.rules_label):
            # a wrapped label must not ask for its one-line width, or the dock scrolls sideways
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            label.setMinimumWidth(120)

        # Every row of the bill, read from its rows when drawn; the columns fit a sample of
        # rows (`rows_table`). Filling 2,000 table items stalled the window 0.45 s.
        self.table, self.table_model = rows_table(COLUMNS)

        # Requests and turns are whole numbers: the bottom axis ticks only integers.
        self.plot = pg.PlotWidget(axisItems={"bottom": CountAxis("bottom")})
        self.plot.getAxis("left").enableAutoSIPrefix(False)  # dollars as dollars, not "x0.001"
        self.plot.setLabel("bottom", "request")
        self.plot.setLabel("left", "prompt tokens")
        self.plot.addLegend(offset=(10, 2), colCount=3)
        self._top = 1.0  # the tallest bar or cost; the y range adds the legend's room above it
        self.plot.plotItem.vb.sigResized.connect(self._fit_y)
        # Created once; every bill updates them with setOpts.
        self.bars = {}
        for key, label, colour in (("uncached", "uncached input", "pending"), ("write", "cache write", "computed"),
                                   ("read", "cache read", "cached")):
            item = pg.BarGraphItem(x=[], height=[], width=0.8, brush=theme.color(colour), pen=None, name=label)
            self.plot.addItem(item)  # `name` puts it in the legend
            self.bars[key] = item
        # A usage log: observed and predicted cost per turn, drawn instead of the bars.
        self.cost_lines = {key: self.plot.plot([], []) for key in ("observed", "predicted")}  # in the legend once shown
        self.usage: dict[str, Any] | None = None

        self.split = split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.table)
        split.addWidget(self.plot)
        split.setSizes([560, 440])
        split.setMinimumHeight(160)  # a short dock scrolls rather than crushing the table
        self.export = export_button(self, plots={"Billing bars": lambda: self.plot},
                                    tables={"Billing table": lambda: model_table(self.table_model)})
        row1.addWidget(self.export)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(row1)
        layout.addLayout(self.controls)
        layout.addWidget(self.total_label)
        layout.addWidget(self.rules_label)
        layout.addWidget(split, 1)
        self.apply_theme()

    def apply_theme(self, name: str | None = None) -> None:
        p = theme.palette(name)
        self.plot.setBackground(p["panel"])
        for side in ("left", "bottom"):
            self.plot.getAxis(side).setTextPen(p["text_dim"])
            self.plot.getAxis(side).setPen(p["text_dim"])
        for key, colour in (("uncached", "pending"), ("write", "computed"), ("read", "cached")):
            self.bars[key].setOpts(brush=theme.color(colour, name))
        self.cost_lines["observed"].setPen(pg.mkPen(theme.color("cached", name), width=2))
        self.cost_lines["observed"].setSymbolBrush(theme.color("cached", name))
        self.cost_lines["predicted"].setPen(pg.mkPen(theme.color("computed", name), width=2,
                                                     style=Qt.PenStyle.DashLine))
        self.cost_lines["predicted"].setSymbolBrush(theme.color("computed", name))
        self.plot.plotItem.legend.setLabelTextColor(p["text"])
        for _, label in self.plot.plotItem.legend.items:  # the colour takes at the next setText
            label.setText(label.text)

    def _reflow(self, per_row: int) -> None:
        if per_row == self._per_row:
            return
        self._per_row = per_row
        for label, w in self._pairs:
            self.controls.removeWidget(label)
            self.controls.removeWidget(w)
        for c in range(12):
            self.controls.setColumnStretch(c, 0)
        for i, (label, w) in enumerate(self._pairs):
            self.controls.addWidget(label, i // per_row, 2 * (i % per_row))
            self.controls.addWidget(w, i // per_row, 2 * (i % per_row) + 1)
        for c in range(per_row):
            self.controls.setColumnStretch(2 * c + 1, 1)

    def resizeEvent(self, event: QResizeEvent) -> None:
        width = event.size().width()
        self._reflow(5 if width >= 1000 else 3 if width >= 620 else 2)
        # side by side needs room for both; a narrow dock stacks the bars under the table
        self.split.setOrientation(Qt.Orientation.Horizontal if width >= 900 else Qt.Orientation.Vertical)
        super().resizeEvent(event)

    # ---------------------------------------------------------------- model -> view
    def set_source(self, source: str) -> None:
        self.source.setText(str(source))
        self.recompute()

    def set_provider(self, provider: str, model: str | None = None) -> None:
        self.provider.setCurrentText(provider)
        if model:
            self.model.setCurrentText(model)

    def show_subject(self, subject: Subject) -> None:
        """Forget the last subject's bill; an opened trace is billed (on the worker) as soon
        as the panel is shown, so a hidden panel does not queue work before the replay."""
        self._generation += 1
        self._stop_run()  # a bill of the last subject frees the worker at its next requests
        self._requests = None
        self._follow = None
        self._clear()
        self._restore_provider()
        if subject.kind == "demo":
            if self._before_demo is None:
                self._before_demo = self._boxes()
        elif self._before_demo is not None:
            self._set_boxes(*self._before_demo)
            self._before_demo = None
        if subject.kind == "trace" and subject.source:
            self.source.setText(subject.source)
            self._follow = subject.source
            self.total_label.setText(f"Billing the trace \u201c{subject.title}\u201d…")
            if self.isVisible():
                QTimer.singleShot(0, self._bill_followed)
            return
        self.source.setText("")
        what = {"demo": "No bill for the demo \u201c{t}\u201d (a billing demo bills its requests here when it is done).",
                "server": "The attached server \u201c{t}\u201d is not billed here.",
                "session": "The session \u201c{t}\u201d is not billed yet: give its session id as the source.",
                "usage": "The usage log \u201c{t}\u201d: its observed and predicted cost per turn are drawn here once "
                         "it is compared with the engine's prediction."}
        self.total_label.setText(what.get(subject.kind, "{t}").format(t=subject.title) + " " + INTRO)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if self._follow is not None:
            QTimer.singleShot(0, self._bill_followed)

    def _bill_followed(self) -> None:
        if self._follow is None or self._follow != self.source.text().strip():
            self._follow = None
            return
        self._follow = None
        self.rebill(quiet=True)

    def _clear(self) -> None:
        """An empty bill: no rows, no bars, no cost lines, the intro text."""
        self.result = None
        if self.usage is not None:
            self._bars_legend()
        self.usage = None
        self.table_model.clear(COLUMNS)
        for bar in self.bars.values():
            bar.setOpts(x=[], height=[], y0=[])
            bar.setVisible(True)
        for line in self.cost_lines.values():
            line.setData([], [])
        self.plot.setLabel("bottom", "request")
        self.plot.setLabel("left", "prompt tokens")
        self.total_label.setText(INTRO)
        self.rules_label.setText("")

    def _bars_legend(self) -> None:
        legend = self.plot.plotItem.legend
        legend.clear()
        for key, label in (("uncached", "uncached input"), ("write", "cache write"), ("read", "cache read")):
            legend.addItem(self.bars[key], label)

    # ---------------------------------------------------------------- view -> model
    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a conversation or trace", "",
                                              "Conversations and traces (*.json *.jsonl);;All files (*)")
        if path:
            self.set_source(path)

    def _fill_models(self) -> None:
        p = self.rules_data["providers"][self.provider.currentText()]
        self.model.blockSignals(True)
        self.model.clear()
        # First, as `cachescope billing` without --model: a request naming its model is
        # priced by that model's rules, one naming none by the provider's default.
        self.model.addItem(PER_REQUEST, None)
        self.model.setItemData(0, f"each request priced by the model it names; one naming none as "
                                  f"{p['default_model']}", Qt.ItemDataRole.ToolTipRole)
        for name in p["models"]:
            self.model.addItem(name, name)
        self.model.setCurrentIndex(0)
        self.model.blockSignals(False)
        self.ttl.setEnabled("ttl_options" in p)
        self.breakpoints.setEnabled(p.get("max_breakpoints", 0) > 0)

    def _provider_changed(self, _: str) -> None:
        self._fill_models()
        self.rebill()

    def settings(self) -> dict[str, Any]:
        provider = self.provider.currentText()
        bps = self.breakpoints.text().strip() if self.breakpoints.isEnabled() else None
        if provider != "anthropic" and bps == "auto":
            bps = None
        return {"provider": provider, "model": self.model.currentData(),
                "ttl": self.ttl.currentText() if self.ttl.isEnabled() else "5m",
                "price": self.price.value() if self.price.value() > 0 else None, "breakpoints": bps}

    def recompute(self) -> None:
        """Load the source again (it may have changed on disk), then bill it."""
        self._requests = None
        self.rebill()

    def rebill(self, *_: Any, quiet: bool = False) -> None:
        """Bill the source on the worker. `quiet`: a bill the panel started by itself (the
        opened trace) says why it failed in the panel, not in a dialog."""
        source = self.source.text().strip()
        if not source:
            return
        self._follow = None
        cached = self._requests if self._requests and self._requests[0] == source else None
        db = getattr(self.ctx.store, "path", None)
        generation = self._generation
        limit = AUTO_BILL_MAX_REQUESTS if quiet else None
        self._stop_run()  # its bill would be replaced by this one
        run = self._run = BillRun(source)
        self.cancel_button.show()
        self.ctx.worker.submit(self._job, run, cached, self.settings(), None if db is None else str(db), limit,
                               on_done=lambda out: self._done(out, generation, run),
                               on_error=lambda exc: self._failed(exc, generation, quiet, run))

    def cancel(self) -> bool:
        """Stop the bill that is running (at its next `PROGRESS_EVERY` requests); False if none runs."""
        if self._run is None:
            return False
        self._run.token.cancel()
        self.total_label.setText("Cancelling the bill…")
        return True

    @property
    def is_billing(self) -> bool:
        return self._run is not None

    def _job(self, run: BillRun, cached: tuple[str, list[Any], str] | None, settings: dict[str, Any],
             db: str | None, limit: int | None) -> tuple[tuple[str, list[Any], str], dict[str, Any]]:
        """Worker thread: `_bill_job`, stopped by the run's Cancel between requests."""
        if run.cancelled:
            raise JobCancelled("the bill was cancelled")
        self._sigStarted.emit(run)

        def progress(done: int, total: int) -> None:
            if run.cancelled:
                raise JobCancelled("the bill was cancelled")
            self._sigProgress.emit(run, done, total)

        with collector_paused():
            return _bill_job(run.source, cached, settings, db, limit, progress)

    def _started(self, run: BillRun) -> None:
        """GUI thread: the window's Cancel stops this bill too, unless another job holds it."""
        if run is self._run and not run.cancelled and self.ctx.job is None:
            run.window_job = self.ctx.start_job(f"billing {os.path.basename(run.source) or run.source}")

    def _progress(self, run: BillRun, done: int, total: int) -> None:
        if run is not self._run or run.cancelled:
            return
        name = os.path.basename(run.source) or run.source
        self.total_label.setText(f"Billing \u201c{name}\u201d: {done:,} of {total:,} requests billed…" if total
                                 else f"Billing \u201c{name}\u201d: {done:,} requests read…")

    def _end_run(self, run: BillRun) -> None:
        if run.window_job is not None:
            self.ctx.end_job(run.window_job)
            run.window_job = None
        if run is self._run:
            self._run = None
            self.cancel_button.hide()

    def _stop_run(self) -> None:
        """Cancel the running bill, whose result nobody will see (a new subject, a newer bill)."""
        run = self._run
        if run is not None:
            run.token.cancel()
            self._end_run(run)

    def _failed(self, exc: BaseException, generation: int, quiet: bool, run: BillRun | None = None) -> None:
        if run is not None:
            current = run is self._run
            self._end_run(run)
            if not current:
                return  # stopped for a newer bill or another subject: nobody waits for it
            if isinstance(exc, JobCancelled):  # the user's Cancel
                shown = " The table and bars below are the last whole bill's." if self.result is not None else ""
                self.total_label.setText(f"Bill cancelled.{shown} Press Enter in the source field to bill it again.")
                return
        if generation != self._generation:
            return
        if quiet:
            text = str(exc).replace("pass --model NAME", "pick a model above")
            self.total_label.setText(f"No bill: {text}")
            return
        self.ctx.show_error(str(exc))

    def _done(self, out: tuple[tuple[str, list[Any], str], dict[str, Any]], generation: int | None = None,
              run: BillRun | None = None) -> None:
        if run is not None:
            superseded = run is not self._run
            self._end_run(run)
            if superseded:
                return  # a newer bill replaces it
        if generation is not None and generation != self._generation:
            return  # billed for a subject that is no longer open
        self._requests, result = out
        self.result = result
        self._show(result)
        self.sigBillDone.emit(result)

    def show_usage(self, result: dict[str, Any]) -> None:
        """A usage log (`engine.analysis.usage.compare_usage`): observed and predicted cost per turn.

        The provider box follows the provider the log's API names (an OpenAI log: openai),
        and the model box the model its requests name; both stay the user's to change for
        the next bill. The source field is emptied: the log is not a source to re-bill."""
        self._generation += 1  # a bill still on the worker would replace the log's lines
        self._stop_run()
        self._follow = None
        self._follow_usage_provider(result)
        self.source.setText("")
        self._requests = None
        self.result = None
        self.usage = result
        rows, t = result["requests"], result["totals"]
        unit = result["cost_unit"]
        usd = unit == "USD"

        def cost(side: dict[str, Any]) -> float:
            return float(side["cost_usd"] if usd else side["weighted_tokens"])

        obs = np.array([cost(r["observed"]) for r in rows], dtype=float)
        pred = np.array([cost(r["predicted"]) for r in rows], dtype=float)
        fmt = _money if usd else (lambda v: f"{v:,.0f}")
        self.total_label.setText(
            f"<b>Observed vs predicted</b> ({', '.join(result['apis'])}): {fmt(float(obs.sum()))} observed, "
            f"{fmt(float(pred.sum()))} predicted · cached tokens {t['observed_cached_tokens']:,} observed, "
            f"{t['predicted_cached_tokens']:,} predicted · {t['matching_requests']} of {t['requests']} turns agree")
        self.rules_label.setText(f"cost per turn in {unit}; predicted by {result['predicted_by']}")
        self.table_model.set_rows(range(len(rows)), lambda i: (
            i, rows[i]["id"], rows[i]["observed"]["cached_tokens"], rows[i]["predicted"]["cached_tokens"],
            fmt(obs[i]), fmt(pred[i])), columns=USAGE_COLUMNS)
        self.table.resizeColumnsToContents()
        legend = self.plot.plotItem.legend
        legend.clear()
        for bar in self.bars.values():
            bar.setOpts(x=[], height=[], y0=[])  # y0 too: the last bill's y0 against no heights raised
            bar.setVisible(False)
        for key, line in self.cost_lines.items():
            legend.addItem(line, f"{key} cost")
        x = np.arange(len(rows), dtype=float)
        self.cost_lines["observed"].setData(x, obs, symbol="o", symbolSize=8)
        self.cost_lines["predicted"].setData(x, pred, symbol="x", symbolSize=10)
        self.plot.setLabel("bottom", "turn")
        self.plot.setLabel("left", "cost" + ("" if usd else f" ({unit})"))
        self.plot.setXRange(-0.6, max(len(rows) - 0.4, 0.4), padding=0)
        self._top = float(max(obs.max(initial=0), pred.max(initial=0))) or 1.0
        self._fit_y()

    def _boxes(self) -> tuple[str, str, str]:
        return self.provider.currentText(), self.model.currentText(), self.breakpoints.text()

    def _set_boxes(self, provider: str, model: str | None, breakpoints: str | None = None) -> None:
        """Set the boxes without billing (the caller bills, or the next source will); a
        None model or breakpoints keeps what the provider's model list and the box hold."""
        for box in (self.provider, self.model):
            box.blockSignals(True)
        try:
            self.provider.setCurrentText(provider)
            self._fill_models()
            self.model.blockSignals(True)
            if model is not None:
                self.model.setCurrentText(model)  # not editable: a name not listed is ignored
            if breakpoints is not None:
                self.breakpoints.setText(breakpoints)
        finally:
            for box in (self.provider, self.model):
                box.blockSignals(False)

    def _restore_provider(self) -> None:
        """The user's provider and model again, as they were before a usage log set its own."""
        if self._before_usage is None:
            return
        before, set_by_log = self._before_usage
        self._before_usage = None
        if self._boxes() == set_by_log:  # the user did not change them while the log was shown
            self._set_boxes(*before)

    def _follow_usage_provider(self, result: dict[str, Any]) -> None:
        self._restore_provider()
        if self._before_demo is not None:  # the log replaces the demo's bill: its settings go too
            self._set_boxes(*self._before_demo)
            self._before_demo = None
        providers = {USAGE_PROVIDERS[a] for a in result.get("apis", ()) if a in USAGE_PROVIDERS}
        if len(providers) != 1:
            return  # a server's log, or a mix: the boxes stay as the user left them
        before = self._boxes()
        provider = providers.pop()
        models = self.rules_data["providers"][provider]["models"]
        named = [r.get("model") for r in result.get("requests", ()) if r.get("model")]
        self._set_boxes(provider, named[0] if len(set(named)) == 1 and named[0] in models else None)
        self._before_usage = (before, self._boxes())

    def _show(self, result: dict[str, Any]) -> None:
        if self.usage is not None:  # the bars' legend back in place of the cost lines'
            self._bars_legend()
        self.usage = None
        for key, line in self.cost_lines.items():
            line.setData([], [])
        for bar in self.bars.values():
            bar.setVisible(True)
        self.plot.setLabel("bottom", "request")
        self.plot.setLabel("left", "prompt tokens")
        rows, t, r = result["requests"], result["totals"], result["rules"]
        self.total_label.setText(
            f"<b>{_money(t['cost_usd'])}</b> with caching vs <b>{_money(t['cost_without_cache_usd'])}</b> without "
            f"— {saving_words(t['savings_fraction'])} · {t['requests']:,} requests, {t['prompt_tokens']:,} prompt "
            f"tokens: {t['read_tokens']:,} read, {t['write_tokens']:,} written, {t['uncached_tokens']:,} uncached · "
            f"{t['num_notes']:,} note{'' if t['num_notes'] == 1 else 's'}")
        if "models" in result:  # priced per request: each model's own rules
            priced = " · ".join(f"{name}: {m['totals']['requests']:,} requests, write {m['rules']['write_multiplier']}x,"
                                f" read {m['rules']['read_multiplier']}x, minimum {m['rules']['min_cacheable_tokens']}"
                                f" tokens, {_money(m['totals']['cost_usd'])}" for name, m in result["models"].items())
            rules = f"{r['label']} · per request ({priced}), TTL {r['ttl_seconds']:.0f} s (rules checked {r['checked']})"
        else:
            rules = (f"{r['label']} · {r['model']}: write {r['write_multiplier']}x, read {r['read_multiplier']}x, "
                     f"minimum {r['min_cacheable_tokens']} tokens, TTL {r['ttl_seconds']:.0f} s "
                     f"(rules checked {r['checked']})")
        self.rules_label.setText(f"{rules} · token counts: {result.get('token_counts', '')}")
        self.table_model.set_rows(rows, bill_cells, columns=COLUMNS, tip=_notes_tip)
        self.table.resizeColumnsToContents()
        x = np.arange(len(rows), dtype=float)
        unc = np.array([row["uncached_tokens"] for row in rows], dtype=float)
        wr = np.array([row["write_tokens"] for row in rows], dtype=float)
        rd = np.array([row["read_tokens"] for row in rows], dtype=float)
        self.bars["uncached"].setOpts(x=x, height=unc, y0=np.zeros_like(unc))
        self.bars["write"].setOpts(x=x, height=wr, y0=unc)
        self.bars["read"].setOpts(x=x, height=rd, y0=unc + wr)
        self._top = float((unc + wr + rd).max()) if len(rows) else 1.0
        self.plot.setXRange(-0.6, max(len(rows) - 0.4, 0.4), padding=0)
        self._fit_y()

    def _fit_y(self, *_: Any) -> None:
        """Headroom above the tallest bar (or cost) for the one-row legend, in the plot's
        pixels: a fixed 18% left the bars under the legend in a short, stacked plot."""
        height = self.plot.plotItem.vb.height()
        legend = self.plot.plotItem.legend
        room = legend.boundingRect().height() + 10 if legend.items else 0.0
        share = min(0.5, room / height) if height > 0 else 0.18
        self.plot.setYRange(0, (self._top or 1.0) / (1.0 - share) * 1.03, padding=0)


def _count_lines(source: str, stop: int) -> int:
    """Lines in the file `source` (0 for what is not a readable file), counted in chunks
    until more than `stop` are seen: a cheap bound on a JSONL trace's requests."""
    n = 0
    if not os.path.isfile(source):  # a FIFO or device is never opened here
        return 0
    try:
        with open(source, "rb") as fh:
            while n <= stop:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                n += chunk.count(b"\n")
    except OSError:
        return 0
    return n


def _bill_job(source: str, cached: tuple[str, list[Any], str] | None, settings: dict[str, Any],
              db: str | None, limit: int | None = None,
              progress: Progress | None = None) -> tuple[tuple[str, list[Any], str], dict[str, Any]]:
    """Worker thread: load (once per source) and bill; a source of more than `limit`
    requests is refused in one sentence (the panel shows it) before it is billed.
    `progress(done, total)` is `engine.analysis.billing`'s, while reading and billing."""
    from engine.analysis import billing

    if cached is None:
        if limit is not None and _count_lines(source, limit) > limit:  # a JSONL trace: one request a line
            raise InputError(f"the trace has more than the {limit:,} requests billed when it opens; "
                             f"press Enter in the source field to bill them all")
        reqs, note = billing.load_billing_requests(source, db, progress=progress)
        cached = (source, reqs, note)
    if limit is not None and len(cached[1]) > limit:
        raise InputError(f"{len(cached[1]):,} requests are more than the {limit:,} billed when a trace opens; "
                         f"press Enter in the source field to bill them all")
    rules = billing.provider_rules(settings["provider"], settings["model"], settings["ttl"], settings["price"])
    # As `cachescope billing` without --model: a request naming its model is priced by it.
    model_rules = (None if settings["model"] is not None else
                   billing.rules_for_models(cached[1], settings["provider"], settings["ttl"], settings["price"],
                                            source=source))
    result = billing.bill(cached[1], rules, billing.parse_breakpoints(settings["breakpoints"], rules), model_rules,
                          progress=progress)
    result["token_counts"] = cached[2]
    result["source"] = source
    return cached, result
