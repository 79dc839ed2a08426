"""A journal-fed log keeps its `seq` column as `ArithmeticRuns` too (one more a row, a clear's
rows sharing one), and every reader of the seqs reads them from the runs: the live log's
`seqs` (searched, cut, indexed, masked as the array), `rows_upto`, `_event_start`/`_event_end`,
scrubs, the events a view builds. Each equals the plain layout's on the recorded frames
(tests/data, vLLM 0.33 frames of `engine.bench.attach`'s recorded stream), with a restart's
clear among them; no read of a tick or a scrub makes the whole column. Seeded mutants of
`ArithmeticRuns.searchsorted` fail the comparison."""

from __future__ import annotations

import dataclasses
import inspect
import textwrap

import numpy as np
import pytest

from engine.core import columnar as C
from engine.core.live_journal import append_journal, journal_log
from engine.remote import fastwire
from engine.remote.colpool import ColumnarPool
from tests.test_colpool import _synthetic
from tests.test_columnar_h10_runs import (_journal_of, _recorded_stream, _same_reads, _twice,
                                          recorded_server_twice)
from tests.test_journal_app import RECORDED, _both


def _timeless(events) -> list:
    return [dataclasses.replace(e, time=0.0) for e in events]


def _same_seqs(log, plain, seed: int = 0) -> None:
    """The live log `log`'s seqs and every reading made of them equal `plain`'s (the same
    events, the plain layout)."""
    got, want = log.seqs, np.asarray(plain.seqs)
    n = len(want)
    assert len(got) == n and np.array_equal(np.asarray(got), want)
    assert np.asarray(got).dtype == want.dtype
    if not n:
        return
    rng = np.random.default_rng(seed)
    top = int(want[-1])
    keys = np.arange(-2, top + 3)
    for side in ("left", "right"):
        assert np.array_equal(np.searchsorted(got, keys, side=side), np.searchsorted(want, keys, side=side)), side
        for k in rng.choice(keys, 40):
            for key in (int(k), np.int64(k), C.as_key(int(k), got), float(k) + 0.5, float(k) - 0.5):
                assert np.searchsorted(got, key, side=side) == np.searchsorted(want, key, side=side), (key, side)
    places = rng.integers(-n, n, 200)
    assert np.array_equal(got[places], want[places])
    mask = rng.random(n) < 0.3
    assert np.array_equal(got[mask], want[mask])
    for i in (0, n - 1, -1, *rng.integers(0, n, 20).tolist()):
        assert got[i] == want[i], i
    for lo, hi in [(0, n), (n - 1, n), *(sorted(rng.integers(0, n + 1, 2)) for _ in range(20))]:
        assert np.array_equal(got[lo:hi], want[lo:hi]), (lo, hi)
    # what the event log view, bookmarks and jumps ask of the log
    for seq in (-1, None, top + 1, *rng.choice(want, 20).tolist()):
        assert log.count_upto(seq) == plain.count_upto(seq), seq
        if seq is not None:
            assert log.position_of(seq) == plain.position_of(seq), seq
        assert log.columnar.rows_upto(seq) == plain.columnar.rows_upto(seq), seq
    mask = rng.random(n) < 0.05
    for here in (None, *rng.choice(want, 5).tolist()):
        for forward in (True, False):
            assert log.find(mask, forward, here) == plain.find(mask, forward, here), (here, forward)
    rows = log.columnar.num_rows
    for row in (0, rows - 1, rows, *rng.integers(0, rows, 30).tolist()):
        assert log.columnar._event_start(row) == plain.columnar._event_start(row), row
        assert log.columnar._event_end(row) == plain.columnar._event_end(row), row
    for lo in (0, *rng.integers(0, n, 3).tolist()):
        hi = min(n, lo + 500)
        # each with the time it arrived with, which differs between the two builds
        assert _timeless(log.build(lo, hi)) == _timeless(plain.build(lo, hi)), lo
    for seq in rng.choice(want, 4).tolist():
        a, b = log.state_at(seq), plain.state_at(seq)
        assert a.seq == b.seq and np.array_equal(a.ref_counts, b.ref_counts), seq
        assert np.array_equal(a.hash_keys, b.hash_keys) and a.counters == b.counters, seq


@pytest.mark.parametrize("name", sorted(RECORDED))
@pytest.mark.parametrize("per_tick", [1, 7])
def test_recorded_servers_seqs_read_as_the_plain_layout(name, per_tick):
    js, plain = recorded_server_twice(name, per_tick)
    col = js.log.columnar
    assert isinstance(col._cols["seq"], C.ArithmeticRuns)
    # the runs, not the column made whole (seqs of its own once an event took several rows)
    assert isinstance(js.log.seqs, np.ndarray) == (js.log._seqs is not None)
    _same_seqs(js.log, plain.log)
    _same_reads(col, plain.log.columnar, scrubs=4)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_restart_clear_shares_one_seq(seed):
    """A restart clears the pool: the clear's rows share one seq, the seqs stop being the
    rows (the live log keeps seqs of its own from then on, read from the runs once)."""
    js, plain = _twice(lambda: _both([_synthetic(220, seed)], 5, restart_at=110)[0])
    col = js.log.columnar
    seq = col.col("seq")
    assert isinstance(col._cols["seq"], C.ArithmeticRuns)
    assert np.count_nonzero(seq[1:] == seq[:-1]) > 0  # rows sharing a seq
    assert col._cols["seq"].num_runs > 1
    _same_seqs(js.log, plain.log, seed)
    _same_reads(col, plain.log.columnar, seed=seed, scrubs=6)


@pytest.fixture(scope="module")
def held_logs():
    payloads = _recorded_stream(10_000, gpu_blocks=1 << 20)
    return _twice(lambda: _journal_of(payloads, 16))


def test_a_held_pool_keeps_its_seqs_as_one_run(held_logs):
    log, plain = held_logs
    col = log.columnar
    assert col.num_rows > C.RUN_MIN_ROWS
    assert col._cols["seq"].num_runs == 1 and col._cols["seq"].nbytes == 9
    # one run counting up: the series' seqs a `Consecutive`, which the timeline keeps as it is
    assert isinstance(log.seqs, C.Consecutive) and isinstance(log.series.seq, C.Consecutive)
    assert col.nbytes() == plain.columnar.nbytes() - 4 * col.num_rows + sum(
        col._cols[name].nbytes - 4 * col.num_rows for name in C.RUN_COLUMNS if name != "seq") + 9
    _same_seqs(log, plain, seed=3)


def test_no_tick_nor_seq_read_makes_the_column_whole(monkeypatch):
    """Appending ticks and reading the seqs after each as the app does (`seqs`, its length and
    last value, searches, the live pool), `rows_upto` and an event's rows cut only a tick's
    rows or a checkpoint's interval from the runs, never the whole column."""
    payloads = _recorded_stream(6_000, gpu_blocks=1 << 20)
    spans: list[tuple[int, int, int]] = []
    span = C._Runs._span

    def counted(self, start, stop):
        spans.append((start, stop, self.n))
        return span(self, start, stop)

    monkeypatch.setattr(C._Runs, "_span", counted)
    log = journal_log(16)
    pool = ColumnarPool("tcp://10.0.0.5:5557", rank=0, journal=True)
    for i, payload in enumerate(payloads):
        pool.apply(fastwire.decode_columns(i, payload))
        if i % 16 == 15:
            append_journal(log, pool.take_journal(), pool, "tcp://10.0.0.5:5557")
            seqs = log.seqs
            last = int(seqs[-1])
            assert last == len(seqs) - 1 == log.last_seq and log.count_upto(last) == len(seqs)
            assert log.live.seq == last
    col = log.columnar
    n = col.num_rows
    assert n > 4 * C.RUN_MIN_ROWS and isinstance(col._cols["seq"], C.ArithmeticRuns)
    assert not [s for s in spans if s[0] == 0 and s[1] == s[2] > C.RUN_MIN_ROWS]  # none whole
    assert sum(stop - start for start, stop, _ in spans) < 6 * n  # each row a few times in all
    spans.clear()
    seqs = log.seqs
    for seq in range(0, n, 997):
        assert len(seqs) == n and int(seqs[-1]) == n - 1
        assert int(np.searchsorted(log.seqs, C.as_key(seq, log.seqs), side="right")) == seq + 1
        assert log.count_upto(seq) == seq + 1 and log.position_of(seq) == seq
        assert col.rows_upto(seq) == seq + 1
        assert col._event_start(seq) == seq and col._event_end(seq) == seq + 1
    assert not spans  # searched from the runs alone
    assert np.array_equal(np.asarray(log.seqs), np.arange(n))  # made whole only when asked


def _mutant(monkeypatch, old: str, new: str) -> None:
    src = textwrap.dedent(inspect.getsource(C.ArithmeticRuns.searchsorted))
    assert old in src
    space: dict = {}
    exec(src.replace(old, new), vars(C), space)
    monkeypatch.setattr(C.ArithmeticRuns, "searchsorted", space["searchsorted"])


@pytest.mark.parametrize("old,new", [
    # a step-1 run's rows past the key counted too
    ("np.clip(off, 0, length)", "np.maximum(off, 0)"),
    # the key's own row not counted on the right
    ('+ (side == "right")', "+ 0"),
])
def test_the_comparison_fails_on_seeded_mutants(monkeypatch, old, new):
    js, plain = _twice(lambda: _both([_synthetic(220, 0)], 5, restart_at=110)[0])
    _same_seqs(js.log, plain.log)  # holds before
    _mutant(monkeypatch, old, new)
    with pytest.raises(AssertionError):
        _same_seqs(js.log, plain.log)


def test_an_empty_journal_log_has_no_seqs():
    log = journal_log(16)
    assert len(log.seqs) == 0 and log.count_upto(5) == 0 and log.position_of(0) is None
    assert int(np.searchsorted(C.ArithmeticRuns(np.int32), 3)) == 0
