"""A live log whose every event has one row (an attached server's) keeps no row bounds per
event: event i is row i. The first event of several rows (a cache reset) gives it bounds
of its own, the same values a log made from the same rows finds (`snapshot`)."""

from __future__ import annotations

import numpy as np

from tests.test_heldmem_seqs import one_row_log, then_a_reset


def _same_bounds(log) -> None:
    frozen = log.snapshot()  # a ColumnarEventLog: its bounds found from the rows' seqs
    assert np.array_equal(log.starts, frozen.starts) and np.array_equal(log.ends, frozen.ends)
    rows = np.array([0, 1, log.columnar.num_rows // 2, log.columnar.num_rows - 1], np.int64)
    assert np.array_equal(log.event_of_rows(rows), frozen.event_of_rows(rows))
    assert len(log.events) == len(frozen.events) == len(log)


def test_one_row_events_keep_no_bounds_then_a_reset_gives_them_their_own():
    from app.commands._bench_gui import _remote_events

    events = _remote_events(3_000)
    log = one_row_log(events)
    assert log._bounds is None  # the old code kept 4 B an event here
    assert np.array_equal(log.starts, np.arange(2_000)) and np.array_equal(log.ends, np.arange(1, 2_001))
    _same_bounds(log)
    assert list(log.events[1_990:2_000]) == events[1_990:2_000]
    assert list(log.build(0, 3)) == events[:3]
    with_bounds = log.nbytes_by_part()["events"]

    reset, moved = then_a_reset(log, events)
    assert log._bounds is not None and log.columnar.num_rows > len(log)
    _same_bounds(log)
    assert log.events[2_000] == reset and list(log.events[2_001:2_004]) == moved[:3]
    assert list(log.events[1_998:2_000]) == events[1_998:2_000]
    assert log.state_at(1_999).num_blocks == 2_000 and log.state_at(2_000).num_cached_free == 0
    assert log.nbytes_by_part()["events"] > with_bounds


def test_rows_out_of_their_event_order_are_refused_without_bounds():
    from app.commands._bench_gui import _remote_events
    from engine.core.live_log import LiveColumnarLog

    log = LiveColumnarLog(0, 16)
    log.extend(_remote_events(10))
    seqs = np.arange(100, 102, dtype=np.int64)
    try:
        log.rows_appended(3, seqs, np.zeros(2))
    except ValueError as e:
        assert "follow row 10" in str(e)
    else:
        raise AssertionError("rows from 3 on were taken after 10 rows")
