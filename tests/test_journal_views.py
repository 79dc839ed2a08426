"""The remote timeline and metrics on the journal route draw what the overlay holds after a
burst, not what they drew before it: their counts are kept between redraws (only the new
times binned) and equal a fresh count of every time, and the event route's, on every
recorded server ticked in bites with a redraw between bites; so do the events' server times
a range on the timeline maps by (read from the log's rows, kept as it grows); the
per-second bars and the tier curves are reduced to the pixels the plot has and keep each
bin's peak and the last sample."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.runtime import remote as remote_mod
from app.views.pool import remote_plots
from app.views.pool.remote_plots import RemoteMetrics, RemoteTimeline, _Rates, bar_bins
from test_journal_app import RECORDED, _rank_frames
from test_journal_tick import _controller


def _views(qtbot, state):
    timeline, metrics = RemoteTimeline(state), RemoteMetrics(state)
    for view in (timeline, metrics):
        qtbot.addWidget(view)
        view.resize(900, 420)
        view.show()
    return timeline, metrics


def _check_drawn(timeline: RemoteTimeline, metrics: RemoteMetrics, state, ref) -> None:
    remote = state.remote
    timeline.refresh()
    metrics.refresh()
    secs, stored, removed = remote.per_second(timeline.start)
    assert timeline.stored_per_s.tolist() == stored.tolist()
    assert timeline.removed_per_s.tolist() == removed.tolist()
    assert stored.sum() == len(remote.stored_times) and removed.sum() == len(remote.removed_times)
    # the event route's overlay counts the same seconds
    assert ref.remote.per_second(timeline.start)[1].tolist() == stored.tolist()
    # the bars show every second (few here) at its count
    assert timeline.b_stored.opts["height"].tolist() == stored.tolist()
    assert timeline.b_removed.opts["height"].tolist() == removed.tolist()
    # each tier's curve ends at the last sample
    for name, code in remote.tier_names.items():
        if name in timeline.curves and code - 1 < len(remote.sample_counts):
            counts = np.frombuffer(remote.sample_counts[code - 1], dtype=np.int64)
            if counts.any():
                xs, ys = timeline.curves[name].getData()
                assert ys[-1] == counts[-1] and xs[-1] == remote.sample_times[-1] - timeline.start
    life = np.frombuffer(remote.lifetimes, dtype=np.float64) if remote.lifetimes else np.zeros(0)
    assert metrics.lifetime_counts.tolist() == np.histogram(life, remote_plots.LIFETIME_EDGES)[0].tolist()
    text = metrics.summary.text().replace("&nbsp;", " ")
    assert f"<b>{len(remote.stored_times):,}</b> blocks stored" in text
    if len(life):
        assert f"median <b>{remote_plots.duration_text(np.percentile(life, 50))}</b>" in text


@pytest.mark.parametrize("name", list(RECORDED))
def test_redraws_between_bites_end_on_what_the_overlay_holds(monkeypatch, qtbot, name):
    path, ranks = RECORDED[name]
    ctrl, state, ref = _controller(_rank_frames(path, ranks))
    timeline, metrics = _views(qtbot, state)
    total = ctrl.pending_rows()
    monkeypatch.setattr(remote_mod, "MIN_TICK_ROWS", max(3, total // 24))
    monkeypatch.setattr(remote_mod, "TICK_BUDGET_S", 1e-12)
    redraws = 0
    while ctrl.pending_rows():
        ctrl.tick()
        timeline.refresh()  # a redraw in the middle of the burst: what it kept must not go stale
        metrics.refresh()
        timeline.x_of_seqs(np.array([0]))  # a range held on the server clock maps every redraw
        redraws += 1
    assert redraws >= 4 and len(state.log) == total
    _check_drawn(timeline, metrics, state, ref)
    # the events' server times, kept as the log grew, are every event's own (and the event route's)
    from engine.remote.overlay import time_of

    seqs, times = timeline._event_times()
    assert seqs.tolist() == [int(s) for s in state.log.seqs]
    assert times.tolist() == [time_of(e) for e in state.log.events]
    ref_view = RemoteTimeline(ref)
    qtbot.addWidget(ref_view)
    assert sorted(ref_view._event_times()[1].tolist()) == sorted(times.tolist())


def test_kept_rates_equal_a_fresh_count_of_every_time(qtbot):
    """Times arriving out of order, before x = 0 and past a day: the kept counts equal
    `per_second` over every time at each step, and start over for another overlay."""
    from engine.remote.overlay import RemoteOverlay, _append_floats

    rng = np.random.default_rng(7)
    rates = _Rates()
    overlay = RemoteOverlay()
    start = 1_796_000_000.0
    for step in range(40):
        spread = 90_000.0 if step == 30 else 600.0  # one bite runs past a day of seconds
        _append_floats(overlay, "stored_times", start - 5 + rng.random(rng.integers(0, 300)) * spread)
        _append_floats(overlay, "removed_times", start - 5 + rng.random(rng.integers(0, 300)) * spread)
        got = rates.update(overlay, start)
        want = overlay.per_second(start)
        assert [a.tolist() for a in got] == [a.tolist() for a in want], step
    other = RemoteOverlay()
    _append_floats(other, "stored_times", np.array([start + 3.5]))
    assert rates.update(other, start)[1].tolist() == [0, 0, 0, 1]


def test_bars_past_a_pixel_each_keep_each_runs_peak():
    secs = np.arange(10_000, dtype=float)
    heights = np.zeros(10_000)
    heights[7_777] = 50.0  # one busy second in a long stream
    left, h, width = bar_bins(secs, heights, 400)
    assert len(h) <= 400 and width == math.ceil(10_000 / 400)
    assert h.max() == 50.0 and left[np.argmax(h)] <= 7_777 < left[np.argmax(h)] + width
    assert bar_bins(secs[:300], heights[:300], 400)[2] == 1.0


@pytest.mark.parametrize("name", ["vllm_connector_frames", "sglang_zmq_frames"])
def test_journal_events_carry_the_batch_time_the_event_routes_do(name):
    """The remote timeline maps its server clock to events by their batch time (a range
    selected on it filters the other views): the journal route's events carry it too, not
    their arrival time."""
    from engine.remote.overlay import time_of

    path, ranks = RECORDED[name]
    ctrl, state, ref = _controller(_rank_frames(path, ranks))
    ctrl.tick(drain=True)
    got = [e.remote.batch_time for e in state.log.events]
    assert got == [e.remote.batch_time for e in ref.log.events] and any(got)
    assert [time_of(e) for e in state.log.events] == [time_of(e) for e in ref.log.events]


def test_the_metrics_hint_sits_mid_plot_before_the_first_refresh(qtbot):
    """A metrics view shown before it has refreshed (a capture opening, whose views hear of
    its rows after half a second) has its hint in the middle of the empty plot, as after a
    refresh, not on the x axis (where the axes' autoscale left it)."""
    from app.runtime.state import PoolState

    metrics = RemoteMetrics(PoolState())
    qtbot.addWidget(metrics)
    metrics.resize(620, 240)  # the dock's size in a 1280x800 window
    metrics.show()
    qtbot.wait(20)
    (x_lo, x_hi), (y_lo, y_hi) = metrics.p_life.viewRange()
    pos = metrics.hint.pos()
    assert metrics.hint.isVisible() and (x_lo, x_hi) == remote_plots.LIFETIME_X
    assert x_lo < pos.x() < x_hi and y_lo + 0.4 * (y_hi - y_lo) < pos.y() < y_lo + 0.6 * (y_hi - y_lo)
    # the whole sentence inside the plot
    plot, text = metrics.p_life.getViewBox().sceneBoundingRect(), metrics.hint.sceneBoundingRect()
    assert plot.left() <= text.left() and text.right() <= plot.right()
