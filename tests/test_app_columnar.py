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
from tests._traces import MOONCAKE, trace_head

NUM_BLOCKS = 400  # small enough that the slice evicts


@pytest.fixture
def slice_path(tmp_path):
    return trace_head(tmp_path, 300)


def reference_events(path: Path) -> list:
    """The Python engine's events for the trace at `path` in a pool of NUM_BLOCKS."""
    bs = trace_block_size(path)
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    replay(load_trace(path, bs), ReplayConfig(block_size=bs, capacity_blocks=NUM_BLOCKS, seed=0), bus)
    return events


def _reference_state(path: Path) -> PoolState:
    """The path before: Python engine events, through batches of 1,000 into a PoolState."""
    bs = trace_block_size(path)
    events = reference_events(path)
    state = PoolState(columnar=False)
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


# ---------------------------------------------------------------------------- the columnar log
# The views on the kernel's columnar log (engine.core.columnar_log) against the views on the
# Python engine's EventLog, on real traces: the Mooncake traces (block-level hash ids) and
# the token traces recorded beside vLLM (tenants, a 64-block pool that evicts).
ROOT = Path(__file__).resolve().parents[1]
TWIN = ROOT / "tests" / "data" / "vllm_twin"
TRACES = {  # name: (path, requests kept, pool blocks)
    "mooncake_conversation": (MOONCAKE, 300, 400),
    "mooncake_synthetic": (ROOT / "resources" / "traces" / "mooncake_synthetic_trace.jsonl", 200, 300),
    "demo_tokens": (ROOT / "resources" / "traces" / "demo_tokens.jsonl", None, 40),
    "tenants_c2": (TWIN / "tenants_c2.trace.jsonl", None, 48),
    "evict_pool64_c1": (TWIN / "evict_pool64_c1.trace.jsonl", None, 63),
}


def _trace(tmp_path: Path, name: str) -> tuple[Path, int]:
    path, keep, blocks = TRACES[name]
    if keep is not None:
        cut = tmp_path / f"{name}_{keep}.jsonl"
        with path.open("rb") as src:
            cut.write_bytes(b"".join(line for _, line in zip(range(keep), src)))
        path = cut
    return path, blocks


def _both(tmp_path: Path, name: str) -> tuple[PoolState, PoolState]:
    """(the Python engine's EventLog path, the kernel's columnar log) on one trace."""
    from engine.core.columnar_log import ColumnarEventLog

    path, blocks = _trace(tmp_path, name)
    bs = trace_block_size(path)
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    replay(load_trace(path, bs), ReplayConfig(block_size=bs, capacity_blocks=blocks, seed=0), bus)
    ref = PoolState(columnar=False)
    ref.set_engine({"block_size": bs, "num_blocks": blocks})
    for i in range(0, len(events), 1000):
        ref.apply_events(events[i:i + 1000])
    _, log = kernel_replay_job(str(path), bs, blocks)
    assert isinstance(log, ColumnarEventLog)  # the kernel ran it: the columnar path is what is tested
    col = PoolState()
    col.set_engine({"block_size": bs, "num_blocks": blocks})
    col.adopt_log(log)
    return ref, col


def _blocks(p) -> list[tuple]:
    return [(b, int(p.ref_counts[b]), p.hashes[b], tuple(p.token_ids[b]), p.category(b), p.parents[b], p.salts[b],
             p.tenants[b], p.external_ids[b], int(p.evicted_seq[b]), p.last_seq[b], p.last_used[b])
            for b in range(p.num_blocks)]


def _same_pool(a, b, where) -> None:
    assert _blocks(a) == _blocks(b), where
    assert list(a.free) == list(b.free), where
    assert a.free_ranks() == b.free_ranks(), where
    assert a.counters == b.counters, where
    assert (a.seq, a.num_events, a.num_in_use, a.num_cached_free, a.num_empty, a.num_hashed, a.max_ref_count,
            a.last_eviction_seq, a.last_request_id) == \
           (b.seq, b.num_events, b.num_in_use, b.num_cached_free, b.num_empty, b.num_hashed, b.max_ref_count,
            b.last_eviction_seq, b.last_request_id), where
    assert a.ref_hist == b.ref_hist, where
    assert a.running == b.running, where
    assert a.request_records() == b.request_records(), where
    assert a.by_hash == b.by_hash, where
    for blk in range(a.num_blocks):
        assert a.chain_of(blk) == b.chain_of(blk), (where, blk)
        assert a.block_info(blk) == b.block_info(blk), (where, blk)
        assert a.owners(blk) == b.owners(blk), (where, blk)
    for rid in list(b.requests)[-5:]:
        assert a.requests.get(rid) == b.requests.get(rid), (where, rid)
        assert a.block_of_hash(rid.encode()) is None
    for h in list(b.by_hash)[:20]:
        assert a.block_of_hash(h) == b.block_of_hash(h), where


@pytest.mark.parametrize("name", sorted(TRACES))
def test_the_columnar_log_reads_as_the_event_log(tmp_path, name):
    ref, col = _both(tmp_path, name)
    n = len(ref.log)
    assert len(col.log) == n > 0 and list(col.log.seqs) == ref.log.seqs
    assert (col.log.first_seq, col.log.last_seq, col.seq_range) == (ref.log.first_seq, ref.log.last_seq, ref.seq_range)
    assert [_strip(e) for e in col.log.events] == [_strip(e) for e in ref.log.events]
    for i in (0, 1, n // 2, n - 1, -1):
        assert _strip(col.log.events[i]) == _strip(ref.log.events[i])
    assert [_strip(e) for e in col.log.events[n // 3:n // 3 + 40]] == [_strip(e) for e in ref.log.events[n // 3:n // 3 + 40]]
    for seq in (-1, 0, n // 2, n - 1, n + 5):
        assert col.log.count_upto(seq) == ref.log.count_upto(seq)
        assert col.contains(seq) == ref.contains(seq)
        e, f = col.log.event_at_seq(seq), ref.log.event_at_seq(seq)
        assert (e is None and f is None) or _strip(e) == _strip(f)
    # the compiled pass (what the app uses) and the numpy one (without numba) alike
    vectorised = col.log._compute_series()
    for field in ("seq", "in_use", "cached_free", "empty", "max_ref", "evicted", "cached_tokens", "prompt_tokens",
                  "refusal_seqs", "reset_seqs"):
        assert list(getattr(col.log.series, field)) == list(getattr(ref.log.series, field)), field
        assert list(getattr(vectorised, field)) == list(getattr(ref.log.series, field)), field


@pytest.mark.parametrize("name", sorted(TRACES))
def test_scrubbing_the_columnar_log_gives_the_reference_pools(tmp_path, name):
    ref, col = _both(tmp_path, name)
    n = len(ref.log)
    _same_pool(col.projection, ref.projection, "live")
    # forward, then back to early events, then live again
    for seq in (n // 2, n - 2, 0, 3, 17, n // 5, n // 3):
        ref.scrub_to(seq)
        col.scrub_to(seq)
        assert col.current_seq == ref.current_seq and not col.is_live
        _same_pool(col.projection, ref.projection, seq)
    ref.scrub_to(None)
    col.scrub_to(None)
    assert col.is_live and col.current_seq == ref.current_seq
    assert col.flash_since_seq == ref.flash_since_seq


@pytest.mark.parametrize("name", sorted(TRACES))
def test_next_and_previous_miss_and_eviction_match(tmp_path, name):
    from app.runtime.state import is_eviction, is_miss

    ref, col = _both(tmp_path, name)
    n = len(ref.log)
    found = 0
    for start in (None, -1, 0, 5, n // 4, n // 2, n - 3, n - 1, n + 2):
        for predicate in (is_miss, is_eviction):
            for forward in (True, False):
                want = ref.find(predicate, forward, start)
                assert col.find(predicate, forward, start) == want, (start, predicate.__name__, forward)
                found += want is not None
    assert found  # each trace has a miss (its first lookup) to find
    # a predicate of another shape still reads the events
    rid = ref.log.events[-1].request_id
    pred = lambda e: e.kind == "request_started" and e.request_id == rid  # noqa: E731
    assert col.find(pred, False, n) == ref.find(pred, False, n)
    # the scrubbed state's own seq is where a search starts by default
    ref.scrub_to(n // 2)
    col.scrub_to(n // 2)
    for predicate in (is_miss, is_eviction):
        assert col.find(predicate, True) == ref.find(predicate, True)
        assert col.find(predicate, False) == ref.find(predicate, False)


FILTERS = ("kind:evicted", "kind:lookup and reason:new_content", "reason:evicted", "not kind:ref_counts_changed",
           "block:3", "block<4 and kind:allocated", "block!=3", "block:3 and block:4", "block>=10 or kind:finished",
           "tier:gpu", "tier!=gpu", "tenant:alice", "tenant!=alice", "request:c0-t0", "request:3",
           "kind:stored and not block:0", "rank:0", "model:x", "session:y", "server:z", "kind:refused")


@pytest.mark.parametrize("name", ["tenants_c2", "evict_pool64_c1", "mooncake_conversation"])
def test_the_shared_filter_matches_the_columns_as_the_events(tmp_path, name):
    from app.runtime.selection import EventFilter, columnar_mask, match_events
    from engine.analysis.filter_language import parse

    ref, col = _both(tmp_path, name)
    tenants = {e.salt for e in ref.log.events if e.kind == "request_started" and e.salt}
    texts = list(FILTERS) + [f"tenant:{t}" for t in sorted(tenants)[:2]]
    hits = 0
    for text in texts:
        flt = parse(text)
        got = columnar_mask(col.log, flt)
        assert got is not None, text
        want, _ = match_events(ref.log.events, flt)
        assert got.tolist() == want.tolist(), text
        hits += int(want.any())
    assert hits >= 8
    assert columnar_mask(col.log, parse("hash:ab")) is None  # hashes: the events are read instead
    assert columnar_mask(ref.log, parse("kind:lookup")) is None
    # through the app's shared filter, hashes included (read from events built chunk by chunk)
    digest = next(e.block_hash for e in ref.log.events if e.kind == "block_stored").hex()[:6]
    for text in ("kind:evicted or block:2", f"hash:{digest}", f"hash:{digest} and kind:lookup"):
        masks = []
        for state in (col, ref):
            shared = EventFilter(state)
            shared.set_filter(text)
            masks.append(shared.match_mask().tolist())
        assert masks[0] == masks[1] and any(masks[1]), text


@pytest.mark.parametrize("name", ["tenants_c2", "evict_pool64_c1", "mooncake_conversation"])
def test_views_on_the_columnar_log_show_what_they_show_on_the_event_log(qtbot, tmp_path, name):
    from app.runtime.selection import EventFilter
    from app.ui.colors import block_colors
    from app.views.pool.block_details import describe_block
    from app.views.pool.block_table_view import compute_colors
    from app.views.pool.chain_layout import build_tree
    from app.views.pool.event_log_view import EventTableModel
    from app.views.pool.metrics_view import request_rows

    ref, col = _both(tmp_path, name)
    n = len(ref.log)
    colors = block_colors("light")
    for seq in (None, n // 3, 2):
        ref.scrub_to(seq)
        col.scrub_to(seq)
        a, b = col.projection, ref.projection
        for flash in (None, ref.flash_since_seq, 0):
            assert compute_colors(a, colors, flash).tolist() == compute_colors(b, colors, flash).tolist(), (seq, flash)
        names, cached, computed = a.request_columns()
        want = [r for r in b.request_records() if r.miss is not None]
        c2, p2, _ = request_rows(want)
        assert list(names) == [r.request_id for r in want] and cached.tolist() == c2.tolist()
        assert computed.tolist() == p2.tolist()
        for blk in range(0, a.num_blocks, 5):
            assert describe_block(a, blk) == describe_block(b, blk), (seq, blk)
        ta, tb = build_tree(a), build_tree(b)
        assert ta.positions == tb.positions and ta.groups == tb.groups
        assert a.recent_request_ids(40) == list(dict.fromkeys(reversed(b.order)))[:40]
    # the event log's rows under its boxes and the shared filter
    models = []
    for state in (col, ref):
        shared = EventFilter(state)
        models.append((EventTableModel(state, shared=shared), shared))
    rid = ref.log.events[n // 2].request_id if hasattr(ref.log.events[n // 2], "request_id") else "1"
    for kind, request, text, flt in (("", "", "", ""), ("block_evicted", "", "", ""), ("lookup", "", "", ""),
                                     ("", rid, "", ""), ("", "0", "", ""), ("", "", "to the free queue", ""),
                                     ("", "", "", "kind:stored"), ("blocks_allocated", "", "", "block<8"),
                                     ("", "", "hit", "kind:lookup")):
        for model, shared in models:
            shared.set_filter(flt)
            model.set_filter(kind, request, text)
        (got, _), (want, _) = models
        assert got.rows.tolist() == want.rows.tolist(), (kind, request, text, flt)
        shown = [r for r in (0, 1, got.rowCount() // 2, got.rowCount() - 1) if 0 <= r < got.rowCount()]
        for r in shown:  # every column but the time (the kernel's events carry the open's)
            assert [got.data(got.index(r, c)) for c in (0, 2, 3, 4)] == \
                [want.data(want.index(r, c)) for c in (0, 2, 3, 4)], (kind, request, text, flt, r)
    for model, _ in models:
        assert model.row_of_seq(n // 2) == models[1][0].row_of_seq(n // 2)


def test_the_timeline_reduction_keeps_each_bins_extremes_and_the_last_sample():
    import numpy as np

    from app.views.pool.timeline_view import peak_reduce

    rng = np.random.default_rng(7)
    x = np.arange(100_000, dtype=float)
    y = np.cumsum(rng.integers(-3, 4, len(x))).astype(float)
    xs, ys = peak_reduce(x, y, 0, x[-1], bins=500)
    assert len(xs) <= 2 * 500 + 2 and xs[-1] == x[-1] and ys[-1] == y[-1] and xs[0] == x[0]
    assert ys.max() == y.max() and ys.min() == y.min()  # no peak is lost
    assert np.all(np.diff(xs) >= 0)
    # a zoom to a part: the part is reduced, the ends of the whole stay for the auto range
    xs, ys = peak_reduce(x, y, 40_000, 41_000, bins=500)
    assert xs[0] == 0 and xs[-1] == x[-1] and len(xs) == 2 * 500 + 2
    body, part = ys[1:-1], y[39_999:41_002]  # the range and one sample either side
    assert xs[1] == 39_999 and body.max() == part.max() and body.min() == part.min()
    short = np.arange(10.0)
    assert peak_reduce(short, short, 0, 9)[0] is short


def test_a_live_engine_after_an_opened_trace_gets_an_event_log_again(tmp_path):
    from engine.core.live_log import LiveColumnarLog

    ref, col = _both(tmp_path, "demo_tokens")
    n = len(col.log)
    stale = ref.log.events[:3]
    col.apply_events(stale)  # a batch in flight from the engine before the trace: no log shown takes it
    assert len(col.log) == n and getattr(col.log, "columnar_log", False)
    with pytest.raises(TypeError, match="read-only"):
        col.log.extend(stale)
    col.set_engine({"block_size": 16, "num_blocks": 40})  # the chat's engine takes over
    assert isinstance(col.log, LiveColumnarLog) and len(col.log) == 0  # a live log, appended to
    col.apply_events(ref.log.events)
    assert [_strip(e) for e in col.log.events] == [_strip(e) for e in ref.log.events]
    assert _blocks(col.projection) == _blocks(ref.projection)
