"""The remote overlay's times (runs of one time, `engine.remote.overlay._Runs`) and lifetimes
(`_Floats`: appended a tick at a time into chunks, moved to an array('d') only when read).
Whether they are read at every tick, at some, or once at the end, a recorded vLLM stream's
times must read back the same, in order, and a reader's numpy view of them must keep what it saw."""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from engine.remote.overlay import FLOAT_CHUNK, RUN_ROOM, RemoteOverlay, _append_floats, _Floats


def test_floats_read_back_every_value_in_order_across_chunks_and_reads():
    rng = np.random.default_rng(3)
    col, parts = _Floats(), []
    assert len(col) == 0 and col.last() == 0.0 and col.read() == array("d")
    for k, read in ((0, False), (5, True), (FLOAT_CHUNK - 5, False), (1, False), (2 * FLOAT_CHUNK + 9, True),
                    (3, False), (700, True), (0, True)):
        part = rng.random(k)
        col.append(part)
        parts.append(part)
        want = np.concatenate(parts)
        assert len(col) == len(want)
        assert col.last() == (want[-1] if len(want) else 0.0)
        if read:
            assert np.array_equal(np.frombuffer(col.read(), np.float64), want)
    assert np.array_equal(np.frombuffer(col.read(), np.float64), np.concatenate(parts))
    assert col.nbytes == 8 * len(col)  # read: nothing left in chunks


def test_a_view_held_across_a_read_keeps_what_it_saw():
    col = _Floats()
    col.append(np.arange(10.0))
    held = np.frombuffer(col.read(), np.float64)  # a reader's view of the array, alive
    col.append(np.arange(10.0, 15.0))
    assert col.read().tolist() == list(np.arange(15.0))  # grown as a copy (BufferError caught)
    assert held.tolist() == list(np.arange(10.0))


def test_append_floats_goes_to_the_chunks_and_an_appended_value_is_kept():
    o = RemoteOverlay()
    _append_floats(o, "stored_times", np.array([1.0, 2.0]))
    _append_floats(o, "removed_times", np.array([3.5]))
    _append_floats(o, "sample_times", np.array([4.0]))  # still an array('d') of its own
    assert o.now == 3.5 and o.num_stored == 2 and o.num_removed == 1
    o.lifetimes.append(9.0)  # an array('d') read from it takes appends, kept
    _append_floats(o, "lifetimes", np.array([1.0]))
    assert list(o.stored_times) == [1.0, 2.0] and list(o.lifetimes) == [9.0, 1.0]
    assert list(o.sample_times) == [4.0]
    # store and removal times are runs (`_Runs`: a time and a count, 16 bytes, each in its first
    # room of RUN_ROOM); the lifetimes, read, in their array; one sample
    assert o.nbytes_by_part()["times"] == 2 * 16 * RUN_ROOM + 8 * 2 + 8
    assert len(o.removed_times) == 1 and o.nbytes_by_part()["times"] == 2 * 16 * RUN_ROOM + 8 * 2 + 8  # no copy kept


def test_the_chunks_room_is_a_sixteenth_of_the_values():
    col = _Floats()
    for _ in range(400):
        col.append(np.ones(1_500))
        assert col.nbytes - 8 * len(col) <= max(1024, len(col) // 16) * 8
    assert len(col._chunks) > 20  # never read: all of them in chunks


def _ticks(num_events: int):
    """A recorded stream's ticks, as `journal_app_rate` takes them."""
    from app.runtime.journal_feed import JournalPools, take_journal_rows
    from app.runtime.live_path import FRAMES_PER_TICK
    from engine.bench.attach import recorded_stream
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    payloads, _, _ = recorded_stream(num_events, gpu_blocks=1_500)
    pool = journal_pool_class()("test")
    att = JournalPools([pool])
    taken: dict[int, int] = {}
    for start in range(0, len(payloads), FRAMES_PER_TICK):
        with att.lock:
            pool.apply_many([fastwire.decode_columns(s, payloads[s])
                             for s in range(start, min(len(payloads), start + FRAMES_PER_TICK))])
        yield take_journal_rows(att, taken, 1 << 30)[0]


@pytest.fixture(scope="module")
def recorded():
    return [list(tick) for tick in _ticks(30_000)]


def _state():
    from app.runtime.state import PoolState

    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    return state


def _apply(state, tick) -> None:
    from engine.core.live_journal import prepare_journal

    state.apply_prepared([(prepare_journal(state.log, h, p, p.source, int(p.rank)), t) for h, p, t in tick],
                         notify=False)


def test_times_read_at_every_tick_or_once_are_the_same(recorded):
    """Two states fed the same recorded ticks: one read (views held) after every tick, one
    read once at the end: the same stores, removals and lifetimes in the same order, past a
    chunk of each; the clock (`now`) of each tick is the newest time read so far."""
    read, unread = _state(), _state()
    held = []
    for tick in recorded:
        _apply(read, tick)
        _apply(unread, tick)
        o = read.remote
        views = [np.frombuffer(a, np.float64) for a in (o.stored_times, o.removed_times, o.lifetimes)]
        held.append(views)
        assert o.now == max(views[0][-1] if len(views[0]) else 0.0, views[1][-1] if len(views[1]) else 0.0)
        assert unread.remote.now == o.now
    a, b = read.remote, unread.remote
    assert b.num_stored == a.num_stored > FLOAT_CHUNK and b.num_removed == a.num_removed > FLOAT_CHUNK
    for name in ("stored_times", "removed_times", "lifetimes"):
        assert np.array_equal(np.frombuffer(getattr(a, name), np.float64),
                              np.frombuffer(getattr(b, name), np.float64)), name
    # each view held kept the values it saw: a prefix of the whole
    whole = np.frombuffer(a.stored_times, np.float64)
    for views in held[::7]:
        assert np.array_equal(views[0], whole[:len(views[0])])
    assert len(a.lifetimes) > 0 and min(a.lifetimes) >= 0.0
    assert list(a.per_second()[1]) == list(b.per_second()[1])
