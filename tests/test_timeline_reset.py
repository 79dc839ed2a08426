"""A new engine resets the timelines' x range: a zoom into the last log must not hide the next.

Each engine numbers its events from the start again (a demo after a trace, the quantized
demo after the eviction one). The timelines kept the x range the user had zoomed or panned
to in the last log, so the next log's curves were drawn outside the view (an empty plot
with the old log's axis) until Home was pressed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from app.views.pool.timeline_view import TimelineView  # noqa: E402
from engine.core.manager import Request  # noqa: E402
from tests.test_engine_views import ctx, deliver, make_engine, replay_trace  # noqa: E402,F401


def _shown_after_a_trace(ctx, qtbot, tmp_path):  # noqa: F811
    """A shown timeline view, and the events of a trace replayed into it."""
    view = TimelineView(ctx)
    qtbot.addWidget(view)
    view.resize(900, 500)
    view.show()
    _, events, _ = replay_trace(ctx, tmp_path, capacity=24)
    view.refresh(force=True)
    qtbot.wait(50)
    return view, events


def test_a_new_engine_shows_its_whole_log_after_a_zoom_into_the_last(ctx, qtbot, tmp_path):  # noqa: F811
    view, events = _shown_after_a_trace(ctx, qtbot, tmp_path)
    first_seq, last_seq = events[0].seq, events[-1].seq
    assert last_seq - first_seq > 100
    # the user zooms into the end of that log
    view.glw.set_x_range(last_seq - 20, last_seq)
    assert view.glw.x_range()[0] > first_seq + 50
    # a new engine: a few requests, numbered from the start again
    mgr, new_events = make_engine(ctx, num_blocks=12, block_size=4)
    mgr.allocate(Request("a", list(range(1, 14))))
    mgr.finish("a")
    deliver(ctx)
    view.refresh(force=True)
    qtbot.wait(50)
    lo, hi = view.glw.x_range()
    assert new_events and new_events[-1].seq < last_seq - 20
    assert lo <= new_events[0].seq and new_events[-1].seq <= hi, (lo, hi, new_events[0].seq, new_events[-1].seq)
    # and it spans the new log, not the old one
    assert hi - lo < (last_seq - first_seq) / 2


def test_the_remote_timeline_shows_all_again_for_another_attach(ctx, qtbot):  # noqa: F811
    from app.runtime.bridge import engine_info
    from app.views.pool.remote_plots import RemoteTimeline

    view = RemoteTimeline(ctx.state)
    qtbot.addWidget(view)
    view.glw.set_x_range(100.0, 120.0)
    vb = view.glw.rows[0][1].getViewBox()
    assert not vb.state["autoRange"][0]  # a zoom turns the x auto range off
    ctx.state.set_engine(engine_info(block_size=16, num_blocks=0) | {"remote": True})
    assert vb.state["autoRange"][0]


def test_an_empty_new_log_does_not_keep_the_last_logs_axis(ctx, qtbot, tmp_path):  # noqa: F811
    from app.runtime.bridge import engine_info

    view, events = _shown_after_a_trace(ctx, qtbot, tmp_path)
    assert view.glw.x_range()[1] >= events[-1].seq
    ctx.state.set_engine(engine_info(block_size=16, num_blocks=0))  # a usage log: no pool, no events
    view.refresh(force=True)
    qtbot.wait(50)
    lo, hi = view.glw.x_range()
    assert hi < events[-1].seq / 2, (lo, hi)
    # the next events still come into view: the x auto range stays on
    mgr, new_events = make_engine(ctx, num_blocks=12, block_size=4)
    for i in range(30):
        mgr.allocate(Request(f"r{i}", list(range(i, i + 9))))
        mgr.finish(f"r{i}")
    deliver(ctx)
    view.refresh(force=True)
    qtbot.wait(50)
    lo, hi = view.glw.x_range()
    assert lo <= new_events[0].seq and new_events[-1].seq <= hi
