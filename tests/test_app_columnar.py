"""File > Open builds the log on the worker and the views adopt it whole (issue 20).

The reference is the path the app took before: the Python engine's events applied one
batch at a time to `PoolState` through the bridge. On a real trace (the first requests of
the Mooncake conversation trace) the adopted log must give the views the same final pool:
block table rows (ref count, hash, tokens, free order), counters, the timeline's series and
the very events, and scrubbing back to early events must match too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.runtime.context import CancelToken, make_test_context
from app.runtime.jobs import trace_block_size
from app.runtime.replays import ReplayCancelled, TraceReplays, kernel_replay_job
from app.runtime.state import PoolState
from engine.core.events import EventBus
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace

MOONCAKE = Path(__file__).resolve().parents[1] / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
NUM_BLOCKS = 400  # small enough that the slice evicts


@pytest.fixture
def slice_path(tmp_path):
    path = tmp_path / "mooncake_300.jsonl"
    with MOONCAKE.open("rb") as src:
        path.write_bytes(b"".join(line for _, line in zip(range(300), src)))
    return path


def _reference_state(path: Path) -> PoolState:
    """The path before: Python engine events, through batches of 1,000 into a PoolState."""
    bs = trace_block_size(path)
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    replay(load_trace(path, bs), ReplayConfig(block_size=bs, capacity_blocks=NUM_BLOCKS, seed=0), bus)
    state = PoolState()
    state.set_engine({"block_size": bs, "num_blocks": NUM_BLOCKS})
    for i in range(0, len(events), 1000):
        state.apply_events(events[i:i + 1000])
    return state


def _rows(state: PoolState) -> list[tuple]:
    p = state.projection
    return [(b, p.ref_counts[b], p.hashes[b], p.token_ids[b], p.category(b)) for b in range(p.num_blocks)]


def _strip(event) -> dict:
    return {k: v for k, v in event.to_dict().items() if k != "time"}


def test_an_opened_trace_shows_the_reference_final_state(qtbot, tmp_path, slice_path):
    expected = _reference_state(slice_path)
    ctx = make_test_context(tmp_path)
    try:
        replays = TraceReplays(ctx)
        changes: list = []
        ctx.state.sigChanged.connect(lambda: changes.append(len(ctx.state.log)))
        done: list = []
        with qtbot.waitSignal(replays.sigShown, timeout=120_000):
            replays.start(slice_path, num_blocks=NUM_BLOCKS, on_done=done.append)
        got = ctx.state
        assert done and done[0]["totals"]["requests"] == 300
        assert got.projection.counters.num_evicted_blocks > 0  # the slice does evict
        # No event went through the bridge: the views redrew once, for the whole log.
        assert ctx.bridge.num_events == 0 and changes[-1] == len(got.log)
        assert changes.count(len(got.log)) == 1
        assert [_strip(e) for e in got.log.events] == [_strip(e) for e in expected.log.events]
        assert _rows(got) == _rows(expected)
        assert list(got.projection.free) == list(expected.projection.free)
        assert got.projection.counters == expected.projection.counters
        assert got.projection.num_in_use == expected.projection.num_in_use
        assert got.projection.num_cached_free == expected.projection.num_cached_free
        for name in ("seq", "in_use", "cached_free", "empty", "max_ref", "evicted", "cached_tokens",
                     "prompt_tokens", "refusal_seqs", "reset_seqs"):
            assert list(getattr(got.log.series, name)) == list(getattr(expected.log.series, name)), name
        assert got.is_live and got.current_seq == expected.current_seq == got.log.last_seq
        # Scrubbing back to early events reads the adopted log's checkpoints.
        for seq in (0, 17, len(got.log) // 3, len(got.log) - 2):
            got.scrub_to(seq)
            expected.scrub_to(seq)
            assert _rows(got) == _rows(expected), seq
            assert got.projection.counters == expected.projection.counters, seq
    finally:
        ctx.shutdown()


def test_the_timeline_and_metrics_draw_the_adopted_log(qtbot, tmp_path, slice_path):
    from app.views.pool.metrics_view import MetricsView
    from app.views.pool.timeline_view import TimelineView

    ctx = make_test_context(tmp_path)
    try:
        timeline, metrics = TimelineView(ctx), MetricsView(ctx)
        for view in (timeline, metrics):
            qtbot.addWidget(view)
            view.resize(900, 400)
            view.show()
        replays = TraceReplays(ctx)
        with qtbot.waitSignal(replays.sigShown, timeout=120_000):
            replays.start(slice_path, num_blocks=NUM_BLOCKS)
        n = len(ctx.state.log)
        qtbot.waitUntil(lambda: timeline._drawn[0] == n, timeout=10_000)
        s, p = ctx.state.log.series, ctx.state.projection
        # the curves' data, not getData(): that is what pyqtgraph's peak downsampling
        # shows at the plot's width, whose last point may fall a few events earlier
        x, used = timeline.c_used.xData, timeline.c_used.yData
        cached = timeline.c_cached.yData
        assert x[-1] == s.seq[-1] == n - 1
        assert used[-1] == s.in_use[-1] == p.num_in_use
        assert cached[-1] == p.num_in_use + p.num_cached_free
        assert f"evicted&nbsp;<b>{p.counters.num_evicted_blocks:,}</b>" in timeline.title.text()
        assert metrics.isVisible()
    finally:
        ctx.shutdown()


def test_cancel_before_the_log_is_built_keeps_nothing_half_made(slice_path):
    token = CancelToken()
    token.cancel()
    with pytest.raises(ReplayCancelled) as info:
        kernel_replay_job(str(slice_path), trace_block_size(slice_path), NUM_BLOCKS, token)
    assert info.value.log is None


def test_the_worker_job_returns_the_result_and_the_whole_log(slice_path):
    bs = trace_block_size(slice_path)
    result, log = kernel_replay_job(str(slice_path), bs, NUM_BLOCKS)
    assert result["totals"]["requests"] == 300 and result["config"]["trace"] == str(slice_path)
    assert log.live.counters.num_requests == 300 and len(log) == len(log.seqs) == len(log.series)
    assert list(log.seqs) == list(range(len(log)))
