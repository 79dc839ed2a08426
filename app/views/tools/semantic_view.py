"""The Semantic cache panel: neighbours of a prompt with scores and risk flags, a 2-D PCA map
with the threshold drawn, a live threshold slider and guarded toggle, and the precision and
false-hit rate the labelled pairs give at that threshold. Cache logic is `engine.semantic.cache`.
A demo can show its own cache here (`show_cache`); it goes when another subject opens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView, QCheckBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton, QSlider,
    QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from app.ui import theme
from app.ui.widgets import PanelView
from engine.semantic.cache import NEAR_MISS_MARGIN, Neighbour, SemanticResult, decide
from engine.semantic.risk import risk_flags

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject

SLIDER_MIN = 50  # thresholds 0.50 .. 1.00 in steps of 0.01
_DECISION_TEXT = {"hit": "HIT: served from the cache", "miss": "MISS: the model must answer",
                  "guarded_miss": "GUARDED MISS: a flagged neighbour was not served"}


def _with_all_flags(result: SemanticResult) -> tuple[Neighbour, ...]:
    """Neighbours with flags computed for every one, so that any threshold can be replayed."""
    return tuple(Neighbour(n.entry_id, n.score, n.prompt, n.response, tuple(risk_flags(result.prompt, n.prompt)))
                 for n in result.neighbours)


class SemanticView(PanelView):
    """`SemanticView(ctx, cache=None)`: with no cache one is made when first needed.

    Lookups run on `ctx.worker` when there is one; `sigLookedUp(SemanticResult)` fires in the
    GUI thread after each. Lookups made elsewhere reach the view as `SemanticLookup` events
    through `ctx.bridge.sigEvents`.
    """

    sigLookedUp = Signal(object)
    sigQualityReady = Signal(dict)

    def __init__(self, ctx: AppContext, cache: Any = None, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.cache = cache
        self.cache_source: str | None = None  # the demo whose cache is shown, None for the app's own
        self.result: SemanticResult | None = None
        self.neighbours: tuple[Neighbour, ...] = ()
        self.decision = "miss"
        self.served_id: int | None = None
        self.quality: dict[str, Any] | None = None  # labelled-pair scores and flags
        self._projection: tuple[np.ndarray, np.ndarray] | None = None  # (mean, 2 x dim components)
        self._entry_points: dict[int, np.ndarray] = {}
        self._measuring = False
        self._build()
        ctx.bridge.sigEvents.connect(self._on_events)
        if cache is not None:
            self._sync_from_cache()

    # ------------------------------------------------------------------ layout
    def _build(self) -> None:
        self.prompt = QLineEdit()
        self.prompt.setPlaceholderText("a prompt to look up in the semantic cache")
        self.prompt.returnPressed.connect(self.look_up)
        self.lookup_button = QPushButton("Look up")
        self.lookup_button.clicked.connect(self.look_up)
        self.guard = QCheckBox("Guarded")
        self.guard.setToolTip("a neighbour with a risk flag is not served")
        self.guard.toggled.connect(self._on_guard)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(SLIDER_MIN, 100)
        self.slider.setValue(90)
        self.slider.valueChanged.connect(self._on_slider)
        self.threshold_label = QLabel()
        self.decision_label = QLabel("no lookup yet")
        self.decision_label.setObjectName("semanticDecision")
        self.quality_label = QLabel("labelled pairs: not measured yet")
        self.quality_label.setWordWrap(True)

        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["score", "stored prompt", "risk flags"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)

        self.plot = pg.PlotWidget()
        self.plot.setAspectLocked(True)
        self.plot.hideAxis("left")
        self.plot.hideAxis("bottom")
        self.plot.setMinimumHeight(180)
        self.plot.addLegend(offset=(5, 5))
        # Items are created once; every update goes through setData.
        self.entries_item = pg.ScatterPlotItem(size=6, pen=None, name="stored")
        self.neighbours_item = pg.ScatterPlotItem(size=11, name="neighbours")
        self.query_item = pg.ScatterPlotItem(size=16, symbol="star", name="query")
        self.circle_item = pg.PlotDataItem(name="threshold: every entry with cosine >= t lies inside")
        for item in (self.circle_item, self.entries_item, self.neighbours_item, self.query_item):
            self.plot.addItem(item)
        self._restyle()

        top = QHBoxLayout()
        top.addWidget(self.prompt, 1)
        top.addWidget(self.lookup_button)
        top.addWidget(self.guard)
        slider_row = QHBoxLayout()
        slider_row.addWidget(QLabel("threshold"))
        slider_row.addWidget(self.slider, 1)
        slider_row.addWidget(self.threshold_label)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.table)
        split.addWidget(self.plot)
        split.setSizes([200, 260])
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addLayout(slider_row)
        layout.addWidget(self.decision_label)
        layout.addWidget(split, 1)
        layout.addWidget(self.quality_label)
        self._update_threshold_label()

    def _restyle(self) -> None:
        self.entries_item.setBrush(pg.mkBrush(theme.color("free")))
        self.query_item.setBrush(pg.mkBrush(theme.color("accent")))
        self.query_item.setPen(pg.mkPen(theme.color("text"), width=1))
        self.circle_item.setPen(pg.mkPen(theme.color("warn"), width=1.5, style=Qt.PenStyle.DashLine))
        self.plot.setBackground(theme.color("panel"))
        self._draw_neighbours()

    # ------------------------------------------------------------------ properties
    @property
    def threshold(self) -> float:
        return self.slider.value() / 100.0

    def set_threshold(self, value: float) -> None:
        self.slider.setValue(int(round(value * 100)))

    # ------------------------------------------------------------------ cache
    def _ensure_cache(self) -> Any:
        if self.cache is None:
            from engine.semantic.cache import Embedder, SemanticCache

            store = self.ctx.store
            self.cache = SemanticCache(Embedder(), store, model=self.ctx.model_name or "",
                                       threshold=self.threshold, guard=self.guard.isChecked())
        return self.cache

    def _sync_from_cache(self) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(int(round(self.cache.threshold * 100)))
        self.slider.blockSignals(False)
        self.guard.blockSignals(True)
        self.guard.setChecked(self.cache.guard)
        self.guard.blockSignals(False)
        self._update_threshold_label()
        self._fit_projection()

    def apply_theme(self, name: str | None = None) -> None:
        self._restyle()

    def _submit(self, fn: Any, on_done: Any) -> None:
        self.ctx.worker.submit(fn, on_done=on_done, on_error=self._on_error)

    def _on_error(self, exc: BaseException) -> None:
        if self.lookup_button is not None:
            self.lookup_button.setEnabled(True)
        self.ctx.show_error(str(exc))

    def look_up(self) -> None:
        text = self.prompt.text().strip()
        if not text:
            self._on_error(ValueError("type a prompt to look up"))
            return
        self.lookup_button.setEnabled(False)

        def job() -> SemanticResult:
            return self._ensure_cache().lookup(text)

        def done(result: SemanticResult) -> None:
            self.lookup_button.setEnabled(True)
            self.show_result(result)
            self.sigLookedUp.emit(result)
            if self.quality is None and not self._measuring:
                self.measure_quality()  # the embedder is loaded now; score the pairs in the background

        self._submit(job, done)

    def measure_quality(self, pairs_path: Any = None) -> None:
        """Score the labelled pairs once (worker thread) so the slider can show precision."""
        from engine.resources import resource_path
        from engine.semantic.evaluation import load_pairs, pair_flags, pair_scores

        self._measuring = True
        self.quality_label.setText("labelled pairs: measuring…")

        def job() -> dict[str, Any]:
            pairs = load_pairs(pairs_path or resource_path("semantic_pairs_heldout.jsonl"))
            scores = pair_scores(pairs, self._ensure_cache().embedder)
            flagged = np.array([bool(f) for f in pair_flags(pairs)])
            return {"scores": scores, "same": np.array([p.same for p in pairs]), "flagged": flagged,
                    "num_pairs": len(pairs)}

        def done(quality: dict[str, Any]) -> None:
            self._measuring = False
            self.quality = quality
            self._update_quality()
            self.sigQualityReady.emit(quality)

        self._submit(job, done)

    # ------------------------------------------------------------------ subjects
    def show_cache(self, cache: Any, prompt: str | None, source: str) -> None:
        """Show a demo's cache (`source`, its title) and, with `prompt`, look that prompt up in it."""
        self.cache = cache
        self.cache_source = source
        self.result = None
        self.neighbours = ()
        self.table.setRowCount(0)
        self._sync_from_cache()
        self.guard.setChecked(False)  # the story starts unguarded: the wrong answer is served
        self.decision_label.setText(f"the cache of the demo \u201c{source}\u201d")
        if prompt:
            self.prompt.setText(prompt)
            self.look_up()

    def show_subject(self, subject: Subject) -> None:
        if self.cache_source is None or (subject.kind == "demo" and subject.title == self.cache_source):
            return
        # The demo's cache is not the app's: go back to the app's own (built on first lookup).
        self.cache, self.cache_source, self.result = None, None, None
        self.neighbours = ()
        self._projection = None
        self.table.setRowCount(0)
        self.entries_item.setData([], [])
        self._draw_neighbours()
        self.decision_label.setStyleSheet("")
        self.decision_label.setText("no lookup yet")

    # ------------------------------------------------------------------ model -> view
    def _on_events(self, events: list) -> None:
        lookups = [e for e in events if getattr(e, "kind", "") == "semantic_lookup"]
        changed = any(getattr(e, "kind", "") in ("semantic_stored", "semantic_evicted") for e in events)
        if changed and self.cache is not None:
            self._fit_projection()
        if not lookups or self.cache is None:
            return
        event = lookups[-1]
        if self.result is not None and self.result.prompt == event.prompt and self.result.threshold == event.threshold:
            return  # our own lookup, already shown
        neighbours = []
        for entry_id, score in event.neighbours:
            try:
                e = self.cache.entry(entry_id)
            except ValueError:
                continue  # evicted since
            neighbours.append(Neighbour(entry_id, score, e.prompt, e.response))
        embedding = self.cache.embedder.encode_one(event.prompt) if self._projection is not None else np.zeros(0)
        result = SemanticResult(event.prompt, event.decision, event.threshold, event.guard, tuple(neighbours),
                                None, embedding, event.tenant)
        self.prompt.setText(event.prompt)
        self.slider.blockSignals(True)
        self.slider.setValue(int(round(event.threshold * 100)))
        self.slider.blockSignals(False)
        self.guard.blockSignals(True)
        self.guard.setChecked(event.guard)
        self.guard.blockSignals(False)
        self.show_result(result)

    def show_result(self, result: SemanticResult) -> None:
        self.result = result
        self.neighbours = _with_all_flags(result)
        self._fit_projection()
        self._replay()

    # ------------------------------------------------------------------ view -> model
    def _on_slider(self, _value: int) -> None:
        if self.cache is not None:
            self.cache.set_threshold(self.threshold)
        self._update_threshold_label()
        self._replay()

    def _on_guard(self, on: bool) -> None:
        if self.cache is not None:
            self.cache.set_guard(on)
        self._replay()
        self._update_quality()

    def _update_threshold_label(self) -> None:
        self.threshold_label.setText(f"{self.threshold:.2f}")
        self._update_quality()

    # ------------------------------------------------------------------ drawing
    def _replay(self) -> None:
        """Decide again for the current threshold and guard, without a new lookup."""
        if self.result is None:
            return
        self.decision, served = decide(self.neighbours, self.threshold, self.guard.isChecked())
        self.served_id = served.entry_id if served else None
        self.decision_label.setText(_DECISION_TEXT[self.decision] + (f"  (entry {self.served_id})" if served else ""))
        colour = {"hit": "cached", "miss": "miss", "guarded_miss": "warn"}[self.decision]
        self.decision_label.setStyleSheet(f"color: {theme.color(colour).name()}; font-weight: bold;")
        self._fill_table()
        self._draw_neighbours()

    def _fill_table(self) -> None:
        self.table.setRowCount(len(self.neighbours))
        for row, n in enumerate(self.neighbours):
            above = n.score >= self.threshold
            # Flags matter for hits and near misses; on a distant entry they are noise.
            near = n.score >= self.threshold - NEAR_MISS_MARGIN
            flags = "; ".join(str(f) for f in n.flags) if near else ""
            items = [QTableWidgetItem(f"{n.score:.3f}"), QTableWidgetItem(n.prompt),
                     QTableWidgetItem(flags or ("-" if near else "(far)"))]
            items[0].setData(Qt.ItemDataRole.UserRole, n.entry_id)
            items[1].setToolTip(f"response: {n.response}")
            colour = theme.color("cached" if n.entry_id == self.served_id else ("warn" if above else "text_dim"))
            for col, item in enumerate(items):
                if col != 2 or not flags:
                    item.setForeground(colour)
                else:
                    item.setForeground(theme.color("miss"))
                self.table.setItem(row, col, item)

    def _fit_projection(self) -> None:
        """PCA of every stored embedding of this cache (recomputed when entries change)."""
        if self.cache is None:
            return
        entries = self.cache.entries(all_tenants=True)
        if len(entries) < 3:
            self._projection = None
            self.entries_item.setData([], [])
            return
        vecs = np.stack([self.cache.embedding(e.id) for e in entries])
        mean = vecs.mean(axis=0)
        _u, _s, vt = np.linalg.svd(vecs - mean, full_matrices=False)
        self._projection = (mean, vt[:2])
        pts = (vecs - mean) @ vt[:2].T
        self._entry_points = {e.id: pts[i] for i, e in enumerate(entries)}
        self.entries_item.setData(pts[:, 0], pts[:, 1], data=[e.id for e in entries])
        self._draw_neighbours()

    def _draw_neighbours(self) -> None:
        if self._projection is None or self.result is None or self.result.embedding.size == 0:
            self.neighbours_item.setData([], [])
            self.query_item.setData([], [])
            self.circle_item.setData([], [])
            return
        mean, comps = self._projection
        q = (self.result.embedding - mean) @ comps.T
        self.query_item.setData([q[0]], [q[1]])
        pts = [self._entry_points[n.entry_id] for n in self.neighbours if n.entry_id in self._entry_points]
        brushes = []
        for n in self.neighbours:
            if n.entry_id not in self._entry_points:
                continue
            key = "cached" if n.entry_id == self.served_id else ("miss" if n.flags and n.score >= self.threshold
                                                               else ("warn" if n.score >= self.threshold else "text_dim"))
            brushes.append(pg.mkBrush(theme.color(key)))
        if pts:
            arr = np.array(pts)
            self.neighbours_item.setData(arr[:, 0], arr[:, 1], brush=brushes, pen=pg.mkPen(theme.color("text"), width=0.5))
        else:
            self.neighbours_item.setData([], [])
        # Unit vectors with cosine >= t lie within chord distance sqrt(2 - 2t); a projection
        # never lengthens distances, so every entry above the threshold is inside the circle.
        radius = float(np.sqrt(max(0.0, 2.0 - 2.0 * self.threshold)))
        angle = np.linspace(0, 2 * np.pi, 120)
        self.circle_item.setData(q[0] + radius * np.cos(angle), q[1] + radius * np.sin(angle))

    def _update_quality(self) -> None:
        if self.quality is None:
            return
        t = self.threshold
        hits = self.quality["scores"] >= t
        same = self.quality["same"]
        guarded = hits & ~self.quality["flagged"]
        parts = []
        for name, h in (("plain", hits), ("guarded", guarded)):
            n = int(h.sum())
            precision = (h & same).sum() / n if n else float("nan")
            recall = (h & same).sum() / same.sum()
            parts.append(f"{name}: precision {precision:.2f}, false-hit rate {1 - precision:.2f}, recall {recall:.2f}"
                         if n else f"{name}: no hits")
        mark = " (guarded mode on)" if self.guard.isChecked() else ""
        self.quality_label.setText(f"labelled pairs ({self.quality['num_pairs']}) at {t:.2f}{mark} | "
                                   + " | ".join(parts))
