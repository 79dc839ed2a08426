"""What an opened trace's log keeps of its rows: `hash` and `a` as the rows that set them
only (the stores' and evictions' hashes, where as a bit an event), `seq`, `request` and `kind`
as one value per event (shared with the event log's per-event arrays; the seqs, 0, 1, 2, ...,
as their first and count), the flag as a bit a row, `block` in int16; the series' `empty` made
when read; one copy of an index two names share after `settle`. Each reading is compared
with the same replay kept whole.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np

from engine.analysis.statistics_columnar import compute_columnar
from engine.core import columnar
from engine.core.columnar import EVICTED, STORED
from engine.core.columnar_log import ColumnarEventLog, EventSeries, _compiled_series_loop
from engine.core.replay import ReplayConfig
from engine.core.trace import read_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES
from tests.test_columnar import assert_views_equal, view_of

MOONCAKE = RESOURCES / "traces" / "mooncake_conversation_trace.jsonl"


def _log(monkeypatch=None, whole: bool = False):
    requests = list(itertools.islice(read_trace(MOONCAKE, 512), 800))
    if whole:  # the hash, a, seq, request and kind columns kept whole, block in int32, as before
        monkeypatch.setattr(columnar, "SPARSE_COLUMNS", {"b": 0})
        monkeypatch.setattr(columnar, "PER_EVENT_COLUMNS", ())
        monkeypatch.setattr(columnar, "NARROW_COLUMNS", {})
    log = replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=300), record=True).log
    if whole:
        monkeypatch.undo()
    assert log is not None
    return log


def _same(x, y) -> bool:
    """Equal values, arrays compared by their elements (statistics hold histograms' values)."""
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return np.array_equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(_same, x, y))
    return x == y


def test_the_hash_and_a_columns_are_kept_sparse_and_read_as_the_whole_ones(monkeypatch):
    log, whole = _log(), _log(monkeypatch, whole=True)
    kind = whole.col("kind")
    for name, fill in (("hash", -1), ("a", 0)):
        assert name not in log._cols and name in whole._cols
        dense = whole.col(name)
        if name in log._per_event:  # `a`, alike on every row of an event: its events that set one (H6)
            kept_a = log._per_event[name]
            assert isinstance(kept_a, columnar._EventSparse) and name not in log._sparse
            rows = np.flatnonzero(dense != fill)
            assert np.array_equal(np.asarray(kept_a), dense[np.asarray(log.event_bounds)[:-1]])
        else:
            rows, values = log._sparse[name]
            base = log._sparse_base.get(name)  # a byte a row, and as rows the values a byte does not hold
            kept = dense != fill if base is None else (dense < 0) | (dense > 255)
            assert np.array_equal(rows, np.flatnonzero(kept)) and np.all(values != fill)
        if name == "hash":  # the rows that carry one
            assert np.array_equal(rows, np.flatnonzero((kind == STORED) | (kind == EVICTED)))
        got = log.col(name)
        assert got.dtype == dense.dtype and np.array_equal(got, dense)
        for start, stop in ((0, log.num_rows), (7, 7), (int(rows[2]), int(rows[2]) + 1), (int(rows[2]) + 1, 5000)):
            assert np.array_equal(log.values_at(name, slice(start, stop)), dense[start:stop])
            assert np.array_equal(log.rows_window(name, start, stop)[start:stop], dense[start:stop])
        picks = np.concatenate([np.random.default_rng(4).integers(0, log.num_rows, 500), rows[:30],
                                [0, log.num_rows - 1]])
        assert np.array_equal(log.values_at(name, picks), dense[picks])
        assert all(int(log.values_at(name, i)) == int(dense[i]) for i in picks[:40].tolist())
    assert list(log.events()) == list(whole.events())
    log.build_checkpoints(every=1009)  # many intervals: each scrub passes over a part of the rows
    whole.build_checkpoints(every=1009)
    rng = random.Random(11)
    for seq in sorted({rng.randrange(len(log)) for _ in range(25)} | {0, len(log) - 1}):
        assert_views_equal(view_of(log, seq), view_of(whole, seq))
    a, b = ColumnarEventLog(log), ColumnarEventLog(whole)
    assert _same(dataclasses.asdict(compute_columnar(a)), dataclasses.asdict(compute_columnar(b)))


def test_seq_and_request_are_kept_per_event_and_read_as_the_whole_columns(monkeypatch):
    log, whole = _log(), _log(monkeypatch, whole=True)
    assert sorted(log._per_event) == ["a", "kind", "request", "seq"] and not {"seq", "request", "kind", "a"} & set(log._cols)
    assert whole.event_bounds is None and "seq" in whole._cols
    n, num_events = log.num_rows, len(log)
    hash_rows, hash_values = log._sparse["hash"]
    a_events = log._per_event["a"]
    flag_rows, flag_values = log._sparse["flag"]
    # 4 + 4 + 1 bytes a row (int32 seq and request, the kind) become the kind's 1 an event and its first
    # row's 4 (the seqs 0, 1, 2, ... keep no array: a Consecutive), the requests 4 + 4 a run of one
    # request's events; the hash's 4 a row become, for where, a bit an event (EventRows: each store
    # and eviction sets the one row of its event) and, for what, a bit a row that sets one and 4 a
    # row that names a chain met before (FirstSeen: the kernel numbers a new chain one more); a's 4 a row 4 + 4 an event
    # that sets one (every row of an event holds its event's); the flag's byte a row a bit a row and 4 + 1 a row whose flag is
    # neither 0 nor 1 (a lookup's miss reason); the block's 4 a row 2
    runs = log._per_event["request"]
    assert runs.nbytes == 8 * len(runs.at) < 4 * num_events
    assert log._per_event["seq"].nbytes == 0 and isinstance(log._per_event["seq"], columnar.Consecutive)
    assert isinstance(hash_rows, columnar.EventRows) and hash_rows.nbytes < len(hash_values) < num_events
    num_again = len(hash_values.others)
    assert isinstance(hash_values, columnar.FirstSeen) and 0 < num_again < len(hash_values)
    assert hash_values.nbytes == 4 * num_again + (len(hash_values) // 64 + 2) * (8 + 4) < 4 * len(hash_values)
    assert "a" not in log._sparse_base and log._sparse_base["flag"].nbytes == (n + 7) // 8
    assert a_events.nbytes == 8 * len(a_events.at) < 8 * num_events // 2
    assert np.all(flag_values > 1) and len(flag_rows) < n // 100
    # the bounds (each event's first row, then n): a byte an event, padded to blocks of 256,
    # a 4-byte bound every 256 events, and 4 + 4 an event of more than 255 rows (none here)
    bounds = log.event_bounds
    assert isinstance(bounds, columnar.EventBounds) and len(bounds.big) == 0
    assert bounds.nbytes == -(-num_events // 256) * 256 + 4 * (num_events // 256 + 1) < 1.02 * num_events + 4
    assert log.nbytes() == (whole.nbytes() - 20 * n + num_events + bounds.nbytes + runs.nbytes
                            + hash_rows.nbytes + hash_values.nbytes + a_events.nbytes
                            + (n + 7) // 8 + 5 * len(flag_rows))
    assert log._cols["block"].dtype == np.int16 and whole._cols["block"].dtype == np.int32
    assert log.kept("block").dtype == np.int16 and np.array_equal(log.kept("block"), whole.col("block"))
    for name in ("seq", "request", "kind", "block", "a"):
        dense = whole.col(name)
        assert log.col(name).dtype == dense.dtype and np.array_equal(log.col(name), dense)
        bounds = log.event_bounds
        edges = [int(bounds[1]), int(bounds[1]) + 1, int(bounds[40]) - 1]
        for start, stop in ((0, n), (3, 3), (0, 1), (edges[0], edges[1]), (edges[1], edges[2]), (5, n - 2), (n - 1, n)):
            assert np.array_equal(log.values_at(name, slice(start, stop)), dense[start:stop])
            assert np.array_equal(log.rows_window(name, start, stop)[start:stop], dense[start:stop])
        picks = np.random.default_rng(9).integers(0, n, 700)
        assert np.array_equal(log.values_at(name, picks), dense[picks])
        assert all(int(log.values_at(name, int(i))) == int(dense[i]) for i in picks[:50].tolist() + [0, n - 1])
    for seq in [-1, 0, 1, 77, len(log) // 2, len(log) - 1, len(log), 2**40, None]:
        assert log.rows_upto(seq) == whole.rows_upto(seq)
        assert log.running_at(seq) == whole.running_at(seq)
    a, b = ColumnarEventLog(log), ColumnarEventLog(whole)
    assert a.starts.bounds is a.ends.bounds is log.event_bounds and a.seqs is log._per_event["seq"]
    assert a.kinds is log._per_event["kind"]
    for name in ("starts", "ends", "seqs", "kinds"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert np.array_equal(a.request_of_events(), b.request_of_events())
    a.warm()
    b.warm()
    a.settle()
    assert a.starts.bounds is log.event_bounds and a.series.seq is log._per_event["seq"]
    for seq in (None, len(log) // 3, 5):
        pa, pb = a.state_at(seq), b.state_at(seq)
        assert [pa.record(r) for r in range(len(log.requests))] == [pb.record(r) for r in range(len(log.requests))]
        assert np.array_equal(pa.evicted_seq, pb.evicted_seq) and pa.last_eviction_seq == pb.last_eviction_seq
        assert pa.last_request_id == pb.last_request_id
        assert [pa.block_info(i) for i in range(0, log.num_blocks, 7)] == \
               [pb.block_info(i) for i in range(0, log.num_blocks, 7)]
    assert [f.name for f in dataclasses.fields(a.series)
            if not np.array_equal(getattr(a.series, f.name), getattr(b.series, f.name))] == []


def test_a_write_after_the_sparse_hash_makes_it_whole_with_minus_one():
    log = _log()
    before = {name: log.col(name) for name in ("hash", "seq", "request", "kind", "block")}
    table = np.zeros((1, 8), np.int64)
    table[0] = (1, len(log) + 3, 0, -1, -1, 0, 0, 0)  # a started row: no hash
    log.write_rows(table)
    assert "hash" in log._cols and np.array_equal(log.col("hash"), np.append(before["hash"], -1))
    assert not log._per_event and log.event_bounds is None
    assert np.array_equal(log.col("seq"), np.append(before["seq"], len(log) + 3))
    assert np.array_equal(log.col("request"), np.append(before["request"], 0))
    assert np.array_equal(log.col("kind"), np.append(before["kind"], 1))
    assert log._cols["block"].dtype == np.int32 and np.array_equal(log.col("block"), np.append(before["block"], -1))
    assert log.rows_upto(len(log) + 3) == log.num_rows and log.rows_upto(len(log) + 2) == log.num_rows - 1


def test_the_series_empty_count_is_made_when_read_and_equals_the_pass():
    view = ColumnarEventLog(_log())
    view.warm()
    view.settle()
    s = view.series
    assert EventSeries.empty.__get__(s) is None  # not kept
    raw = view._compiled_series(_compiled_series_loop())  # the pass's own int32 sums
    assert s.empty.dtype == np.int16 and np.array_equal(s.empty, raw.empty)
    assert np.array_equal(s.empty.astype(np.int64) + s.in_use + s.cached_free, np.full(len(view), 300))


def test_settle_keeps_an_index_two_names_share_once():
    view = ColumnarEventLog(_log())
    view.warm()
    assert view._index["eviction_rows"] is view._index["evicted_rows"]  # no cache reset in a trace
    view.settle()
    assert view._index["eviction_rows"] is view._index["evicted_rows"]
