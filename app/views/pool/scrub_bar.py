"""The time scrubber: a slider over the event log that shows every view as it was at event N.

Dragging scrubs `ctx.state`; the Live button follows new events again. The slider moves
over positions in the log (not raw seq numbers), so gaps in seq never leave dead ranges,
but the label names the event by its seq, the number the log, the links and the JSON use.
Buttons jump to the previous or next miss and eviction; Play steps through the log.
The bar is built with the window's frame, before the pool state exists (it is in the first
paint at its final height); it follows `ctx.state` once the context's runtime is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QPushButton, QSlider, QToolButton, QWidget

if TYPE_CHECKING:
    from app.runtime.context import AppContext, Subject
    from app.runtime.state import PoolState

# Play speeds in events per second; a timer tick moves several events at the faster ones.
SPEEDS = (10, 100, 1_000, 10_000)
PLAY_TICK_MS = 50


class ScrubBar(QWidget):
    """Slider, step and jump buttons, Play with speed, Live button, "event N" label.

    Not a `PanelView`, which reads `ctx.state` as it is made: `state` is None until the
    context's runtime is built (`sigRuntimeReady`), and the bar shows an empty log until then.
    """

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.state: PoolState | None = None
        ctx.sigSubjectChanged.connect(self.show_subject)
        self.setObjectName("scrub_bar")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setObjectName("scrub_slider")
        self.slider.setRange(0, 0)
        self.slider.setToolTip("drag to see the pool as it was at any event")
        self.back = self._button("◀", "one event back", lambda: self.step(-1))
        self.forward = self._button("▶", "one event forward", lambda: self.step(1))
        self.prev_miss = self._button("◀ miss", "the previous request that missed a block",
                                      lambda: self._jump_to("miss", False))
        self.next_miss = self._button("miss ▶", "the next request that missed a block", lambda: self._jump_to("miss", True))
        self.prev_evict = self._button("◀ evict", "the previous eviction", lambda: self._jump_to("eviction", False))
        self.next_evict = self._button("evict ▶", "the next eviction", lambda: self._jump_to("eviction", True))
        self.play = QToolButton()
        self.play.setObjectName("scrub_play")
        self.play.setText("Play")
        self.play.setCheckable(True)
        self.play.setToolTip("step through the log at the chosen speed")
        self.play.toggled.connect(self.set_playing)
        self.speed = QComboBox()
        self.speed.setObjectName("scrub_speed")
        for value in SPEEDS:
            self.speed.addItem(f"{value:,} ev/s", value)
        self.speed.setCurrentIndex(1)
        self.speed.setToolTip("events per second while playing")
        self.live = QPushButton("Live")
        self.live.setObjectName("scrub_live")
        self.live.setCheckable(True)
        self.live.setChecked(True)
        self.live.setToolTip("follow new events as they come")
        self.label = QLabel("no events yet")
        self.label.setObjectName("scrub_label")
        self.label.setMinimumWidth(240)

        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 2, 6, 2)
        layout.addWidget(QLabel("Time"))
        for w in (self.prev_evict, self.prev_miss, self.back):
            layout.addWidget(w)
        layout.addWidget(self.slider, 1)
        for w in (self.forward, self.next_miss, self.next_evict, self.play, self.speed, self.live, self.label):
            layout.addWidget(w)

        self._timer = QTimer(self, interval=PLAY_TICK_MS, timeout=self._tick)
        self._carry = 0.0
        self._updating = False
        self.slider.valueChanged.connect(self._on_slider)
        self.live.clicked.connect(self._on_live)
        self._show_count(0)
        if ctx.runtime_ready:
            self._follow_state()
        else:
            ctx.sigRuntimeReady.connect(self._follow_state)

    def _follow_state(self) -> None:
        if self.state is not None:
            return
        self.state = self.ctx.state
        self.state.sigChanged.connect(self.sync)
        self.sync()

    def _button(self, text: str, tip: str, slot: Callable[[], object]) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.clicked.connect(lambda _checked=False: slot())
        return button

    def show_subject(self, subject: Subject) -> None:
        self.play.setChecked(False)

    def _on_slider(self, index: int) -> None:
        if self._updating or self.state is None:
            return
        seqs = self.state.log.seqs
        if not len(seqs):
            return
        self.state.scrub_to(int(seqs[min(index, len(seqs) - 1)]))

    def _on_live(self, checked: bool) -> None:
        if self.state is None:
            self.live.setChecked(True)  # nothing to scrub yet
            return
        if checked:
            self.play.setChecked(False)
            self.state.scrub_to(None)
        else:
            seq = self.state.current_seq
            if seq is not None:
                self.state.scrub_to(seq)
        self.sync()

    def step(self, delta: int) -> None:
        """Move `delta` events back or forward (leaving live mode)."""
        if self.state is None:
            return
        seqs = self.state.log.seqs
        if not len(seqs):
            return
        index = max(0, min(len(seqs) - 1, self.state.log.count_upto(self.state.current_seq) - 1 + delta))
        self.state.scrub_to(int(seqs[index]))

    def _jump_to(self, what: str, forward: bool) -> int | None:
        from app.runtime.state import is_eviction, is_miss  # the pool state (numpy): not in the first paint

        return self.jump(is_miss if what == "miss" else is_eviction, forward)

    def jump(self, predicate: Callable[..., bool], forward: bool) -> int | None:
        """Scrub to the previous or next event matching `predicate`; its seq, or None (stays)."""
        from app.runtime.state import is_miss

        if self.state is None:
            return None
        seq = self.state.find(predicate, forward)
        if seq is None:
            what = "miss" if predicate is is_miss else "eviction"
            self.label.setText(f"no {'later' if forward else 'earlier'} {what}")
            return None
        self.state.scrub_to(seq)
        return seq

    # ------------------------------------------------------------------ play
    def set_playing(self, playing: bool) -> None:
        if playing and self.state is None:
            self.play.setChecked(False)
            return
        if playing:
            if self.state.is_live or self.state.current_seq == self.state.log.last_seq:
                seqs = self.state.log.seqs
                if not len(seqs):
                    self.play.setChecked(False)
                    return
                self.state.scrub_to(int(seqs[0]))  # play from the start, not from the end
            self._carry = 0.0
            self._timer.start()
        else:
            self._timer.stop()
        self.play.setText("Pause" if playing else "Play")

    def _tick(self) -> None:
        if self.state is None:
            return
        speed = int(self.speed.currentData() or SPEEDS[0])
        self._carry += speed * PLAY_TICK_MS / 1000.0
        n = int(self._carry)
        if n < 1:
            return
        self._carry -= n
        if self.state.current_seq is not None and self.state.current_seq >= (self.state.log.last_seq or 0):
            self.play.setChecked(False)
            return
        self.step(n)

    # ------------------------------------------------------------------ model -> view
    def sync(self) -> None:
        """Model to view: slider range and position, Live button, label."""
        if self.state is None:
            return
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
        self._show_count(n)
        if n == 0:
            return
        seq = self.state.current_seq
        event = log.event_at_seq(seq) if seq is not None else None
        kind = event.kind.replace("_", " ") if event is not None else "start"
        where = "live" if self.state.is_live else "scrubbed"
        self.label.setText(f"event {seq:,}: {kind} ({where})" if seq is not None else f"before event {log.first_seq:,}")
        self.label.setToolTip(f"the log holds events {log.first_seq:,} to {log.last_seq:,} ({n:,} events)")

    def _show_count(self, n: int) -> None:
        """What depends only on whether the log has events: the buttons enabled, the empty label."""
        for w in (self.slider, self.back, self.forward, self.prev_miss, self.next_miss, self.prev_evict,
                  self.next_evict, self.play):
            w.setEnabled(n > 0)
        if n == 0:
            self.label.setText("no events yet")
