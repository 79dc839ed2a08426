"""`PoolState` on its live columnar log against `PoolState(columnar=False)`, the Python
`EventLog` the app used before (issue 20), through what the views read: the pool after
each batch and scrubbed back, next/previous miss and eviction, `contains`, the flash of
evictions, a re-delivered batch, a new request while scrubbed; and for an attached server
the tier, rank and age overlay. Real flows: a bundled demo run by the Python engine, the
Mooncake trace streamed in bridge-sized batches, recorded and synthetic vLLM streams.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.runtime.state import PoolState, is_eviction, is_miss
from engine.core.live_log import LiveColumnarLog
from engine.core.projection import EventLog
from tests.test_live_log import MOONCAKE, _check_projection, _events_of_trace, _remote_events


def _pair(info: dict) -> tuple[PoolState, PoolState]:
    col, ref = PoolState(), PoolState(columnar=False)
    for s in (col, ref):
        s.set_engine(info)
    assert isinstance(col.log, LiveColumnarLog) and isinstance(ref.log, EventLog)
    return col, ref


def _same_views(col: PoolState, ref: PoolState, where: str) -> None:
    _check_projection(col.projection, ref.projection, where)
    assert (col.current_seq, col.is_live, col.seq_range, col.flash_since_seq) == \
        (ref.current_seq, ref.is_live, ref.seq_range, ref.flash_since_seq), where
    for name in ("in_use", "cached_free", "empty", "max_ref", "evicted", "cached_tokens", "prompt_tokens"):
        assert list(getattr(col.log.series, name)) == list(getattr(ref.log.series, name)), (where, name)


def _same_finds(col: PoolState, ref: PoolState, seqs: list[int]) -> int:
    found = 0
    for here in seqs:
        for pred in (is_miss, is_eviction):
            for forward in (True, False):
                got = col.find(pred, forward, here)
                assert got == ref.find(pred, forward, here), (here, pred.__name__, forward)
                found += got is not None
    return found


def _play(col: PoolState, ref: PoolState, events: list, size: int, check_every: bool = True) -> None:
    for i in range(0, len(events), size):
        batch = events[i:i + size]
        col.apply_events(batch)
        ref.apply_events(batch)
        if check_every:
            _same_views(col, ref, f"batch at {i}")


def _demo_events(demo) -> list:
    from engine.demos.env import DemoEnv

    env = DemoEnv()
    env.run(demo)
    return env.events


def test_a_demo_from_the_python_engine_and_every_scrub():
    from engine.demos.prompts import AB_SETTING

    events = _demo_events(AB_SETTING)  # two model-less managers, one after the other
    starts = [i for i, e in enumerate(events) if i == 0 or e.seq <= events[i - 1].seq] + [len(events)]
    assert len(starts) == 3 and len(events) > 100
    col, ref = _pair({"block_size": 16, "num_blocks": 256})
    for a, b in zip(starts, starts[1:]):  # each engine's own bus: the app starts a log for each
        for s in (col, ref):
            s.set_engine({"block_size": 16, "num_blocks": 256})
        part = events[a:b]
        _play(col, ref, part, 17)
        seqs = [e.seq for e in part]
        for seq in seqs[::max(1, len(seqs) // 40)] + [seqs[0], seqs[-1]]:
            col.scrub_to(seq)
            ref.scrub_to(seq)
            _same_views(col, ref, f"scrubbed to {seq}")
            assert col.contains(seq) and ref.contains(seq)
        assert _same_finds(col, ref, seqs[::max(1, len(seqs) // 25)]) > 0
        col.scrub_to(None)
        ref.scrub_to(None)
        _same_views(col, ref, "live again")
        assert not col.contains(seqs[-1] + 1) and not col.contains(None)


def test_the_mooncake_trace_in_bridge_batches_a_redelivered_batch_and_a_new_request_while_scrubbed():
    events = _events_of_trace(MOONCAKE, 150, 300, 512)
    col, ref = _pair({"block_size": 512, "num_blocks": 300})
    half = len(events) // 2
    _play(col, ref, events[:half], 1000, check_every=False)
    _same_views(col, ref, "half way")
    # a re-delivered batch (the bus shared across engines) adds nothing
    n = len(col.log)
    col.apply_events(events[half - 500:half])
    ref.apply_events(events[half - 500:half])
    assert len(col.log) == len(ref.log) == n
    # scrubbed back, a batch without a new request keeps the past shown; one with a start goes live
    early = events[40].seq
    col.scrub_to(early)
    ref.scrub_to(early)
    tail_wo_start = []
    for e in events[half:]:
        if e.kind == "request_started":
            break
        tail_wo_start.append(e)
    rest = events[half + len(tail_wo_start):]
    if tail_wo_start:
        col.apply_events(tail_wo_start)
        ref.apply_events(tail_wo_start)
        assert not col.is_live and col.current_seq == early
        _same_views(col, ref, "scrubbed while events arrive")
    col.apply_events(rest[:300])
    ref.apply_events(rest[:300])
    assert col.is_live
    _same_views(col, ref, "live after a new request")
    _play(col, ref, rest[300:], 1000, check_every=False)
    _same_views(col, ref, "at the end")
    assert ref.projection.counters.num_evicted_blocks > 0
    assert _same_finds(col, ref, [e.seq for e in events[::97]]) > 0


@pytest.mark.parametrize("num_ranks, reset_every", [(1, 9), (2, 6)])
def test_an_attached_servers_overlay_reads_the_same_slots(num_ranks, reset_every):
    from tests.test_colpool import _synthetic

    events = _remote_events(_synthetic(200, 7 + num_ranks), num_ranks, reset_every)
    info = {"block_size": 16, "num_blocks": 0, "remote": True, "model": "vLLM test",
            "data_parallel_size": num_ranks}
    col, ref = _pair(info)
    assert isinstance(col.log, LiveColumnarLog)
    for i in range(0, len(events), 23):
        col.apply_events(events[i:i + 23])
        ref.apply_events(events[i:i + 23])
        a, b = col.remote, ref.remote
        pa, pb = col.projection, ref.projection
        assert np.array_equal(a.codes(pa), b.codes(pb)), i
        assert a.tier_counts(pa) == b.tier_counts(pb) and a.ranks(pa) == b.ranks(pb), i
        n = pb.num_blocks
        assert np.array_equal(a.tier[:n], b.tier[:n]) and np.array_equal(a.rank[:n], b.rank[:n]), i
        assert list(a.lifetimes) == list(b.lifetimes) and a.num_stored_again == b.num_stored_again, i
    _same_views(col, ref, "at the end")
    for seq in [e.seq for e in events[::31]]:
        col.scrub_to(seq)
        ref.scrub_to(seq)
        _same_views(col, ref, f"scrubbed to {seq}")
    assert _same_finds(col, ref, [e.seq for e in events[::41]]) > 0


def test_a_recorded_server_through_the_state():
    from tests.test_fastwire import FIXTURES

    events = _remote_events(FIXTURES["vllm_copies/vllm_copies_events.jsonl"])
    col, ref = _pair({"block_size": 16, "num_blocks": 0, "remote": True, "model": "vLLM test"})
    _play(col, ref, events, 50)
    assert np.array_equal(col.remote.codes(col.projection), ref.remote.codes(ref.projection))


def test_the_app_path_measurement_runs_both_logs_on_the_same_stream():
    from app.runtime.live_path import app_path_rate

    ref = app_path_rate(3_000, columnar=False, gpu_blocks=500, frames_per_tick=16)
    col = app_path_rate(3_000, columnar=True, gpu_blocks=500, frames_per_tick=16)
    assert (ref["log"], col["log"]) == ("EventLog", "LiveColumnarLog")
    assert col["vllm_events"] == ref["vllm_events"] >= 3_000
    assert col["cachescope_events"] == ref["cachescope_events"] > col["vllm_events"]  # one per block
    assert col["slots"] == ref["slots"] > 0


def test_the_journal_path_measurement_gives_the_reference_pool():
    from app.runtime.live_path import app_path_rate, journal_path_rate

    ref = app_path_rate(3_000, columnar=True, gpu_blocks=500, frames_per_tick=16)
    journal = journal_path_rate(3_000, gpu_blocks=500, frames_per_tick=16)
    assert journal["vllm_events"] == ref["vllm_events"]
    assert journal["cachescope_events"] == ref["cachescope_events"] and journal["slots"] == ref["slots"] > 0
