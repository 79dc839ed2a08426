"""A finished log keeps each trace request's last chain id only (its parent chain in the key
table is the rest): every request's keys, read one at a time or all at once, are still the
ones the replay looked up, against the Python engine's lookups and the trace's hash ids.
"""

from __future__ import annotations

import itertools

import numpy as np

from engine.core.columnar import RequestTable
from engine.core.columnar_log import ColumnarEventLog
from engine.core.events import EventBus, LookupDone
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace, read_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES
from engine.store.weka import load_weka_requests

TRACES = RESOURCES / "traces"


def _lookups(events) -> list[tuple[str, tuple[bytes, ...]]]:
    return [(e.request_id, e.block_hashes) for e in events if isinstance(e, LookupDone)]


def _assert_request_keys_read_one_by_one(view: ColumnarEventLog) -> None:
    reqs = view.columnar.requests
    flat, starts = view.request_keys()
    assert flat.dtype == np.int64 and len(starts) == len(reqs) + 1
    assert [flat[starts[r]:starts[r + 1]].tolist() for r in range(len(reqs))] == [
        list(reqs.hash_keys(r)) for r in range(len(reqs))]


def test_a_salted_token_trace_keeps_the_last_key_and_looks_up_what_the_python_engine_did():
    requests = load_trace(TRACES / "demo_tokens.jsonl", 16)
    config = ReplayConfig(block_size=16, capacity_blocks=40, concurrency=2)
    bus, ref = EventBus(), []
    bus.subscribe(ref.append)
    replay(requests, config, bus)
    log = replay_kernel(requests, config, record=True).log
    assert log is not None
    reqs = log.requests
    assert len(reqs.salts) > 1  # salted chains and unsalted ones
    assert reqs._keys is None and reqs._koff is None  # the replay's per-block ids are gone
    assert reqs._last.dtype == np.int32 and len(reqs._last) == reqs.num_fixed
    assert reqs._nfull.dtype == np.uint16
    assert _lookups(log.events()) == _lookups(ref)
    log.settle()  # the table's arrays made again: read the same
    assert _lookups(log.events()) == _lookups(ref)
    _assert_request_keys_read_one_by_one(ColumnarEventLog(log))


def test_every_mooncake_request_reads_its_hash_ids_back_and_keeps_six_bytes():
    requests = list(itertools.islice(read_trace(TRACES / "mooncake_conversation_trace.jsonl", 512), 1500))
    log = replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=300), record=True).log
    assert log is not None
    view = ColumnarEventLog(log)
    view.warm()
    view.settle()
    reqs, keys = log.requests, log.keys
    n = reqs.num_fixed
    assert reqs._last.nbytes + reqs._nfull.nbytes == 6 * n  # not 4 bytes a block of every prompt
    for r in range(n):
        want = list(requests[r].hash_ids[:requests[r].input_length // 512])
        assert [keys.attributes(k)[3] for k in reqs.hash_keys(r)] == want
    _assert_request_keys_read_one_by_one(view)
    # a live request after the trace's: its keys follow theirs
    r = reqs.add("live-1", None, 1024)
    reqs.set_live(r, None, 1024, (5, 6))
    view._index.pop("request_keys")
    flat, starts = view.request_keys()
    assert flat[starts[r]:].tolist() == [5, 6] and starts[r] == starts[r - 1] + len(reqs.hash_keys(r - 1))


def test_a_weka_trace_and_a_table_kept_whole_read_the_same_keys():
    requests = load_weka_requests(TRACES / "weka" / "trace_0104.json")
    config = ReplayConfig(block_size=64, capacity_blocks=200)
    log = replay_kernel(requests, config, record=True).log
    assert log is not None
    reqs = log.requests
    # the same rows kept whole, as the kernel gave them: every request's ids in a row
    whole = [list(reqs.hash_keys(r)) for r in range(len(reqs))]
    koff = np.zeros(len(whole) + 1, np.int64)
    np.cumsum([len(x) for x in whole], out=koff[1:])
    flat = np.array([k for x in whole for k in x], np.int32)
    kept = RequestTable(list(reqs.ids), reqs.salts, reqs.fixed_salt_ids(), reqs.prompt_sizes(), flat, koff,
                        np.diff(koff).astype(np.int32))
    assert sum(map(len, whole)) > 1000
    assert [list(kept.hash_keys(r)) for r in range(len(whole))] == whole
    for a, b in zip(kept.fixed_keys(), reqs.fixed_keys()):
        assert np.array_equal(a, b)
    # each request's first id is a root and each next one's parent the one before it
    parent = log.keys.parent
    for x in whole:
        assert [int(parent[k]) for k in x] == [-1] + x[:-1]
