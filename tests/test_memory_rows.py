"""What the journal route keeps per tracked block beside the log's rows: the compiled
placer's arrays, the hash ids' and stores' columns and the slot numbering
(`engine.core.live_journal`), counted in bytes for the bench's held stream (a fixed,
generated vLLM stream), so the budget reached cannot grow back unseen; and the narrow
columns widening before a value would not fit."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core import live_journal
from engine.core.columnar import ArithmeticRuns
from engine.core.live_journal import _Grow

NUM_BLOCKS = 100_000

# Bytes per block reached on 2026-12-03 at this scale, with a little room. Before, every
# array int64 and grown by doubling: placer 176 (hash table 63 of it), hash ids 24, stores 24,
# slot numbering 11; after: 85, 12, 11, 4.6. Hash ids 0.3 since 2026-12-06 (their keys are the
# pool's per-store keys, JournalKeys).
BUDGET = {"placer": 88.0, "keys": 0.5, "stores": 11.5, "slot_ids": 5.0}


def _held_log():
    from app.commands._bench_gui import _held_frames
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    log = live_journal.journal_log(16)
    pool = journal_pool_class()("test")
    for seq, payload in enumerate(_held_frames(NUM_BLOCKS)):
        pool.apply(fastwire.decode_columns(seq, payload))
        if seq % 4 == 3:  # a tick every four frames
            live_journal.append_journal(log, pool.take_journal(), pool, "test")
    live_journal.append_journal(log, pool.take_journal(), pool, "test")
    return log


def _parts(log) -> dict[str, float]:
    col = log.columnar
    stores = col.store_attributes
    placer = stores.placer
    assert isinstance(placer, live_journal._CompiledPlacer)
    parts = {
        "placer": sum(a.nbytes for a in vars(placer).values() if isinstance(a, np.ndarray)),
        "keys": sum(g.nbytes for g in (col.keys._store, col.keys._own_id, col.keys._own_key, col.keys._width,
                                       col.keys._pool)),
        "stores": sum(g.nbytes for g in (stores._pool, stores._local, stores.tenants)),
        "slot_ids": sum(t.nbytes for t in stores._slot_ids.values()),
    }
    return {k: v / NUM_BLOCKS for k, v in parts.items()}


def test_journal_route_bytes_per_block_stay_within_the_budget():
    log = _held_log()
    assert log.columnar.num_blocks == NUM_BLOCKS
    parts = _parts(log)
    over = {k: round(v, 1) for k, v in parts.items() if v > BUDGET[k]}
    assert not over, (over, parts)


def test_grow_stays_narrow_until_a_value_does_not_fit():
    g = _Grow(np.int64, np.int32)
    g.extend(np.arange(5000, dtype=np.int64))
    assert g.buf.dtype == np.int32 and len(g.buf) < 2 * 5000
    big = np.array([2**31, -1], np.int64)
    assert g.extend(big).tolist() == [5000, 5001]
    assert g.buf.dtype == np.int64
    assert g.buf[:g.n].tolist() == list(range(5000)) + [2**31, -1]
    w = _Grow(np.int64, np.uint8)
    w.extend(np.array([0, 1, 2], np.int64))
    assert w.buf.dtype == np.uint8
    w.extend(np.array([-1], np.int64))
    assert w.buf.dtype == np.int64 and w.buf[:4].tolist() == [0, 1, 2, -1]


def test_slot_numbers_widen_before_they_would_pass_int32(monkeypatch):
    stores = live_journal.JournalStores(live_journal.JournalKeys(), compiled=False)
    monkeypatch.setattr(live_journal, "_I32_TOP", 10)
    first = stores.slot_ids(0, np.array([3, 1, 3, -1], np.int64))
    assert first.tolist() == [1, 0, 1, -1] and stores._slot_ids[0].dtype == np.int32
    got = stores.slot_ids(0, np.array(list(range(20)), np.int64))
    assert stores._slot_ids[0].dtype == np.int64
    assert got[[1, 3]].tolist() == [0, 1] and sorted(got.tolist()) == list(range(20))


@pytest.mark.parametrize("compiled", [True, False])
def test_held_route_numbers_do_not_depend_on_the_narrow_arrays(compiled, monkeypatch):
    # the same stream placed with every array widened from its first tick (int32's top
    # lowered to 0) gives the same rows as the narrow arrays do
    from app.commands._bench_gui import _held_frames
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    def rows():
        log = live_journal.journal_log(16, compiled=compiled)
        pool = journal_pool_class()("test")
        for seq, payload in enumerate(_held_frames(3000)):
            pool.apply(fastwire.decode_columns(seq, payload))
            if seq % 4 == 3:
                live_journal.append_journal(log, pool.take_journal(), pool, "test")
        live_journal.append_journal(log, pool.take_journal(), pool, "test")
        col = log.columnar
        return [col._cols[name][:col.num_rows].tolist() for name in sorted(col._cols)]

    narrow = rows()
    monkeypatch.setattr(live_journal, "_I32_TOP", 0)
    assert rows() == narrow


def test_a_rows_columns_are_26_bytes_while_their_values_fit():
    log = _held_log()
    col = log.columnar
    # seq, a and b were int64: 39; the tier byte no source wrote is not kept: 26
    assert sum(c.dtype.itemsize for c in col._cols.values()) == 26
    # a journal's seq, request, hash, a and b are kept as runs (`ArithmeticRuns`): the other
    # three columns (kind, block, flag) take 6 bytes a row, the runs a few per batch
    runs = [c for c in col._cols.values() if isinstance(c, ArithmeticRuns)]
    assert len(runs) == 5 and sum(r.nbytes for r in runs) < col.num_rows
    assert col.nbytes() == 6 * col.num_rows + sum(r.nbytes for r in runs)
    assert col._born_row.dtype == np.int32 and not hasattr(col, "_born_place")


def test_columns_widen_once_before_a_value_would_not_fit():
    from engine.core.columnar import ColumnarLog

    col = ColumnarLog(4, 16)
    narrow = np.array([[4, 0, 0, 1, 2, 3, 4, 1], [6, 1, 0, 2, -1, -7, 0, 0]], np.int64)
    col.write_rows(narrow)
    col.reserve(5000)  # a spare made narrow, on another thread in the app
    wide = np.zeros((3000, 8), np.int64)
    wide[:, 0], wide[:, 1] = 4, 2 + np.arange(3000)
    wide[:, 5], wide[:, 6] = 2**31 + np.arange(3000), -2**40
    col.write_rows(wide)
    assert (col.col("seq").dtype, col.col("a").dtype, col.col("b").dtype) == (np.int32, np.int64, np.int64)
    assert col.col("a").tolist() == [3, -7] + (2**31 + np.arange(3000)).tolist()
    assert col.col("b").tolist() == [4, 0] + [-2**40] * 3000
    assert col.col("seq").tolist() == [0, 1] + list(range(2, 3002))
    big = ColumnarLog.from_columns(4, 16, [np.array([4], np.uint8), np.zeros(1, np.uint8), np.array([2**33]),
                                           np.zeros(1), np.zeros(1), np.zeros(1), np.array([1]), np.array([-1]),
                                           np.zeros(1, np.uint8)], col.keys, col.requests, col.final_counters, 1)
    assert big.col("seq").dtype == np.int64 and big.col("seq").tolist() == [2**33]
    assert big.col("a").dtype == np.int32 and big.col("b").tolist() == [-1]


def test_a_pool_grown_past_int32_rows_keeps_its_born_rows():
    from engine.core.columnar import TAIL_BASE, ColumnarLog

    col = ColumnarLog(0, 16)
    col.num_rows = 10
    col._grow(3)
    col.num_rows = 2**31 + 5  # rows numbered past int32 (no rows written: the per-block arrays only)
    col._grow(5)
    assert col._born_row.dtype == np.int64 and col._born_row.span(0, 6).tolist() == [10] * 4 + [2**31 + 5] * 2
    # the free-queue place each joined at, computed from its born row (no longer kept)
    places = col._grown_to(col.initial_state(), 2**32)[2]
    assert places.tolist() == [TAIL_BASE + 2 * 10 - 1] * 4 + [TAIL_BASE + 2 * (2**31 + 5) - 1] * 2


def test_a_recorded_server_scrubs_the_same_with_every_column_widened(monkeypatch):
    # the live log's rows in int64 from the first row (the widening forced) scrub and give
    # back the very events the narrow ones do, checked against the reference as test_live_log does
    import engine.core.columnar as columnar
    from tests.test_live_log import MOONCAKE, _check_scrubbing, _events_of_trace, _feed

    events = _events_of_trace(MOONCAKE, 60, 4096, 512)
    monkeypatch.setattr(columnar, "_fits32", lambda values: False)
    col, ref = _feed(events, 0, 512, [9, 40], every_batch=False, checkpoint_rows=200)
    assert col.columnar.col("seq").dtype == np.int64 and col.columnar.col("a").dtype == np.int64
    _check_scrubbing(col, ref)


@pytest.fixture
def journal_app_state(qtbot):
    from app.commands._bench_gui import _held_frames
    from app.runtime.context import make_test_context
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    ctx = make_test_context()
    ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    pool = journal_pool_class()("test")
    for seq, payload in enumerate(_held_frames(20_000)):
        pool.apply(fastwire.decode_columns(seq, payload))
        if seq % 4 == 3:
            rows = pool.take_journal()
            ctx.state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
    rows = pool.take_journal()
    ctx.state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
    yield ctx
    ctx.shutdown()


def test_the_timeline_keeps_event_times_as_runs(journal_app_state, qtbot):
    # the events' server times: a run per vLLM batch (the seqs are the log's own), where an
    # int64 seq and a float64 time were kept per event; read back they are every event's time
    from app.views.pool.remote_plots import RemoteTimeline, event_times

    state = journal_app_state.state
    view = RemoteTimeline(state)
    qtbot.addWidget(view)
    n = len(state.log.seqs)
    seqs = np.asarray(state.log.seqs, np.int64)
    every = event_times(state.log, 0, n, seqs)
    x = view.x_of_seqs(seqs[::97])
    _, at, values = view._time_runs()
    assert len(at) > 1 and (at.nbytes + values.nbytes) * 8 < n  # under a byte an event (16 before)
    assert x.tolist() == (every[::97] - view.start).tolist()
    got_seqs, got_times = view._event_times()
    assert got_seqs.tolist() == seqs.tolist() and got_times.tolist() == every.tolist()
    lo, hi = float(every.min()), float(every.max())
    for a, b in ((lo, hi), (lo + (hi - lo) / 3, lo + (hi - lo) / 2), (hi + 1, hi + 2)):
        inside = np.flatnonzero((every >= a) & (every <= b))
        want = (int(seqs[inside[0]]), int(seqs[inside[-1]])) if len(inside) else None
        assert view.seqs_in(a - view.start, b - view.start) == want


def test_the_event_table_lists_every_event_in_4_bytes_each(journal_app_state, qtbot):
    from app.views.pool.event_log_view import EventTableModel

    state = journal_app_state.state
    model = EventTableModel(state)
    model.reset_log()
    assert model.rows.dtype == np.int32 and model.rows.tolist() == list(range(len(state.log)))
