"""The event log's search of the details on an attach's log: the events built a span at a time
give the rows that building each one alone gives (the search was 145 us an event that way: 13 s
for a 91,505-event attach, on the GUI thread, at every keystroke), the box applies once typing
pauses, not at each key, and a long search runs on the worker a job at a time (the window
stayed frozen 1.4 s for 91,505 events, about 20 s for 1M), keeping the rows a search here keeps,
the events that arrive meanwhile included."""

from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from app.runtime.context import make_test_context  # noqa: E402
from app.views.pool.event_log_view import SEARCH_PAUSE_MS, EventLogView, describe, request_of  # noqa: E402


@pytest.fixture
def ctx(qtbot, tmp_path):
    from tests.test_colpool import _synthetic
    from tests.test_live_journal import feed_state

    c = make_test_context(tmp_path)
    feed_state(c.state, _synthetic(200, 3), reset_every=53)
    yield c
    c.shutdown()


def _one_by_one(state, kind: str, text: str) -> list[int]:
    """The rows the search keeps, each event built alone and described."""
    out = []
    for i in range(len(state.log)):
        e = state.log.events[i]
        if kind and e.kind != kind:
            continue
        if text in f"{e.kind} {request_of(e)} {describe(e, state)}".lower():
            out.append(i)
    return out


def _searched(qtbot, view) -> None:
    """Wait for a search on the worker to answer."""
    qtbot.waitUntil(lambda: view.model.searching is None, timeout=60_000)


@pytest.mark.parametrize("on_worker", [False, True])
@pytest.mark.parametrize("kind, text", [("", "cpu"), ("", "gpu, rank 0"), ("block_evicted", "cpu"),
                                        ("", "cache_reset"), ("", "no such text")])
def test_a_search_over_spans_keeps_the_rows_one_by_one_keeps(qtbot, ctx, kind, text, on_worker, monkeypatch):
    from app.views.pool import event_log_view

    monkeypatch.setattr(event_log_view, "_SEARCH_SPAN", 300)  # several spans, dense and sparse
    monkeypatch.setattr(event_log_view, "ASYNC_SEARCH", 100 if on_worker else 10**9)
    monkeypatch.setattr(event_log_view, "SEARCH_JOB", 700)  # several jobs
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    assert len(ctx.state.log) > 6 * 300
    view.set_filter(kind, "", text)
    assert (view.model.searching is not None) == on_worker
    _searched(qtbot, view)
    want = _one_by_one(ctx.state, kind, text)
    assert view.model.rows.tolist() == want
    if text != "no such text":
        assert want
    assert view.count_label.text() == f"{len(want):,} of {len(ctx.state.log):,}"


def test_a_search_on_the_worker_shows_how_far_it_is_and_adds_rows_as_jobs_answer(qtbot, ctx, monkeypatch):
    from app.views.pool import event_log_view

    monkeypatch.setattr(event_log_view, "ASYNC_SEARCH", 100)
    monkeypatch.setattr(event_log_view, "SEARCH_JOB", 500)
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    seen: list[tuple[int, str]] = []
    view.model.sigSearched.connect(lambda: seen.append((len(view.model.rows), view.count_label.text())))
    view.set_filter("", "", "rank 0")
    assert view.count_label.text() == "searching 0%\u2026"
    assert view.count_label.toolTip() == f"0 rows found in 0 of the {len(ctx.state.log):,} events searched so far"
    _searched(qtbot, view)
    n = len(ctx.state.log)
    jobs = -(-n // 500)
    assert len(seen) == jobs
    assert [rows for rows, _ in seen] == sorted(rows for rows, _ in seen)  # rows only ever added
    assert seen[0][1] == f"searching {500 / n:.0%}\u2026"
    assert view.count_label.toolTip() == ""
    assert seen[-1] == (len(view.model.rows), f"{len(view.model.rows):,} of {n:,}")


def test_events_that_arrive_during_a_search_are_searched_after_it(qtbot, tmp_path, monkeypatch):
    """An attach goes on appending while the worker searches a snapshot: the ticks wait for
    its answers, then their events are searched too, in order, none twice."""
    from app.views.pool import event_log_view
    from tests.test_colpool import _synthetic
    from tests.test_live_journal import feed_state

    monkeypatch.setattr(event_log_view, "ASYNC_SEARCH", 100)
    monkeypatch.setattr(event_log_view, "SEARCH_JOB", 400)
    c = make_test_context(tmp_path)
    view = EventLogView(c)
    qtbot.addWidget(view)
    ticks = []

    def tick() -> None:
        ticks.append(len(c.state.log))
        if len(ticks) == 15:
            view.set_filter("", "", "cpu")
            assert view.model.searching is not None
        if len(ticks) > 15 and len(ticks) % 5 == 0:
            qtbot.wait(5)  # some answers delivered between ticks, some not

    try:
        feed_state(c.state, _synthetic(200, 3), reset_every=53, per_tick=4, after_tick=tick)
        assert len(c.state.log) > ticks[14] + 1000
        _searched(qtbot, view)
        assert view.model.rows.tolist() == _one_by_one(c.state, "", "cpu")
    finally:
        c.shutdown()


def test_a_new_search_drops_the_one_on_the_worker(qtbot, ctx, monkeypatch):
    from app.views.pool import event_log_view

    monkeypatch.setattr(event_log_view, "ASYNC_SEARCH", 100)
    monkeypatch.setattr(event_log_view, "SEARCH_JOB", 300)
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    jobs = []
    real = event_log_view._search_job
    monkeypatch.setattr(event_log_view, "_search_job", lambda *a: jobs.append(a[2]) or real(*a))
    view.set_filter("", "", "cpu")
    view.set_filter("", "", "removed")  # before the first answer came
    _searched(qtbot, view)
    assert view.model.rows.tolist() == _one_by_one(ctx.state, "", "removed")
    assert jobs.count("cpu") == 1  # its first job ran (or stopped at its next span); no more were asked


def test_a_search_that_fails_on_the_worker_says_so_and_keeps_the_window(qtbot, ctx, monkeypatch):
    from app.views.pool import event_log_view

    monkeypatch.setattr(event_log_view, "ASYNC_SEARCH", 100)

    def broken(*_a):
        raise MemoryError("no room for the span's events")

    monkeypatch.setattr(event_log_view, "_search_job", broken)
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    view.set_filter("", "", "cpu")
    _searched(qtbot, view)
    assert ctx.errors[-1] == "The search of the event log stopped: no room for the span's events"
    assert view.model.rows.tolist() == []
    assert view.count_label.text() == f"0 of {len(ctx.state.log):,}"


@pytest.mark.parametrize("columnar", [True, False])
def test_a_search_on_the_worker_names_evictions_as_the_view_does(qtbot, tmp_path, monkeypatch, columnar):
    """A local engine's lookups that missed an evicted block say where it was evicted ("evicted
    at event N"), read on the worker from the log's snapshot (a columnar log's, or a Python
    log's events so far) as the view reads its state."""
    from app.views.pool import event_log_view
    from tests.test_statistics import replayed_events

    monkeypatch.setattr(event_log_view, "ASYNC_SEARCH", 5)
    events, bs, capacity = replayed_events("twin_evict")
    c = make_test_context(tmp_path)
    try:
        c.state.columnar = columnar
        c.state.set_engine({"block_size": bs, "num_blocks": capacity})
        for at in range(0, len(events), 97):
            c.state.apply_events(events[at:at + 97])
        view = EventLogView(c)
        qtbot.addWidget(view)
        view.set_filter("lookup", "", "evicted at event")
        assert bool(getattr(c.state.log, "live_log", False)) == columnar and view.model.searching is not None
        _searched(qtbot, view)
        want = _one_by_one(c.state, "lookup", "evicted at event")
        assert want and view.model.rows.tolist() == want
    finally:
        c.shutdown()


def test_the_search_box_applies_once_typing_pauses(qtbot, ctx):
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    n = len(ctx.state.log)
    qtbot.keyClicks(view.text_edit, "cpu")
    assert len(view.model.rows) == n and view.model.text == ""  # not yet: typing goes on
    qtbot.waitUntil(lambda: view.model.text == "cpu", timeout=10 * SEARCH_PAUSE_MS)
    assert view.model.rows.tolist() == _one_by_one(ctx.state, "", "cpu")
    assert view.count_label.text() == f"{len(view.model.rows):,} of {n:,}"
