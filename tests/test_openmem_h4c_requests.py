"""A finished log's request index (`ColumnarLog._request_spans`) kept in int32 while its
row numbers fit: the same rows as an int64 one made from the rows, and the running
requests' block tables unchanged at every scrub target.
"""

from __future__ import annotations

import numpy as np

from engine.core.columnar import ALLOCATED, FINISHED, STARTED
from engine.core.replay import ReplayConfig
from engine.core.trace import load_trace
from engine.kernel import replay_kernel
from tests.test_columnar import TRACES


def _log(limit: int = 800, capacity: int = 300):
    requests = load_trace(TRACES / "mooncake_conversation_trace.jsonl", 512)[:limit]
    return replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=capacity), record=True).log


def _reference(log):
    kind, req, block = log.col("kind"), log.col("request"), log.col("block")
    n_req, n = len(log.requests), log.num_rows
    start, finish = np.full(n_req, n, np.int64), np.full(n_req, n, np.int64)
    for code, out in ((STARTED, start), (FINISHED, finish)):
        for r in np.flatnonzero(kind == code).tolist():
            out[req[r]] = r
    rows = np.flatnonzero((kind == ALLOCATED) & (block >= 0))
    rows = rows[np.argsort(req[rows], kind="stable")]
    return start, finish, rows, np.searchsorted(req[rows], np.arange(n_req + 1))


def _check(log) -> None:
    spans = log._request_spans()
    assert all(a.dtype == np.int32 for a in spans)
    want = _reference(log)
    for got, ref in zip(log._request_index(), want):
        assert np.array_equal(got, ref)
    block = log.col("block")
    ids = log.requests.ids
    rng = np.random.default_rng(11)
    for seq in [0, len(log) - 1, *rng.integers(0, len(log), 20).tolist()]:
        n = log.rows_upto(seq)
        running = np.flatnonzero((want[0] < n) & (want[1] >= n)).tolist()
        expect = {ids[r]: tuple(block[rows[rows < n]].tolist()) for r in running
                  for rows in [want[2][want[3][r]:want[3][r + 1]]]}
        assert log.running_at(seq) == expect, seq


def test_the_request_index_is_int32_and_the_reference_rows():
    log = _log()
    _check(log)
    log.settle()
    _check(log)


def test_the_check_fails_on_a_finish_one_row_off():
    log = _log(300)
    start, finish, alloc, bounds = log._request_spans()
    finish = finish.copy()
    done = np.flatnonzero(finish < log.num_rows)
    finish[done[len(done) // 2]] += 1
    log._req_index = (log.num_rows, (start, finish, alloc, bounds))
    try:
        _check(log)
    except AssertionError:
        return
    raise AssertionError("a finish one row off passed the check")
