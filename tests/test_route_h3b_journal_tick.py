"""A journal tick's series and live pool moved on in one compiled pass (`LiveColumnarLog._journal_tick`)
hold, after every tick, what the series pass and `ColumnarLog._advance` held apart: the series,
the live pool's hashes, free-queue places and counters, the checkpoints and a scrub to them.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.core import live_log
from tests.test_route_h3_regrow import _snapshot


def _pool_snapshot(state) -> dict:
    out = _snapshot(state)
    log, col = state.log, state.log.columnar
    live = log._live_arrays
    out["live.hash_keys"], out["live.free_pos"] = np.array(live.hash_keys), np.array(live.free_pos)
    out["live.counters"], out["live.seq"] = live.counters, live.seq
    out["heads"] = (col._heads_after, dict(col._head_marks))
    for i, cp in enumerate(col._cp_states):
        for name in ("ref_counts", "hash_keys", "free_pos"):
            out[f"cp{i}.{name}"] = np.array(getattr(cp, name))
    if len(log.seqs) > 10:  # a scrub back, replayed from a checkpoint
        scrub = log.state_at(int(log.seqs[len(log.seqs) // 3]))
        out["scrub.hashed"], out["scrub.free"] = np.array(scrub.hashed), np.array(scrub.arrays.free_pos)
    return out


def _ticks(payload_ticks: list[list[bytes]], first_seq: int = 0) -> tuple[list[dict], int]:
    from app.runtime.journal_feed import JournalPools, take_journal_rows
    from app.runtime.state import PoolState
    from engine.core.live_journal import prepare_journal
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    pool = journal_pool_class()("bench")
    att = JournalPools([pool])
    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM bench"})
    state.log.columnar.checkpoint_rows = 2_000  # many checkpoints: the fused pass must leave them as they were
    taken: dict[int, int] = {}
    out, seq = [], first_seq
    fused = 0
    for payloads in payload_ticks:
        pool.apply_many([fastwire.decode_columns(seq + i, p) for i, p in enumerate(payloads)])
        seq += len(payloads)
        got = take_journal_rows(att, taken, 1 << 30)
        state.apply_prepared([(prepare_journal(state.log, h, p, p.source, int(p.rank)), t) for h, p, t in got[0]],
                             notify=False)
        out.append(_pool_snapshot(state))
    return out, fused


def _both(monkeypatch, payload_ticks) -> tuple[list[dict], list[dict], int]:
    calls = []
    real = live_log.LiveColumnarLog._journal_tick

    def counted(self, r0, r1, last_seq):
        done = real(self, r0, r1, last_seq)
        calls.append(done)
        return done

    monkeypatch.setattr(live_log.LiveColumnarLog, "_journal_tick", counted)
    fused, _ = _ticks(payload_ticks)
    monkeypatch.setattr(live_log, "_JOURNAL_LOOP", [None])  # no compiled pass: the two passes apart
    apart, _ = _ticks(payload_ticks)
    return fused, apart, sum(calls)


def _same(fused: list[dict], apart: list[dict]) -> None:
    assert len(fused) == len(apart)
    for t, (a, b) in enumerate(zip(fused, apart)):
        assert a.keys() == b.keys()
        for name in a:
            if isinstance(a[name], np.ndarray):
                assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), (t, name)
            else:
                assert a[name] == b[name], (t, name)


@pytest.mark.parametrize("frames_per_tick", [1, 7, 64])
def test_a_recorded_streams_ticks_hold_what_the_two_passes_held(monkeypatch, frames_per_tick):
    from engine.bench.attach import recorded_stream

    payloads, _, _ = recorded_stream(12_000, gpu_blocks=1_500)
    ticks = [payloads[s:s + frames_per_tick] for s in range(0, len(payloads), frames_per_tick)]
    fused, apart, num_fused = _both(monkeypatch, ticks)
    assert num_fused == len(ticks)  # every tick took the one pass
    assert len(fused[-1]["col.kind"]) > 20_000 and len(fused[-1]["checkpoints"]) > 3
    assert int(fused[-1]["series.evicted"][-1]) > 0 and fused[-1]["live.counters"].num_evicted_blocks > 0
    _same(fused, apart)


def test_clears_of_one_row_and_of_many_hold_what_the_two_passes_held(monkeypatch):
    from engine.remote.wire import VllmEvent, encode_batch

    def store(i):
        return VllmEvent("BlockStored", ((i + 9 << 40).to_bytes(8, "big"),), None, tuple(range(16)), 16)

    def remove(i):
        return VllmEvent("BlockRemoved", ((i + 9 << 40).to_bytes(8, "big"),))

    clear = VllmEvent("AllBlocksCleared")
    frames = [
        [store(0), store(1), remove(0)], [remove(1), clear],  # a clear of nothing held: one row
        [store(2)], [clear, store(3)],  # a clear of one block: one row
        [store(4), store(5), store(6), remove(4)], [store(7)],
        [clear, store(8), store(9)],  # a clear of three blocks: an event of three rows
        [store(10), remove(8)], [store(11)],
    ]
    ticks = [[encode_batch(2.0 + i, f, 0)] for i, f in enumerate(frames)]
    fused, apart, num_fused = _both(monkeypatch, ticks)
    assert num_fused == 6  # the ticks before the clear of three rows (then every event has bounds)
    assert fused[-1]["series.reset_seqs"].tolist() and fused[-1]["live.counters"].num_evicted_blocks == 4
    _same(fused, apart)


def test_store_numbers_said_to_count_up_are_kept_as_the_same_runs():
    from engine.core.live_journal import _Steps, _scan_numpy

    rng = np.random.default_rng(7)
    told, looked = _Steps(), _Steps()
    at = 0
    for tick in range(300):
        k = int(rng.integers(1, 50))
        if tick % 7 == 3:
            at += int(rng.integers(2, 9))  # a gap: another pool's stores came between
        values = np.arange(at, at + k, dtype=np.int64)
        if tick % 11 == 5:
            values = values[::-1].copy()  # not counting up: runs of one
        at += k
        ops = np.zeros(k, np.int64)
        counting = _scan_numpy(ops, ops, ops, values, ops + 1).stores_counting
        assert counting == (tick % 11 != 5 or k == 1)
        told.append(values, counting)
        looked.append(values)
    assert told.n == looked.n > 3000
    every = np.arange(told.n)
    assert np.array_equal(told.take(every), looked.take(every))
    assert np.array_equal(told._start.view, looked._start.view) and np.array_equal(told._first.view, looked._first.view)


class _AlwaysSeen(dict):
    """A `top_batch` that says every batch was named before: `commit_journal` and
    `RemoteSlots.info_ids` look each up."""

    def get(self, key, default=None):
        return 1 << 62


def _servers_route(looked_up: bool) -> list[dict]:
    """Two ranks of one server whose batch seqs overlap, a batch of two tiers, a restart
    (seqs from 0 again, at later times), ticks of at most 3 rows (a batch's rows in two)."""
    from app.runtime.journal_feed import JournalPools, take_journal_rows
    from app.runtime.state import PoolState
    from engine.core.live_journal import prepare_journal
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class
    from engine.remote.wire import VllmEvent, encode_batch

    pools = [journal_pool_class()("srv", rank=r) for r in (0, 1)]
    att = JournalPools(pools)
    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM bench"})
    if looked_up:
        state.log.columnar.store_attributes.top_batch = _AlwaysSeen()

    def frame(rank, seq, t, medium=None):
        h = (rank << 50 | seq << 20 | int(t * 10)).to_bytes(8, "big")
        events = [VllmEvent("BlockStored", (h,), None, tuple(range(16)), 16, medium=medium)]
        if seq % 3 == 2:
            events.append(VllmEvent("BlockRemoved", (h,), medium=medium))
        if seq == 4:  # a second tier in the same batch
            events.append(VllmEvent("BlockStored", (h[::-1],), None, tuple(range(16)), 16, medium="CPU"))
        return fastwire.decode_columns(seq, encode_batch(t, events, rank))

    plan = [(0, range(0, 6), 1.0), (1, range(3, 9), 1.5), (0, range(6, 8), 2.0), (0, range(0, 4), 9.0),
            (1, range(9, 12), 9.5), (0, range(4, 9), 10.0)]
    taken: dict[int, int] = {}
    out = []
    for rank, seqs, t in plan:
        for s in seqs:
            pools[rank].apply(frame(rank, s, t + s / 100))
            if s % 2:
                continue
            got = take_journal_rows(att, taken, 3)  # a batch's rows cut between ticks
            state.apply_prepared([(prepare_journal(state.log, h, p, p.source, int(p.rank)), tt)
                                  for h, p, tt in got[0]], notify=False)
            out.append(_pool_snapshot(state))
    while (got := take_journal_rows(att, taken, 1 << 30))[0]:
        state.apply_prepared([(prepare_journal(state.log, h, p, p.source, int(p.rank)), tt)
                              for h, p, tt in got[0]], notify=False)
        out.append(_pool_snapshot(state))
    return out


def test_requests_and_infos_of_new_batches_equal_those_looked_up(monkeypatch):
    from engine.core.live_slots import RemoteSlots

    fast = _servers_route(False)
    init = RemoteSlots.__init__

    def every_info_looked_up(self, *args, **kwargs):  # info_ids' lookup for every batch
        init(self, *args, **kwargs)
        self._top_batch = _AlwaysSeen()

    monkeypatch.setattr(RemoteSlots, "__init__", every_info_looked_up)
    looked = _servers_route(True)
    assert len(fast[-1]["requests"]) < len(fast[-1]["infos"]) < len(fast[-1]["col.kind"])  # batches shared, tiers apart
    assert len(set(fast[-1]["requests"])) == len(fast[-1]["requests"]) < 20
    _same(fast, looked)
