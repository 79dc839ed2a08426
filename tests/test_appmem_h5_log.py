"""What a journal-fed live log keeps per block of an attached server beside its live pool's
hashes and places: no ref counts (none is ever set), no "hash held" flags (the journal tick
reads them from the hashes), and the same series, live pool and checkpoints whichever pass
each tick takes (the series pass rebuilds its flags from the hashes when it comes back).
"""

from __future__ import annotations

import numpy as np

from engine.core import live_log
from tests.test_route_h3b_journal_tick import _same, _ticks


def _recorded_ticks(frames_per_tick: int = 16) -> list[list[bytes]]:
    from engine.bench.attach import recorded_stream

    payloads, _, _ = recorded_stream(12_000, gpu_blocks=1_500)
    return [payloads[s:s + frames_per_tick] for s in range(0, len(payloads), frames_per_tick)]


def test_a_journal_logs_per_block_state_beside_its_hashes_and_places_is_not_kept():
    from app.runtime.journal_feed import JournalPools, take_journal_rows
    from app.runtime.state import PoolState
    from engine.core.live_journal import prepare_journal
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    pool = journal_pool_class()("bench")
    att = JournalPools([pool])
    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM bench"})
    taken: dict[int, int] = {}
    seq = 0
    for payloads in _recorded_ticks():
        pool.apply_many([fastwire.decode_columns(seq + i, p) for i, p in enumerate(payloads)])
        seq += len(payloads)
        got = take_journal_rows(att, taken, 1 << 30)
        state.apply_prepared([(prepare_journal(state.log, h, p, p.source, int(p.rank)), t) for h, p, t in got[0]],
                             notify=False)
    log, col = state.log, state.log.columnar
    n = col.num_blocks
    assert n > 1_000 and int(log.series.cached_free[-1]) > 500
    # the series pass's state: a ref count (4 bytes) and a flag (1) a block before
    assert log.nbytes_by_part()["series_state"] < 64
    assert log._ref.nbytes + log._held.nbytes <= 8
    # the live pool: hashes (4 bytes) and places (8) a block, its ref counts a zero-stride view
    ref, hk, pos = col._bufs
    assert ref.nbytes <= 4 and len(hk) >= n and len(pos) >= n
    assert log.live.ref_counts.strides[0] == 0 and not log.live.ref_counts.any()
    assert log.nbytes_by_part()["live"] == hk.nbytes + pos.nbytes
    # what the views read of it is what the pool holds
    held = int(np.count_nonzero(np.asarray(log.live.arrays.hash_keys) >= 0))
    assert held == int(log.series.cached_free[-1]) == int(log.live.hashed.sum())


def test_ticks_that_take_the_series_pass_between_journal_ticks_hold_what_one_pass_held(monkeypatch):
    """Every third tick through the series pass and `ColumnarLog._advance` (the flags of the
    hashes held rebuilt from the live pool's hashes), the rest through the journal tick's
    pass: after every tick, the same series, live pool, checkpoints and scrub as the route
    whose ticks all take the journal tick's pass."""
    ticks = _recorded_ticks(7)
    fused, _ = _ticks(ticks)
    real = live_log.LiveColumnarLog._journal_tick
    calls = {"tick": 0, "fused": 0}

    def every_third_apart(self, r0, r1, last_seq):
        calls["tick"] += 1
        if calls["tick"] % 3 == 0:
            return False
        done = real(self, r0, r1, last_seq)
        calls["fused"] += done
        return done

    monkeypatch.setattr(live_log.LiveColumnarLog, "_journal_tick", every_third_apart)
    mixed, _ = _ticks(ticks)
    assert calls["tick"] == len(ticks) and 0 < calls["fused"] < len(ticks)
    assert int(fused[-1]["series.evicted"][-1]) > 0
    _same(mixed, fused)


def test_ref_counts_wanted_after_journal_ticks_are_an_array_of_their_own():
    """A log whose passes so far set no ref count (`_grown_to(refs=False)`: a zero-stride
    view, no array kept) and then a pass that may (`ColumnarLog._advance`): the counts are a
    writable array of zeros as long as the pool, kept and moved on in place from then on."""
    from engine.core.columnar import PoolArrays

    log = live_log.LiveColumnarLog(0, 16)
    col = log.columnar
    col._grow(9)  # ten blocks, born at row 0
    ref, hk, pos = col._grown_to(col.moving, 1, refs=False)
    assert len(ref) == len(hk) == 10 and ref.strides[0] == 0 and not ref.any()
    assert col._bufs[0].nbytes == 0 and (hk == -1).all()
    col.moving = PoolArrays(0, 1, ref, hk, pos, log._live_arrays.counters)
    ref, hk, pos = col._grown_to(col.moving, 1)
    assert len(ref) == 10 and ref.strides[0] == 4 and ref.flags.writeable and not ref.any()
    ref[3] = 2
    col.moving = PoolArrays(0, 1, ref, hk, pos, log._live_arrays.counters)
    again, _, _ = col._grown_to(col.moving, 1)
    assert again[3] == 2 and np.shares_memory(again, ref)
