"""What an opened trace's log derives instead of keeping: the series' eviction count (read
from the eviction rows at each event's end). Each reading is compared with what the series
pass computes, on the recorded Mooncake trace and on a log whose evictions do not all count.
"""

from __future__ import annotations

import itertools

import numpy as np

from engine.core.columnar import EVICTED, STORED
from engine.core.columnar_log import ColumnarEventLog, EventSeries, _compiled_series_loop
from engine.core.replay import ReplayConfig
from engine.core.trace import read_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES

MOONCAKE = RESOURCES / "traces" / "mooncake_conversation_trace.jsonl"


def _log(num_requests: int = 800, capacity: int = 300):
    requests = list(itertools.islice(read_trace(MOONCAKE, 512), num_requests))
    log = replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=capacity), record=True).log
    assert log is not None
    return log


def test_the_eviction_count_is_read_from_the_eviction_rows_and_equals_the_pass():
    view = ColumnarEventLog(_log())
    view.warm()
    view.settle()
    s = view.series
    assert EventSeries.evicted.__get__(s) is None  # not kept
    raw = view._compiled_series(_compiled_series_loop())
    assert int(raw.evicted[-1]) > 1000  # the small pool evicts all along
    assert s.evicted.dtype == np.int32 and np.array_equal(s.evicted, raw.evicted)
    assert view.eviction_rows() is view._index["evicted_rows"]  # one index, no reset in a trace
    assert EventSeries.evicted.__get__(view.series) is None  # reading it kept nothing


def test_an_eviction_the_pass_does_not_count_keeps_the_count():
    # an eviction row of a block still in use (no manager writes one) is not counted by the
    # pass: the rows would give one more, so the series keeps the pass's counts
    log = _log(300, 300)
    kinds, bounds = log._per_event["kind"], log.event_bounds
    # a store names a block its request holds: as an eviction, of a block in use
    e = int(np.flatnonzero(kinds == STORED)[0])
    kinds[e] = EVICTED
    view = ColumnarEventLog(log)
    raw = view._compiled_series(_compiled_series_loop())
    assert int(raw.evicted[-1]) < len(view.eviction_rows())  # not every one counted
    s = view.series
    assert EventSeries.evicted.__get__(s) is not None and np.array_equal(s.evicted, raw.evicted)
