"""An opened trace's log keeps each event's request as runs (`columnar._EventRuns`): the
trace's events come request by request. Every reading of the request column, of the
events and of the pool at scrub points is the one the same replay kept whole gives."""

from __future__ import annotations

import numpy as np

from engine.core import columnar
from engine.core.columnar import _EventRuns
from engine.core.columnar_log import ColumnarEventLog
from tests.test_columnar import assert_views_equal, view_of
from tests.test_tracemem_rows import _log


def test_a_traces_requests_are_kept_as_runs_and_read_as_the_whole_column(monkeypatch):
    log, whole = _log(), _log(monkeypatch, whole=True)
    runs = log._per_event["request"]
    assert isinstance(runs, _EventRuns)  # the old code kept one int32 an event
    assert runs.nbytes * 4 < 4 * len(log)
    dense = whole.col("request")
    assert np.array_equal(log.col("request"), dense)
    rng = np.random.default_rng(3)
    rows = np.sort(rng.integers(0, log.num_rows, 500))
    assert np.array_equal(log.values_at("request", rows), dense[rows])
    for row in (0, 1, int(rows[7]), log.num_rows - 1):
        assert int(log.values_at("request", row)) == int(dense[row])
    a, b = ColumnarEventLog(log), ColumnarEventLog(whole)
    assert np.array_equal(a.request_of_events(), b.request_of_events())
    assert list(log.events()) == list(whole.events())
    log.settle()
    assert isinstance(log._per_event["request"], _EventRuns) and np.array_equal(log.col("request"), dense)
    for seq in (0, len(log) // 3, len(log) - 1):
        assert_views_equal(view_of(log, seq), view_of(whole, seq))


def test_the_a_column_is_a_byte_a_row_and_its_large_values_apart(monkeypatch):
    # the form `a` is kept in when an event's rows do not all hold the same (`PER_EVENT_WHEN_ALIKE`)
    monkeypatch.setattr(columnar, "PER_EVENT_WHEN_ALIKE", ())
    log = _log()
    monkeypatch.undo()
    whole = _log(monkeypatch, whole=True)
    dense = whole.col("a")
    base = log._sparse_base["a"]  # the old code kept 4 + 4 bytes a row that sets one, no byte a row
    rows, values = log._sparse["a"]
    assert base.dtype == np.uint8 and len(rows) < np.count_nonzero(dense) // 2 and np.all(values > 255)
    assert log.col("a").dtype == dense.dtype and np.array_equal(log.col("a"), dense)
    for start, stop in ((0, log.num_rows), (int(rows[0]), int(rows[0]) + 1), (int(rows[1]) - 3, int(rows[3]) + 2)):
        assert np.array_equal(log.values_at("a", slice(start, stop)), dense[start:stop])
        assert np.array_equal(log.rows_window("a", start, stop)[start:stop], dense[start:stop])
    picks = np.concatenate([rows[:20], np.random.default_rng(8).integers(0, log.num_rows, 300)])
    assert np.array_equal(log.values_at("a", picks), dense[picks])
    assert [int(log.values_at("a", int(i))) for i in picks[:30]] == dense[picks[:30]].tolist()
    table = np.zeros((1, 8), np.int64)
    table[0] = (9, len(log) + 3, 0, -1, -1, 70_000, 0, 0)  # a finish of 70,000 tokens written after
    log.write_rows(table)
    assert "a" in log._cols and not log._sparse_base and np.array_equal(log.col("a"), np.append(dense, 70_000))


def test_a_traces_top_ref_count_is_a_byte_an_event(monkeypatch):
    log, whole = _log(), _log(monkeypatch, whole=True)
    a, b = ColumnarEventLog(log), ColumnarEventLog(whole)
    assert a.series.max_ref.dtype == np.int8  # the old code kept int16
    assert np.array_equal(a.series.max_ref, b.series.max_ref) and int(a.series.max_ref.max()) > 0
