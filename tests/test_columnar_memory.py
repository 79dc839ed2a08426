"""What a trace's columnar log keeps once the app has opened it, and that keeping less
changes no reading: `settle` (the arrays made again after the replay's temporaries are
gone), the narrow key table and request index, the eviction rows kept once, the 16K-block
pool's `empty` series in int16, and no `tier` column. Each read is compared with the
reference projection or with the same log before the change.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np

from engine.core.columnar import ALLOCATED, EVICTED, KEPT_COLUMNS, ColumnarLog, EventBounds
from engine.core.columnar_log import ColumnarEventLog, EventSeries, _compiled_series_loop
from engine.core.replay import ReplayConfig
from engine.core.trace import read_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES
from tests.test_columnar import assert_views_equal, reference_states, view_of

TRACES = RESOURCES / "traces"


def _log(name: str, block_size: int, capacity: int, limit: int) -> ColumnarLog:
    requests = list(itertools.islice(read_trace(TRACES / name, block_size), limit))
    log = replay_kernel(requests, ReplayConfig(block_size=block_size, capacity_blocks=capacity), record=True).log
    assert log is not None
    return log


def _kept_arrays(log: ColumnarLog) -> list[np.ndarray]:
    keys, req = log.keys, log.requests
    out = [log.col(name) for name in log._cols]
    out += [keys.parent, keys.item, keys.tag, keys.content, req._last, req._nfull, req._salt_ids,
            req._nprompt, *log._req_index[1], *(a for pair in log._sparse.values() for a in pair),
            *log._sparse_base.values(),
            *(a for v in log._per_event.values() for a in ((v.at, v.values) if hasattr(v, "at") else (v,))),
            *([] if log.event_bounds is None else  # the packed bounds: their four arrays
              [log.event_bounds.sizes, log.event_bounds.offsets, log.event_bounds.big, log.event_bounds.big_sizes])]
    for state in log._cp_states:
        out += [state.ref_counts, state.hash_keys, state.free_pos]
    return out


def test_settle_copies_every_kept_array_and_every_reading_stays_the_reference():
    for name, bs, capacity, limit in (("demo_tokens.jsonl", 16, 40, 400),
                                      ("mooncake_conversation_trace.jsonl", 512, 300, 600)):
        log = _log(name, bs, capacity, limit)
        log.build_checkpoints(every=997)  # several snapshots to move
        before = _kept_arrays(log)
        copies = [a.copy() for a in before]
        events = list(log.events())
        log.settle()
        after = _kept_arrays(log)
        assert len(after) == len(before)
        for old, new, copy in zip(before, after, copies):
            assert not np.shares_memory(old, new)
            assert new.dtype == copy.dtype and np.array_equal(new, copy)
        assert list(log.events()) == events
        rng = random.Random(5)
        seqs = sorted({rng.randrange(len(log)) for _ in range(10)} | {0, len(log) - 1})
        ref = reference_states(events, capacity, bs, seqs)
        for seq in reversed(seqs):
            assert_views_equal(view_of(log, seq), ref[seq])


def test_a_log_keeps_no_tier_column_and_narrow_tables_read_the_same_values():
    log = _log("mooncake_conversation_trace.jsonl", 512, 300, 600)
    assert "tier" not in log._cols
    assert sorted(n for n, _ in KEPT_COLUMNS) == sorted([*log._cols, *log._sparse, *log._per_event])
    keys = log.keys
    assert keys.item.dtype == np.int32 and keys.tag.dtype == np.uint8  # the trace's ids fit, its tags a byte
    wide = type(keys)(keys.parent, keys.item.astype(np.int64), keys.tag.astype(np.int64), keys.content,
                      keys.salts, keys.hasher, keys.block_size, keys.models)
    ids = np.arange(len(keys))
    assert [keys.digest(k) for k in ids.tolist()] == [wide.digest(k) for k in ids.tolist()]
    assert np.array_equal(keys.root_salt_ids(ids), wide.root_salt_ids(ids))
    big = np.array([1 << 40, 3], np.int64)
    assert type(keys)(keys.parent[:2], big, big, keys.content, keys.salts, keys.hasher, 512).item.dtype == np.int64
    tags = np.array([3, 1 << 20, (2 << 33) | 5], np.int64)  # a salt past a byte, a model's id past 32 bits
    assert type(keys)(keys.parent[:2], big, tags[:2], keys.content, keys.salts, keys.hasher, 512).tag.dtype == np.int32
    assert type(keys)(keys.parent[:3], big[[0, 1, 1]], tags, keys.content, keys.salts, keys.hasher, 512).tag.dtype == np.int64
    start, finish, alloc, bounds = log._request_index()
    assert alloc.dtype == np.int32
    kind = log.col("kind")
    rows = np.flatnonzero((kind == ALLOCATED) & (log.col("block") >= 0))
    assert np.array_equal(alloc, rows[np.argsort(log.col("request")[rows], kind="stable")])


def test_eviction_rows_are_kept_once_and_empty_is_int16_for_a_16k_block_pool():
    log = _log("mooncake_conversation_trace.jsonl", 512, 16384, 4000)
    view = ColumnarEventLog(log)
    view.warm()
    live = view.live
    ev = view._index["evicted_rows"]
    assert view._index["eviction_rows"] is ev and ev.dtype == np.int32  # no cache reset in a trace
    kind, block = log.col("kind"), log.col("block")
    assert np.array_equal(ev, np.flatnonzero((kind == EVICTED) & (block >= 0)))
    assert live.last_eviction_seq == (int(log.col("seq")[ev[-1]]) if len(ev) else -1)
    s = view.series
    assert s.empty.dtype == np.int16
    expect = log.num_blocks - s.in_use.astype(np.int64) - s.cached_free.astype(np.int64)
    assert int(expect.max()) == 16384  # past int16's half range: `narrowest` would keep int32
    assert np.array_equal(s.empty.astype(np.int64), expect)


def test_the_sparse_b_column_reads_as_the_whole_one_and_is_made_whole_before_a_write():
    requests = list(itertools.islice(read_trace(TRACES / "mooncake_conversation_trace.jsonl", 512), 600))
    config = ReplayConfig(block_size=512, capacity_blocks=300)
    log = replay_kernel(requests, config, record=True).log
    rows, values = log._sparse["b"]
    assert "b" not in log._cols and rows.dtype == np.int32 and np.all(values != 0)
    assert 0 < len(rows) < log.num_rows // 8  # lookups only
    dense = log.col("b")
    assert dense.dtype == np.int32 and np.array_equal(np.flatnonzero(dense), rows)
    for start, stop in ((0, log.num_rows), (5, 5), (int(rows[3]), int(rows[3]) + 1), (int(rows[3]) + 1, 900)):
        assert np.array_equal(log.values_at("b", slice(start, stop)), dense[start:stop])
    picks = np.random.default_rng(2).integers(0, log.num_rows, 500)
    picks = np.concatenate([picks, rows[:20], [log.num_rows - 1, 0]])
    assert np.array_equal(log.values_at("b", picks), dense[picks])
    assert int(log.values_at("b", int(rows[7]))) == int(dense[rows[7]])
    assert log.nbytes() < 23 * log.num_rows  # 22 B a row and the lookups' b
    table = np.zeros((1, 8), np.int64)
    table[0] = (1, len(log) + 5, 0, -1, -1, 0, 123, 0)  # a started row with b set
    log.write_rows(table)
    assert not log._sparse and np.array_equal(log.col("b")[:-1], dense) and int(log.col("b")[-1]) == 123


def test_settling_the_warmed_event_log_keeps_its_series_indexes_and_events():
    log = _log("mooncake_conversation_trace.jsonl", 512, 300, 800)
    view = ColumnarEventLog(log)
    view.warm()
    series = {f.name: getattr(view.series, f.name).copy() for f in dataclasses.fields(EventSeries)}
    index = {k: v.copy() for k, v in view._index.items() if isinstance(v, np.ndarray)}
    starts, ends, seqs, kinds = view.starts.copy(), view.ends.copy(), view.seqs.copy(), view.kinds.copy()
    events = list(view.events[:50]) + list(view.events[-50:])
    old_series = view.series
    view.settle()
    assert view.series is old_series and view.series.seq is view.seqs
    for f, before in series.items():
        got = getattr(view.series, f)
        assert got.dtype == before.dtype and np.array_equal(got, before), f
    for k, before in index.items():
        assert np.array_equal(view._index[k], before), k
    for got, before in ((view.starts, starts), (view.ends, ends), (view.seqs, seqs), (view.kinds, kinds)):
        assert got.dtype == before.dtype and np.array_equal(got, before)
    # two views of the log's packed bounds, as before of one array, nothing kept of their own
    assert view.starts.bounds is view.ends.bounds is view.columnar.event_bounds
    assert isinstance(view.columnar.event_bounds, EventBounds) and view.starts.nbytes == view.ends.nbytes == 0
    view.events._cache.clear()
    assert list(view.events[:50]) + list(view.events[-50:]) == events


def test_row_events_are_int32_and_name_each_rows_event():
    log = _log("mooncake_conversation_trace.jsonl", 512, 300, 800)
    view = ColumnarEventLog(log)
    got = view.row_events()
    assert got.dtype == np.int32 and len(got) == log.num_rows
    seq = log.col("seq")
    assert np.array_equal(view.seqs[got], seq)  # each row's event has the row's seq
    positions = np.array([3, 10, 11, 400])
    kind, block = log.col("kind"), log.col("block")
    named = np.isin(kind, (ALLOCATED, 4, 5, 6, EVICTED)) & (block >= 0) & np.isin(got, positions)
    assert np.array_equal(view.touched_blocks(positions, len(view)), np.unique(block[named]))


def test_the_token_sums_are_made_when_read_and_match_the_compiled_pass():
    # No view reads cached_tokens and prompt_tokens: an opened (warmed, settled) log keeps
    # neither until asked, then makes them equal to what the series pass computes.
    log = _log("mooncake_conversation_trace.jsonl", 512, 300, 800)
    view = ColumnarEventLog(log)
    view.warm()
    view.settle()
    series = view.series
    for name in ("cached_tokens", "prompt_tokens"):
        assert getattr(EventSeries, name).__get__(series) is None, name
    reference = view._compiled_series(_compiled_series_loop())
    assert np.array_equal(series.cached_tokens, reference.cached_tokens)
    assert np.array_equal(series.prompt_tokens, reference.prompt_tokens)
    assert series.prompt_tokens[-1] > series.cached_tokens[-1] > 0
    assert series.cached_tokens.dtype == np.int32  # the narrowest that holds the sums, as before
