"""The token strip painter: a strip of tokens coloured by cache state (`StripData`, `TokenStrip`).

Cells wrap to the widget width; a wider gap and a tick mark every block boundary, a red
bar at the first missed block and a red outline on the divergence token; hovering a cell
shows its position, token id and text. Which tokens a strip shows, and in which state, its
callers decide: the chat (`app.views.chat.strips`) and the diff view.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QEvent, QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from app.ui import theme

STATES = ("cached", "computed", "partial", "generated", "pending")
STATE_LABELS = {"cached": "cached (reused)", "computed": "computed (prefill)", "partial": "partial tail block",
                "generated": "generated (decode)",
                "pending": "not run (grey): no request has sent these tokens through the model yet - a queued "
                           "turn, or a recorded reply that only a later turn's prompt would carry"}
CELL_W = 7
CELL_H = 12
GAP = 1
BLOCK_GAP = 4
ROW_GAP = 3
MARGIN = 2


@dataclass(slots=True)
class StripData:
    """What a strip shows: tokens at absolute positions `start`, `start+1`, ... ."""

    token_ids: list[int]
    texts: list[str]
    states: list[str]
    start: int = 0
    block_size: int = 16
    miss_position: int | None = None  # absolute position of the first computed block start
    divergence_position: int | None = None  # absolute position where the tokens diverge
    miss_text: str = ""

    def __post_init__(self) -> None:
        if not (len(self.token_ids) == len(self.texts) == len(self.states)):
            raise ValueError("a token strip needs as many texts and states as token ids")
        bad = set(self.states) - set(STATES)
        if bad:
            raise ValueError(f"unknown token states: {', '.join(sorted(bad))}")
        if self.block_size < 1:
            raise ValueError(f"block size must be at least 1, not {self.block_size}")


class TokenStrip(QWidget):
    """`set_data(StripData)` and it paints; `cell_at(point)` maps the mouse to a token index."""

    sigTokenHovered = Signal(int)  # absolute position of the hovered token

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.data = StripData([], [], [])
        self._rects: list[QRect] = []
        self._laid_out_width = -1
        self.setMouseTracking(True)
        sp = QSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        sp.setHeightForWidth(True)
        self.setSizePolicy(sp)

    # ------------------------------------------------------------------ data
    def set_data(self, data: StripData) -> None:
        self.data = data
        self._laid_out_width = -1
        self.updateGeometry()
        self.update()

    def clear(self) -> None:
        self.set_data(StripData([], [], []))

    @property
    def num_tokens(self) -> int:
        return len(self.data.token_ids)

    def count(self, state: str) -> int:
        return sum(1 for s in self.data.states if s == state)

    # ------------------------------------------------------------------ geometry
    def _layout(self, width: int) -> tuple[list[QRect], int]:
        rects: list[QRect] = []
        d = self.data
        x, y = MARGIN, MARGIN
        right = max(width - MARGIN, CELL_W + 2 * MARGIN)
        for i in range(len(d.token_ids)):
            pos = d.start + i
            if i > 0 and pos % d.block_size == 0:
                x += BLOCK_GAP
            if x + CELL_W > right and x > MARGIN:
                x, y = MARGIN, y + CELL_H + ROW_GAP
            rects.append(QRect(x, y, CELL_W, CELL_H))
            x += CELL_W + GAP
        height = (y + CELL_H + MARGIN) if rects else 0
        return rects, height

    def _ensure_layout(self) -> None:
        if self._laid_out_width != self.width():
            self._rects, _ = self._layout(self.width())
            self._laid_out_width = self.width()

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt override
        return self._layout(width)[1]

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        w = max(self.width(), 240)
        return QSize(w, self.heightForWidth(w))

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(CELL_W * 4, self.heightForWidth(max(self.width(), 240)))

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self._laid_out_width = -1
        super().resizeEvent(event)
        if self.height() != self.heightForWidth(self.width()):
            self.updateGeometry()

    def cell_at(self, point: QPoint) -> int | None:
        """Index (0-based within the strip) of the token under `point`, or None."""
        self._ensure_layout()
        for i, r in enumerate(self._rects):
            if r.adjusted(0, 0, GAP, ROW_GAP).contains(point):
                return i
        return None

    def cell_rect(self, index: int) -> QRect:
        self._ensure_layout()
        return QRect(self._rects[index])

    # ------------------------------------------------------------------ painting
    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt override
        self._ensure_layout()
        d = self.data
        if not d.token_ids:
            return
        painter = QPainter(self)
        colors = {s: theme.color(s) for s in STATES}
        for rect, state in zip(self._rects, d.states):
            painter.fillRect(rect, colors[state])
        tick = QColor(theme.color("text_dim"))
        tick.setAlpha(160)
        painter.setPen(QPen(tick, 1))
        for i, rect in enumerate(self._rects):
            if (d.start + i) % d.block_size == 0 and i > 0:
                x = rect.left() - BLOCK_GAP // 2 - 1
                painter.drawLine(x, rect.top() - 1, x, rect.bottom() + 1)
        miss = theme.color("miss")
        if d.divergence_position is not None and 0 <= d.divergence_position - d.start < len(self._rects):
            painter.setPen(QPen(miss, 2))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRect(self._rects[d.divergence_position - d.start].adjusted(0, 0, -1, -1))
        if d.miss_position is not None and 0 <= d.miss_position - d.start < len(self._rects):
            r = self._rects[d.miss_position - d.start]
            painter.fillRect(QRect(r.left() - 3, r.top() - 2, 2, CELL_H + 4), miss)
        painter.end()

    # ------------------------------------------------------------------ hover
    def tooltip_text(self, index: int) -> str:
        d = self.data
        pos = d.start + index
        text = d.texts[index].replace("\n", "\\n")
        lines = [f"token {pos} (block {pos // d.block_size}) · id {d.token_ids[index]}",
                 f"text {text!r}", STATE_LABELS[d.states[index]]]
        if d.divergence_position == pos:
            lines.append("first token that differs from the cache")
        if d.miss_position == pos and d.miss_text:
            lines.append(d.miss_text)
        return "\n".join(lines)

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            index = self.cell_at(event.pos())
            if index is None:
                QToolTip.hideText()
                event.ignore()
            else:
                QToolTip.showText(event.globalPos(), self.tooltip_text(index), self)
                self.sigTokenHovered.emit(self.data.start + index)
            return True
        return super().event(event)
