"""The measure of an attach's path through the app (`app.runtime.live_path.app_routes`) runs
the journal route the app takes and the event route it replaced on one stream, into the
window's `PoolState`, and both end on the same log and pool."""

from __future__ import annotations


def test_both_routes_reach_the_same_pool_state():
    from app.runtime.live_path import app_routes

    got = app_routes(3_000, gpu_blocks=500, frames_per_tick=16)
    journal, events = got["journal_route"], got["event_route"]
    rates = journal["runs_events_per_s_cpu"]  # three runs of the journal route, the median reported
    assert len(rates) == 3 and journal["events_per_s_cpu"] == sorted(rates)[1]
    assert journal["vllm_events"] == events["vllm_events"] >= 3_000
    assert journal["cachescope_events"] == journal["log_rows"] == events["cachescope_events"] > 3_000
    assert journal["slots"] == events["slots"] > 0
    assert set(journal["stages_cpu_s"]) == {"decode", "pool", "place", "commit"}
    assert got["journal_events_per_s_cpu"] == journal["events_per_s_cpu"] > 0
    # taken as the feed takes them (every TAKE_EVERY_S: here one take at the end, its rows
    # written in blocks of a tick's budget) or once per tick's apply: the same log and pool
    per_tick = got["journal_route_taken_per_tick"]
    assert journal["takes"] == "feed" and per_tick["takes"] == "tick"
    assert per_tick["num_takes"] > 5 * journal["num_takes"] >= 5
    assert (per_tick["cachescope_events"], per_tick["slots"]) == (journal["cachescope_events"], journal["slots"])
    assert got["journal_taken_per_tick_events_per_s_cpu"] == per_tick["events_per_s_cpu"] > 0


def test_the_route_is_taken_as_the_feed_or_per_tick_only():
    import pytest

    from app.runtime.live_path import journal_app_rate

    with pytest.raises(ValueError, match="'feed' or 'tick'"):
        journal_app_rate(1_000, gpu_blocks=100, takes="sometimes")


def test_the_median_run_is_the_middle_one_with_every_runs_figure():
    from app.runtime.live_path import median_run

    runs = [{"rate": 300, "other": "a"}, {"rate": 100, "other": "b"}, {"rate": 200, "other": "c"}]
    got = median_run(runs, "rate")
    assert got["other"] == "c" and got["runs_rate"] == [300, 100, 200]
    assert median_run(runs[:2], "rate")["rate"] == 100  # an even number: the lower middle one
    assert "runs_rate" not in runs[2]  # the runs are left as they were
