"""What an opened trace's log derives instead of keeping: the series' eviction count (read
from the eviction rows at each event's end). Each reading is compared with what the series
pass computes, on the recorded Mooncake trace and on a log whose evictions do not all count.
"""

from __future__ import annotations

import itertools

import numpy as np

from engine.core.columnar import EVICTED, STORED, EventBounds
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


def test_a_replays_seqs_are_kept_as_their_first_and_count_and_read_as_the_array():
    import copy

    from engine.core.columnar import Consecutive

    log = _log()
    kept = log._per_event["seq"]
    assert isinstance(kept, Consecutive) and kept.nbytes == 0 and len(kept) == len(log) == log.num_seq
    whole = copy.copy(log)  # the same log with its seqs as the array they stand for
    whole._per_event = {**log._per_event, "seq": np.asarray(kept)}
    assert np.array_equal(whole._per_event["seq"], np.arange(len(log))) and whole._per_event["seq"].dtype == np.int32
    a, b = ColumnarEventLog(log), ColumnarEventLog(whole)
    assert a.seqs is kept and a.series.seq is kept
    n = len(log)
    rng = np.random.default_rng(7)
    picks = np.concatenate([rng.integers(0, n, 200), [0, n - 1, -1, -n]])
    assert np.array_equal(a.seqs[picks], b.seqs[picks]) and a.seqs[picks].dtype == b.seqs.dtype
    mask = rng.random(n) < 0.3
    assert np.array_equal(a.seqs[mask], b.seqs[mask])
    for sl in (slice(None), slice(5, 90), slice(n - 3, n + 10), slice(40, 4), slice(None, None, 7), slice(None, None, -3)):
        assert np.array_equal(a.seqs[sl], b.seqs[sl]), sl
    for i in (0, 17, n - 1, -1, np.int64(9)):
        assert a.seqs[i] == b.seqs[i] and type(a.seqs[i]) is type(b.seqs[i])
    for bad in (n, -n - 1):
        for s in (a.seqs, b.seqs):
            try:
                s[bad]
            except IndexError:
                pass
            else:
                raise AssertionError(bad)
    probes = [-5, -1, 0, 1, 2, n // 2, n - 2, n - 1, n, n + 9, 2**40, -2**40]
    for side in ("left", "right"):
        assert np.array_equal(np.searchsorted(a.seqs, probes, side=side), np.searchsorted(b.seqs, probes, side=side))
        edges = np.linspace(-1.5, n + 0.5, 37)
        assert np.array_equal(np.searchsorted(a.seqs, edges, side=side), np.searchsorted(b.seqs, edges, side=side))
    for seq in probes[:-2]:
        assert a.count_upto(seq) == b.count_upto(seq) and a.position_of(seq) == b.position_of(seq)
        assert log.rows_upto(seq) == whole.rows_upto(seq)
    assert np.array_equal(log.col("seq"), whole.col("seq"))
    assert np.array_equal(log.values_at("seq", slice(3, 900)), whole.values_at("seq", slice(3, 900)))
    assert list(a.seqs) == list(b.seqs) == a.seqs.tolist() == list(range(n))
    for here in (None, 0, n // 3, n - 1):
        for forward in (True, False):
            assert a.find(a.eviction_mask(), forward, here) == b.find(b.eviction_mask(), forward, here)
    for seq in (0, n // 2, n - 2):
        pa, pb = a.state_at(seq), b.state_at(seq)
        assert pa.seq == pb.seq == seq and np.array_equal(pa.ref_counts, pb.ref_counts)
    assert list(a.events[:40]) == list(b.events[:40]) and list(a.events[-40:]) == list(b.events[-40:])
    assert np.array_equal(a.series.refusal_seqs, b.series.refusal_seqs)
    log.settle()
    assert log._per_event["seq"] is kept  # nothing to copy
    # a log whose seqs skip one keeps them as an array
    gap = np.arange(10, dtype=np.int32)
    gap[5:] += 1
    assert Consecutive.of(gap) is gap


def test_the_hash_rows_are_kept_as_the_events_they_begin_and_read_as_the_rows():
    import copy

    from engine.core.columnar import EVICTED, EventRows

    log = _log()
    rows, values = log._sparse["hash"]
    kind = log.col("kind")
    want = np.flatnonzero((kind == STORED) | (kind == EVICTED)).astype(np.int32)
    assert isinstance(rows, EventRows) and rows.nbytes * 16 < want.nbytes and len(rows) == len(want) == len(values)
    assert np.array_equal(np.asarray(rows), want) and np.asarray(rows).dtype == want.dtype
    rng = np.random.default_rng(3)
    for a, b in [*np.sort(rng.integers(0, len(want) + 1, (200, 2)), axis=1).tolist(), (0, len(want)), (5, 5), (9, 2)]:
        assert np.array_equal(rows[a:b], want[a:b]), (a, b)
    for k in [*range(70), len(want) - 1, -1, -len(want)]:
        assert rows[k] == want[k]
    for bad in (len(want), -len(want) - 1):
        try:
            rows[bad]
        except IndexError:
            pass
        else:
            raise AssertionError(bad)
    picks = rng.integers(0, len(want), 300)
    assert np.array_equal(rows[picks], want[picks])
    probes = np.concatenate([rng.integers(-9, log.num_rows + 9, 3000), want[:64], want[-64:] + 1, [0, log.num_rows, 2**40]])
    for side in ("left", "right"):
        assert np.array_equal(np.searchsorted(rows, probes, side=side), np.searchsorted(want, probes, side=side))
        assert all(np.searchsorted(rows, int(p), side=side) == np.searchsorted(want, int(p), side=side)
                   for p in probes[:80].tolist())
    # the column read through them is the one kept with its rows as an array
    whole = copy.copy(log)
    whole._sparse = {**log._sparse, "hash": (want, values)}
    assert np.array_equal(log.col("hash"), whole.col("hash"))
    for start, stop in ((0, log.num_rows), (int(want[7]), int(want[7]) + 1), (int(want[7]) + 1, 9000), (11, 11)):
        assert np.array_equal(log.values_at("hash", slice(start, stop)), whole.values_at("hash", slice(start, stop)))
        assert np.array_equal(log.rows_window("hash", start, stop)[start:stop], whole.col("hash")[start:stop])
    at = rng.integers(0, log.num_rows, 500)
    assert np.array_equal(log.values_at("hash", at), whole.values_at("hash", at))
    assert list(log.events()) == list(whole.events())
    for seq in (0, len(log) // 3, len(log) - 1):
        sa, sb = log.state_at(seq), whole.state_at(seq)
        assert np.array_equal(sa.hash_keys, sb.hash_keys) and np.array_equal(sa.free_order(), sb.free_order())
    log.settle()  # the bits copied, the rows read over the settled event bounds
    settled = log._sparse["hash"][0]
    assert isinstance(settled, EventRows) and settled.bounds is log.event_bounds  # the packed bounds, shared
    assert isinstance(log.event_bounds, EventBounds) and settled.nbytes == settled.words.nbytes + settled.before.nbytes
    assert np.array_equal(np.asarray(settled), want)
    # a log whose hashed rows are not the first rows of those events keeps them as rows
    assert isinstance(EventRows.of(want[1:], log.event_bounds, np.isin(log._per_event["kind"], (STORED, EVICTED))),
                      np.ndarray)


def test_the_find_masks_are_made_when_asked_not_kept_and_match_the_events():
    from app.runtime.state import is_eviction, is_miss

    view = ColumnarEventLog(_log())
    view.warm()
    view.settle()
    events = list(view.events)
    for mask, predicate in ((view.miss_mask(), is_miss), (view.eviction_mask(), is_eviction)):
        want = np.array([predicate(e) for e in events])
        assert want.sum() > 100 and np.array_equal(mask, want)
    assert view.find(view.miss_mask(), True, None) == next(e.seq for e in events if is_miss(e))
    assert not {"miss_mask", "eviction_mask"} & set(view._index)  # a byte an event each, not kept


def test_a_replays_hash_chains_are_laid_out_from_its_chain_ids_as_from_by_hash():
    from tests.test_chain_layout import _same_layout

    view = ColumnarEventLog(_log(800, 300))
    view.warm()
    view.settle()
    assert "by_hash_map" not in view.live._cache  # warm computed the digests, kept no dict of them
    for seq in (None, len(view) // 2, 40):
        p = view.state_at(seq)
        got = p.chain_index()
        assert got is not None and "by_hash_map" not in p._cache
        hashes, first, par, has = got
        by = p.by_hash  # the reference, read block by block
        assert hashes == list(by) and first.tolist() == [v[0] for v in by.values()]
        parents = p.parents_of(first)
        index = {h: i for i, h in enumerate(hashes)}
        assert has.tolist() == [q is not None for q in parents]
        assert par.tolist() == [-1 if q is None else index.get(q, -1) for q in parents]
        assert 0 < int(has.sum()) and 0 < int((par >= 0).sum()) < len(par)  # roots, and parents not cached
        _same_layout(p, f"replay at {seq}")


def test_the_requests_allocations_are_kept_as_events_and_give_the_block_tables_of_the_rows():
    from engine.core.columnar import ALLOCATED

    log = _log(800, 300)
    start, finish, alloc, bounds = log._request_spans()
    assert log._alloc_by_event and len(alloc) < len(log.requests) * 3  # events, not rows
    kind, req, block = log.col("kind"), log.col("request"), log.col("block")
    rows = np.flatnonzero((kind == ALLOCATED) & (block >= 0))
    rows = rows[np.argsort(req[rows], kind="stable")]
    _, _, got_rows, got_bounds = log._request_index()  # the rows, made from the events
    assert got_rows.dtype == np.int32 and np.array_equal(got_rows, rows)
    assert np.array_equal(got_bounds, np.searchsorted(req[rows], np.arange(len(log.requests) + 1)))
    view = ColumnarEventLog(log)
    ids = log.requests.ids
    rng = np.random.default_rng(5)
    for seq in [0, 1, len(log) - 1, *rng.integers(0, len(log), 25).tolist()]:
        n = log.rows_upto(seq)
        want = {}
        for r in np.flatnonzero((start < n) & (finish >= n)).tolist():
            mine = rows[req[rows] == r]
            want[ids[r]] = tuple(block[mine[mine < n]].tolist())
        assert log.running_at(seq) == want and view.state_at(seq).running == want, seq
    assert any(len(t) > 1 for t in want.values())


def test_the_flag_column_is_a_bit_a_row_and_its_miss_reasons_apart():
    import copy

    from tests.test_columnar import assert_views_equal, view_of

    log = _log()
    assert "flag" not in log._cols and "flag" in log._bit_base
    rows, values = log._sparse["flag"]
    bits = log._sparse_base["flag"]
    assert bits.nbytes == (log.num_rows + 7) // 8 and np.all(values > 1) and len(values) > 50  # the miss reasons
    whole = copy.copy(log)  # the same log with the flags kept whole
    dense = log.col("flag")
    whole._cols = {**log._cols, "flag": dense.copy()}
    whole._sparse = {k: v for k, v in log._sparse.items() if k != "flag"}
    whole._sparse_base = {k: v for k, v in log._sparse_base.items() if k != "flag"}
    whole._bit_base = set()
    assert dense.dtype == np.uint8 and 0 < int((dense == 1).sum()) < log.num_rows
    assert np.array_equal(dense, whole.col("flag"))
    rng = np.random.default_rng(9)
    for start, stop in [(0, log.num_rows), (3, 3), (int(rows[0]), int(rows[0]) + 1), (5, 13), (8, 16), (7, 9001),
                        *np.sort(rng.integers(0, log.num_rows + 1, (40, 2)), axis=1).tolist()]:
        assert np.array_equal(log.values_at("flag", slice(start, stop)), dense[start:stop]), (start, stop)
        assert np.array_equal(log.rows_window("flag", start, stop)[start:stop], dense[start:stop])
    picks = np.concatenate([rows[:20], rng.integers(0, log.num_rows, 400), [0, log.num_rows - 1, -1, -5]])
    assert np.array_equal(log.values_at("flag", picks), dense[picks])
    assert [int(log.values_at("flag", int(i))) for i in picks[:60]] == dense[picks[:60]].tolist()
    assert list(log.events()) == list(whole.events())
    for seq in (0, len(log) // 3, len(log) - 2):
        assert_views_equal(view_of(log, seq), view_of(whole, seq))
    log.settle()
    assert np.array_equal(log.col("flag"), dense)
    table = np.zeros((1, 8), np.int64)
    table[0] = (9, len(log) + 3, 0, -1, -1, 0, 0, 1)  # an aborted finish written after: the column whole again
    log.write_rows(table)
    assert "flag" in log._cols and not log._bit_base and np.array_equal(log.col("flag"), np.append(dense, 1))


def test_the_eviction_rows_are_kept_as_the_events_they_begin():
    from engine.core.columnar import EventRows

    view = ColumnarEventLog(_log())
    view.warm()
    ev = view.eviction_rows()
    kind, block, seq = view.columnar.col("kind"), view.columnar.col("block"), view.columnar.col("seq")
    want = np.flatnonzero((kind == EVICTED) & (block >= 0)).astype(np.int32)
    assert isinstance(ev, EventRows) and ev is view._index["evicted_rows"] and ev.nbytes * 8 < want.nbytes
    assert np.array_equal(ev, want) and ev.dtype == want.dtype
    view.settle()
    ev = view.eviction_rows()
    assert ev.bounds is view.columnar.event_bounds and ev is view._index["evicted_rows"]  # one copy, settled bounds
    assert isinstance(ev.bounds, EventBounds)  # packed, a byte an event
    for n in (0, int(want[0]), int(want[0]) + 1, view.columnar.num_rows // 2, view.columnar.num_rows):
        p = view.state_at(int(seq[n - 1]) if n else -1)
        before = want[want < p.arrays.num_rows]
        blocks = np.full(p.num_blocks, -1, np.int64)
        blocks[block[before]] = seq[before]
        assert np.array_equal(p.evicted_seq, blocks)
        assert p.last_eviction_seq == (int(seq[before[-1]]) if len(before) else -1)
    raw = view._compiled_series(_compiled_series_loop())
    assert np.array_equal(view.series.evicted, raw.evicted)
