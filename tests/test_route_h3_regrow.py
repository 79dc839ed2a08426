"""The attach's route (frames -> journal pool -> placer -> `PoolState.apply_prepared`) with the
log's, series' and overlay's arrays grown in mappings of their own (`growth.regrow` past
`MAPPED_BYTES`) holds, after every tick, what it holds with every array on the heap; and
`regrow` grows a mapped array where it lies unless a reader holds a view of it; `unheld`
says whether anything but its holder refers to an array.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.core import growth
from engine.core.growth import _mapping_of, regrow


class _Owner:
    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr


needs_mremap = pytest.mark.skipif(not growth.CAN_MAP, reason="arrays lie in mappings of their own on Linux only")


@needs_mremap
def test_a_large_array_grows_in_its_own_mapping_without_a_copy():
    n = growth.MAPPED_BYTES // 8
    owner = _Owner(np.arange(1000, dtype=np.int64))
    regrow(owner, "arr", n, 1000)  # past MAPPED_BYTES: moved into a mapping
    mapping = _mapping_of(owner.arr)
    assert mapping is not None and owner.arr[:1000].tolist() == list(range(1000))
    owner.arr[1000:] = np.arange(1000, n)
    regrow(owner, "arr", 2 * n, n)
    assert _mapping_of(owner.arr) is mapping  # the same mapping, resized: nothing copied
    assert len(owner.arr) == 2 * n and owner.arr[:n].tolist() == list(range(n))
    kept = owner.arr[5:10]  # a reader's view: its mapping may not move under it
    regrow(owner, "arr", 3 * n, 2 * n)
    assert _mapping_of(owner.arr) is not mapping and len(owner.arr) == 3 * n
    assert kept.tolist() == [5, 6, 7, 8, 9] and owner.arr[:n].tolist() == list(range(n))
    cols = {"a": owner.arr}
    del owner.arr  # the dict's reference the only one left
    regrow(cols, "a", 4 * n, 3 * n)
    assert cols["a"][:n].tolist() == list(range(n)) and len(cols["a"]) == 4 * n



@needs_mremap
def test_an_array_over_a_mapping_regrow_did_not_make_is_copied_not_resized():
    import mmap

    n = growth.MAPPED_BYTES // 8
    theirs = mmap.mmap(-1, n * 8)  # someone else's mapping (a file's, say)
    owner = _Owner(np.frombuffer(theirs, np.int64, count=n))
    owner.arr[:] = np.arange(n)
    regrow(owner, "arr", 2 * n, n)
    assert len(theirs) == n * 8  # never resized under its owner
    assert _mapping_of(owner.arr) is not None and owner.arr[:n].tolist() == list(range(n))

def _snapshot(state) -> dict:
    """What a `PoolState` holds that the views read: the log's columns, the event index, the
    series, the live pool, checkpoints, request slots and the remote overlay."""
    log, col = state.log, state.log.columnar
    out = {f"col.{name}": np.array(col.col(name)) for name in ("kind", "seq", "request", "block", "hash", "a", "b",
                                                             "flag")}
    out["seqs"], out["kinds"] = np.array(log.seqs), np.array(log.kinds)
    series = log.series
    for name in ("seq", "in_use", "cached_free", "empty", "max_ref", "evicted", "cached_tokens", "prompt_tokens",
                 "refusal_seqs", "reset_seqs"):
        out[f"series.{name}"] = np.array(getattr(series, name))
    live = log.live
    out["live.ref_counts"], out["live.hashed"] = np.array(live.ref_counts), np.array(live.hashed)
    out["checkpoints"] = np.array(col._cp_rows)
    out["requests"] = list(col.requests.ids)
    out["infos"] = list(col._remote_slots().infos)
    remote = state.remote
    for name in ("tier", "rank", "stored_at", "base"):
        out[f"overlay.{name}"] = np.array(getattr(remote, name))[:col.num_blocks]
    for name in ("stored_times", "removed_times", "lifetimes"):
        got = getattr(remote, name)
        out[f"overlay.{name}"] = np.array(got.read() if hasattr(got, "read") else got)
    out["overlay.stored_again"] = remote.num_stored_again
    return out


def _route(num_events: int, frames_per_tick: int) -> list[dict]:
    from app.runtime.journal_feed import JournalPools, take_journal_rows
    from app.runtime.state import PoolState
    from engine.bench.attach import recorded_stream
    from engine.core.live_journal import prepare_journal
    from engine.remote import fastwire

    payloads, _, _ = recorded_stream(num_events, gpu_blocks=2_000)
    from engine.remote.overlay import journal_pool_class

    pool = journal_pool_class()("bench")
    att = JournalPools([pool])
    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM bench"})
    taken: dict[int, int] = {}
    ticks = []
    for start in range(0, len(payloads), frames_per_tick):
        pool.apply_many([fastwire.decode_columns(s, payloads[s])
                         for s in range(start, min(len(payloads), start + frames_per_tick))])
        got = take_journal_rows(att, taken, 1 << 30)
        state.apply_prepared([(prepare_journal(state.log, h, p, p.source, int(p.rank)), t) for h, p, t in got[0]],
                             notify=False)
        ticks.append(_snapshot(state))
        cols = state.log.columnar._cols
        ticks[-1]["mappings"] = [_mapping_of(cols[name]) for name in ("kind", "block", "flag")]
    ticks[-1]["mapped"] = _mapping_of(state.log.columnar._cols["block"]) is not None
    return ticks


@needs_mremap
@pytest.mark.parametrize("frames_per_tick", [5, 24])
def test_the_route_holds_the_same_with_mapped_arrays(monkeypatch, frames_per_tick):
    monkeypatch.setattr(growth, "MAPPED_BYTES", 1 << 60)  # every array on the heap
    heap = _route(6_000, frames_per_tick)
    monkeypatch.setattr(growth, "MAPPED_BYTES", 256)  # nearly every array in a mapping
    mapped = _route(6_000, frames_per_tick)
    assert len(heap) == len(mapped) > 10
    assert len(heap[-1]["col.kind"]) > 5_000  # the columns grew many times
    assert not heap[-1].pop("mapped") and mapped[-1].pop("mapped")
    # each whole column was mapped once and then grown where it lay: no reader holds a view of
    # it between ticks, and `_write_table` held none while growing it (it held every column
    # once, and each growth copied the column into a new mapping)
    mappings = [b.pop("mappings") for b in mapped]
    assert all(m is None for a in heap for m in a.pop("mappings"))
    for j, name in enumerate(("kind", "block", "flag")):
        held = [m[j] for m in mappings if m[j] is not None]  # from the tick it passed MAPPED_BYTES on
        assert len(held) > 10 and all(m is held[0] for m in held), name
    for a, b in zip(heap, mapped):
        assert a.keys() == b.keys()
        for name in a:
            if isinstance(a[name], np.ndarray):
                assert np.array_equal(a[name], b[name]), name
            else:
                assert a[name] == b[name], name


def test_prompt_sizes_read_every_request_in_place_for_a_live_table():
    from engine.core.columnar import RequestTable

    live = RequestTable.empty()
    assert len(live.prompt_sizes()) == 0
    sizes = [int(x) for x in np.random.default_rng(2).integers(1, 5000, 3000)]
    for i, s in enumerate(sizes[:1500]):
        live.add(f"r{i}", None, s)
    live.add_many([f"b{i}" for i in range(700)])  # a journal's batches: no prompt
    for i, s in enumerate(sizes[1500:]):
        live.add(f"q{i}", None, s)
    want = sizes[:1500] + [0] * 700 + sizes[1500:]
    got = live.prompt_sizes()
    assert got.dtype == np.int64 and got.tolist() == want
    assert [live.num_prompt_tokens(r) for r in range(len(live))] == want
    fixed = RequestTable(["a", "b"], [None], np.array([-1, -1]), np.array([7, 9]), np.zeros(0, np.int64),
                         np.zeros(2, np.int64), np.zeros(2, np.int64))
    assert fixed.prompt_sizes().tolist() == [7, 9]
    fixed.add("c", None, 11)
    assert fixed.prompt_sizes().tolist() == [7, 9, 11]


def test_unheld_says_whether_anything_but_its_holder_refers_to_an_array():
    """`unheld`: the journal's arrays, the decoder's rooms and the receive's buffers are
    taken again only while nothing but their one attribute, list or tuple refers to them: a
    view, a payload's memoryview or a name keeps them held until it goes."""
    from engine.core.growth import unheld

    class Pool:
        pass

    pool = Pool()
    pool.J = np.zeros((8, 7), np.int64)
    rooms = [np.zeros(16)]
    room = (np.zeros(4), np.zeros(4))

    def looks() -> list[bool]:  # (read outside `assert`: pytest's rewriting keeps what it shows)
        return [unheld(pool.J), unheld(rooms[0]), unheld(room[0]), unheld(room[1])]

    before = looks()
    column = pool.J[2:, 3]
    payload = memoryview(rooms[0])
    name = room[1]
    held = looks()
    del column, payload, name
    after = looks()
    assert before == after == [True] * 4 and held == [False, False, True, False]
