"""`ColumnarLog._advance` compiled (`_advance_loop`, one pass over the rows) against its
vectorised numpy passes: the same arrays and counters for any range of rows, a range that
cuts an event's rows included, on a kernel log (head and tail frees, evictions) and a
journal-fed one (a remote pool's stores, removals and clears)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.core import columnar
from engine.core.columnar import ColumnarLog
from engine.core.replay import ReplayConfig
from engine.core.trace import load_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES

pytest.importorskip("numba")


def _both(log: ColumnarLog, state, start: int, stop: int, monkeypatch):
    compiled = log._advance(state, start, stop)
    with monkeypatch.context() as m:
        m.setattr(columnar, "_compiled_advance", lambda: None)
        vectorised = log._advance(state, start, stop)
    return compiled, vectorised


def _assert_same(a, b) -> None:
    assert (a.seq, a.num_rows, a.counters) == (b.seq, b.num_rows, b.counters)
    for name in ("ref_counts", "hash_keys", "free_pos"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


def _ranges(log: ColumnarLog, rng: random.Random) -> list[tuple[int, int]]:
    n = log.num_rows
    out = [(0, n), (0, 1), (n - 1, n)]
    seq = log.col("seq")
    cuts = np.flatnonzero(seq[1:] == seq[:-1]) + 1  # rows inside an event's rows
    for _ in range(20):
        start = int(rng.choice(cuts)) if len(cuts) and rng.random() < 0.5 else rng.randrange(n)
        out.append((start, rng.randrange(start, n + 1)))
    return out


@pytest.mark.parametrize("concurrency", [1, 3])
def test_compiled_advance_equals_the_vectorised_one(concurrency, monkeypatch):
    requests = load_trace(RESOURCES / "traces" / "demo_tokens.jsonl", 16)
    log = replay_kernel(requests, ReplayConfig(block_size=16, capacity_blocks=40, concurrency=concurrency),
                        record=True).log
    kind = log.col("kind")
    assert (kind == columnar.FREED).any() and (kind == columnar.EVICTED).any()
    rng = random.Random(concurrency)
    for start, stop in _ranges(log, rng):
        state = log.state_at(int(log.col("seq")[start - 1])) if start else log.initial_state()
        state.num_rows = start
        compiled, vectorised = _both(log, state, start, stop, monkeypatch)
        _assert_same(compiled, vectorised)


def test_compiled_advance_on_a_journal_log(monkeypatch):
    from tests.test_colpool import _synthetic
    from tests.test_live_journal import _journal_fed

    log = _journal_fed(_synthetic(220, 1), reset_every=37, per_tick=7).columnar
    kind = log.col("kind")
    assert (kind == columnar.RESET).any() and (kind == columnar.EVICTED).any()
    for start, stop in _ranges(log, random.Random(5)):
        state = log.state_at(int(log.col("seq")[start - 1])) if start else log.initial_state()
        state.num_rows = start
        _assert_same(*_both(log, state, start, stop, monkeypatch))


def test_compiled_advance_can_tell_a_wrong_place(monkeypatch):
    """A head prepend's place off by one would be caught: the check above can fail."""
    requests = load_trace(RESOURCES / "traces" / "demo_tokens.jsonl", 16)
    log = replay_kernel(requests, ReplayConfig(block_size=16, capacity_blocks=40, concurrency=3), record=True).log
    compiled, vectorised = _both(log, log.initial_state(), 0, log.num_rows, monkeypatch)
    vectorised.free_pos[np.flatnonzero(vectorised.free_pos < 0)[:1]] -= 1
    with pytest.raises(AssertionError):
        _assert_same(compiled, vectorised)
