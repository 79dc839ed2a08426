"""The event log's search of the details on an attach's log: the events built a span at a time
give the rows that building each one alone gives (the search was 145 us an event that way: 13 s
for a 91,505-event attach, on the GUI thread, at every keystroke), and the box applies once
typing pauses, not at each key."""

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


@pytest.mark.parametrize("kind, text", [("", "cpu"), ("", "gpu, rank 0"), ("block_evicted", "cpu"),
                                        ("", "cache_reset"), ("", "no such text")])
def test_a_search_over_spans_keeps_the_rows_one_by_one_keeps(qtbot, ctx, kind, text, monkeypatch):
    from app.views.pool import event_log_view

    monkeypatch.setattr(event_log_view, "_SEARCH_SPAN", 300)  # several spans, dense and sparse
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    assert len(ctx.state.log) > 6 * 300
    view.set_filter(kind, "", text)
    want = _one_by_one(ctx.state, kind, text)
    assert view.model.rows.tolist() == want
    if text != "no such text":
        assert want


def test_the_search_box_applies_once_typing_pauses(qtbot, ctx):
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    n = len(ctx.state.log)
    qtbot.keyClicks(view.text_edit, "cpu")
    assert len(view.model.rows) == n and view.model.text == ""  # not yet: typing goes on
    qtbot.waitUntil(lambda: view.model.text == "cpu", timeout=10 * SEARCH_PAUSE_MS)
    assert view.model.rows.tolist() == _one_by_one(ctx.state, "", "cpu")
    assert view.count_label.text() == f"{len(view.model.rows):,} of {n:,}"
