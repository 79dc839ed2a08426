"""The engine views, offscreen: what each shows after real engine events, both directions.

Events come from a real PrefixCacheManager (driven directly or by a trace replay) wired to
the app context's bus; `bridge.flush` delivers them the way the per-frame timer does.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from PySide6.QtCore import Qt

from app.runtime.context import engine_info, make_test_context
from app.views.pool.block_table_view import BlockTableView, compute_colors, grid_shape
from app.views.pool.event_log_view import EventLogView, request_of
from app.views.pool.hash_chain_view import HashChainView
from app.views.pool.kv_memory_view import KvMemoryView
from engine.model.kv_memory import kv_bytes
from app.views.pool.metrics_view import MetricsView
from app.views.pool.scrub_bar import ScrubBar
from app.views.pool.timeline_view import TimelineView
from engine.core.events import BlockEvicted
from engine.core.hashing import BlockHasher
from engine.core.manager import PrefixCacheManager, Request
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace


@pytest.fixture
def ctx(qtbot, tmp_path):
    context = make_test_context(tmp_path)
    yield context
    context.shutdown()


def make_engine(ctx, num_blocks=12, block_size=4):
    bus = ctx.new_event_bus(engine_info(block_size=block_size, num_blocks=num_blocks))
    events: list = []
    bus.subscribe(events.append)
    return PrefixCacheManager(num_blocks, block_size, BlockHasher(seed=0), bus), events


def deliver(ctx):
    ctx.bridge.flush(everything=True)


def write_trace(path, seed=0):
    """A token-level trace: two tenants, shared system prompts, growing conversations."""
    rng = random.Random(seed)
    lines = []
    for c in range(6):
        tenant = "acme" if c % 2 == 0 else "globex"
        system = [1000 + (c % 2)] * 8
        history = list(system)
        for turn in range(3):
            history += [rng.randrange(50, 500) for _ in range(rng.randrange(3, 9))]
            out = [rng.randrange(50, 500) for _ in range(4)]
            lines.append({"id": f"c{c}t{turn}", "tenant": tenant, "tokens": list(history), "output_tokens": out})
            history += out
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def replay_trace(ctx, tmp_path, capacity=40, block_size=4, concurrency=2):
    config = ReplayConfig(block_size=block_size, capacity_blocks=capacity, concurrency=concurrency)
    bus = ctx.new_event_bus(engine_info(block_size=block_size, num_blocks=capacity))
    events: list = []
    bus.subscribe(events.append)
    mgr = PrefixCacheManager(capacity, block_size, BlockHasher(seed=0), bus)
    result = replay(load_trace(write_trace(tmp_path / "trace.jsonl")), config, manager=mgr).to_dict()
    deliver(ctx)
    return mgr, events, result


def test_block_grid_colours_follow_the_pool(ctx, qtbot):
    view = BlockTableView(ctx)
    qtbot.addWidget(view)
    mgr, events = make_engine(ctx, num_blocks=12, block_size=4)
    c = view.colors
    mgr.allocate(Request("a", list(range(1, 14))))  # 3 full blocks + 1 partial: 4 blocks
    mgr.allocate(Request("b", list(range(1, 9)) + [99, 98, 97, 96, 95]))  # shares a's first 2 blocks
    mgr.allocate(Request("c", [7] * 9))
    mgr.finish("c")
    deliver(ctx)
    a, b = mgr.block_table("a"), mgr.block_table("b")
    assert view.color_of(a[0]) == c["ref2"] and view.color_of(a[1]) == c["ref2"]
    assert view.color_of(a[2]) == c["ref1"] and view.color_of(b[2]) == c["ref1"]
    snap = mgr.snapshot()
    cached_free = sorted((v.free_rank, v.block_id) for v in snap.blocks
                         if v.ref_count == 0 and v.block_hash is not None)
    assert len(cached_free) == 2  # c's two full blocks; its partial tail was never hashed
    # LRU age: the next to be evicted is drawn darkest, the one freed last brightest
    assert view.color_of(cached_free[0][1]) == c["cached_old"]
    assert view.color_of(cached_free[-1][1]) == c["cached_new"]
    empty = [v.block_id for v in snap.blocks if v.ref_count == 0 and v.block_hash is None]
    assert all(view.color_of(x) == c["empty"] for x in empty)
    assert "in use 6" in view.summary.text().replace("<b>", "").replace("</b>", "")

    # fill the pool: the LRU cached blocks are evicted and flash in this frame
    mgr.allocate(Request("d", [5] * 20))  # 5 blocks: the empty ones first, then the LRU cached one
    deliver(ctx)
    evicted = {e.block_id for e in events if isinstance(e, BlockEvicted)}
    assert evicted == {cached_free[0][1]}, "only the oldest cached block was needed"
    assert view.color_of(cached_free[0][1]) == c["evicted"]


def test_click_selects_the_chain_and_hover_explains(ctx, qtbot):
    view = BlockTableView(ctx)
    qtbot.addWidget(view)
    view.resize(700, 420)
    view.show()
    qtbot.waitExposed(view)
    mgr, _ = make_engine(ctx, num_blocks=24, block_size=4)
    mgr.allocate(Request("a", list(range(1, 18)), salt="acme"))
    deliver(ctx)
    table = mgr.block_table("a")
    target = table[3]
    # view to model: a real mouse click on the cell of block 3 of the chain
    scene_pt = view.vb.mapViewToScene(view.view_point_of(target))
    pos = view.glw.mapFromScene(scene_pt)
    qtbot.mouseClick(view.glw.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert view.selected_chain == list(table[:4])
    assert view.select_block(table[1]) == list(table[:2])
    tip = view.tooltip_for(target)
    digest = mgr.block(target).block_hash.hex()[:12]
    assert f"Block {target}" in tip and digest in tip and "ref count 1" in tip
    assert "tenant: acme" in tip and "13, 14, 15, 16" in tip  # token ids without a tokenizer
    # clicking empty space clears the selection
    qtbot.mouseClick(view.glw.viewport(), Qt.MouseButton.LeftButton,
                     pos=view.glw.mapFromScene(view.vb.mapViewToScene(view.view_point_of(23))))
    assert view.selected_chain == [23]
    view.select_block(None)
    assert view.selected_chain == []


def test_hash_tree_nodes_path_and_divergence(ctx, qtbot, tmp_path):
    view = HashChainView(ctx)
    qtbot.addWidget(view)
    mgr, events, result = replay_trace(ctx, tmp_path, capacity=200)
    view.refresh(force=True)
    assert view.tree.num_nodes == len(mgr.pool.blocks_by_hash)
    labels = {label for label, _ in view.tree.groups}
    assert {"tenant acme", "tenant globex"} <= labels
    last = result["requests"][-1]
    rec = ctx.state.projection.requests[last["id"]]
    assert view.path_record is rec
    assert view.divergence_block == last["cached_tokens"] // 4 == rec.num_hit_blocks
    assert view.path_hashes == [h for h in rec.block_hashes if h in mgr.pool.blocks_by_hash]
    assert len(view.tree.segments) < view.tree.num_nodes  # unary runs are collapsed
    # another request chosen in the box
    first = result["requests"][0]["id"]
    view.show_request(first)
    assert view.path_record.request_id == first and view.divergence_block == 0


def test_event_log_filters_and_scrubs_both_ways(ctx, qtbot, tmp_path):
    view = EventLogView(ctx)
    qtbot.addWidget(view)
    mgr, events, _ = replay_trace(ctx, tmp_path, capacity=24)
    assert len(view.model.rows) == len(events)
    n_evicted = sum(isinstance(e, BlockEvicted) for e in events)
    assert n_evicted > 0
    view.set_filter(kind="block_evicted")
    assert len(view.model.rows) == n_evicted
    assert all(view.model.event(r).kind == "block_evicted" for r in range(len(view.model.rows)))
    view.set_filter(request="c3t1")
    assert {request_of(view.model.event(r)) for r in range(len(view.model.rows))} == {"c3t1"}
    view.set_filter(text="new content")
    assert len(view.model.rows) > 0
    assert all("new content" in view.model.details(i) for i in view.model.rows)
    assert all(view.model.event(r).kind == "lookup" for r in range(len(view.model.rows)))
    view.set_filter()
    # view to model: selecting a row scrubs the pool to that event
    row = len(view.model.rows) // 2
    view.table.selectRow(row)
    seq = view.model.event(row).seq
    assert not ctx.state.is_live and ctx.state.current_seq == seq
    # model to view: scrubbing elsewhere selects that event's row
    ctx.state.scrub_to(events[10].seq)
    assert view.selected_event() == events[10]  # built from the live log's columns: equal, not the same object
    # new events while scrubbed are listed, and live follows again
    mgr.allocate(Request("late", [3, 3, 3, 3, 3]))
    deliver(ctx)
    assert view.model.event(len(view.model.rows) - 1).request_id == "late"
    ctx.state.scrub_to(None)
    assert ctx.state.is_live and ctx.state.current_seq == events[-1].seq


def test_scrubbing_restores_earlier_colours_then_live_returns(ctx, qtbot, tmp_path):
    grid = BlockTableView(ctx)
    bar = ScrubBar(ctx)
    qtbot.addWidget(grid)
    qtbot.addWidget(bar)
    grid.flash_seconds = 0  # live flashes would depend on how fast this test runs
    mgr, events = make_engine(ctx, num_blocks=8, block_size=2)
    mgr.allocate(Request("a", [1, 2, 3, 4, 5]))
    deliver(ctx)
    moment = events[-1].seq
    before = grid.cell_colors.copy()
    a_blocks = mgr.block_table("a")
    mgr.finish("a")
    mgr.allocate(Request("b", [9] * 12))
    deliver(ctx)
    after = grid.cell_colors.copy()
    assert not np.array_equal(before, after)
    # view to model: drag the slider back to the moment
    bar.slider.setValue(ctx.state.log.count_upto(moment) - 1)
    assert ctx.state.current_seq == moment and not ctx.state.is_live
    assert np.array_equal(grid.cell_colors[:, :3], before[:, :3])
    assert all(grid.color_of(b) == grid.colors["ref1"] for b in a_blocks)
    assert f"event {moment}:" in bar.label.text()  # the event's seq, as the log and the links name it
    assert not bar.live.isChecked()
    # Live returns to the present
    bar.live.click()
    assert ctx.state.is_live and bar.live.isChecked()
    assert np.array_equal(grid.cell_colors[:, :3], after[:, :3])
    # model to view: a scrub from code moves the slider
    ctx.state.scrub_to(events[3].seq)
    assert bar.slider.value() == 3
    bar.step(1)
    assert ctx.state.current_seq == events[4].seq


def test_timelines_match_the_projection(ctx, qtbot, tmp_path):
    view = TimelineView(ctx)
    qtbot.addWidget(view)
    mgr, events, result = replay_trace(ctx, tmp_path, capacity=24)
    view.refresh(force=True)
    x, used = view.c_used.xData, view.c_used.yData
    p = ctx.state.projection
    assert x[-1] == events[-1].seq and used[-1] == p.num_in_use == 0
    # the pool's 24 blocks fill up, so its size is the dashed line at the top of the view
    assert view.pool_size == 24 and view.pool_line.isVisible() and view.pool_line.value() == 24
    assert view.c_cached.yData.max() <= 24 <= view.p_blocks.vb.viewRange()[1][1]
    assert view.eviction_counts.sum() == result["totals"]["evicted_blocks"] > 0
    max_ref = view.c_ref.yData
    assert max_ref.max() == 2  # concurrency 2 over shared system prompts
    view.scrub_to_x(events[40].seq + 0.4)
    assert ctx.state.current_seq == events[40].seq
    assert all(line.value() == events[40].seq and line.isVisible() for line in view.cursors)


def test_metrics_show_reuse_and_timings(ctx, qtbot, tmp_path):
    view = MetricsView(ctx)
    qtbot.addWidget(view)
    _, _, result = replay_trace(ctx, tmp_path, capacity=200)
    rows = [r for r in result["requests"] if not r.get("refused")]
    assert list(view.cached_tokens) == [r["cached_tokens"] for r in rows]
    assert list(view.computed_tokens) == [r["computed_tokens"] for r in rows]
    assert view.hit_rates[-1] == pytest.approx(result["totals"]["hit_rate"], abs=1e-6)
    assert view.ttft_hint.isVisible()
    ctx.state.record_timing(rows[-1]["id"], 12.5, 40.0)
    assert not view.ttft_hint.isVisible()
    assert view.b_warm.opts["height"][0] == 12.5 and view.b_cold.opts["height"][0] == 40.0


def test_kv_memory_formula_and_what_if(ctx, qtbot):
    per_layer = [kv_bytes(1, 3, 64, 4, 16 * 64)] * 30
    ctx.new_event_bus(engine_info(block_size=16, num_blocks=64, model="SmolLM2-135M-Instruct", num_layers=30,
                                  num_kv_heads=3, head_dim=64, dtype="float32", per_layer_bytes=per_layer))
    view = KvMemoryView(ctx)
    qtbot.addWidget(view)
    assert not view.plot.isHidden() and len(view.bars.opts["height"]) == 30
    assert "✓ equals" in view.totals.text()
    assert "2 × 30 layers × 3 kv heads × 64 head dim × 4 bytes × 1,024 tokens" in view.totals.text()
    assert view.what_if_bytes == sum(per_layer)
    view.dtype_box.setCurrentText("float16")
    assert view.what_if_bytes == sum(per_layer) // 2
    view.tokens_box.setValue(2048)
    assert view.what_if_bytes == sum(per_layer)


@pytest.mark.model
def test_views_on_the_real_model(ctx, qtbot, default_model):
    """A chat on SmolLM2 reaches the views: decoded tokens in tooltips, measured KV bytes."""
    from engine.model.runner import ModelRunner

    runner = ModelRunner(default_model, num_blocks=32, block_size=16, seed=0)
    ctx.set_runner(runner)
    grid = BlockTableView(ctx)
    kv = KvMemoryView(ctx)
    qtbot.addWidget(grid)
    qtbot.addWidget(kv)
    messages = [{"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": "Name three colours of the rainbow."}]
    first = runner.chat(messages, max_new_tokens=8)
    second = runner.chat(messages, max_new_tokens=8)
    deliver(ctx)
    assert second.num_cached_tokens > 0
    p = ctx.state.projection
    assert p.snapshot().blocks == runner.manager.snapshot().blocks
    block = p.block_of_hash(p.requests[second.request_id].block_hashes[0])
    tip = grid.tooltip_for(block)
    assert "You are a terse assistant." in tip
    assert runner.tokenizer.decode(list(first.prompt_token_ids[:16])).replace("\n", "⏎") in tip
    measured = sum(runner.kv_pool.per_layer_bytes())
    assert measured == kv_bytes(default_model.num_layers, default_model.num_kv_heads,
                                     default_model.head_dim, 4, runner.manager.num_blocks * 16)
    assert "✓ equals" in kv.totals.text()


def test_colour_redraw_handles_a_large_pool(ctx, qtbot):
    """16K blocks in one image: colours come out per block (the speed is in the benchmark)."""
    mgr, _ = make_engine(ctx, num_blocks=16384, block_size=2)
    for i in range(200):
        mgr.allocate(Request(f"r{i}", [i % 7, i, i + 1, i + 2, 5]))
        if i % 3:
            mgr.finish(f"r{i}")
    view = BlockTableView(ctx)
    qtbot.addWidget(view)
    deliver(ctx)
    colors = compute_colors(ctx.state.projection, view.colors, None)
    assert colors.shape == (16384, 4)
    assert view._img.shape[0] * view._img.shape[1] >= 16384
    in_use = [v.block_id for v in mgr.snapshot().blocks if v.ref_count == 1]
    assert in_use and all(view.color_of(b) == view.colors["ref1"] for b in in_use[:50])


# ---------------------------------------------------------------------- dock sizes
def test_views_fit_docks_narrower_than_700_px(ctx, qtbot, tmp_path):
    """Summaries and legends wrap instead of widening a dock (no horizontal scroll bar)."""
    views = [cls(ctx) for cls in (BlockTableView, HashChainView, TimelineView, MetricsView, KvMemoryView, EventLogView)]
    for view in views:
        qtbot.addWidget(view)
    replay_trace(ctx, tmp_path, capacity=40)
    for view in views:
        view.resize(600, 300)
        view.show()
    qtbot.waitExposed(views[-1])
    for view in views:
        assert view.minimumSizeHint().width() <= 600, type(view).__name__
    assert views[4].plot.isHidden()  # a trace has no model pool: no empty axes
    grid = views[0]
    # the legend takes a second row when narrow rather than forcing its width
    assert grid.legend.heightForWidth(400) > grid.legend.heightForWidth(1400) > 0
    assert "in&nbsp;use,&nbsp;ref&nbsp;1" in grid.legend.text()


def test_block_grid_fits_its_area_with_square_cells(ctx, qtbot):
    assert grid_shape(96, aspect=860 / 380) == (16, 6)
    for n, aspect in ((16384, 2.0), (16384, 0.5), (1000, 1.0), (5, 3.0)):
        cols, rows = grid_shape(n, aspect)
        assert cols * rows >= n and (cols - 8) * rows < n or n <= 8
        assert cols % 8 == 0 or n <= 8
    wide, tall = grid_shape(16384, 3.0), grid_shape(16384, 0.5)
    assert wide[0] > tall[0] and wide[1] < tall[1]
    view = BlockTableView(ctx)
    qtbot.addWidget(view)
    mgr, _ = make_engine(ctx, num_blocks=96, block_size=4)
    mgr.allocate(Request("a", list(range(1, 30))))
    deliver(ctx)
    view.resize(860, 420)
    view.show()
    qtbot.waitExposed(view)
    qtbot.waitUntil(lambda: view.cols == 16)
    view.resize(300, 700)  # the dock turned tall and narrow: fewer columns, more rows
    qtbot.waitUntil(lambda: view.cols == 8)
    assert view.rows == 12 and view._img.shape[:2] == (12 * view.cell_px, 8 * view.cell_px)
    # cells stay square and the mapping of view points to blocks follows the new shape
    rect = view.vb.viewRect()
    px_w, px_h = view.vb.width() / rect.width(), view.vb.height() / rect.height()
    assert abs(px_w - px_h) < 0.5
    assert all(view.block_at(view.view_point_of(b).x(), view.view_point_of(b).y()) == b for b in (0, 9, 95))
    assert view.color_of(mgr.block_table("a")[0]) == view.colors["ref1"]


def test_timeline_rows_step_out_when_the_dock_is_short(ctx, qtbot, tmp_path):
    view = TimelineView(ctx)
    qtbot.addWidget(view)
    mgr, events, result = replay_trace(ctx, tmp_path, capacity=200)  # big pool: no evictions
    view.resize(690, 300)
    view.show()
    qtbot.waitExposed(view)
    qtbot.waitUntil(lambda: view.glw.shown == [True, True, True, True])
    bottom = [p.getAxis("bottom") for p in view.plots]
    assert [a.style["showValues"] for a in bottom] == [False, False, False, True]  # one shared x axis
    # counts start at 0 with whole-number ticks; no evictions is a 0..1 range and a hint
    assert view.p_evict.vb.viewRange()[1][0] == 0 and view.p_evict.vb.viewRange()[1][1] < 1.5
    assert view.no_evictions.isVisible() and result["totals"]["evicted_blocks"] == 0
    lo, hi = view.p_ref.vb.viewRange()[1]
    assert lo == 0 and hi >= view.c_ref.yData.max()
    for plot in view.plots:
        (_, ticks), = plot.getAxis("left").tickValues(*plot.vb.viewRange()[1], 60)
        assert ticks and all(float(t).is_integer() for t in ticks) and 0 in ticks
    view.resize(690, 190)  # too short for four rows: max ref steps out, evictions stay
    qtbot.waitUntil(lambda: len(view.glw.shown) == 4 and not view.glw.shown[2])
    assert view.glw.shown[0] and view.glw.shown[3]
    assert not view.p_ref.isVisible() and view.p_evict.isVisible()
    assert "evicted" in view.headers[3].text and "max&nbsp;ref" in view.title.text()  # still in the summary


def test_metrics_number_requests_with_whole_ticks(ctx, qtbot, tmp_path):
    view = MetricsView(ctx)
    qtbot.addWidget(view)
    _, _, result = replay_trace(ctx, tmp_path, capacity=200)
    n = len([r for r in result["requests"] if not r.get("refused")])
    view.resize(690, 300)
    view.show()
    qtbot.waitExposed(view)
    assert list(view.b_cached.opts["x"]) == list(range(1, n + 1))
    x_axis = view.p_ttft.getAxis("bottom")
    (_, ticks), = x_axis.tickValues(*view.p_ttft.vb.viewRange()[0], 600)
    assert ticks and all(float(t).is_integer() for t in ticks)
    # the ticks name requests as the log, the chat and the JSON do, not by position
    served = [r["id"] for r in result["requests"] if not r.get("refused")]
    assert x_axis.tickStrings([1.0, float(n)], 1.0, 1.0) == [served[0], served[-1]]
    # all three plots share the request axis, the TTFT one too (no empty -400..400 range)
    assert view.p_ttft.vb.viewRange()[0] == view.p_rate.vb.viewRange()[0]
    # with no timings the TTFT row steps out first when the dock is short
    view.resize(690, 190)
    qtbot.waitUntil(lambda: view.glw.shown == [True, True, False])
    assert "reused" in view.summary.text() and "computed" in view.summary.text()


@pytest.mark.parametrize("preset", ["llama-3.1-70b", "deepseek-v3"])
def test_kv_memory_what_if_presets_match_the_kv_memory_command(ctx, qtbot, preset):
    from engine.model.kv_memory import PRESETS, kv_memory_report

    view = KvMemoryView(ctx)
    qtbot.addWidget(view)
    view.preset_box.setCurrentIndex(view.preset_box.findData(preset))
    view.dtype_box.setCurrentText("bfloat16" if view.dtype_box.findText("bfloat16") >= 0 else "float16")
    view.tokens_box.setValue(4096)
    expected = kv_memory_report(PRESETS[preset], 4096, "bf16")["total_bytes"]
    assert view.what_if_bytes == expected
