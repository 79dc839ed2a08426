"""What an opened trace's log keeps of its rows: the `hash` column as the stores' and
evictions' rows only (every other row's is -1), and one copy of an index two names share
after `settle`. Each reading is compared with the same replay kept whole.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np

from engine.analysis.statistics_columnar import compute_columnar
from engine.core import columnar
from engine.core.columnar import EVICTED, STORED
from engine.core.columnar_log import ColumnarEventLog
from engine.core.replay import ReplayConfig
from engine.core.trace import read_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES
from tests.test_columnar import assert_views_equal, view_of

MOONCAKE = RESOURCES / "traces" / "mooncake_conversation_trace.jsonl"


def _log(monkeypatch=None, whole: bool = False):
    requests = list(itertools.islice(read_trace(MOONCAKE, 512), 800))
    if whole:  # the hash column kept whole, as before
        monkeypatch.setattr(columnar, "SPARSE_COLUMNS", {"b": 0})
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


def test_the_hash_column_is_kept_sparse_and_reads_as_the_whole_one(monkeypatch):
    log, whole = _log(), _log(monkeypatch, whole=True)
    assert "hash" in log._sparse and "hash" not in log._cols and "hash" in whole._cols
    rows, values = log._sparse["hash"]
    dense = whole.col("hash")
    kind = whole.col("kind")
    assert np.array_equal(rows, np.flatnonzero((kind == STORED) | (kind == EVICTED)))  # the rows that carry one
    assert np.all(values >= 0) and log.nbytes() < whole.nbytes() - whole.num_rows
    got = log.col("hash")
    assert got.dtype == dense.dtype and np.array_equal(got, dense)
    for start, stop in ((0, log.num_rows), (7, 7), (int(rows[2]), int(rows[2]) + 1), (int(rows[2]) + 1, 5000)):
        assert np.array_equal(log.values_at("hash", slice(start, stop)), dense[start:stop])
        assert np.array_equal(log.rows_window("hash", start, stop)[start:stop], dense[start:stop])
    picks = np.concatenate([np.random.default_rng(4).integers(0, log.num_rows, 500), rows[:30], [0, log.num_rows - 1]])
    assert np.array_equal(log.values_at("hash", picks), dense[picks])
    assert list(log.events()) == list(whole.events())
    log.build_checkpoints(every=1009)  # many intervals: each scrub passes over a part of the rows
    whole.build_checkpoints(every=1009)
    rng = random.Random(11)
    for seq in sorted({rng.randrange(len(log)) for _ in range(25)} | {0, len(log) - 1}):
        assert_views_equal(view_of(log, seq), view_of(whole, seq))
    a, b = ColumnarEventLog(log), ColumnarEventLog(whole)
    assert _same(dataclasses.asdict(compute_columnar(a)), dataclasses.asdict(compute_columnar(b)))


def test_a_write_after_the_sparse_hash_makes_it_whole_with_minus_one():
    log = _log()
    before = log.col("hash")
    table = np.zeros((1, 8), np.int64)
    table[0] = (1, len(log) + 3, 0, -1, -1, 0, 0, 0)  # a started row: no hash
    log.write_rows(table)
    assert "hash" in log._cols and np.array_equal(log.col("hash"), np.append(before, -1))


def test_settle_keeps_an_index_two_names_share_once():
    view = ColumnarEventLog(_log())
    view.warm()
    assert view._index["eviction_rows"] is view._index["evicted_rows"]  # no cache reset in a trace
    view.settle()
    assert view._index["eviction_rows"] is view._index["evicted_rows"]
