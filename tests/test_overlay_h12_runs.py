"""The remote overlay's store and removal times kept as runs of one time (`_Runs`), each slot's
store time as its store's run (`stored_run`), and the remote plots' rates (`_Rates`) read from
the runs new since their last read. What a user sees must stay: every time, each slot's store
time and lifetime, and the per-second bars, as the values themselves give them."""

from __future__ import annotations

import numpy as np
import pytest

from app.views.pool.remote_plots import _Rates
from engine.remote.overlay import RUN_ROOM, RemoteOverlay, _append_floats, _Runs


def _bars(times: np.ndarray, start: float, n: int) -> list[int]:
    """Values per whole second since `start`, counted from the values themselves."""
    return np.bincount(np.clip((times - start).astype(np.int64), 0, n - 1), minlength=n).tolist()


def test_runs_read_back_every_value_and_join_equal_neighbours_across_appends():
    rng = np.random.default_rng(12)
    runs, parts = _Runs(), []
    assert len(runs) == 0 and runs.last() == 0.0 and len(runs.values()) == 0
    for step in range(60):
        # batches of one time each; every third append opens with the time the last one ended with
        last = parts[-1][-1] if parts and len(parts[-1]) else 1.0
        part = last + np.repeat(np.cumsum(rng.random(rng.integers(0, 6))), rng.integers(1, 20))
        if step % 3 == 0:
            part = np.concatenate(([last] * int(rng.integers(1, 4)), part))
        runs.append(part)
        parts.append(part)
        want = np.concatenate(parts)
        assert len(runs) == len(want) and runs.last() == (want[-1] if len(want) else 0.0)
        assert np.array_equal(np.frombuffer(runs.values(), np.float64), want), step
        t, c = runs.runs()
        assert (c > 0).all() and not (t[1:] == t[:-1]).any()  # each run as long as its time lasts
    assert runs.num_runs - 1 < len(runs) // 4  # far fewer runs than values
    assert runs.add(runs.last(), 3) == runs.num_runs - 1  # the same time joins the newest run
    assert runs.add(runs.last() + 1.0) == runs.num_runs - 1 and runs.runs()[1][-1] == 1


def test_rates_read_from_runs_equal_a_count_of_every_value():
    """Runs that go on across reads (a time appended again after a read) are counted once:
    the kept bars equal the values' own count after every read, and start over for another
    overlay. Fails if a read counts a run it had read again in whole."""
    rng = np.random.default_rng(5)
    rates, overlay = _Rates(), RemoteOverlay()
    start, now = 1_796_000_000.0, 1_796_000_000.0
    stored, removed = [], []
    for step in range(50):
        for name, kept in (("stored_times", stored), ("removed_times", removed)):
            times = now + np.repeat(np.arange(rng.integers(0, 4)) * 0.4, rng.integers(1, 30))
            if step % 3 == 0 and kept:  # the last read time again: its run goes on
                times = np.concatenate(([kept[-1]] * int(rng.integers(1, 5)), times))
            _append_floats(overlay, name, times)
            kept.extend(times.tolist())
        now += rng.random() * 2
        secs, got_s, got_r = rates.update(overlay, start)
        n = len(secs)
        assert got_s.tolist() == _bars(np.array(stored), start, n), step
        assert got_r.tolist() == _bars(np.array(removed), start, n), step
        assert [a.tolist() for a in overlay.per_second(start)] == [secs.tolist(), got_s.tolist(), got_r.tolist()]
    assert overlay.num_stored == len(stored) and overlay._stored_times.num_runs - 1 < len(stored) // 5
    other = RemoteOverlay()
    _append_floats(other, "stored_times", np.array([start + 3.5, start + 3.5]))
    assert rates.update(other, start)[1].tolist() == [0, 0, 0, 2]


@pytest.fixture(scope="module")
def routed():
    """A recorded vLLM stream (engine.bench.attach.recorded_stream) on the app's journal
    route, 8 frames a tick, the rates read after every tick; and every stored row's time and
    slot as the journal and the placer gave them."""
    from app.runtime.journal_feed import JournalPools, take_journal_rows
    from app.runtime.state import PoolState
    from engine.bench.attach import recorded_stream
    from engine.core.live_journal import prepare_journal
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    payloads, _, _ = recorded_stream(30_000, gpu_blocks=3_000)
    pool = journal_pool_class()("test")
    att = JournalPools([pool])
    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    rates, taken, read = _Rates(), {}, []
    last_store: dict[int, float] = {}  # slot -> the time of its newest store row
    for start in range(0, len(payloads), 8):
        pool.apply_many(fastwire.decode_columns_many(start, payloads[start:start + 8]))
        got = take_journal_rows(att, taken, 1 << 30)[0]
        prepared = [(prepare_journal(state.log, h, p, p.source, int(p.rank)), t) for h, p, t in got]
        for block, times in prepared:
            op, slots = np.asarray(block.journal.op), np.asarray(block.slots)
            rows = np.flatnonzero(op != 2)  # the slots name the stored and removed rows, in order
            for slot, row in zip(slots[op[rows] == 0].tolist(), rows[op[rows] == 0].tolist()):
                if slot >= 0:
                    last_store[slot] = float(times[row])
        state.apply_prepared(prepared, notify=False)
        if state.remote.num_stored:
            first = float(np.floor(state.remote.stored_runs[0][0]))
            read.append((first, rates.update(state.remote, first)))
    return state, read, last_store


def test_the_route_keeps_each_slots_store_time_and_the_rates(routed):
    state, read, last_store = routed
    o, p = state.remote, state.projection
    n = p.num_blocks
    held = np.flatnonzero(o.base[:n])
    assert len(held) > 1_000 and o.num_removed > 1_000
    stored_at = o.stored_at
    assert stored_at.dtype == np.float64 and o.stored_run.dtype == np.uint32
    # each held slot's store time is its last store row's batch time, exactly
    assert stored_at[held].tolist() == [last_store[s] for s in held.tolist()]
    # the bars read after every tick equal the values' own count
    values_s = np.frombuffer(o.stored_times, np.float64)
    values_r = np.frombuffer(o.removed_times, np.float64)
    assert len(values_s) == o.num_stored and len(values_r) == o.num_removed
    first, (secs, got_s, got_r) = read[-1]
    assert got_s.tolist() == _bars(values_s, first, len(secs)) and got_r.tolist() == _bars(values_r, first, len(secs))
    assert sum(got_s) == o.num_stored and sum(got_r) == o.num_removed
    # a removal's lifetime is its time less its copy's store time: none negative, as many as removals of held copies
    assert len(o.lifetimes) > 0 and min(o.lifetimes) >= 0.0


def test_the_route_holds_runs_not_values(routed):
    state, _, _ = routed
    o = state.remote
    parts = o.nbytes_by_part()
    num_runs = o._stored_times.num_runs + o._removed_times.num_runs
    # runs (a time and a count) in their room: 16 bytes a run, not 8 a value
    assert o._stored_times.nbytes + o._removed_times.nbytes <= 16 * max(2 * RUN_ROOM, 2 * num_runs + 4 * 8 * 1024)
    assert num_runs * 10 < o.num_stored + o.num_removed
    codes = o._codes.nbytes + (o._cells.nbytes if o._cells is not None else 0)
    assert parts["slots"] == 5 * len(o.tier) + codes  # store run (uint32), code (the tier read from it)


def test_a_big_tick_makes_room_for_its_runs_not_its_rows():
    """A recorded stream's rows in one tick (a 1M-block pool's ticks are 500K rows): the
    runs' arrays get room for the runs the tick's times can make, not a run a row."""
    from app.runtime.state import PoolState
    from engine.bench.attach import recorded_stream
    from engine.core.live_journal import prepare_journal
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    payloads, _, _ = recorded_stream(20_000, gpu_blocks=3_000)
    pool = journal_pool_class()("test")
    pool.apply_many(fastwire.decode_columns_many(0, payloads))
    rows = pool.take_journal()
    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    state.apply_prepared([(prepare_journal(state.log, rows, pool, pool.source, 0), pool.times_of(rows))])
    o = state.remote
    assert len(rows) > 20 * RUN_ROOM and o.num_stored + o.num_removed == len(rows)
    for runs in (o._stored_times, o._removed_times):
        assert runs.nbytes <= 16 * max(RUN_ROOM, 2 * runs.num_runs)
    assert len(np.unique(np.frombuffer(o.stored_times))) == o._stored_times.num_runs - 1


def _tiered_frames() -> list[tuple[int, bytes]]:
    """vLLM frames storing chains on GPU and CPU, then on tiers the overlay meets later (a
    remote pool, an unknown medium: codes 4 and 5, each moving every held code), removing
    some of each, a batch time a frame."""
    from engine.remote.wire import VllmEvent, encode_batch

    rng = np.random.default_rng(4)
    mediums = ["GPU", "CPU", None, "CPU", "EXTERNAL", "GPU", "nvme-x", "CPU", "EXTERNAL", "GPU"]
    frames, held = [], []
    for seq, medium in enumerate(mediums):
        events = []
        for c in range(3):
            hashes = tuple(int(seq * 1000 + c * 10 + i + 1).to_bytes(8, "big") for i in range(4))
            events.append(VllmEvent("BlockStored", hashes, None, tuple(range(64)), 16, medium=medium))
            held += [(h, medium) for h in hashes]
        if seq % 2 and held:
            gone = [held.pop(int(rng.integers(len(held)))) for _ in range(5)]
            events += [VllmEvent("BlockRemoved", (h,), medium=m) for h, m in gone]
        frames.append((seq, encode_batch(1_796_000_000.0 + seq * 0.7, events)))
    return frames


@pytest.mark.parametrize("per_tick", [1, 4])
def test_the_tier_read_from_a_slots_code_is_the_tier_its_store_named(per_tick):
    """The tier of each held slot (the `tier` array is not kept: it is read from the slot's
    code) is the tier of the medium its store named, on both routes, also after tiers the
    overlay met later moved every code; tier counts and codes equal the reference's."""
    from tests.test_journal_app import _both
    from engine.remote.tiers import tier_of_medium
    from engine.remote.wire import decode_batch

    frames = _tiered_frames()
    medium_of = {}
    for seq, payload in frames:
        for e in decode_batch(seq, payload).events:
            if e.kind == "BlockStored":
                medium_of.update({h: e.medium for h in e.block_hashes})
    js, rs = _both([frames], per_tick)
    for state in (js, rs):
        o, p = state.remote, state.projection
        assert list(o.tier_names)[3:] == ["REMOTE", "NVME-X"]
        n = p.num_blocks
        held = np.flatnonzero(o.base[:n])
        assert len(held) == sum(1 for b in range(n) if p.hashes[b] is not None) > 50
        names = {code: name for name, code in o.tier_names.items()}
        tiers = o.tier[:n]
        for b in held.tolist():
            want = tier_of_medium(medium_of[p.hashes[b]])
            assert names[int(tiers[b])] == o.tier_name(b) == want, b
        assert not tiers[o.base[:n] == 0].any()
    assert [(c.tier, c.num_blocks) for c in js.remote.tier_counts(js.projection)] == \
        [(c.tier, c.num_blocks) for c in rs.remote.tier_counts(rs.projection)]
    now = rs.remote.now
    assert js.remote.codes(js.projection, now).tolist() == rs.remote.codes(rs.projection, now).tolist()
