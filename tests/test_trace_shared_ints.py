"""A trace read shares small ids as `validation.loads` does, and keeps no map of them once read."""

import tracemalloc

from engine.core import trace
from engine.core import validation as v

# Both lines hold ids on both sides of the shared table's end: the by-value map is needed.
LINES = (b'{"input_length": 1024, "hash_ids": [5, 99999, 100000, 123456]}\n'
         b'{"input_length": 1024, "hash_ids": [99998, 100001]}\n')


def test_a_read_trace_shares_its_ids_and_keeps_no_map(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(LINES)
    tracemalloc.start()
    try:
        requests = trace.load_trace(path)
        kept = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, trace.__file__)])
    finally:
        tracemalloc.stop()
    assert [r.hash_ids for r in requests] == [(5, 99999, 100000, 123456), (99998, 100001)]
    assert requests[0].hash_ids[1] is v._SHARED_INTS[99999] and requests[1].hash_ids[0] is v._SHARED_INTS[99998]
    # what the read allocated in trace.py and still holds: the requests, not a 5 MB map
    assert sum(stat.size for stat in kept.statistics("filename")) < 100_000


def test_one_read_builds_the_map_once(tmp_path, monkeypatch):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(LINES * 3)
    builds = []
    by_value = trace.SharedInts.by_value

    def counted(self):
        if self._by_value is None:
            builds.append(1)
        return by_value(self)

    monkeypatch.setattr(trace.SharedInts, "by_value", counted)
    assert len(trace.load_trace(path)) == 6
    assert len(builds) == 1
    assert len(trace.load_trace(path)) == 6
    assert len(builds) == 2  # each read its own, dropped with it
