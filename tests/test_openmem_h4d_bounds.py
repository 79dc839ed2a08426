"""A finished log's event bounds packed (`columnar.EventBounds`): a byte an event, 0 for an
event of more than 255 rows (its count in a side table), and the full bound of every 256th
event. Read back equal to the int32 array they stand for, at and around the blocks' edges
and the escaped events, on made-up counts and on a recorded trace whose allocations pass
255 blocks; the log's readers (rows, scrubs, block tables, the event view) equal a log kept
whole."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from engine.core import columnar
from engine.core.columnar import EventBounds
from engine.core.columnar_log import ColumnarEventLog
from engine.core.replay import ReplayConfig
from engine.core.trace import read_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES

SYNTHETIC = RESOURCES / "traces" / "mooncake_synthetic_trace.jsonl"
EDGES = (0, 1, 254, 255, 256, 257, 511, 512, 513)  # events around the 256-event blocks' edges


def _counts(n: int, seed: int) -> np.ndarray:
    """Row counts of `n` events: mostly a few rows, and 254-257 rows (the escape's edge) and
    a long one placed on and beside the blocks' edges."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 4, n)
    for e, c in zip((254, 255, 256, 257, 511, 512, 513, 300, 700), (255, 256, 257, 254, 256, 255, 70_000, 256, 1)):
        if e < n:
            counts[e] = c
    return counts


def _bounds(counts: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int32)


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 511, 512, 513, 900])
def test_packed_bounds_read_back_every_bound_around_the_edges(n):
    counts = _counts(n, n)
    want = _bounds(counts)
    got = EventBounds.of(want)
    # the bytes kept: one an event padded to whole blocks, a bound every 256, the escapes'
    # event and count (only the events of more than 255 rows)
    assert np.array_equal(got.big, np.flatnonzero(counts > 255))
    assert np.array_equal(got.big_sizes, counts[counts > 255])
    assert got.sizes.dtype == np.uint8 and len(got.sizes) == -(-n // 256) * 256
    assert got.nbytes == len(got.sizes) + 4 * (n // 256 + 1) + 8 * len(got.big)
    assert np.asarray(got).dtype == np.int32 and np.array_equal(np.asarray(got), want)
    assert np.array_equal(got.counts(), counts)
    assert [int(got[i]) for i in range(n + 1)] == want.tolist()
    assert int(got[-1]) == int(want[-1])
    picks = np.array([e for e in EDGES if e <= n] + [n, -1, -n - 1])
    assert np.array_equal(got[picks], want[picks])
    for a, b in itertools.product([e for e in EDGES if e <= n] + [n], repeat=2):
        assert np.array_equal(got[a:b], want[a:b]), (a, b)
        if a < b:
            assert np.array_equal(got.counts(a, b), counts[a:b])
    rows = np.unique(np.concatenate([want - 1, want, want + 1]))[:2000]
    starts, ends = got.starts(), got.ends()
    assert np.array_equal(np.asarray(starts), want[:-1]) and np.array_equal(np.asarray(ends), want[1:])
    for side in ("left", "right"):
        assert np.array_equal(np.searchsorted(got, rows, side=side), np.searchsorted(want, rows, side=side))
        assert [int(np.searchsorted(got, r, side=side)) for r in rows[:300]] == \
               np.searchsorted(want, rows[:300], side=side).tolist()
        for view, arr in ((starts, want[:-1]), (ends, want[1:])):
            assert [int(np.searchsorted(view, r, side=side)) for r in rows[:300]] == \
                   np.searchsorted(arr, rows[:300], side=side).tolist()
            assert np.array_equal(np.searchsorted(view, rows, side=side), np.searchsorted(arr, rows, side=side))
    if n:
        with pytest.raises(IndexError):
            got[n + 1]
        at = picks[:-1] % n
        assert np.array_equal(starts[at], want[:-1][at]) and np.array_equal(ends[at], want[1:][at])


def test_bounds_of_an_event_without_rows_are_refused():
    with pytest.raises(ValueError, match="at least one row"):
        EventBounds.of(np.array([0, 3, 3, 5], np.int32))


def _log(monkeypatch=None, whole: bool = False):
    # the synthetic Mooncake trace's first 3,000 requests at 512: 24 allocations of 256 to
    # 374 blocks, the events the escape keeps
    requests = list(itertools.islice(read_trace(SYNTHETIC, 512), 3000))
    if whole:  # seq, request and kind kept as columns: no bounds kept, read from the seqs
        monkeypatch.setattr(columnar, "PER_EVENT_COLUMNS", ())
    log = replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=2000), record=True).log
    if whole:
        monkeypatch.undo()
    return log


def test_a_recorded_traces_packed_bounds_and_their_readers_equal_a_log_kept_whole(monkeypatch):
    log, whole = _log(), _log(monkeypatch, whole=True)
    assert whole.event_bounds is None
    seq = whole.col("seq")
    want = np.append(np.flatnonzero(np.concatenate(([True], seq[1:] != seq[:-1]))), whole.num_rows).astype(np.int32)
    counts = np.diff(want)
    bounds = log.event_bounds
    assert isinstance(bounds, EventBounds) and len(bounds.big) >= 20 and int(counts.max()) > 300
    assert np.array_equal(bounds.big, np.flatnonzero(counts > 255)) and np.array_equal(np.asarray(bounds), want)
    assert bounds.nbytes < 1.05 * len(counts) + 200  # ~a byte an event, not 4
    # the events to read at: the blocks' edges, each escaped event and those beside it
    big = bounds.big.astype(np.int64)
    edges = np.arange(256, len(counts), 256)
    events = np.concatenate([np.array(EDGES), edges - 1, edges, edges + 1, big - 1, big, big + 1])
    events = np.unique(np.clip(events, 0, len(counts) - 1))
    heads = want[events].astype(np.int64)
    few = events[::max(1, len(events) // 30)]  # read by the blocks they fall in, not a span
    assert len(few) * 256 < int(few.max()) - int(few.min())
    for picks in (events, few, few[::-1], np.append(few, len(counts))):
        assert np.array_equal(bounds[picks], want[picks])
    assert np.array_equal(bounds.ends()[few], want[few + 1]) and np.array_equal(bounds.starts()[few], want[few])
    rows = np.unique(np.clip(np.concatenate([heads - 1, heads, heads + 1, want[events + 1] - 1]), 0, log.num_rows - 1))
    for name in ("seq", "request", "kind"):
        dense = whole.col(name)
        assert np.array_equal(log.col(name), dense)
        assert np.array_equal(log.values_at(name, rows), dense[rows])
        for e in events[::3].tolist():
            lo, hi = max(0, int(want[e]) - 1), int(want[e + 1]) + 1
            assert np.array_equal(log.values_at(name, slice(lo, hi)), dense[lo:hi]), (name, e)
            assert int(log.values_at(name, int(want[e]))) == int(dense[want[e]])
    assert [log._event_start(r) for r in rows.tolist()] == [whole._event_start(r) for r in rows.tolist()]
    seqs = [int(seq[want[e]]) for e in events.tolist()]
    for s in seqs + [-1, None]:
        assert log.rows_upto(s) == whole.rows_upto(s)
    for s in seqs[::len(seqs) // 40] + [None]:
        assert log.running_at(s) == whole.running_at(s)
        a, b = log.state_at(s), whole.state_at(s)
        assert np.array_equal(a.hash_keys, b.hash_keys) and np.array_equal(a.free_order(), b.free_order())
    view, ref = ColumnarEventLog(log), ColumnarEventLog(whole)
    assert np.array_equal(view.starts, ref.starts) and np.array_equal(view.ends, ref.ends)
    assert np.array_equal(view.row_events(), ref.row_events())
    assert np.array_equal(view.event_of_rows(rows), ref.event_of_rows(rows))
    assert np.array_equal(view.miss_mask(), ref.miss_mask())
    assert np.array_equal(view.request_of_events(), ref.request_of_events())
    for e in events[::2].tolist():
        assert list(view.build(e, e + 2)) == list(ref.build(e, e + 2))
    view.warm()
    ref.warm()
    view.settle()
    assert isinstance(view.starts.bounds, EventBounds) and view.starts.bounds is log.event_bounds
    for s in seqs[::len(seqs) // 6]:
        pa, pb = view.state_at(s), ref.state_at(s)
        assert np.array_equal(pa.evicted_seq, pb.evicted_seq)
        assert [pa.record(r) for r in range(0, len(log.requests), 29)] == \
               [pb.record(r) for r in range(0, len(log.requests), 29)]
