"""`journal_pool_class()`'s batch times across journal releases (`ColumnarPool.release_journal`):
`row_times` drops what the journal drops, and `times_of` (global rows) dates every row as a
pool that never released does."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.overlay import journal_pool_class


def _batches(num_events: int) -> list:
    payloads, _, _ = recorded_stream(num_events, gpu_blocks=2_000, seed=3)
    return [fastwire.decode_columns(seq, p) for seq, p in enumerate(payloads)]


@pytest.mark.parametrize("min_rows", [1, 1024])
def test_times_of_equal_a_pool_that_never_released(min_rows):
    """Frames a call, many a call and restarts, a take and a release after each: every take's
    times equal the same take of a pool never released, and what it holds is a few ticks' rows."""
    pool_class = journal_pool_class()
    kept, released = pool_class("t"), pool_class("t")
    released._release_min_rows = min_rows
    batches = _batches(6_000)
    num_drops = 0
    step = 0
    at = 0
    while at < len(batches):
        size = (1, 17, 40)[step % 3]
        part = batches[at:at + size]
        at += size
        for pool in (kept, released):
            if size == 1:
                pool.apply(part[0])
            else:
                pool.apply_many(part)
            if step % 7 == 6:  # a restart: a clear dated by its batch time
                pool.reset(part[-1].seq, 1_900_000_000.0 + step)
        a, b = kept.take_journal(), released.take_journal()
        assert (a.start, a.stop) == (b.start, b.stop)
        assert np.array_equal(kept.times_of(a), released.times_of(b)), step
        base = released.journal_base
        released.release_journal(b.stop)
        num_drops += released.journal_base > base
        # what is still held reads the same from its first row on
        held = released.journal_since(released.journal_base)
        assert np.array_equal(kept.times_of(kept.journal_since(released.journal_base)), released.times_of(held))
        step += 1
    assert num_drops >= 3 and released.journal_base > 0
    # (the times shift where they lie while J has at least half their room, `_journal_released`)
    assert len(released.J) <= len(released.row_times) <= 2 * len(released.J)
    assert len(released.row_times) < len(kept.row_times) // 4
    assert kept.num_journal_rows == released.num_journal_rows > 20_000
    # a take that reaches back past the rows released cannot be dated
    with pytest.raises(ValueError, match="released"):
        released.times_of(kept.journal_since(0))


def test_times_are_not_shifted_in_place():
    """A release gives `row_times` a new array: one a reader still holds keeps its values."""
    pool = journal_pool_class()("t")
    pool._release_min_rows = 1
    batches = _batches(1_500)
    pool.apply_many(batches[:20])
    rows = pool.take_journal()
    before = pool.row_times
    want = before.copy()
    pool.release_journal(rows.stop)
    assert pool.journal_base == rows.stop and pool.row_times is not before
    assert np.array_equal(before, want)
    pool.apply_many(batches[20:40])
    more = pool.take_journal()
    assert np.all(pool.times_of(more) >= want[:len(rows)].max())
