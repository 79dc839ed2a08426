"""The measure of an attach's path through the app (`app.runtime.live_path.app_routes`) runs
the journal route the app takes and the event route it replaced on one stream, into the
window's `PoolState`, and both end on the same log and pool."""

from __future__ import annotations


def test_both_routes_reach_the_same_pool_state():
    from app.runtime.live_path import app_routes

    got = app_routes(3_000, gpu_blocks=500, frames_per_tick=16)
    journal, events = got["journal_route"], got["event_route"]
    assert journal["vllm_events"] == events["vllm_events"] >= 3_000
    assert journal["cachescope_events"] == journal["log_rows"] == events["cachescope_events"] > 3_000
    assert journal["slots"] == events["slots"] > 0
    assert set(journal["stages_cpu_s"]) == {"decode", "pool", "place", "commit"}
    assert got["journal_events_per_s_cpu"] == journal["events_per_s_cpu"] > 0
