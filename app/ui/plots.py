"""Plot pieces every view shares: `CountAxis` (round, non-colliding ticks for counts) and
`PlotStack` (plots in rows over one shared x axis, rows stepping out when the dock is short).

What any one view plots lives with that view; only the axes, the stack and the curves'
reduction to the pixels they have (`peak_reduce`, the timelines' and the remote plots') live here.

Every PlotStack takes the keyboard (`TIMELINE_KEYS`, listed in Help > Keyboard shortcuts):
W / S (or + / -) zoom the x axis in and out around its centre, A / D (or the arrows) pan
it, Home shows everything again, R selects the range in view (a draggable band; its edges
can be dragged), Esc clears it. The mouse selects a range too: drag across a row with
Shift held (a plain drag still pans). A stack whose x axis is the event seq binds to the
app's shared `EventFilter`: its range selection filters the other views to that window of
events, and the events the shared filter keeps are marked along the bottom of each row.
A stack over another x (the server clock of a remote pool) binds the same way through
`map_x`, which turns its x range into event seqs and seqs into x.
"""

from __future__ import annotations

import math

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QRectF, Qt, Signal
from PySide6.QtGui import QFontMetrics, QKeyEvent, QMouseEvent, QResizeEvent, QShowEvent
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.runtime.selection import EventFilter, shared_filter
from app.ui import theme
from app.ui.timeline_keys import TIMELINE_KEYS  # noqa: F401 - re-exported: the keys PlotStack takes

HEADER_WIDTH = 78  # the column of row titles left of the plots
AXIS_WIDTH = 44  # every left axis equally wide, so the linked x axes line up
MIN_ROW_PX = 42  # a plot row shorter than this is unreadable: it steps out instead
X_AXIS_PX = 40  # tick labels and title of the shared x axis
ROW_GAP_PX = 8  # between two rows: a row's "0" and the next row's top label stay apart
MARGIN_PX = 2  # above the first row and below the x axis
PLOT_FRAME_PX = 2  # a PlotItem's own margins around its view box (1 px each side)
QWIDGETSIZE_MAX = 16777215
ZOOM_STEP = 0.8  # W keeps 80% of the span in view, S shows 125%
PAN_STEP = 0.2  # A / D move the view by a fifth of its span
MAX_MARKS = 4000  # matching events drawn as marks; more are merged per pixel column
SEQ_LABEL = "event seq"



# Curves are drawn from at most this many bins of events across the range shown (two
# points each): more than the pixels of a wide screen, so nothing visible is lost.
CURVE_BINS = 2048


def peak_reduce(x: np.ndarray, y: np.ndarray, lo: float, hi: float, bins: int = CURVE_BINS) -> tuple[np.ndarray, np.ndarray]:
    """`x` (sorted), `y` as at most about 2 * `bins` points across [lo, hi]: each bin's lowest
    and highest sample; the samples just outside the range and the series' first and last
    ones are kept, so the curve runs on past the view's edges and ends exactly where it does."""
    n = len(x)
    if n <= 2 * bins + 2:
        return x, y
    i0 = max(0, int(np.searchsorted(x, lo, side="left")) - 1)
    i1 = min(n, int(np.searchsorted(x, hi, side="right")) + 1)
    m = i1 - i0
    if m <= 2 * bins:
        xs, ys = x[i0:i1], y[i0:i1]
    else:
        starts = (np.arange(bins, dtype=np.int64) * m) // bins
        seg = y[i0:i1]
        lows, highs = np.minimum.reduceat(seg, starts), np.maximum.reduceat(seg, starts)
        xs = np.repeat(x[i0 + starts], 2)
        ys = np.column_stack([lows, highs]).ravel()
    if i0 > 0:
        xs, ys = np.concatenate(([x[0]], xs)), np.concatenate(([y[0]], ys))
    if xs[-1] != x[-1] or ys[-1] != y[-1]:
        xs, ys = np.concatenate((xs, [x[-1]])), np.concatenate((ys, [y[-1]]))
    return xs, ys

def nice_step(raw: float) -> float:
    """The smallest of 1, 2, 5 × 10^k that is at least `raw`."""
    if raw <= 0:
        return 1.0
    p10 = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 5.0, 10.0):
        if factor * p10 >= raw * (1 - 1e-9):
            return factor * p10
    return 10.0 * p10


def smaller_step(step: float) -> float:
    """The 1, 2, 5 × 10^k step just below `step` (5 -> 2 -> 1 -> 0.5)."""
    p10 = 10.0 ** math.floor(math.log10(step) + 1e-9)
    factor = round(step / p10)
    return {5: 2.0, 2: 1.0}.get(factor, 0.5) * p10


class CountAxis(pg.AxisItem):
    """Ticks at round values spaced so their labels never collide, whole numbers for counts.

    The spacing is measured, not guessed: a step is kept only when the widest label it would
    print (in the axis' own font) fits between two ticks with a gap, so "100,000" and
    "150,000" cannot run together where "10" and "20" would have fitted. A short row still
    reads: the step shrinks (while labels fit) until two ticks carry labels, and a side
    axis drops a tick whose label would stick out over the top of its plot, into the row
    above (or past the stack's edge, where it is cut).
    """

    GAP_PX = 12  # clear space between two horizontal labels
    MAX_STEPS = 40
    OVERHANG_PX = 2  # how far a side label may reach over its plot's top (the gap below is wider)

    def __init__(self, orientation: str, integer: bool = True) -> None:
        super().__init__(orientation)
        self.integer = integer
        self.names: list[str] = []  # when set, x = 1..n print as these names (request ids)
        self.enableAutoSIPrefix(False)

    def _font_metrics(self) -> QFontMetrics:
        font = self.style.get("tickFont") or self.font()
        return QFontMetrics(font)

    def label_extent(self, values: list[float], step: float) -> float:
        """Pixels one label needs along the axis (its width, or its height on a vertical axis)."""
        fm = self._font_metrics()
        if self.orientation in ("left", "right"):
            return fm.height() + 4
        texts = self.tickStrings(values, 1.0, step)
        return max((fm.horizontalAdvance(t) for t in texts), default=0) + self.GAP_PX

    def tickSpacing(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, float]]:
        lo, hi = min(minVal, maxVal), max(minVal, maxVal)
        span = hi - lo
        if span <= 0 or size <= 0:
            return []
        step = nice_step(span / max(2.0, size / 40.0))
        if self.integer:
            step = max(1.0, step)
        for _ in range(self.MAX_STEPS):
            if self._fits(lo, hi, size, step):
                break
            step = nice_step(step * 1.0001)
        # Rounding up to a nice step can leave one tick in a short row (0 to 4,282 in 47 px
        # took 5,000: only "0" showed): a smaller step while its labels still fit.
        for _ in range(self.MAX_STEPS):
            smaller = smaller_step(step)
            if len(self._labelled(lo, hi, size, step)) >= 2 or (self.integer and smaller < 1.0) \
                    or not self._fits(lo, hi, size, smaller):
                break
            step = smaller
        return [(step, 0.0)]

    def tickValues(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, list[float]]]:
        levels = super().tickValues(minVal, maxVal, size)
        if self.orientation not in ("left", "right") or self.logMode:
            return levels
        lo, hi = min(minVal, maxVal), max(minVal, maxVal)
        return [(step, self._labelled(lo, hi, size, step, values)) for step, values in levels]

    def _fits(self, lo: float, hi: float, size: float, step: float) -> bool:
        """Whether labels `step` apart fit between their ticks over [lo, hi] in `size` pixels."""
        first = math.ceil(lo / step) * step
        values = [first + i * step for i in range(int((hi - first) // step) + 1)] or [first]
        return step / (hi - lo) * size >= self.label_extent(values, step)

    def _labelled(self, lo: float, hi: float, size: float, step: float,
                  values: list[float] | None = None) -> list[float]:
        """The ticks `step` apart in [lo, hi] (or `values`) whose labels stay on the plot: on a
        side axis, not those whose label (drawn at 0.8 of a line, centred on its tick) reaches
        more than OVERHANG_PX over the top."""
        if values is None:
            first = math.ceil(lo / step) * step
            values = [first + i * step for i in range(int((hi - first) // step) + 1)]
        if self.orientation not in ("left", "right") or size <= 0 or hi <= lo:
            return list(values)
        over = self._font_metrics().height() * 0.4 - self.OVERHANG_PX
        top = hi - max(0.0, over) * (hi - lo) / size
        return [v for v in values if v <= top]

    def boundingRect(self) -> QRectF:
        # with a grid pyqtgraph culls the "0" half past the axis end; let it overhang a little
        rect = super().boundingRect()
        return rect.adjusted(0, -8, 0, 8) if self.orientation in ("left", "right") else rect

    def tickStrings(self, values: list[float], scale: float, spacing: float) -> list[str]:
        if self.names:  # the same names the chat, hash chains and log use; spacing measures them
            n = len(self.names)
            return [self.names[int(v) - 1] if v == int(v) and 1 <= v <= n else "" for v in values]
        if self.orientation in ("left", "right") and max((abs(v) for v in values), default=0) >= 10_000:
            return [compact_count(v) for v in values]  # a narrow side axis cannot hold "16,000"
        if self.integer or spacing >= 1:
            return [f"{v:,.0f}" for v in values]
        return super().tickStrings(values, scale, spacing)


def compact_count(v: float) -> str:
    """16000 -> "16k", 2500000 -> "2.5M": counts short enough for a 44-pixel axis."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{unit}"
    return f"{v:,.0f}"


def row_heights(room: int, stretches: list[int], least: int) -> list[int]:
    """`room` pixels shared among rows by their stretch, none below `least` (or an equal
    share when the room is short of that), whole pixels, the rest to the first row."""
    n = len(stretches)
    if n == 0:
        return []
    room = max(0, int(room))
    least = min(least, room // n)
    heights = [0.0] * n
    free = list(range(n))  # rows not yet held at `least`
    while True:
        left = room - least * (n - len(free))
        total = sum(stretches[i] for i in free) or 1
        low = [i for i in free if left * stretches[i] / total < least]
        if not low:
            for i in free:
                heights[i] = left * stretches[i] / total
            break
        for i in low:
            heights[i] = least
            free.remove(i)
    whole = [int(h) for h in heights]
    whole[0] += room - sum(whole)
    return whole


class PlotStack(pg.GraphicsLayoutWidget):
    """Plots stacked in rows over one shared x axis, each with its title in a column of its
    own (rotated axis labels collide on short rows). Tick labels show under the last row
    only, and when the dock is too short for every row, rows of low priority step out.

    Keys zoom, pan and select a range (`TIMELINE_KEYS`); `sigRangeSelected` gives the
    selected (first, last) x, or None when cleared. With `events_on_x` (the default when
    the x axis is the event seq) the stack binds to its panel's shared `EventFilter` when
    first shown (or at `bind_events`)."""

    sigRangeSelected = Signal(object)

    def __init__(self, x_label: str, header_width: int = HEADER_WIDTH, events_on_x: bool | None = None) -> None:
        self.rows: list[tuple[pg.LabelItem, pg.PlotItem, int]] = []
        self.regions: list[pg.LinearRegionItem] = []  # before Qt's constructor sends events
        self.marks: list[pg.ScatterPlotItem] = []
        super().__init__()
        self.x_label = x_label
        self.events_on_x = x_label == SEQ_LABEL if events_on_x is None else events_on_x
        self.selected_range: tuple[float, float] | None = None
        self.shared: EventFilter | None = None
        self._mark_x = np.zeros(0)
        self._moving_region = False
        self._drag_from: float | None = None  # x where a Shift-drag began
        # x to seqs and back, for a stack whose x is not the seq (`map_x`)
        self._x_to_seqs: Any = None
        self._seqs_to_x: Any = None
        self._sent: tuple[int, int] | None = None  # the seq range a mapped selection last set
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setToolTip("W/S zoom, A/D pan, Home shows all, R selects the range in view, Shift+drag selects "
                        "a range, Esc clears it")
        self.priority: list[int] = []  # row indices, the most important first
        self.shown: list[bool] = []
        layout = self.ci.layout
        layout.setContentsMargins(2, MARGIN_PX, 6, MARGIN_PX)
        layout.setVerticalSpacing(ROW_GAP_PX)
        layout.setHorizontalSpacing(0)
        layout.setColumnFixedWidth(0, header_width)
        # The plots take the room the labels above leave and never ask for more: in a dock's
        # scroll area a preferred height would force a vertical scroll bar.
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.setMinimumHeight(MIN_ROW_PX + X_AXIS_PX)

    def add(self, stretch: int) -> tuple[pg.LabelItem, pg.PlotItem]:
        """A new row under the others (rows share the first row's x range)."""
        plot = pg.PlotItem(axisItems={"left": CountAxis("left"), "bottom": CountAxis("bottom")})
        plot.setMenuEnabled(False)
        plot.hideButtons()
        plot.getAxis("left").setWidth(AXIS_WIDTH)
        plot.setLabel("bottom", self.x_label)
        if self.rows:
            plot.setXLink(self.rows[0][1])
        header = pg.LabelItem(justify="right")
        self.ci.addItem(header, row=len(self.rows), col=0)
        self.ci.addItem(plot, row=len(self.rows), col=1)
        self.rows.append((header, plot, stretch))
        self.priority.append(len(self.rows) - 1)
        region = pg.LinearRegionItem(orientation="vertical", movable=True)
        region.setZValue(-5)  # under the curves
        region.setVisible(False)
        region.sigRegionChangeFinished.connect(self._on_region_moved)
        plot.addItem(region, ignoreBounds=True)
        self.regions.append(region)
        marks = pg.ScatterPlotItem(symbol="|", size=9, pxMode=True)
        marks.setZValue(20)
        plot.addItem(marks, ignoreBounds=True)
        self.marks.append(marks)
        plot.getViewBox().sigYRangeChanged.connect(lambda *_a, i=len(self.marks) - 1: self._place_marks(i))
        self._style_overlays()
        return header, plot

    # ------------------------------------------------------------------ keyboard
    def x_range(self) -> tuple[float, float]:
        lo, hi = self.rows[0][1].getViewBox().viewRange()[0]
        return float(lo), float(hi)

    def set_x_range(self, lo: float, hi: float) -> None:
        if self.rows and hi > lo:
            self.rows[0][1].getViewBox().setXRange(lo, hi, padding=0)

    def zoom(self, factor: float) -> None:
        """Keep `factor` of the x span in view, around its centre (< 1 zooms in)."""
        if not self.rows:
            return
        lo, hi = self.x_range()
        c, half = (lo + hi) / 2, (hi - lo) * factor / 2
        self.set_x_range(c - half, c + half)

    def pan(self, fraction: float) -> None:
        """Move the view by `fraction` of its span (negative: to the left)."""
        if not self.rows:
            return
        lo, hi = self.x_range()
        d = (hi - lo) * fraction
        self.set_x_range(lo + d, hi + d)

    def show_all(self) -> None:
        if self.rows:
            self.rows[0][1].getViewBox().enableAutoRange(x=True)

    def keyPressEvent(self, ev: QKeyEvent | None) -> None:
        if ev is None or not self.rows:
            super().keyPressEvent(ev)
            return
        k = ev.key()
        K = Qt.Key
        if k in (K.Key_W, K.Key_Plus, K.Key_Equal):
            self.zoom(ZOOM_STEP)
        elif k in (K.Key_S, K.Key_Minus):
            self.zoom(1 / ZOOM_STEP)
        elif k in (K.Key_A, K.Key_Left):
            self.pan(-PAN_STEP)
        elif k in (K.Key_D, K.Key_Right):
            self.pan(PAN_STEP)
        elif k == K.Key_Home:
            self.show_all()
        elif k == K.Key_R:
            self.select_range(*self.x_range())
        elif k == K.Key_Escape and self.selected_range is not None:
            self.select_range(None)
        else:
            super().keyPressEvent(ev)
            return
        ev.accept()

    # ------------------------------------------------------------------ mouse
    def _x_at(self, ev: QMouseEvent) -> float | None:
        """The x under the pointer when it is over a shown row's plot, else None."""
        pos = self.mapToScene(ev.position().toPoint())
        for _header, plot, _stretch in self.rows:
            vb = plot.getViewBox()
            if plot.isVisible() and vb.sceneBoundingRect().contains(pos):
                return float(vb.mapSceneToView(pos).x())
        return None

    def mousePressEvent(self, ev: QMouseEvent | None) -> None:
        if (ev is not None and ev.button() == Qt.MouseButton.LeftButton
                and ev.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            x = self._x_at(ev)
            if x is not None:
                self._drag_from = x
                self.setFocus(Qt.FocusReason.MouseFocusReason)
                self._show_range((x, x))
                ev.accept()
                return
        super().mousePressEvent(ev)

    def mouseMoveEvent(self, ev: QMouseEvent | None) -> None:
        if ev is not None and self._drag_from is not None:
            x = self._x_at(ev)
            if x is not None:
                self._show_range((min(self._drag_from, x), max(self._drag_from, x)))
            ev.accept()
            return
        super().mouseMoveEvent(ev)

    def mouseReleaseEvent(self, ev: QMouseEvent | None) -> None:
        if ev is not None and self._drag_from is not None:
            start, self._drag_from = self._drag_from, None
            x = self._x_at(ev)
            if x is None:  # released off the plots: the band as last drawn
                x = self.regions[0].getRegion()[1] if self.regions else start
            if x == start:  # a Shift-click, not a drag: nothing to select
                self._show_range(self.selected_range)
            else:
                self.select_range(start, x)
            ev.accept()
            return
        super().mouseReleaseEvent(ev)

    # ------------------------------------------------------------------ range selection
    def select_range(self, lo: float | None, hi: float | None = None) -> None:
        """Select [lo, hi] on the x axis (None clears) and tell `sigRangeSelected`."""
        new = None if lo is None or hi is None else (min(lo, hi), max(lo, hi))
        self._show_range(new)
        self.selected_range = new
        self.sigRangeSelected.emit(new)

    def _show_range(self, rng: tuple[float, float] | None) -> None:
        self._moving_region = True
        try:
            for region in self.regions:
                region.setVisible(rng is not None)
                if rng is not None:
                    region.setRegion(rng)
        finally:
            self._moving_region = False

    def _on_region_moved(self, region: pg.LinearRegionItem) -> None:
        if self._moving_region or not region.isVisible():
            return
        lo, hi = region.getRegion()
        self.select_range(float(lo), float(hi))

    def _style_overlays(self) -> None:
        p = theme.palette()
        brush = pg.mkColor(p["accent"])
        brush.setAlpha(40)
        for region in self.regions:
            region.setBrush(brush)
            for line in region.lines:
                line.setPen(pg.mkPen(p["accent"], width=1.5))
        for m in self.marks:
            m.setPen(pg.mkPen(p["text"], width=1.5))
            m.setBrush(None)

    def apply_theme(self) -> None:
        """Restyle the range band and the filter marks in the current theme."""
        self._style_overlays()

    def changeEvent(self, ev: QEvent) -> None:
        # theme.apply_theme sets the application palette: restyle with it
        super().changeEvent(ev)
        if ev.type() == QEvent.Type.PaletteChange and hasattr(self, "_mark_x") and not getattr(self, "closed", False):
            self.apply_theme()

    # ------------------------------------------------------------------ the shared filter
    def showEvent(self, ev: QShowEvent) -> None:
        super().showEvent(ev)
        if (self.events_on_x or self._x_to_seqs is not None) and self.shared is None:
            owner: QWidget | None = self.parentWidget()
            while owner is not None and getattr(owner, "ctx", None) is None:
                owner = owner.parentWidget()
            if owner is not None:
                self.bind_events(shared_filter(owner.ctx))  # type: ignore[attr-defined]

    def map_x(self, x_to_seqs: Any, seqs_to_x: Any) -> None:
        """Bind a stack whose x is not the event seq: `x_to_seqs(lo, hi)` gives the (first,
        last) seq of the events in [lo, hi] (None when none is), `seqs_to_x(seqs)` the x of
        each seq of an int array. Bound to the shared filter when first shown."""
        self._x_to_seqs, self._seqs_to_x = x_to_seqs, seqs_to_x

    def bind_events(self, shared: EventFilter) -> None:
        """x is the event seq: a range selection sets `shared`'s range (whole seqs), and
        the events its filter keeps are marked."""
        if self.shared is shared:
            return
        self.shared = shared
        self.sigRangeSelected.connect(self._range_to_shared)
        shared.sigChanged.connect(self.update_marks)
        shared.state.sigChanged.connect(self._catch_up_marks)
        self.update_marks()

    def _range_to_shared(self, rng: tuple[float, float] | None) -> None:
        if self.shared is None:
            return
        if rng is None:
            self._sent = None
            self.shared.set_range(None)
        elif self._x_to_seqs is not None:
            seqs = self._x_to_seqs(rng[0], rng[1])
            # no event in the window: a range that keeps none (seqs start at 0)
            self._sent = (int(seqs[0]), int(seqs[1])) if seqs is not None else (-1, -1)
            self.shared.set_range(*self._sent)
        else:
            self.shared.set_range(math.ceil(rng[0]), math.floor(rng[1]))

    def _catch_up_marks(self) -> None:
        if self.shared is not None and self.shared.filter.root is not None and self.isVisible():
            self.update_marks()

    def update_marks(self) -> None:
        """Marks at the seqs the shared filter keeps; the band at its range."""
        shared = self.shared
        if shared is None:
            return
        x = shared.matching_seqs().astype(float) if shared.filter.root is not None else np.zeros(0)
        if self._seqs_to_x is not None and len(x):
            x = np.sort(np.asarray(self._seqs_to_x(x.astype(np.int64)), dtype=float))
        if len(x) > MAX_MARKS:  # one mark per pixel column is all a screen shows
            lo, hi = float(x[0]), float(x[-1])
            bins = np.unique(np.floor((x - lo) / max(1e-9, hi - lo) * MAX_MARKS))
            x = lo + bins * (hi - lo) / MAX_MARKS
        self._mark_x = x
        for i in range(len(self.marks)):
            self._place_marks(i)
        rng = shared.range
        if self._seqs_to_x is not None:
            if rng != self._sent:  # set elsewhere (another timeline, or cleared): shown in this x
                self._sent = rng
                if rng is None or rng[1] < 0:
                    self.selected_range = None
                else:
                    xs = np.asarray(self._seqs_to_x(np.asarray(rng, dtype=np.int64)), dtype=float)
                    self.selected_range = (float(xs.min()), float(xs.max()))
                self._show_range(self.selected_range)
            return
        if rng != (None if self.selected_range is None else
                   (math.ceil(self.selected_range[0]), math.floor(self.selected_range[1]))):
            self.selected_range = None if rng is None else (float(rng[0]), float(rng[1]))
            self._show_range(self.selected_range)

    def _place_marks(self, i: int) -> None:
        """The marks sit along the bottom of row `i`, whatever its y range."""
        if i >= len(self.marks):
            return
        x = self._mark_x
        if not len(x):
            self.marks[i].setData(x=[], y=[])
            return
        y0, y1 = self.rows[i][1].getViewBox().viewRange()[1]
        self.marks[i].setData(x=x, y=np.full(len(x), y0 + (y1 - y0) * 0.06))

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        # GraphicsView.close clears the scene (the items' C++ objects go) and then resizes; a
        # closed stack is restyled no more either (changeEvent)
        if self.rows and not getattr(self, "closed", False):
            self.fit(event.size().height() if event is not None else None)
        super().resizeEvent(event)

    def fit(self, height: int | None = None) -> None:
        """Show as many rows as fit `height` pixels, the most important ones, and size them."""
        height = self.height() if height is None else height
        # each row MIN_ROW_PX with a gap between two, the x axis under the last
        room = max(1, (height - 2 * MARGIN_PX - X_AXIS_PX + ROW_GAP_PX) // (MIN_ROW_PX + PLOT_FRAME_PX + ROW_GAP_PX))
        keep = set(self.priority[:room])
        self.show_rows([i in keep for i in range(len(self.rows))])
        self._size_rows(height)

    def _size_rows(self, height: int) -> None:
        """Each shown row's plot as tall as its stretch gives it, none below MIN_ROW_PX while
        there is room. Left to Qt's layout the last row (which also holds the x axis) came out
        shortest: 23 px under rows of 43 and 36 in a 211 px stack, unreadable."""
        shown = [i for i, on in enumerate(self.shown) if on]
        if not shown:
            return
        room = height - 2 * MARGIN_PX - X_AXIS_PX - (ROW_GAP_PX + PLOT_FRAME_PX) * len(shown) + ROW_GAP_PX
        heights = dict(zip(shown, row_heights(room, [self.rows[i][2] for i in shown], MIN_ROW_PX)))
        layout = self.ci.layout
        for i in range(len(self.rows)):
            on = i in heights
            extra = PLOT_FRAME_PX + (X_AXIS_PX if i == shown[-1] else 0)
            layout.setRowFixedHeight(i, heights[i] + extra if on else 0)
            # a row stepped out takes no gap either
            layout.setRowSpacing(i, ROW_GAP_PX if on and i < shown[-1] else 0)

    def show_rows(self, shown: list[bool]) -> None:
        if shown == self.shown:
            return
        # A row steps out by hiding at zero height: its items stay in the layout and keep
        # their data and links, so stepping back in costs nothing.
        last = max((i for i, on in enumerate(shown) if on), default=-1)
        for i, (header, plot, stretch) in enumerate(self.rows):
            on = shown[i]
            for item in (header, plot):
                item.setVisible(on)
                item.setMinimumHeight(-1 if on else 0)  # -1: its own minimum again
                item.setMaximumHeight(QWIDGETSIZE_MAX if on else 0)
            self.ci.layout.setRowStretchFactor(i, stretch if on else 0)
            axis = plot.getAxis("bottom")
            axis.setStyle(showValues=i == last)
            axis.showLabel(i == last)
        self.shown = list(shown)
