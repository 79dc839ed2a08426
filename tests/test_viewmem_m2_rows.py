"""What the event log view keeps of an opened trace: with no filter its rows are the log's
positions 0..n-1, kept as an `engine.core.columnar.Consecutive` (no bytes) and read as
the array; filtering, scrolling, selection and growth read the same as the reference
engine's log shown in the same view."""

from __future__ import annotations

import numpy as np

from app.runtime.context import make_test_context
from app.runtime.jobs import trace_block_size
from app.runtime.replays import kernel_replay_job
from engine.core.columnar import Consecutive
from tests.test_app_columnar import NUM_BLOCKS, reference_events, slice_path  # noqa: F401 - slice_path: a fixture


def _shown(view) -> list[tuple]:
    m = view.model
    return [tuple(m.data(m.index(r, c)) for c in (0, 2, 3, 4)) for r in range(m.rowCount())]


def _views(qtbot, tmp_path, slice_path):
    from app.views.pool.event_log_view import EventLogView

    bs = trace_block_size(slice_path)
    ref_ctx = make_test_context(tmp_path / "ref")
    ref_ctx.state.set_engine({"block_size": bs, "num_blocks": NUM_BLOCKS})
    ref_view = EventLogView(ref_ctx)
    qtbot.addWidget(ref_view)
    events = reference_events(slice_path)
    for i in range(0, len(events), 1000):
        ref_ctx.state.apply_events(events[i:i + 1000])
    ctx = make_test_context(tmp_path / "col")
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    view.resize(900, 500)
    view.show()
    _, log = kernel_replay_job(str(slice_path), bs, NUM_BLOCKS)
    ctx.state.set_engine({"block_size": bs, "num_blocks": NUM_BLOCKS})
    ctx.state.adopt_log(log)
    return (ref_ctx, ref_view), (ctx, view)


def test_unfiltered_rows_are_consecutive_and_read_as_the_reference(qtbot, tmp_path, slice_path):
    (ref_ctx, ref_view), (ctx, view) = _views(qtbot, tmp_path, slice_path)
    try:
        n = len(ctx.state.log)
        assert n == len(ref_ctx.state.log) > 10_000
        rows = view.model.rows
        assert isinstance(rows, Consecutive) and rows.nbytes == 0 and len(rows) == n
        assert np.asarray(rows).tolist() == list(range(n)) == ref_view.model.rows.tolist()
        assert _shown(view) == _shown(ref_view)
        assert view.count_label.text() == f"{n:,} of {n:,}"
        # live and following: the table is scrolled to its last row
        qtbot.waitUntil(lambda: view.table.verticalScrollBar().value() == view.table.verticalScrollBar().maximum() > 0)
        # a scrubbed seq's row, as searchsorted over the array would find it
        for seq in (0, 1, 57, n // 3, n - 2, n - 1):
            assert view.model.row_of_seq(seq) == ref_view.model.row_of_seq(seq) == seq
    finally:
        ctx.shutdown()
        ref_ctx.shutdown()


def test_filters_select_and_clear_like_the_reference(qtbot, tmp_path, slice_path):
    (ref_ctx, ref_view), (ctx, view) = _views(qtbot, tmp_path, slice_path)
    try:
        from app.views.pool.event_log_view import request_of

        n = len(ctx.state.log)
        rid = request_of(ref_ctx.state.log.events[n // 2])
        assert rid
        for kind, request, text in (("block_evicted", "", ""), ("", rid, ""), ("lookup", "", "evicted")):
            view.set_filter(kind, request, text)
            ref_view.set_filter(kind, request, text)
            assert not isinstance(view.model.rows, Consecutive)
            assert 0 < len(view.model.rows) < n
            assert np.asarray(view.model.rows).tolist() == ref_view.model.rows.tolist(), (kind, request, text)
            assert _shown(view) == _shown(ref_view)
        view.set_filter("block_evicted")
        # view to model: selecting a row scrubs the pool to its event
        row = len(view.model.rows) // 2
        view.table.selectRow(row)
        seq = view.model.event(row).seq
        assert ctx.state.current_seq == seq and not ctx.state.is_live
        # model to view: the filter cleared, the selected row is the scrubbed event's
        view.set_filter()
        assert isinstance(view.model.rows, Consecutive) and len(view.model.rows) == n
        assert view.table.currentIndex().row() == view.model.row_of_seq(seq) == seq
    finally:
        ctx.shutdown()
        ref_ctx.shutdown()


def test_rows_that_meet_stay_one_run_else_an_array():
    from app.views.pool.event_log_view import _joined

    a = Consecutive(0, 5, np.int32)
    joined = _joined(a, Consecutive(5, 3, np.int32))
    assert isinstance(joined, Consecutive) and np.asarray(joined).tolist() == list(range(8))
    gap = _joined(a, Consecutive(7, 2, np.int32))
    assert isinstance(gap, np.ndarray) and gap.tolist() == [0, 1, 2, 3, 4, 7, 8]
    mixed = _joined(a, np.array([9, 11], np.int64))
    assert mixed.dtype == np.int64 and mixed.tolist() == [0, 1, 2, 3, 4, 9, 11]
    assert _joined(np.zeros(0, np.int64), a) is a and _joined(a, Consecutive(5, 0, np.int32)) is a
