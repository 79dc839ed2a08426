"""A journal-fed log keeps its `RUN_COLUMNS` as `ArithmeticRuns` (runs of step 0 or 1) while
that is smaller, and every reading of them must equal the plain layout's: `col`, `values_at`
(rows, slices, one row), `rows_window`, `kept`, scrubs (`state_at`, whose compiled pass reads
windows), `events()`, a frozen snapshot. Fed the recorded vLLM and SGLang frames
(tests/data) through the app's journal route, vLLM 0.33 frames of `engine.bench.attach`'s
recorded stream (a pool that evicts, whose hashes stop running), and row tables whose runs
break, widen past int32 and stop paying. Seeded mutants of the run code fail the comparison."""

from __future__ import annotations

import contextlib
import inspect
import textwrap

import numpy as np
import pytest

from engine.core import columnar as C
from engine.core.live_journal import append_journal, journal_log
from engine.remote import fastwire
from engine.remote.colpool import ColumnarPool
from tests.test_journal_app import RECORDED, _both, _rank_frames


@contextlib.contextmanager
def _plain_layout():
    """Logs begun inside keep every column as an array (the layout before runs)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(C, "RUN_COLUMNS", ())
        yield


def _twice(build):
    """`build()` with runs, and again with the plain layout: (runs' log, plain log)."""
    got = build()
    with _plain_layout():
        plain = build()
    return got, plain


_EVENT_ROWS = 3_000


def _same_reads(col: C.ColumnarLog, plain: C.ColumnarLog, seed: int = 0, scrubs: int = 12) -> None:
    """Every reading of `col` equals the plain layout's (`plain`, the same rows written)."""
    assert all(isinstance(arr, np.ndarray) for arr in plain._cols.values())
    n = col.num_rows
    assert plain.num_rows == n
    rng = np.random.default_rng(seed)
    for name, _ in C.KEPT_COLUMNS:
        whole = plain.col(name)
        got = col.col(name)
        assert got.dtype == whole.dtype and np.array_equal(got, whole), name
        assert np.array_equal(col.kept(name), plain.kept(name)), name
        if not n:
            continue
        rows = rng.integers(-n, n, 300)
        assert np.array_equal(col.values_at(name, rows), plain.values_at(name, rows)), name
        assert np.array_equal(col.values_at(name, np.sort(rows % n)), whole[np.sort(rows % n)]), name
        for start, stop in [(0, n), (0, 1), (n - 1, n), *(sorted(rng.integers(0, n + 1, 2)) for _ in range(20))]:
            part = col.values_at(name, slice(start, stop))
            assert part.dtype == whole.dtype and np.array_equal(part, whole[start:stop]), (name, start, stop)
            window = col.rows_window(name, start, stop)
            assert np.array_equal(window[start:stop], whole[start:stop]), (name, start, stop)
        for i in (0, n - 1, -1, int(rng.integers(0, n))):
            assert col.values_at(name, i) == whole[i], (name, i)
    # the events of the first rows and of a stretch elsewhere (each row an object: not all of a long log)
    lo = int(rng.integers(0, max(1, n - _EVENT_ROWS)))
    for start, stop in ((0, _EVENT_ROWS), (lo, lo + _EVENT_ROWS)):
        assert list(col.events(start_row=start, stop_row=stop)) == list(plain.events(start_row=start, stop_row=stop))
    seqs = np.unique(plain.col("seq"))
    targets = [None, *seqs[:3].tolist(), *rng.choice(seqs, min(scrubs, len(seqs))).tolist()] if len(seqs) else [None]
    for seq in targets:
        a, b = col.state_at(seq), plain.state_at(seq)
        assert (a.seq, a.num_rows) == (b.seq, b.num_rows), seq
        for field in ("ref_counts", "hash_keys", "free_pos"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), (seq, field)
        assert a.counters == b.counters, seq


def _journal_of(payloads: list[bytes], per_tick: int):
    log = journal_log(16)
    pool = ColumnarPool("tcp://10.0.0.5:5557", rank=0, journal=True)
    for i, payload in enumerate(payloads):
        pool.apply(fastwire.decode_columns(i, payload))
        if i % per_tick == per_tick - 1:
            append_journal(log, pool.take_journal(), pool, "tcp://10.0.0.5:5557")
    append_journal(log, pool.take_journal(), pool, "tcp://10.0.0.5:5557")
    return log


def _recorded_stream(num_events: int, gpu_blocks: int) -> list[bytes]:
    from engine.bench.attach import recorded_stream

    return recorded_stream(num_events, gpu_blocks=gpu_blocks)[0]


def recorded_server_twice(name: str, per_tick: int) -> tuple:
    """A recorded server's frames (RECORDED[name]) through the app's journal route, `per_tick`
    frames a tick, as (the journal-fed window, one built with the plain layout)."""
    path, ranks = RECORDED[name]
    frames = _rank_frames(path, ranks)
    return _twice(lambda: _both(frames, per_tick)[0])


@pytest.mark.parametrize("name", sorted(RECORDED))
@pytest.mark.parametrize("per_tick", [1, 7])
def test_recorded_servers_read_as_the_plain_layout(name, per_tick):
    js, plain = recorded_server_twice(name, per_tick)
    col = js.log.columnar
    assert col.journal_fed and col.num_rows > 10
    assert all(isinstance(col._cols[n], C.ArithmeticRuns) for n in C.RUN_COLUMNS)
    _same_reads(col, plain.log.columnar)


@pytest.fixture(scope="module")
def held_log():
    """vLLM 0.33 frames of a pool that never evicts: every run column a few runs a batch."""
    payloads = _recorded_stream(10_000, gpu_blocks=1 << 20)
    return _twice(lambda: _journal_of(payloads, 16))


@pytest.fixture(scope="module")
def busy_log():
    """A pool of 600 blocks that evicts all along: half the rows remove a block."""
    payloads = _recorded_stream(10_000, gpu_blocks=600)
    return _twice(lambda: _journal_of(payloads, 8))


def test_a_held_pool_keeps_its_columns_as_few_runs(held_log):
    col, plain = (log.columnar for log in held_log)
    n = col.num_rows
    assert n > C.RUN_MIN_ROWS
    kept = {name: col._cols[name] for name in C.RUN_COLUMNS}
    assert all(isinstance(arr, C.ArithmeticRuns) for arr in kept.values())
    # hashes count up a row each, stores' ordinals too: a run for all; a batch's request
    # one, its RemoteInfo one for each stretch of one tier (a batch's tiers interleave)
    assert kept["hash"].num_runs == kept["a"].num_runs == 1
    assert kept["request"].num_runs == len(col.requests)
    b = np.asarray(kept["b"])
    assert kept["b"].num_runs <= 1 + np.count_nonzero(b[1:] != b[:-1])
    runs_bytes = sum(arr.nbytes for arr in kept.values())
    assert runs_bytes < 0.1 * 4 * len(C.RUN_COLUMNS) * n  # under a tenth of the int32 arrays
    assert col.nbytes() == plain.nbytes() - 4 * len(C.RUN_COLUMNS) * n + runs_bytes
    _same_reads(col, plain)


def test_a_busy_pool_keeps_its_columns_as_runs(busy_log):
    col, plain = (log.columnar for log in busy_log)
    n = col.num_rows
    kind = col.col("kind")
    assert np.count_nonzero(kind == C.EVICTED) > n // 3
    # a journal's row names its own hash id, and is an event: both the row's number
    assert np.array_equal(col.col("hash"), np.arange(n)) and np.array_equal(col.col("seq"), np.arange(n))
    assert col._cols["hash"].num_runs == 1
    # stores' ordinals count up, removals' are 0: a run each stretch
    a = col._cols["a"]
    stretches = 1 + np.count_nonzero(kind[1:] != kind[:-1])
    assert a.num_runs <= stretches and C.RUN_MOST_ROWS * a.num_runs <= n
    _same_reads(col, plain, seed=1)


def test_a_snapshot_reads_what_was_written_before_later_batches():
    payloads = _recorded_stream(3_000, gpu_blocks=400)
    logs = [journal_log(16), journal_log(16)]  # runs, the plain layout
    pools = [ColumnarPool("tcp://10.0.0.5:5557", rank=0, journal=True) for _ in logs]
    shots = []
    for i, payload in enumerate(payloads):
        for log, pool, plain in zip(logs, pools, (False, True)):
            pool.apply(fastwire.decode_columns(i, payload))
            if i % 5 == 4:
                with _plain_layout() if plain else contextlib.nullcontext():
                    append_journal(log, pool.take_journal(), pool, "tcp://10.0.0.5:5557")
        if i % 40 == 4:
            shots.append([log.snapshot().columnar for log in logs])
    assert len(shots) > 5 and logs[0].columnar.num_rows > shots[-1][0].num_rows > C.RUN_MIN_ROWS
    for frozen, plain in shots:
        assert any(isinstance(frozen._cols[n], C.ArithmeticRuns) for n in C.RUN_COLUMNS)
        _same_reads(frozen, plain, scrubs=3)


def _tables(rng: np.random.Generator, num_batches: int, wide_at: int | None = None):
    """Row tables (`write_rows`' layout) whose run columns mix runs of 0 and 1 steps, runs
    that continue across batches, alternations, jumps, and (from batch `wide_at` on) values
    past int32 in the columns that widen."""
    seq = 0
    for t in range(num_batches):
        m = int(rng.integers(1, 40))
        table = np.zeros((m, 8), np.int64)
        table[:, 0] = rng.choice([C.REFUSED, C.FINISHED], m)  # rows whose events read no key
        table[:, 1] = seq + np.arange(m)
        table[:, 3] = rng.integers(-1, 50, m)
        for j in (2, 4, 5, 6):
            pattern = rng.integers(0, 5)
            base = int(rng.integers(-3, 30))
            if pattern == 0:
                table[:, j] = base
            elif pattern == 1:
                table[:, j] = base + np.arange(m)
            elif pattern == 2:
                table[:, j] = base + np.arange(m) % 2
            elif pattern == 3:
                table[:, j] = rng.integers(-2, 40, m)
            else:
                table[:, j] = base + np.repeat(np.arange(m), 3)[:m]
        table[:, 4] = np.maximum(table[:, 4], -1)
        table[:, 2] = np.abs(table[:, 2])
        if wide_at is not None and t >= wide_at:
            table[:, 5] += 1 << 33
            table[:, 6] -= 1 << 32
        seq += m
        yield table


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_runs_that_break_widen_and_stop_paying(seed):
    rng = np.random.default_rng(seed)
    log, plain = C.ColumnarLog(64, 16), C.ColumnarLog(64, 16)
    log.journal_fed = True
    for r in range(100):
        log.requests.add(f"r{r}", None, 0)
    plain.requests = log.requests
    changed = False
    for t, table in enumerate(_tables(rng, 400, wide_at=300)):
        table[:, 2] %= 100
        for one in (log, plain):
            one.write_rows(table)
            one.num_seq = int(table[-1, 1]) + 1
        if t in (0, 1, 7, 150, 299, 300, 399):
            _same_reads(log, plain, seed=t, scrubs=4)
        changed = changed or any(isinstance(log._cols[n], np.ndarray) for n in C.RUN_COLUMNS)
    assert changed  # random values stopped paying
    assert log._cols["a"].dtype == np.int64 and log._cols["b"].dtype == np.int64
    assert int(log.values_at("a", log.num_rows - 1)) > 1 << 32


def test_runs_read_as_their_array():
    rng = np.random.default_rng(5)
    for trial in range(300):
        values = np.concatenate([t[:, 5] for t in _tables(rng, int(rng.integers(1, 6)))])
        runs = C.ArithmeticRuns(np.int32)
        cuts = np.unique(np.concatenate([[0, len(values)], rng.integers(0, len(values), 3)]))
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            runs.extend(values[lo:hi])
        assert runs.n == len(values) and np.array_equal(np.asarray(runs), values)
        assert runs.nbytes == 9 * runs.num_runs
        places = rng.integers(-len(values), len(values), 50)
        assert np.array_equal(runs[places], values[places])
        mask = rng.random(len(values)) < 0.3
        assert np.array_equal(runs[mask], values[mask])
        assert [runs[i] for i in range(len(values))] == values.tolist()
        lo, hi = sorted(rng.integers(0, len(values) + 1, 2))
        assert np.array_equal(runs[lo:hi], values[lo:hi]) and np.array_equal(runs[::3], values[::3])
        k = int(rng.integers(0, len(values) + 1))
        head = runs.head(k)
        assert np.array_equal(np.asarray(head), values[:k]) and head.num_runs <= runs.num_runs
        assert np.array_equal(np.asarray(runs.fresh()), values)
        with pytest.raises(IndexError):
            runs[len(values)]
    equal = C.ArithmeticRuns(np.int32)
    for part in np.array_split(np.full(1000, 7), 9):
        equal.extend(part)
    counting = C.ArithmeticRuns(np.int32)
    for part in np.array_split(np.arange(5, 1005), 9):
        counting.extend(part)
    assert equal.num_runs == counting.num_runs == 1  # continued across batches


def test_the_compiled_pass_makes_the_vectorised_runs():
    rng = np.random.default_rng(7)
    assert C._compiled_runs_extend() is not None
    for trial in range(100):
        batches = [t[:, j] for t in _tables(rng, int(rng.integers(1, 30))) for j in (2, 5)]
        compiled, vectorised = C.ArithmeticRuns(np.int32), C.ArithmeticRuns(np.int32)
        for values in batches:
            compiled.extend(values)
            vectorised._extend_vectorised(values)
            assert (compiled.n, compiled.num_runs, compiled._last, compiled._diff) == \
                (vectorised.n, vectorised.num_runs, vectorised._last, vectorised._diff)
        for name in ("at", "first", "step"):
            assert np.array_equal(getattr(compiled, name), getattr(vectorised, name)), name


def _mutant(monkeypatch, function, old: str, new: str, compiled: bool) -> None:
    """`ArithmeticRuns.extend` with one line of `function`'s source changed: the compiled
    pass's (`_runs_extend_loop`, compiled again), or the vectorised one's without numba."""
    src = textwrap.dedent(inspect.getsource(function))
    assert old in src
    space: dict = {}
    exec(src.replace(old, new), vars(C), space)
    mutant = space[function.__name__]
    if compiled:
        from numba import njit

        monkeypatch.setattr(C, "_RUNS_LOOP", [njit(mutant)])
    else:
        monkeypatch.setattr(C, "_RUNS_LOOP", [None])
        monkeypatch.setattr(C.ArithmeticRuns, function.__name__, mutant)


@pytest.mark.parametrize("function,old,new", [
    # the compiled pass: a run of one row takes no step from its second row
    (C._runs_extend_loop, "step[k - 1] = d", "step[k - 1] = 0"),
    # a run's first row numbered within its batch, not the log
    (C._runs_extend_loop, "at[k] = n + i", "at[k] = i"),
    # vectorised: a run of one row at a batch's end keeps step 0 when the next batch counts it up
    (C.ArithmeticRuns._extend_vectorised, "if k0 and not new[0] and", "if False and k0 and not new[0] and"),
    # the first row of a batch compared with 0, not the last value written
    (C.ArithmeticRuns._extend_vectorised, "d[0] = v[0] - self._last if self.n else _NO_STEP",
     "d[0] = v[0] if self.n else _NO_STEP"),
])
def test_the_comparison_fails_on_seeded_mutants(monkeypatch, function, old, new):
    payloads = _recorded_stream(3_000, gpu_blocks=300)
    compiled = function is C._runs_extend_loop
    if not compiled:  # the vectorised passes hold too
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(C, "_RUNS_LOOP", [None])
            _same_reads(*(log.columnar for log in _twice(lambda: _journal_of(payloads, 1))))
    _same_reads(*(log.columnar for log in _twice(lambda: _journal_of(payloads, 1))))  # holds before
    _mutant(monkeypatch, function, old, new, compiled)
    # (the log's born rows are runs too, `BornRows`: a mutant may break their reads first)
    with pytest.raises((AssertionError, ValueError)):
        _same_reads(*(log.columnar for log in _twice(lambda: _journal_of(payloads, 1))))


def test_the_route_keeps_runs_only_for_journal_logs():
    from engine.core.live_log import LiveColumnarLog
    from tests.test_colpool import _synthetic
    from tests.test_live_log import _remote_events

    log = LiveColumnarLog(8, 16)
    log.extend(_remote_events(_synthetic(40, 2), 1, 0))
    assert not log.columnar.journal_fed
    assert all(isinstance(arr, np.ndarray) for arr in log.columnar._cols.values())
    assert log.columnar.nbytes() == sum(arr[:log.columnar.num_rows].nbytes for arr in log.columnar._cols.values())
