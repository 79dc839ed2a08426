"""A live log whose every event has one row (an attached server's: one row a block operation)
keeps no seq per event of its own: the row seq column answers `seqs`. The first event of
several rows (a cache reset clears many blocks) gives it seqs of its own, the same values."""

from __future__ import annotations

import dataclasses

import numpy as np


def one_row_log(events):
    """A live log of the first 2,000 of a remote pool's `events` (one row each), in two batches."""
    from engine.core.live_log import LiveColumnarLog

    log = LiveColumnarLog(0, 16)
    log.extend(events[:1_000])
    log.extend(events[1_000:2_000])
    return log


def then_a_reset(log, events):
    """`log` given a cache reset of its 2,000 blocks (an event of 2,000 rows), then the rest of
    `events`, their seqs moved on by one: (the reset, the events after it)."""
    from engine.core.events import CacheReset

    reset = CacheReset(seq=2_000, time=events[1_999].time, num_blocks_cleared=2_000, remote=events[1_999].remote)
    moved = [dataclasses.replace(e, seq=e.seq + 1) for e in events[2_000:]]
    log.extend([reset])
    log.extend(moved)
    return reset, moved


def test_one_row_events_read_their_seqs_from_the_rows_then_a_reset_gives_them_their_own():
    from app.commands._bench_gui import _remote_events

    events = _remote_events(3_000)
    log = one_row_log(events)
    assert log._seqs is None and log.columnar.num_rows == len(log) == 2_000
    assert np.shares_memory(log.seqs, log.columnar.col("seq"))
    assert log.seqs.tolist() == [e.seq for e in events[:2_000]]
    bytes_before = log.nbytes_by_part()["events"]

    reset, moved = then_a_reset(log, events)
    assert log._seqs is not None and log.columnar.num_rows > len(log)
    want = [e.seq for e in events[:2_000]] + [2_000] + [e.seq for e in moved]
    assert log.seqs.tolist() == want
    assert [log.events[i].seq for i in (0, 1_999, 2_000, 2_001, len(log) - 1)] == [want[i] for i in
                                                                               (0, 1_999, 2_000, 2_001, -1)]
    assert log.state_at(1_999).num_blocks == 2_000 and log.state_at(2_000).num_cached_free == 0
    assert log.nbytes_by_part()["events"] > bytes_before


def test_a_held_journal_keeps_no_seq_per_event(qtbot):
    from tests.test_heldmem_ref import NUM_BLOCKS, _journal_ticks
    from app.runtime.context import make_test_context

    ctx = make_test_context()
    try:
        ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
        _journal_ticks(ctx.state, NUM_BLOCKS, 2)
        log = ctx.state.log
        assert log._seqs is None and len(log) == NUM_BLOCKS
        assert np.array_equal(log.seqs, np.arange(NUM_BLOCKS))
        assert ctx.state.seq_range == (0, NUM_BLOCKS - 1) and ctx.state.contains(NUM_BLOCKS // 2)
        assert log.nbytes_by_part()["events"] <= 12 * NUM_BLOCKS  # row bounds and one series column, 4 B each and room
    finally:
        ctx.shutdown()
