"""The kernel's columnar result and its fast preparation, against the Python engine.

A kernel replay keeps its rows as columns (`engine.kernel.result.ServedColumns`): its JSON
rows, its totals and its `ServedRequest` rows (made only when read) equal the Python
engine's. The preparation's C-level coding of names (`_codes`), the compiled cut of hash ids
to full blocks (`cut_items`) and the dense interning (`intern_trace`) give what the plain
routes give.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.core.replay import ReplayConfig, replay
from engine.core.served import ReplayResult, ReplayTotals
from engine.core.trace import TraceRequest, load_trace
from engine.kernel import prepare, replay_kernel
from engine.kernel.intern import find_key, intern_chains, intern_trace, root_tag
from engine.kernel.loop import cut_items
from engine.kernel.replay import _codes
from engine.kernel.result import ServedColumns
from engine.resources import RESOURCES

TRACES = RESOURCES / "traces"


def _mooncake(n: int) -> list[TraceRequest]:
    return load_trace(TRACES / "mooncake_conversation_trace.jsonl", 512)[:n]


CASES = [
    ("tokens, tenants", lambda: load_trace(TRACES / "demo_tokens.jsonl", 16), 16, 64, 2),
    ("mooncake, evicting", lambda: _mooncake(800), 512, 900, 1),
    ("mooncake, most refused", lambda: _mooncake(300), 512, 12, 1),
    ("mooncake, four at once", lambda: _mooncake(400), 512, 700, 4),
]


@pytest.mark.parametrize("name,load,bs,capacity,concurrency", CASES, ids=[c[0] for c in CASES])
def test_the_columnar_result_is_the_python_engines(name, load, bs, capacity, concurrency):
    requests = load()
    config = ReplayConfig(block_size=bs, capacity_blocks=capacity, concurrency=concurrency)
    expected = replay(requests, config)
    result = replay_kernel(requests, config).result
    assert result.columns is not None and result._rows is None
    assert result.to_dict() == expected.to_dict()
    assert result.to_dict(with_requests=False) == expected.to_dict(with_requests=False)
    assert result._rows is None  # the JSON rows and the totals are read from the arrays
    assert result.totals == expected.totals == ReplayTotals.of(expected.requests, _Counters(expected.totals))
    assert result.requests == expected.requests  # made on demand, now
    assert result._rows is not None and result.requests is result.requests
    assert result == expected and result.to_dict() == expected.to_dict()
    if "refused" in name:
        assert 0 < expected.totals.refused_requests < len(requests)


class _Counters:
    def __init__(self, totals: ReplayTotals) -> None:
        self.num_stored_blocks, self.num_evicted_blocks = totals.stored_blocks, totals.evicted_blocks


def test_rows_come_back_in_input_order_whatever_order_the_requests_came_in():
    requests = _mooncake(200)
    shuffled = [dataclasses.replace(r, index=len(requests) - 1 - r.index) for r in requests]
    config = ReplayConfig(block_size=512, capacity_blocks=300)
    expected = replay(shuffled, config)
    result = replay_kernel(shuffled, config).result
    assert [row["index"] for row in result.to_dict()["requests"]] == list(range(len(requests)))
    assert result.to_dict() == expected.to_dict() and result.requests == expected.requests


def test_a_result_given_rows_keeps_them_and_setting_rows_drops_the_columns():
    rows = replay(_mooncake(20), ReplayConfig(block_size=512, capacity_blocks=100)).requests
    plain = ReplayResult({}, ReplayTotals(0, 0, 0, 0, 0.0, 0, 0, 0), rows)
    assert plain.requests is rows and plain.columns is None
    kernel = replay_kernel(_mooncake(20), ReplayConfig(block_size=512, capacity_blocks=100)).result
    kernel.requests = rows[:3]
    assert kernel.columns is None and len(kernel.to_dict()["requests"]) == 3


def test_a_refused_row_says_so_and_a_missing_divergence_is_none():
    columns = ServedColumns(np.array([0, 1]), np.array([1, 0]), ["a", "b"], np.array([-1, 0]), ["t"],
                            np.array([10, 20]), np.array([0, 0]), np.array([10, 0]), np.array([3, 4]),
                            np.array([0, 4], np.uint8), ("new_content", "evicted", "salt", "model", "partial_block",
                                                         "last_token"),
                            np.array([0, 0]), np.array([5, -1]), np.array([0, 1], np.uint8))
    dicts = columns.to_dicts()
    assert dicts[0] == {"index": 0, "id": "b", "tenant": None, "prompt_tokens": 10, "cached_tokens": 0,
                        "computed_tokens": 10, "output_tokens": 3, "miss_reason": "new_content",
                        "first_miss_block": 0, "divergence_token": 5}
    assert dicts[1]["refused"] is True and dicts[1]["tenant"] == "t" and dicts[1]["divergence_token"] is None
    assert dicts == [r.to_dict() for r in columns.rows()]
    assert columns.totals(_Counters(ReplayTotals(0, 0, 0, 0, 0.0, 7, 2, 0))) == \
        ReplayTotals(2, 10, 0, 10, 0.0, 7, 2, 1)


def test_names_are_coded_in_first_seen_order_as_a_dict_would():
    def plain(values, table):
        return [table.setdefault(v, len(table) - (None in table)) for v in values]

    for values, table in ((["a", "b", "c"], {}), ([None] * 5, {None: -1}), (["x", None, "x", "y", None], {None: -1}),
                          (["a", "b"], {"b": 0}), (["", None, ""], {None: -1}), ([], {})):
        mine, theirs = dict(table), dict(table)
        assert _codes(list(values), mine).tolist() == plain(values, theirs)
        assert mine == theirs
    table: dict = {}
    _codes(["a", "b"], table)
    assert _codes(["c", "a"], table).tolist() == [2, 0] and table == {"a": 0, "b": 1, "c": 2}


def test_hash_ids_are_cut_to_full_blocks():
    flat = np.arange(10, dtype=np.int64)
    assert cut_items(flat, np.array([3, 0, 4, 3]), np.array([2, 0, 4, 1])).tolist() == [0, 1, 3, 4, 5, 6, 7]


def _intern_both(items, offsets, kinds, root_tags):
    plain = intern_chains(items, offsets, kinds, root_tags)
    dense = intern_trace(items, offsets, kinds, root_tags, need_table=True)
    for a, b in zip(plain[2:], dense[2:]):
        assert np.array_equal(a, b)
    assert np.array_equal(plain[0], dense[0])
    keys, table, k_parent, k_item, k_tag = dense
    for k in range(len(k_parent)):  # the dense route's table finds every key, as the plain one's does
        assert find_key(table, k_parent, k_item, k_tag, k_parent[k], k_item[k], k_tag[k]) == k
    return dense


def test_dense_interning_gives_the_hash_tables_ids():
    arrays = prepare(load_trace(TRACES / "demo_tokens.jsonl", 16), 16)
    kinds = arrays.kind.astype(np.int64)
    tags = root_tag(kinds, arrays.salt.astype(np.int64), arrays.model.astype(np.int64))
    _intern_both(arrays.items, arrays.koff, kinds, tags)
    arrays = prepare(_mooncake(2000), 512)
    kinds = arrays.kind.astype(np.int64)
    _intern_both(arrays.items, arrays.koff, kinds,
                 root_tag(kinds, arrays.salt.astype(np.int64), arrays.model.astype(np.int64)))


def test_dense_interning_of_one_item_under_many_parents_and_salts():
    # the same item at every depth and under two salts: every key but the first of each
    # item goes through the collision table
    items = np.array([7, 7, 7, 7, 7, 7, 3, 7, 7, 7], np.int64)
    offsets = np.array([0, 4, 6, 10], np.int64)
    kinds = np.zeros(3, np.int64)
    tags = root_tag(kinds, np.array([-1, 0, -1], np.int64), np.full(3, -1, np.int64))
    keys, _, k_parent, _, _ = _intern_both(items, offsets, kinds, tags)
    assert keys.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9][:4] + [4, 5] + [6, 7, 8, 9]
    assert k_parent.tolist()[:4] == [-1, 0, 1, 2]


def test_without_a_second_salt_or_model_the_table_is_not_built():
    arrays = prepare(_mooncake(50), 512)
    kinds = arrays.kind.astype(np.int64)
    tags = root_tag(kinds, arrays.salt.astype(np.int64), arrays.model.astype(np.int64))
    keys, table, k_parent, k_item, k_tag = intern_trace(arrays.items, arrays.koff, kinds, tags, need_table=False)
    assert len(table) == 16 and (table == -1).all() and len(k_parent) > 16
    # huge ids (a vLLM trace's 64-bit hashes) take the hash table
    big = arrays.items + (1 << 40)
    keys2, table2, *_ = intern_trace(big, arrays.koff, kinds, tags, need_table=False)
    assert np.array_equal(keys, keys2) and len(table2) > len(k_parent)
