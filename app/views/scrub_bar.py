"""The time scrubber: a slider over the event log that shows every view as it was at event N.

Dragging scrubs `ctx.state`; the Live button follows new events again. The slider moves
over positions in the log (not raw seq numbers), so gaps in seq never leave dead ranges.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSlider, QToolButton, QWidget


class ScrubBar(QWidget):
    """Slider + step buttons + Live button + "event N of M: kind" label."""

    def __init__(self, ctx: Any, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.state = ctx.state
        self.setObjectName("scrub_bar")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setObjectName("scrub_slider")
        self.slider.setRange(0, 0)
        self.slider.setToolTip("drag to see the pool as it was at any event")
        self.back = QToolButton()
        self.back.setText("◀")
        self.back.setToolTip("one event back")
        self.forward = QToolButton()
        self.forward.setText("▶")
        self.forward.setToolTip("one event forward")
        self.live = QPushButton("Live")
        self.live.setObjectName("scrub_live")
        self.live.setCheckable(True)
        self.live.setChecked(True)
        self.live.setToolTip("follow new events as they come")
        self.label = QLabel("no events yet")
        self.label.setObjectName("scrub_label")
        self.label.setMinimumWidth(280)

        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 2, 6, 2)
        layout.addWidget(QLabel("Time"))
        layout.addWidget(self.back)
        layout.addWidget(self.slider, 1)
        layout.addWidget(self.forward)
        layout.addWidget(self.live)
        layout.addWidget(self.label)

        self._updating = False
        self.slider.valueChanged.connect(self._on_slider)
        self.back.clicked.connect(lambda: self.step(-1))
        self.forward.clicked.connect(lambda: self.step(1))
        self.live.clicked.connect(self._on_live)
        self.state.sigChanged.connect(self.sync)
        self.sync()

    def _on_slider(self, index: int) -> None:
        if self._updating:
            return
        seqs = self.state.log.seqs
        if not seqs:
            return
        self.state.scrub_to(seqs[min(index, len(seqs) - 1)])

    def _on_live(self, checked: bool) -> None:
        if checked:
            self.state.scrub_to(None)
        else:
            seq = self.state.current_seq
            if seq is not None:
                self.state.scrub_to(seq)
        self.sync()

    def step(self, delta: int) -> None:
        """Move one event back or forward (leaving live mode)."""
        seqs = self.state.log.seqs
        if not seqs:
            return
        index = max(0, min(len(seqs) - 1, self.state.log.count_upto(self.state.current_seq) - 1 + delta))
        self.state.scrub_to(seqs[index])

    def sync(self) -> None:
        """Model to view: slider range and position, Live button, label."""
        log = self.state.log
        n = len(log)
        self._updating = True
        try:
            self.slider.setRange(0, max(0, n - 1))
            shown = log.count_upto(self.state.current_seq) if self.state.current_seq is not None else 0
            self.slider.setValue(max(0, shown - 1))
            self.live.setChecked(self.state.is_live)
        finally:
            self._updating = False
        enabled = n > 0
        for w in (self.slider, self.back, self.forward):
            w.setEnabled(enabled)
        if n == 0:
            self.label.setText("no events yet")
            return
        seq = self.state.current_seq
        event = log.event_at_seq(seq) if seq is not None else None
        kind = event.kind.replace("_", " ") if event is not None else "start"
        where = "live" if self.state.is_live else "scrubbed"
        self.label.setText(f"event {shown:,} of {n:,}: {kind} ({where})")
