"""The filter language in the pool views and the keyboard on the timelines (issue 22), on
a real replay of the bundled demo trace: the event log keeps exactly the rows the engine's
predicate selects, an error names its position, the block table emphasises the blocks of
the matching events, W/A/S/D change a timeline's range and its range selection filters the
event log, through the one shared filter of the app context."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from app.dialogs.shortcuts_dialog import shortcut_rows  # noqa: E402
from app.runtime.context import make_test_context  # noqa: E402
from app.runtime.selection import shared_filter  # noqa: E402
from app.views.pool.block_table_view import BlockTableView  # noqa: E402
from app.views.pool.event_log_view import EventLogView  # noqa: E402
from app.views.pool.timeline_view import TimelineView  # noqa: E402
from engine.analysis.filter_language import parse  # noqa: E402
from engine.core.events import EventBus  # noqa: E402
from engine.core.replay import ReplayConfig, replay  # noqa: E402
from engine.core.trace import load_trace  # noqa: E402
from tests._traces import trace_head  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "resources" / "traces" / "demo_tokens.jsonl"
CAPACITY = 60


@pytest.fixture
def ctx(qtbot, tmp_path):
    c = make_test_context(tmp_path)
    c.suppress_dialogs = True
    yield c
    c.shutdown()


@pytest.fixture
def events(ctx):
    bus = EventBus()
    out: list = []
    bus.subscribe(out.append)
    replay(load_trace(DEMO), ReplayConfig(block_size=16, capacity_blocks=CAPACITY, seed=0), bus)
    ctx.state.set_engine({"num_blocks": CAPACITY, "block_size": 16})
    ctx.state.apply_events(out)
    return out


def rows_of(view: EventLogView) -> list[int]:
    return [view.model.event(r).seq for r in range(view.model.rowCount())]


@pytest.mark.parametrize("text", ["kind:evicted and tier:GPU and tenant:bob", "kind:evicted", "tenant:alice",
                                  "not tenant:alice and kind:stored", "request:q81-t1 or (kind:lookup and reason:new_content)"])
def test_the_filter_keeps_exactly_what_the_engine_predicate_selects(qtbot, ctx, events, text):
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    view.filter_bar.set_text(text)
    dicts = [e.to_dict() for e in events]
    want = [d["seq"] for d in parse(text).select(dicts)]
    assert want and len(want) < len(events)  # the trace has both kinds of row
    assert rows_of(view) == want
    assert view.filter_bar.count.text() == f"{len(want):,} of {len(events):,}"


def test_evictions_take_their_tenant_from_the_request_that_evicted(qtbot, ctx, events):
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    view.filter_bar.set_text("kind:evicted and tenant:bob")
    kept = [view.model.event(r) for r in range(view.model.rowCount())]
    tenant = {e.request_id: e.salt for e in events if e.kind == "request_started"}
    assert kept and all(e.kind == "block_evicted" and tenant[e.by_request_id] == "bob" for e in kept)
    assert len(kept) == sum(1 for e in events if e.kind == "block_evicted" and tenant[e.by_request_id] == "bob")


def test_an_error_shows_its_position_and_keeps_the_last_good_filter(qtbot, ctx, events):
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    view.filter_bar.set_text("kind:evicted")
    n = view.model.rowCount()
    view.filter_bar.edit.setText("kind:evicted and tier")
    assert view.filter_bar.error is not None and view.filter_bar.error.position == 21
    assert view.filter_bar.message.isVisibleTo(view) and view.filter_bar.message.text().startswith("at 22: ")
    assert view.model.rowCount() == n
    view.filter_bar.edit.setText("colour:red")
    assert view.filter_bar.message.text().startswith("at 1: ")


def test_the_block_table_shares_the_filter_and_emphasises_the_matching_blocks(qtbot, ctx, events):
    log = EventLogView(ctx)
    table = BlockTableView(ctx)
    qtbot.addWidget(log)
    qtbot.addWidget(table)
    table.filter_bar.set_text("kind:evicted")
    # the event log follows the filter set in the block table (one shared filter)
    assert log.filter_bar.text == "kind:evicted" and shared_filter(ctx).filter.text == "kind:evicted"
    assert rows_of(log) == [e.seq for e in events if e.kind == "block_evicted"]
    evicted = sorted({e.block_id for e in events if e.kind == "block_evicted"})
    assert table.matched_blocks.tolist() == evicted
    assert table.filter_bar.count.text() == f"{len(evicted):,} of {CAPACITY} blocks"
    # scrubbed back, only what was evicted up to the event shown
    mid = events[len(events) // 2].seq
    ctx.state.scrub_to(mid)
    assert table.matched_blocks.tolist() == sorted({e.block_id for e in events
                                                    if e.kind == "block_evicted" and e.seq <= mid})
    log.filter_bar.set_text("")
    assert table.filter_bar.text == "" and len(table.matched_blocks) == 0


def test_saved_filters_are_shared_across_views(qtbot, ctx, events):
    log = EventLogView(ctx)
    table = BlockTableView(ctx)
    qtbot.addWidget(log)
    qtbot.addWidget(table)
    log.filter_bar.set_text("tier:GPU and tenant:alice")
    assert log.filter_bar.save_current()
    assert table.filter_bar.saved_filters() == ["tier:GPU and tenant:alice"]


def test_keys_zoom_and_pan_a_timeline_and_a_range_selection_filters_the_log(qtbot, ctx, events):
    log = EventLogView(ctx)
    timeline = TimelineView(ctx)
    qtbot.addWidget(log)
    qtbot.addWidget(timeline)
    timeline.resize(900, 420)
    timeline.show()
    qtbot.waitExposed(timeline)
    stack = timeline.glw
    assert stack.shared is shared_filter(ctx)
    stack.setFocus()
    lo, hi = stack.x_range()
    qtbot.keyClick(stack, Qt.Key.Key_W)
    lo2, hi2 = stack.x_range()
    assert hi2 - lo2 == pytest.approx((hi - lo) * 0.8) and (lo2 + hi2) == pytest.approx(lo + hi)
    qtbot.keyClick(stack, Qt.Key.Key_D)
    lo3, hi3 = stack.x_range()
    assert lo3 == pytest.approx(lo2 + 0.2 * (hi2 - lo2)) and hi3 - lo3 == pytest.approx(hi2 - lo2)
    qtbot.keyClick(stack, Qt.Key.Key_A)
    qtbot.keyClick(stack, Qt.Key.Key_S)
    assert stack.x_range()[1] - stack.x_range()[0] == pytest.approx(hi - lo)
    # zoom to a window, select it with R: the log keeps the events of that window
    stack.set_x_range(100.2, 250.7)
    qtbot.keyClick(stack, Qt.Key.Key_R)
    assert shared_filter(ctx).range == (101, 250)
    assert rows_of(log) == [e.seq for e in events if 101 <= e.seq <= 250]
    assert "101" in log.range_label.text() and log.range_label.isVisibleTo(log)
    # the range and the typed filter together; the timeline marks the matches
    log.filter_bar.set_text("kind:evicted")
    assert rows_of(log) == [e.seq for e in events if 101 <= e.seq <= 250 and e.kind == "block_evicted"]
    assert sorted(stack._mark_x.tolist()) == [float(e.seq) for e in events if e.kind == "block_evicted"]
    qtbot.keyClick(stack, Qt.Key.Key_Escape)
    assert shared_filter(ctx).range is None
    assert rows_of(log) == [e.seq for e in events if e.kind == "block_evicted"]


def test_the_timeline_keys_are_in_the_shortcuts_list(qtbot, ctx):
    from PySide6.QtWidgets import QWidget
    w = QWidget()
    qtbot.addWidget(w)
    rows = dict(shortcut_rows(w))
    assert rows["Timeline: zoom in"] == "W, +" and rows["Timeline: pan left"] == "A, Left"
    assert "R" in rows.values() and "Esc" in rows.values()


def test_events_read_field_by_field_filter_as_their_dicts(events):
    # the shared filter reads events through EventFields, not to_dict(): same answers
    from engine.analysis.filter_language import EventContext, FIELDS, field_values
    from app.runtime.selection import EventFields
    dicts = [e.to_dict() for e in events]
    ctx = EventContext.from_events(dicts)
    assert EventContext.from_events([EventFields(e) for e in events]) == ctx
    for e, d in zip(events, dicts):
        for name in FIELDS:
            assert field_values(EventFields(e), name, ctx) == field_values(d, name, ctx), (e.seq, name)


def test_a_recorded_vllm_stream_reads_the_same_field_by_field():
    # vLLM 0.33.0's offloading connector (tiers, ranks, servers), recorded in ../shared/data, copied to tests/data/vllm_connector
    import base64
    import json
    from app.runtime.selection import EventFields
    from engine.analysis.filter_language import FIELDS, EventContext, field_values
    from engine.remote import RemotePool
    from engine.remote.wire import decode_batch, parse_pub
    frames = ROOT / "tests" / "data" / "vllm_connector" / "vllm_connector_frames.jsonl"
    bus = EventBus()
    got: list = []
    bus.subscribe(got.append)
    pool = RemotePool("tcp://10.0.0.5:5557", 0, bus)
    for row in map(json.loads, frames.read_text().splitlines()):
        if row["case"] == "one-server":
            _, seq, payload = parse_pub([base64.b64decode(f) for f in row["frames"]])
            pool.apply(decode_batch(seq, payload))
    assert got and any(e.remote is not None for e in got)
    dicts = [e.to_dict() for e in got]
    ctx = EventContext.from_events(dicts)
    for e, d in zip(got, dicts):
        for name in FIELDS:
            assert field_values(EventFields(e), name, ctx) == field_values(d, name, ctx), (e.seq, name)


def test_a_long_log_is_matched_on_the_worker(qtbot, ctx, events):
    from app.runtime.selection import EventFilter
    # the live log is columnar and answers these fields from its columns at once (below);
    # the Python EventLog, the reference, is what a filter of events goes to the worker for
    want = [d["seq"] for d in parse("kind:evicted and tenant:bob").select([e.to_dict() for e in events])]
    columns_view = EventLogView(ctx)
    qtbot.addWidget(columns_view)
    columns_view.filter_bar.set_text("kind:evicted and tenant:bob")
    assert not shared_filter(ctx).pending and rows_of(columns_view) == want
    columns_view.filter_bar.set_text("")
    ctx.state.columnar = False
    ctx.state.set_engine({"num_blocks": CAPACITY, "block_size": 16})
    ctx.state.apply_events(events)
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    shared = shared_filter(ctx)
    shared.async_events = 100  # the demo replay's 512 events count as long here
    assert shared.worker is ctx.worker
    with qtbot.waitSignals([shared.sigChanged, shared.sigChanged], timeout=30_000):
        view.filter_bar.set_text("kind:evicted and tenant:bob")
        assert shared.pending and view.model.rowCount() == 0 and view.filter_bar.count.text() == "matching\u2026"
    qtbot.waitUntil(lambda: not shared.pending, timeout=30_000)
    assert rows_of(view) == want and view.filter_bar.count.text() == f"{len(want):,} of {len(events):,}"
    # a filter typed while the worker matches wins over the older answer
    view.filter_bar.set_text("kind:lookup")
    view.filter_bar.set_text("kind:stored")
    qtbot.waitUntil(lambda: not shared.pending, timeout=30_000)
    qtbot.wait(200)  # the older job's answer, if any, arrives and is dropped
    assert rows_of(view) == [e.seq for e in events if e.kind == "block_stored"]
    assert isinstance(shared, EventFilter)


@pytest.mark.parametrize("text, middle", [("tenant:bob", False), ("kind:stored or kind:lookup", True), ("", True)])
def test_statistics_follow_the_shared_filter_and_range(qtbot, ctx, events, text, middle):
    """The Statistics pane under the shared filter (set in another view) and a timeline's
    range equals the statistics of the filtered trace: the events the engine's own
    predicate selects, inside the range."""
    from app.views.tools.statistics_view import StatisticsView
    from engine.analysis.statistics import compute

    pane = StatisticsView(ctx)
    qtbot.addWidget(pane)
    log = EventLogView(ctx)
    qtbot.addWidget(log)
    shared = shared_filter(ctx)
    with qtbot.waitSignal(pane.sigComputed, timeout=30_000):
        pane.show()  # shown: computed on the whole log, then again on every change of the filter
    lo, hi = (events[len(events) // 4].seq, events[3 * len(events) // 4].seq) if middle else (None, None)
    with qtbot.waitSignal(pane.sigComputed, timeout=30_000):
        log.filter_bar.set_text(text)  # the event log's bar sets the shared filter
        shared.set_range(lo, hi)
    qtbot.waitUntil(lambda: not pane._busy, timeout=30_000)
    dicts = [e.to_dict() for e in events]
    kept = parse(text).select(dicts) if text else dicts
    if middle:
        kept = [d for d in kept if lo <= d["seq"] <= hi]
    assert 0 < len(kept) < len(events)
    want = compute(kept, block_size=16)
    assert pane.stats.tables() == want.tables() and pane.stats.num_events == len(kept)
    assert pane.summary.text().startswith(f"{len(kept):,} of {len(events):,} events")
    if text:
        assert pane.filter_bar.filter.text == text and pane.filter_bar.count.text() == f"{len(kept):,} of {len(events):,}"
    # clearing both gives the whole log's statistics again
    with qtbot.waitSignal(pane.sigComputed, timeout=30_000):
        shared.clear()
    qtbot.waitUntil(lambda: not pane._busy, timeout=30_000)
    assert pane.stats.tables() == compute(dicts, block_size=16).tables()
    assert pane.summary.text().startswith(f"{len(events):,} of {len(events):,} events")


def shift_drag(qtbot, stack, plot, x0: float, x1: float) -> None:
    """Drag across `plot` of `stack` from x0 to x1 (view coordinates) with Shift held."""
    from PySide6.QtCore import QPointF

    def at(x: float):
        y0, y1 = plot.getViewBox().viewRange()[1]
        scene = plot.getViewBox().mapViewToScene(QPointF(x, (y0 + y1) / 2))
        return stack.mapFromScene(scene)

    shift, left = Qt.KeyboardModifier.ShiftModifier, Qt.MouseButton.LeftButton
    qtbot.mousePress(stack.viewport(), left, shift, at(x0))
    qtbot.mouseMove(stack.viewport(), at((x0 + x1) / 2))
    qtbot.mouseMove(stack.viewport(), at(x1))
    qtbot.mouseRelease(stack.viewport(), left, shift, at(x1))


def test_a_shift_drag_on_the_timeline_selects_a_range(qtbot, ctx, events):
    log = EventLogView(ctx)
    timeline = TimelineView(ctx)
    qtbot.addWidget(log)
    qtbot.addWidget(timeline)
    timeline.resize(900, 420)
    timeline.show()
    qtbot.waitExposed(timeline)
    stack = timeline.glw
    plot = stack.rows[0][1]
    before = stack.x_range()
    shift_drag(qtbot, stack, plot, 120.0, 300.0)
    lo, hi = shared_filter(ctx).range
    # a pixel is a few seqs wide at this zoom: the range is where the pointer went, within one
    px = (before[1] - before[0]) / plot.getViewBox().width()
    assert abs(lo - 120) <= 2 * px + 1 and abs(hi - 300) <= 2 * px + 1
    assert stack.x_range() == pytest.approx(before)  # the drag selected; it did not pan
    assert rows_of(log) == [e.seq for e in events if lo <= e.seq <= hi]
    # a plain drag still pans, and selects nothing new
    qtbot.keyClick(stack, Qt.Key.Key_Escape)
    assert shared_filter(ctx).range is None


def remote_events(n: int = 40) -> list:
    """`n` blocks a vLLM server stored, one every half second of server time, each event
    as engine.remote builds it (a RemoteInfo with the batch time)."""
    from engine.core.events import BlockStored, RemoteInfo

    t0 = 1_700_000_000.0
    out = []
    for i in range(n):
        info = RemoteInfo(source="tcp://pod-a:5557", batch_seq=i, batch_time=t0 + 0.5 * i)
        out.append(BlockStored(seq=i, time=t0 + 100 + i, request_id="", block_id=-1,
                               block_hash=i.to_bytes(8, "big"), parent_hash=None, token_ids=tuple(range(16)),
                               salt=None, remote=info))
    return out


def test_a_range_on_the_remote_timeline_filters_the_other_views(qtbot, tmp_path):
    from PySide6.QtWidgets import QVBoxLayout, QWidget

    from app.views.pool.remote_plots import RemoteTimeline

    c = make_test_context(tmp_path)
    try:
        c.state.set_engine({"remote": True, "num_blocks": 0, "block_size": 16})
        events = remote_events()
        c.state.apply_events(events)
        host = QWidget()
        host.ctx = c  # the panel that holds the remote plots: the stack finds its context there
        qtbot.addWidget(host)
        remote = RemoteTimeline(c.state, host)
        QVBoxLayout(host).addWidget(remote)
        log = EventLogView(c)
        qtbot.addWidget(log)
        host.resize(900, 420)
        host.show()
        qtbot.waitExposed(host)
        remote.refresh()
        stack = remote.glw
        shared = shared_filter(c)
        assert stack.shared is shared
        # R on a zoomed window of server time: the events published from 4.2 s to 9.9 s
        stack.set_x_range(4.2, 9.9)
        stack.setFocus()
        qtbot.keyClick(stack, Qt.Key.Key_R)
        want = [e.seq for e in events if 4.2 <= e.remote.batch_time - remote.start <= 9.9]
        assert want == list(range(9, 20)) and shared.range == (9, 19)
        assert rows_of(log) == want
        # a Shift-drag selects the same way
        stack.set_x_range(0.0, 20.0)
        shift_drag(qtbot, stack, remote.p_cached, 2.0, 6.0)
        lo, hi = shared.range
        assert events[lo].remote.batch_time - remote.start == pytest.approx(2.0, abs=0.6)
        assert events[hi].remote.batch_time - remote.start == pytest.approx(6.0, abs=0.6)
        assert rows_of(log) == list(range(lo, hi + 1))
        # a range set elsewhere (the main timeline, in seqs) shows on the server clock
        shared.set_range(30, 35)
        assert stack.selected_range == pytest.approx((15.0, 17.5))
        # a window with no event keeps none
        stack.select_range(100.0, 200.0)
        assert shared.range == (-1, -1) and rows_of(log) == []
        qtbot.keyClick(stack, Qt.Key.Key_Escape)
        assert shared.range is None and len(rows_of(log)) == len(events)
    finally:
        c.shutdown()


def _own_span(events: list, ids: set[str]) -> tuple[int, int]:
    """First and last seq of the events these requests emitted themselves."""
    own = [e.seq for e in events if getattr(e, "request_id", None) in ids]
    return min(own), max(own)


def _metrics(qtbot, ctx):
    from app.views.pool.metrics_view import MetricsView

    log = EventLogView(ctx)
    metrics = MetricsView(ctx)
    qtbot.addWidget(log)
    qtbot.addWidget(metrics)
    metrics.resize(900, 420)
    metrics.show()
    qtbot.waitExposed(metrics)
    return log, metrics


def test_a_range_on_the_metrics_timeline_selects_the_events_of_those_requests(qtbot, ctx, events):
    log, metrics = _metrics(qtbot, ctx)
    stack, shared = metrics.glw, shared_filter(ctx)
    assert stack.shared is shared
    # the x axis is the request, in start order (the requests' own started events)
    names = metrics.p_rate.getAxis("bottom").names
    assert list(names) == [e.request_id for e in events if e.kind == "request_started"]
    # R on requests 5 to 9: the log keeps every event from the 5th's start to the 9th's finish
    stack.set_x_range(4.6, 9.4)
    stack.setFocus()
    qtbot.keyClick(stack, Qt.Key.Key_R)
    lo, hi = _own_span(events, set(names[4:9]))
    assert shared.range == (lo, hi)
    rows = rows_of(log)
    assert rows == [e.seq for e in events if lo <= e.seq <= hi]
    by_seq = {e.seq: e for e in events}
    assert (by_seq[rows[0]].kind, by_seq[rows[0]].request_id) == ("request_started", names[4])
    assert (by_seq[rows[-1]].kind, by_seq[rows[-1]].request_id) == ("request_finished", names[8])
    # one request at a time: every row is one of theirs, or an eviction one of them made
    assert {getattr(by_seq[s], "request_id", None) or by_seq[s].by_request_id for s in rows} == set(names[4:9])
    # a Shift-drag over requests 12 to 14 selects theirs
    stack.set_x_range(0.5, 24.5)
    shift_drag(qtbot, stack, metrics.p_tokens, 11.7, 14.2)
    assert shared.range == _own_span(events, set(names[11:14]))
    # the log's range with a typed filter: the evictions those requests made, marked in their slots
    log.filter_bar.set_text("kind:evicted")
    lo, hi = shared.range
    evicted = [e for e in events if e.kind == "block_evicted"]
    assert rows_of(log) == [e.seq for e in evicted if lo <= e.seq <= hi]
    slots = np.floor(np.sort(stack._mark_x) + 0.5).astype(int)
    assert slots.tolist() == [names.index(e.by_request_id) + 1 for e in evicted]
    log.filter_bar.set_text("")
    # a range set elsewhere (the main timeline, in seqs) shows on the request axis: from the
    # start of request 5 to the finish of request 7 is the slots of 5, 6 and 7
    lo, hi = _own_span(events, set(names[4:7]))
    shared.set_range(lo, hi)
    first, last = stack.selected_range
    assert first == pytest.approx(4.5) and 7.0 < last < 7.5
    # a redraw of the same requests (a theme change) keeps the zoom the range is seen in
    stack.set_x_range(3.5, 8.5)
    metrics.apply_theme("light")
    assert stack.x_range() == pytest.approx((3.5, 8.5)) and stack.selected_range == (first, last)
    # a window with no request keeps none; Esc clears
    stack.select_range(30.0, 40.0)
    assert shared.range == (-1, -1) and rows_of(log) == []
    qtbot.keyClick(stack, Qt.Key.Key_Escape)
    assert shared.range is None and len(rows_of(log)) == len(events)


def test_a_range_on_the_metrics_timeline_of_an_opened_trace(qtbot, ctx, events):
    """The same on the columnar log File > Open adopts: its request rows give the seqs."""
    from app.runtime.replays import kernel_replay_job
    from engine.core.columnar_log import ColumnarEventLog

    _, columnar = kernel_replay_job(str(DEMO), 16, CAPACITY)
    assert isinstance(columnar, ColumnarEventLog)
    ctx.state.set_engine({"num_blocks": CAPACITY, "block_size": 16})
    ctx.state.adopt_log(columnar)
    log, metrics = _metrics(qtbot, ctx)
    stack, shared = metrics.glw, shared_filter(ctx)
    names = list(metrics.p_rate.getAxis("bottom").names)
    assert names == [e.request_id for e in events if e.kind == "request_started"]
    stack.select_range(2.8, 6.1)
    lo, hi = _own_span(events, set(names[2:6]))  # the Python engine's events: the same seqs
    assert shared.range == (lo, hi)
    assert rows_of(log) == [e.seq for e in events if lo <= e.seq <= hi]
    # scrubbed back into request 4, the range still reaches request 6's finish in the log
    ctx.state.scrub_to(_own_span(events, {names[3]})[0] + 2)
    assert len(metrics.cached_tokens) == 4
    stack.select_range(None)
    stack.select_range(2.8, 4.2)
    assert shared.range == _own_span(events, set(names[2:4]))




@pytest.mark.parametrize("text, middle", [("", False), ("kind:evicted or kind:lookup", True)])
def test_statistics_of_an_opened_trace_count_its_whole_columnar_log(qtbot, ctx, tmp_path, monkeypatch, text,
                                                                     middle):
    """An opened trace's log is columnar: the pane counts every event of it (no "last N",
    though a live log's limit is set far below the log's size here) from the columns, under
    the shared filter and range, and equals `compute` over the dicts of the events kept."""
    from app.runtime.replays import TraceReplays
    from app.views.tools import statistics_view
    from app.views.tools.statistics_view import StatisticsView

    monkeypatch.setattr(statistics_view, "MAX_EVENTS", 1000)
    from engine.analysis.statistics import compute

    path = trace_head(tmp_path, 300)
    replays = TraceReplays(ctx)
    with qtbot.waitSignal(replays.sigShown, timeout=120_000):
        replays.start(path, num_blocks=400)
    log = ctx.state.log
    assert getattr(log, "columnar_log", False)
    pane = StatisticsView(ctx)
    qtbot.addWidget(pane)
    shared = shared_filter(ctx)
    with qtbot.waitSignal(pane.sigComputed, timeout=60_000):
        pane.show()
    qtbot.waitUntil(lambda: not pane._busy, timeout=60_000)
    dicts = [e.to_dict() for e in log.events]
    lo, hi = (dicts[len(dicts) // 4]["seq"], dicts[3 * len(dicts) // 4]["seq"]) if middle else (None, None)
    if text or middle:
        with qtbot.waitSignal(pane.sigComputed, timeout=60_000):
            shared.set_filter(text)
            shared.set_range(lo, hi)
        qtbot.waitUntil(lambda: not pane._busy and not shared.pending, timeout=60_000)
    kept = parse(text).select(dicts) if text else dicts
    if middle:
        kept = [d for d in kept if lo <= d["seq"] <= hi]
    assert 0 < len(kept) <= len(dicts)
    want = compute(kept, block_size=log.block_size)
    assert pane.stats.tables() == want.tables() and pane.stats.num_events == len(kept)
    assert pane.summary.text().startswith(f"{len(kept):,} of {len(dicts):,} events")
    assert "counted" not in pane.summary.text()
    assert want.shared_prefixes and want.reuse_distance.values
