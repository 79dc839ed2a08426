"""What an opened trace's log keeps of `a` and of its request ids (issue 20, H6): `a` as a
value per event where every row of an event holds the same (the events that set one and
their values), the trace's ids without a str each. Each reading is compared with the log
kept the old way, from the same replay."""

from __future__ import annotations

import gc
import itertools
import random
import tracemalloc

import numpy as np
import pytest

from engine.core import columnar
from engine.core.columnar import RequestIds, RequestTable
from engine.core.columnar_log import ColumnarEventLog
from engine.core.replay import ReplayConfig
from engine.core.trace import read_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES
from tests.test_columnar import assert_views_equal, view_of

MOONCAKE = RESOURCES / "traces" / "mooncake_conversation_trace.jsonl"


def _requests(n: int = 800) -> list:
    return list(itertools.islice(read_trace(MOONCAKE, 512), n))


def _log(requests: list, monkeypatch=None, old: bool = False, **config):
    if old:  # `a` kept as before: a byte a row, its values a byte does not hold apart
        monkeypatch.setattr(columnar, "PER_EVENT_WHEN_ALIKE", ())
    log = replay_kernel(requests, ReplayConfig(block_size=512, **config), record=True).log
    if old:
        monkeypatch.undo()
    return log


def _same_readings(log, old, name: str = "a") -> None:
    dense = old.col(name)
    assert log.col(name).dtype == dense.dtype and np.array_equal(log.col(name), dense)
    n = log.num_rows
    rng = np.random.default_rng(6)
    bounds = np.asarray(log.event_bounds) if log.event_bounds is not None else np.arange(n + 1)
    spans = [(0, n), (0, 1), (n - 1, n), (5, 5)] + [
        (int(s), int(s) + int(k)) for s, k in zip(rng.integers(0, n, 40), rng.integers(1, 3000, 40))]
    spans += [(int(bounds[i]), int(bounds[i + 1])) for i in rng.integers(0, len(bounds) - 1, 20)]
    for start, stop in spans:
        stop = min(stop, n)
        assert np.array_equal(log.values_at(name, slice(start, stop)), dense[start:stop])
        assert np.array_equal(log.rows_window(name, start, stop)[start:stop], dense[start:stop])
    picks = np.concatenate([rng.integers(0, n, 700), np.flatnonzero(dense)[:50], [0, n - 1]])
    assert np.array_equal(log.values_at(name, picks), dense[picks])
    assert all(int(log.values_at(name, i)) == int(dense[i]) for i in picks[::7].tolist())


def test_a_is_kept_per_event_where_every_row_of_an_event_agrees(monkeypatch):
    requests = _requests()
    log, old = _log(requests, capacity_blocks=300), _log(requests, monkeypatch, old=True, capacity_blocks=300)
    kept = log._per_event["a"]
    assert isinstance(kept, columnar._EventSparse) and "a" not in log._sparse and "a" not in log._sparse_base
    # the old layout's byte a row and large values: more than three times the events that set one
    assert kept.nbytes * 3 < old._column_nbytes("a") and log.nbytes() < old.nbytes() - 2 * kept.nbytes
    assert len(kept.at) == np.count_nonzero(np.asarray(kept)) < len(log) // 4
    _same_readings(log, old)
    assert list(log.events()) == list(old.events())
    rng = random.Random(5)
    for seq in sorted({rng.randrange(len(log)) for _ in range(20)} | {0, len(log) - 1}):
        assert_views_equal(view_of(log, seq), view_of(old, seq))
    a, b = ColumnarEventLog(log), ColumnarEventLog(old)
    a.warm()
    b.warm()
    a.settle()  # fresh copies of the kept arrays: the same values
    assert isinstance(log._per_event["a"], columnar._EventSparse)
    _same_readings(log, old)
    for seq in (None, len(log) // 2, 3):
        pa, pb = a.state_at(seq), b.state_at(seq)
        assert [pa.record(r) for r in range(len(log.requests))] == [pb.record(r) for r in range(len(log.requests))]
    assert np.array_equal(a.series.cached_tokens, b.series.cached_tokens)


def test_a_whose_rows_differ_within_an_event_stays_sparse(monkeypatch):
    # four requests at once share prefixes: a ref event counts 2 on a shared block, 1 on a new one
    requests = _requests(400)
    log = _log(requests, capacity_blocks=600, concurrency=4)
    old = _log(requests, monkeypatch, old=True, capacity_blocks=600, concurrency=4)
    assert "a" not in log._per_event and "a" in log._sparse and "a" in log._sparse_base
    _same_readings(log, old)
    assert list(log.events()) == list(old.events())


def test_the_event_sparse_form_reads_as_the_array_it_stands_for():
    values = np.array([0, 0, 7, 0, 300_000, 0, 0, 1, 0, 0], np.int32)
    kept = columnar._EventSparse.of(values, 0)
    assert kept.nbytes == 3 * 8 and np.array_equal(np.asarray(kept), values) and len(kept) == len(values)
    for start, stop in ((0, 10), (2, 3), (3, 4), (1, 8), (9, 10), (4, 4)):
        assert np.array_equal(kept[start:stop], values[start:stop])
    assert [int(kept[i]) for i in range(-10, 10)] == values[list(range(-10, 10))].tolist()
    picks = np.array([9, 0, 4, 4, 2, -1, 7])
    assert np.array_equal(kept[picks], values[picks]) and np.array_equal(kept[values > 0], values[values > 0])
    assert np.array_equal(kept[::3], values[::3])
    with pytest.raises(IndexError):
        kept[10]
    assert np.array_equal(np.asarray(columnar._EventSparse.of(np.zeros(4, np.int32), 0)[np.array([1, 3])]), [0, 0])


def test_a_write_after_a_kept_per_event_makes_it_whole():
    log = _log(_requests(200), capacity_blocks=300)
    before = log.col("a")
    assert "a" in log._per_event
    table = np.zeros((1, 8), np.int64)
    table[0] = (9, len(log) + 3, 0, -1, -1, 70_000, 0, 0)  # a finish of 70,000 tokens written after
    log.write_rows(table)
    assert "a" in log._cols and not log._per_event and np.array_equal(log.col("a"), np.append(before, 70_000))


def _traced(make):
    gc.collect()
    tracemalloc.start()
    try:
        got = make()
        return got, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


def test_a_traces_request_ids_keep_no_str_each():
    names = [str(i) for i in range(12_031)]  # a trace without ids: each its occurrence's number
    ids, kept = _traced(lambda: RequestIds(list(names)))
    # the old table's list of str: ~62 B an id (0.75 MB for the Mooncake trace's)
    assert kept < 2_000 and ids.nbytes == 0
    assert list(ids) == names and len(ids) == len(names) and ids == names
    assert [ids[i] for i in (0, 1, 9_999, -1, -12_031)] == ["0", "1", "9999", "12030", "0"]
    own = [f"req-{i:06d}-ü" for i in range(5000)]  # ids of their own: one UTF-8 blob and each one's end
    ids, kept = _traced(lambda: RequestIds(list(own)))
    assert ids.nbytes == len("".join(own).encode()) + 4 * len(own) and kept < ids.nbytes + 2_000
    assert list(ids) == own and ids[4999] == own[4999] and ids[1:4] == own[1:4]
    with pytest.raises(IndexError):
        ids[5000]
    ids.append("live-1")  # a live source's requests join after the trace's
    ids.extend(["live-2", "live-3"])
    assert len(ids) == 5003 and ids[-3:] == ["live-1", "live-2", "live-3"] and list(ids)[-1] == "live-3"
    odd = RequestIds(["1", 2])  # not what a trace gives: kept as they are
    assert list(odd) == ["1", 2]


def test_the_kernels_table_reads_its_ids_back():
    requests = _requests(300)
    log = _log(requests, capacity_blocks=300)
    assert isinstance(log.requests.ids, RequestIds) and log.requests.ids.nbytes == 0
    assert list(log.requests.ids) == [r.id for r in requests]
    view = ColumnarEventLog(log)
    assert view.request_ids().tolist() == [r.id for r in requests]
    assert list(view.state_at(None).order) == [r.id for r in requests if r.id in view.state_at(None).order]
    table = RequestTable(["x", "y"], [None], np.array([-1, -1]), np.array([7, 9]), np.zeros(0, np.int64),
                         np.zeros(3, np.int64), np.zeros(2, np.int32))
    assert table.add("z", None, 4) == 2 and list(table.ids) == ["x", "y", "z"]


def test_the_hashes_are_kept_as_first_seen_chains_and_read_as_before(monkeypatch):
    requests = _requests()
    log = _log(requests, capacity_blocks=300)
    monkeypatch.setattr(columnar, "COUNTED_VALUES", ())
    old = _log(requests, capacity_blocks=300)
    monkeypatch.undo()
    _, values = log._sparse["hash"]
    _, old_values = old._sparse["hash"]
    assert isinstance(values, columnar.FirstSeen) and isinstance(old_values, np.ndarray)
    # a store of a chain met for the first time is a bit, not 4 bytes: the old layout's int32 each
    # (800 requests at 300 blocks evict more than the whole trace at 16,384: 58% of its hashes
    # name a chain met before, the whole trace's 55%)
    assert values.nbytes < 0.65 * old_values.nbytes and len(values.others) < 0.6 * len(values)
    assert np.array_equal(np.asarray(values), old_values) and values.dtype == old_values.dtype
    _same_readings(log, old, "hash")
    assert list(log.events()) == list(old.events())
    rng = random.Random(9)
    for seq in sorted({rng.randrange(len(log)) for _ in range(20)} | {0, len(log) - 1}):
        assert_views_equal(view_of(log, seq), view_of(old, seq))
    log.settle()
    assert isinstance(log._sparse["hash"][1], columnar.FirstSeen)
    _same_readings(log, old, "hash")


@pytest.mark.parametrize("values", [
    [0, 1, 2, 1, 3, 0, 4, 4, 5],  # new chains one more than the largest, chains met again between
    list(range(7, 200)) + [9, 7, 150] + list(range(200, 330)),  # across words, the first one not 0
    [0, 2, 1, 3],  # a jump: 2 is more than one past 0 (kept as they are)
    [5, 3, 6, 7, 1],
    [3],
])
def test_first_seen_values_read_as_the_array_they_stand_for(values):
    values = np.array(values, np.int32)
    kept = columnar.FirstSeen.of(values)
    seen = np.maximum.accumulate(np.concatenate([[values[0] - 1], values[:-1]]))
    counted = len(values) > 1 and np.array_equal(values[values > seen], seen[values > seen] + 1)
    if not counted:  # a value past the largest by more than one: no count tells it
        assert kept is values
    if not isinstance(kept, columnar.FirstSeen):
        kept = columnar.FirstSeen(*_parts(values))  # its reading, whatever the bytes
    n = len(values)
    assert np.array_equal(np.asarray(kept), values) and kept.dtype == values.dtype and len(kept) == n
    for start in range(n):
        for stop in {start + 1, min(n, start + 3), min(n, start + 70), n}:
            assert np.array_equal(kept[start:stop], values[start:stop])
    assert [int(kept[i]) for i in range(-n, n)] == values[list(range(-n, n))].tolist()
    picks = np.array([n - 1, 0, n // 2, n // 2, -1])
    assert np.array_equal(kept[picks], values[picks]) and np.array_equal(kept[values > 2], values[values > 2])
    with pytest.raises(IndexError):
        kept[n]
    with pytest.raises(IndexError):
        kept[np.array([0, n])]


def _parts(values: np.ndarray) -> tuple:
    """A FirstSeen's fields for `values` whose new largest values count up by one."""
    n = len(values)
    seen = np.maximum.accumulate(np.concatenate([[int(values[0]) - 1], values[:-1]]))
    new = values > seen
    if not np.array_equal(values[new], seen[new] + 1):
        new = np.zeros(n, bool)
        new[0] = True
    bits = np.packbits(np.concatenate([new, np.zeros(64 - n % 64 + 64, bool)]), bitorder="little")
    words = bits.view("<u8").astype(np.uint64)
    before = np.concatenate([[0], np.cumsum(np.bitwise_count(words[:-1]))]).astype(np.int32)
    return words, before, values[~new], int(values[0]), n, values.dtype


def test_the_state_shown_keeps_its_free_order_and_evictions_in_int32(monkeypatch):
    from engine.core import columnar_log

    log = _log(_requests(), capacity_blocks=300)
    kind, block, seqs = log.col("kind"), log.col("block"), log.col("seq")
    rng = random.Random(2)
    for seq in sorted({rng.randrange(len(log)) for _ in range(8)} | {len(log) - 1}):
        state = ColumnarEventLog(log).state_at(seq)
        # int64 before: 8 B a pool block each, kept with the state a window shows
        assert state.free_order().dtype == np.int32 and state.evicted_seq.dtype == np.int32
        assert np.array_equal(state.free_order(), log.state_at(seq).free_order())
        want = np.full(log.num_blocks, -1)
        rows = np.flatnonzero(kind[:log.rows_upto(seq)] == columnar.EVICTED)
        want[block[rows]] = seqs[rows]
        assert np.array_equal(state.evicted_seq, want) and (want >= 0).any() == (len(rows) > 0)
    monkeypatch.setattr(columnar_log, "_I32_MAX", 100)  # a pool or seqs past int32: as wide as they need
    wide = ColumnarEventLog(log).state_at(len(log) - 1)
    assert wide.free_order().dtype == np.int64 and wide.evicted_seq.dtype == np.int64
    assert np.array_equal(wide.free_order(), state.free_order()) and np.array_equal(wide.evicted_seq, state.evicted_seq)


def test_the_key_tables_parents_and_items_are_kept_as_counting_runs():
    log = _log(_requests(), capacity_blocks=300)
    keys = log.keys
    parent, item = keys.parent, keys.item
    assert isinstance(parent, columnar.CountingRuns) and isinstance(item, columnar.CountingRuns)
    whole_parent, whole_item = np.asarray(parent), np.asarray(item)
    # int32 each before: 4 B a chain id; the runs 8 B each, one every ~18 ids here
    assert parent.nbytes + item.nbytes < (whole_parent.nbytes + whole_item.nbytes) / 4
    assert whole_parent.dtype == np.int32 and whole_item.dtype == np.int32 == item.dtype
    assert np.all(whole_parent < np.arange(len(keys))) and np.mean(whole_parent[1:] == np.arange(len(keys) - 1)) > 0.9
    plain = columnar.KeyTable(whole_parent, whole_item, keys.tag, keys.content, keys.salts, keys.hasher,
                              keys.block_size, keys.models)
    assert isinstance(plain.parent, columnar.CountingRuns)  # made so from arrays as well
    plain.parent, plain.item = whole_parent, whole_item  # the old layout
    ids = list(range(0, len(keys), 7)) + [len(keys) - 1]
    assert [keys.digest(k) for k in ids] == [plain.digest(k) for k in ids]
    assert [keys.attributes(k) for k in ids[::5]] == [plain.attributes(k) for k in ids[::5]]
    assert np.array_equal(keys.root_salt_ids(np.array(ids)), plain.root_salt_ids(np.array(ids)))
    flat, starts = log.requests.fixed_keys()
    assert all(log.requests.hash_keys(r) == flat[starts[r]:starts[r + 1]].tolist() for r in range(len(log.requests)))
    log.settle()
    assert isinstance(keys.parent, columnar.CountingRuns) and np.array_equal(np.asarray(keys.parent), whole_parent)


@pytest.mark.parametrize("values", [
    [-1, 0, 1, 2, -1, 4, 5, 2, 8, 9, 10],  # parents: roots, chains, a branch
    list(range(100, 300)) + [7, 8, 9] + list(range(300, 500)),
    [5, 5, 5, 6],
])
def test_counting_runs_read_as_the_array_they_stand_for(values):
    values = np.array(values, np.int32)
    runs = columnar.CountingRuns.of(values)
    if not isinstance(runs, columnar.CountingRuns):  # not smaller so: its reading all the same
        at = np.flatnonzero(np.concatenate(([True], np.diff(values) != 1))).astype(np.int32)
        runs = columnar.CountingRuns(at, values[at], len(values), values.dtype)
    n = len(values)
    assert np.array_equal(np.asarray(runs), values) and runs.astype(np.int64).dtype == np.int64
    for start in range(n):
        for stop in {start + 1, min(n, start + 4), n}:
            assert np.array_equal(runs[start:stop], values[start:stop])
    # single places up and down (the last run found is read again without a search)
    order = list(range(n)) + list(range(n - 1, -n - 1, -1)) + [0, n - 1, n // 2, n // 2 + 1]
    assert [int(runs[i]) for i in order] == [int(values[i]) for i in order]
    assert [int(runs[np.int64(i)]) for i in order[:20]] == [int(values[i]) for i in order[:20]]
    picks = np.array([n - 1, 0, n // 2, -2])
    assert np.array_equal(runs[picks], values[picks]) and np.array_equal(runs[values > 4], values[values > 4])
    assert np.array_equal(runs[::2], values[::2])
    with pytest.raises(IndexError):
        runs[n]
    with pytest.raises(IndexError):
        runs[np.array([n])]
