"""Rows made off the writing thread (`LiveColumnarLog.prepare` on an engine thread,
`extend_prepared` on the GUI thread) against the Python `EventLog`, the reference.

The same real flows as tests/test_live_log.py: the Mooncake trace (evicting), the token
trace, a manager with tenants, a cache reset and a semantic event, a pool that grows and
a recorded vLLM server (where preparing stops and the rest goes the plain way); each
prepared in chunks on one thread while another writes, compared at many scrub points.
"""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest

from engine.core.live_log import LiveColumnarLog, PreparedBatch
from engine.core.projection import EventLog
from tests.test_live_log import (
    MOONCAKE, TOKENS, _check_same, _check_scrubbing, _events_of_manager, _events_of_trace, _remote_events,
    _remote_fixtures, _strip_times,
)


def _feed_prepared(events: list, num_blocks: int, block_size: int, chunk: int, checkpoint_rows: int | None = None,
                   check_every_batch: bool = False) -> tuple[LiveColumnarLog, EventLog, int]:
    """Chunks prepared on a producer thread, written here in the order made, as the bridge
    does; returns the logs and how many events the prepared rows covered."""
    col = LiveColumnarLog(num_blocks, block_size, checkpoint_rows=checkpoint_rows)
    ref = EventLog(num_blocks, block_size)
    made: queue.Queue = queue.Queue()

    def produce() -> None:
        for i in range(0, len(events), chunk):
            part = events[i:i + chunk]
            made.put(PreparedBatch(part, [col.prepare(part)]) if col.can_prepare else part)
        made.put(None)

    producer = threading.Thread(target=produce)
    producer.start()
    covered = 0
    while (batch := made.get()) is not None:
        covered += sum(len(p) for p in getattr(batch, "prepared", ()))
        col.extend(batch)
        ref.extend(list(batch))
        if check_every_batch:
            _check_same(col, ref, f"after {len(ref)} events")
    producer.join()
    _check_same(col, ref, "at the end")
    return col, ref, covered


def test_the_mooncake_trace_prepared_on_another_thread_equals_the_reference():
    events = _events_of_trace(MOONCAKE, 120, 160, 512)
    col, ref, covered = _feed_prepared(events, 160, 512, 97, checkpoint_rows=256)
    assert covered == len(events)  # every row was made off the writing thread
    assert ref.live.counters.num_evicted_blocks > 0
    assert col.num_checkpoints > 2
    _check_scrubbing(col, ref)
    assert _strip_times(col.events) == _strip_times(ref.events)


def test_prepared_rows_equal_the_plain_path_row_for_row():
    events = _events_of_trace(TOKENS, 60, 64, 16)
    plain = LiveColumnarLog(64, 16, checkpoint_rows=128)
    plain.extend(events)
    col, ref, covered = _feed_prepared(events, 64, 16, 33, checkpoint_rows=128, check_every_batch=True)
    assert covered == len(events)
    for name in ("kind", "seq", "request", "block", "hash", "a", "b", "flag"):
        assert np.array_equal(col.columnar.col(name), plain.columnar.col(name)), name
    _check_scrubbing(col, ref)


def test_tenants_a_reset_and_other_events_are_prepared_too():
    events = _events_of_manager()
    assert {"cache_reset", "semantic_stored"} <= {e.kind for e in events}
    col, ref, covered = _feed_prepared(events, 24, 4, 5, checkpoint_rows=16, check_every_batch=True)
    assert covered == len(events)
    _check_scrubbing(col, ref)
    assert _strip_times(col.events) == _strip_times(ref.events)


def test_a_pool_that_grows_stops_preparing_and_goes_on_the_plain_way():
    events = _events_of_trace(MOONCAKE, 60, 4096, 512)
    col = LiveColumnarLog(8, 512, checkpoint_rows=200)
    ref = EventLog(8, 512)
    prepared = col.prepare(events[:300])
    assert 0 < len(prepared) < 300 and not col.can_prepare  # a block past the 8th: the writer grows it
    col.extend(PreparedBatch(events[:300], [prepared]))
    col.extend(events[300:])
    ref.extend(events)
    _check_same(col, ref, "grown")
    _check_scrubbing(col, ref)


@pytest.mark.parametrize("name", sorted(_remote_fixtures())[:2])
def test_a_remote_server_is_never_prepared(name):
    events = _remote_events(_remote_fixtures()[name])
    if not events:
        pytest.skip("the fixture's frames carry no block event")
    col, ref, covered = _feed_prepared(events, 0, 16, 50, checkpoint_rows=64)
    assert covered == 0  # slots are placed as rows are written: only the writing thread may
    _check_scrubbing(col, ref)


def test_split_batches_and_out_of_order_writes_are_refused_or_kept_whole():
    events = _events_of_trace(TOKENS, 20, 64, 16)
    col = LiveColumnarLog(64, 16)
    first, second = col.prepare(events[:150]), col.prepare(events[150:])
    a, b = first.split(40)
    assert len(a) == 40 and len(a) + len(b) == 150 and len(a.table) + len(b.table) == len(first.table)
    with pytest.raises(ValueError, match="in the order made"):
        col.extend_prepared([b])
    assert len(col) == 0  # nothing of it was kept
    col.extend(PreparedBatch(events[:40], [a]))
    col.extend_prepared([b, second])
    ref = EventLog(64, 16)
    ref.extend(events)
    _check_same(col, ref, "split")
    with pytest.raises(ValueError, match="in the order made"):
        col.extend_prepared([LiveColumnarLog(64, 16).prepare(events[:3])])
    # a seq not after the one before: preparing stops there, the writer refuses it as before
    late = col.prepare(events[5:9])
    assert len(late) == 0 and not col.can_prepare
