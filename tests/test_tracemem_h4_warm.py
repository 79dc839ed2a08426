"""What an opened trace's log keeps after `warm` and `settle`: no digest of a cached block
(made when the hash chain view first reads them, equal to `by_hash`), and the per-request
indexes as int32 row numbers equal to the rows read one by one from the columns.
"""

from __future__ import annotations

import itertools

import numpy as np

from engine.core.columnar import FINISHED, LOOKUP, STARTED
from engine.core.columnar_log import ColumnarEventLog
from engine.core.replay import ReplayConfig
from engine.core.trace import read_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES

MOONCAKE = RESOURCES / "traces" / "mooncake_conversation_trace.jsonl"


def _view(num_requests: int = 800, capacity: int = 300) -> ColumnarEventLog:
    requests = list(itertools.islice(read_trace(MOONCAKE, 512), num_requests))
    log = replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=capacity), record=True).log
    assert log is not None
    view = ColumnarEventLog(log)
    view.warm()
    view.settle()
    return view


def test_warm_makes_no_digest_and_the_chains_read_them_when_asked():
    view = _view()
    keys = view.columnar.keys
    assert keys.num_digests_made == 0  # none made, none kept
    hashes, first, par, has = view.live.chain_index()
    assert len(hashes) == len(view.live.held_blocks()) > 100  # made now, for the cached blocks
    by = view.live.by_hash  # the reference, block by block
    assert hashes == list(by) and first.tolist() == [v[0] for v in by.values()]
    index = {h: i for i, h in enumerate(hashes)}
    parents = view.live.parents_of(first)
    assert par.tolist() == [-1 if q is None else index.get(q, -1) for q in parents]
    assert has.tolist() == [q is not None for q in parents]


def test_the_request_indexes_are_int32_rows_equal_to_the_columns():
    view = _view()
    col = view.columnar
    kind, req = col.col("kind"), col.col("request")
    n, nrows = len(col.requests), col.num_rows
    want = {code: [nrows] * n for code in (STARTED, LOOKUP, FINISHED)}
    for row, (k, r) in enumerate(zip(kind.tolist(), req.tolist())):
        if k in want:
            want[k][r] = row  # the last such row of a request, as the index keeps it
    got = view.request_index()
    assert [a.dtype for a in got] == [np.dtype(np.int32)] * 3
    assert [a.tolist() for a in got] == [want[c] for c in (STARTED, LOOKUP, FINISHED)]
    order, starts = view.start_order()
    assert order.dtype == np.int32 and starts.dtype == np.int32
    begun = [r for r in range(n) if want[STARTED][r] < nrows]
    assert order.tolist() == sorted(begun, key=lambda r: want[STARTED][r])
    assert starts.tolist() == sorted(want[STARTED][r] for r in begun)
    codes, num_ids = view.id_codes()
    assert codes.dtype == np.int32 and codes.tolist() == list(range(n)) and num_ids == n
    # what the views read through them: every started request's record, in start order
    assert list(view.live.requests) == [col.requests.ids[r] for r in order.tolist()]


def test_the_request_table_keeps_prompt_sizes_in_int32_and_each_request_s_last_key_and_reads_them_back():
    from engine.kernel.replay import prepare

    requests = list(itertools.islice(read_trace(MOONCAKE, 512), 800))
    arrays = prepare(requests, 512)  # the kernel's int64 arrays, the reference
    log = replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=300), record=True).log
    assert log is not None
    reqs = log.requests
    assert reqs._nprompt.dtype == np.int32  # 4 bytes a request less
    # no per-block ids: each request's last (int32) and its count (uint16), 6 bytes a request
    assert reqs._keys is None and reqs._koff is None
    assert reqs._last.dtype == np.int32 and reqs._nfull.dtype == np.uint16 and len(reqs._last) == 800
    assert reqs.prompt_sizes().dtype == np.int64
    assert reqs.prompt_sizes().tolist() == arrays.nprompt.tolist() == [r.input_length for r in requests]
    assert reqs._nfull.tolist() == arrays.nfull.tolist()
    for r in range(800):  # each request's full blocks through its last key's chain: its hash ids
        n = int(arrays.nfull[r])
        got = [log.keys.attributes(k)[3] for k in reqs.hash_keys(r)]
        assert got == list(requests[r].hash_ids[:n])
    assert int(arrays.nfull.min()) > 0  # every request read a chain
