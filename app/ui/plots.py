"""Plot pieces every view shares: `CountAxis` (round, non-colliding ticks for counts) and
`PlotStack` (plots in rows over one shared x axis, rows stepping out when the dock is short).

What any one view plots lives with that view; only the axes and the stack live here.
"""

from __future__ import annotations

import math

import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtGui import QFontMetrics, QResizeEvent
from PySide6.QtWidgets import QSizePolicy

HEADER_WIDTH = 78  # the column of row titles left of the plots
AXIS_WIDTH = 44  # every left axis equally wide, so the linked x axes line up
MIN_ROW_PX = 42  # a plot row shorter than this is unreadable: it steps out instead
X_AXIS_PX = 40  # tick labels and title of the shared x axis
QWIDGETSIZE_MAX = 16777215


def nice_step(raw: float) -> float:
    """The smallest of 1, 2, 5 × 10^k that is at least `raw`."""
    if raw <= 0:
        return 1.0
    p10 = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 5.0, 10.0):
        if factor * p10 >= raw * (1 - 1e-9):
            return factor * p10
    return 10.0 * p10


class CountAxis(pg.AxisItem):
    """Ticks at round values spaced so their labels never collide, whole numbers for counts.

    The spacing is measured, not guessed: a step is kept only when the widest label it would
    print (in the axis' own font) fits between two ticks with a gap, so "100,000" and
    "150,000" cannot run together where "10" and "20" would have fitted.
    """

    GAP_PX = 12  # clear space between two horizontal labels
    MAX_STEPS = 40

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
            first = math.ceil(lo / step) * step
            values = [first + i * step for i in range(int((hi - first) // step) + 1)] or [first]
            if step / span * size >= self.label_extent(values, step):
                break
            step = nice_step(step * 1.0001)
        return [(step, 0.0)]

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


class PlotStack(pg.GraphicsLayoutWidget):
    """Plots stacked in rows over one shared x axis, each with its title in a column of its
    own (rotated axis labels collide on short rows). Tick labels show under the last row
    only, and when the dock is too short for every row, rows of low priority step out."""

    def __init__(self, x_label: str, header_width: int = HEADER_WIDTH) -> None:
        self.rows: list[tuple[pg.LabelItem, pg.PlotItem, int]] = []
        super().__init__()
        self.x_label = x_label
        self.priority: list[int] = []  # row indices, the most important first
        self.shown: list[bool] = []
        layout = self.ci.layout
        layout.setContentsMargins(2, 2, 6, 2)
        layout.setVerticalSpacing(8)  # a row's "0" and the next row's top label stay apart
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
        return header, plot

    def resizeEvent(self, event: QResizeEvent | None) -> None:
        if self.rows:
            self.fit(event.size().height() if event is not None else None)
        super().resizeEvent(event)

    def fit(self, height: int | None = None) -> None:
        """Show as many rows as fit `height` pixels, the most important ones."""
        height = self.height() if height is None else height
        room = max(1, (height - X_AXIS_PX) // MIN_ROW_PX)
        keep = set(self.priority[:room])
        self.show_rows([i in keep for i in range(len(self.rows))])

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
