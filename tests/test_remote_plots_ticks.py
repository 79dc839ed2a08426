"""The remote timeline and metrics read at a laptop's 1280x800 window (and at 1600x1000, in
both themes): every row shown has at least two labelled ticks on its left axis (the
"stored per s" row showed "0" alone), no label runs into another or out of the plots, and
the lifetime axis shows its end labels. The labels checked are the ones pyqtgraph draws
(`AxisItem.generateDrawSpecs`, after it drops those that would leave the axis)."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from PySide6.QtGui import QFontMetrics, QImage, QPainter

from app.ui.plots import CountAxis
from engine.remote.overlay import _append_floats

T0 = 1_796_000_000.0  # the server clock at the first event


def _drawn(axis) -> list[tuple[object, str]]:
    """(scene rect, text) of each tick label the axis draws now."""
    image = QImage(8, 8, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        _, _, texts = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(axis.mapRectToScene(rect), text) for rect, _, text in texts]


def _stream_like_the_bench(remote) -> None:
    """What the journal route's screenshots show: 38 s of 3,300-3,900 blocks stored a second,
    removals from second 9 on, the GPU tier filling to 30,000 blocks and the CPU's growing."""
    rng = np.random.default_rng(3)
    secs = 38
    stored = np.concatenate([T0 + s + rng.random(int(rng.integers(3300, 3900))) for s in range(secs)])
    removed = np.concatenate([T0 + s + rng.random(int(rng.integers(2900, 3400))) for s in range(9, secs)])
    _append_floats(remote, "stored_times", np.sort(stored))
    _append_floats(remote, "removed_times", np.sort(removed))
    _append_floats(remote, "lifetimes", rng.lognormal(1.8, 1.0, len(removed)))
    t = T0 + np.linspace(0.5, secs, 400)
    _append_floats(remote, "sample_times", t)
    gpu = np.minimum(30_000, (t - T0) * 3500).astype(np.int64)
    cpu = ((t - T0) * 360).astype(np.int64)
    remote.sample_counts = [array("q", gpu.tolist()), array("q", cpu.tolist())] + \
        [array("q", [0] * len(t)) for _ in range(len(remote.tier_names) - 2)]
    remote.revision += 1


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("size", [(1280, 800), (1600, 1000)])
def test_every_remote_row_has_labelled_ticks_that_never_overlap(window, qtbot, size, theme):
    window.apply_theme(theme, save=False)
    window.resize(*size)
    window.show()
    qtbot.waitExposed(window)
    state = window.ctx.state
    state.set_engine({"remote": True, "block_size": 16, "num_blocks": 0})
    _stream_like_the_bench(state.remote)
    state.sigChanged.emit()
    timeline = window.panels["timeline"].remote_view
    metrics = window.panels["metrics"].remote_view
    qtbot.waitUntil(lambda: timeline.isVisible() and metrics.isVisible())
    qtbot.wait(50)  # the layout settles
    timeline.refresh()
    metrics.refresh()
    qtbot.wait(50)
    assert timeline.glw.shown == [True, True, True]  # the dock has room for every row

    labels = []
    for name, plot in zip(("cached", "stored", "removed"), (timeline.p_cached, timeline.p_stored,
                                                            timeline.p_removed)):
        drawn = _drawn(plot.getAxis("left"))
        assert len(drawn) >= 2, (name, size, [t for _, t in drawn], plot.vb.viewRange()[1], plot.vb.height())
        labels += drawn
    labels += _drawn(timeline.p_removed.getAxis("bottom"))
    view = timeline.glw.mapToScene(timeline.glw.viewport().rect()).boundingRect()
    for i, (rect, text) in enumerate(labels):
        assert view.contains(rect), (text, rect, view)  # not cut at the stack's edge
        for other, other_text in labels[i + 1:]:
            assert not rect.intersects(other), (text, other_text, size)

    bottom = [t for _, t in _drawn(metrics.p_life.getAxis("bottom"))]
    assert bottom[0] == "10 ms" and bottom[-1] == "1 day", bottom
    assert len(_drawn(metrics.p_life.getAxis("left"))) >= 2


@pytest.mark.parametrize("hi", [1.1, 3_711.0, 4_282.0, 33_000.0, 486_000.0])
@pytest.mark.parametrize("size", [34, 37, 47, 60, 73, 111])
def test_a_short_side_axis_labels_two_ticks_none_over_its_top(qtbot, hi, size):
    axis = CountAxis("left")
    (step, values), = axis.tickValues(0.0, hi, size)
    fm = QFontMetrics(axis.style.get("tickFont") or axis.font())
    assert step / hi * size >= fm.height()  # a line per label
    if step / hi * size < size - fm.height() * 0.4:  # room below the top for a second label
        assert len(values) >= 2, (step, values)
    for v in values:  # a label is drawn at 0.8 of a line, centred on its tick
        assert (hi - v) / hi * size >= fm.height() * 0.4 - CountAxis.OVERHANG_PX, (v, values)
