"""Readable at any scale (issue 12, part B): sweeps with refusals, ticks that never collide,
the hash chain view at Mooncake scale, the block details pane, exports and the glossary."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetrics, QImage

from app.cli import main
from app.runtime.context import engine_info, make_test_context
from app.ui.export import export_plot, export_table, model_table
from app.dialogs.glossary import GLOSSARY, GlossaryDialog, glossary_html
from app.views.pool.block_details import BlockDetailsView, describe_block
from app.views.pool.block_table_view import BlockTableView
from app.views.pool.hash_chain_view import MAX_LABELS, HashChainView
from app.views.tools.sweep_view import SweepView
from app.ui.plots import CountAxis
from app.views.pool.timeline_view import TimelineView
from engine.analysis.sweep import sweep
from engine.core.hashing import BlockHasher
from engine.core.manager import PrefixCacheManager, Request
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "resources" / "traces" / "mooncake_conversation_trace.jsonl"


@pytest.fixture
def ctx(qtbot, tmp_path):
    context = make_test_context(tmp_path)
    yield context
    context.shutdown()


@pytest.fixture(scope="module")
def mooncake_2000():
    return load_trace(MOONCAKE)[:2000]


def open_mooncake(ctx, reqs, capacity=4096):
    bus = ctx.new_event_bus(engine_info(block_size=512, num_blocks=capacity))
    result = replay(reqs, ReplayConfig(block_size=512, capacity_blocks=capacity, seed=0), events=bus)
    ctx.bridge.flush(everything=True)
    return result


# ---- sweeps: refused requests stay in the denominator ---------------------------------------

def test_capacity_curve_counts_refusals_as_misses(mooncake_2000):
    out = sweep(mooncake_2000, capacities=[64, 128, 256, 1024, 4096])
    cap = [p for p in out["points"] if p["series"] == "capacity"]
    total = sum(r.input_length for r in mooncake_2000)
    # every point asks for the same prompt tokens: a refused request no longer leaves the denominator
    assert all(p["prompt_tokens"] == total for p in cap)
    assert cap[0]["refused_requests"] > 0 and cap[0]["refused_tokens"] > 0 and cap[-1]["refused_requests"] == 0
    rates = [p["hit_rate"] for p in cap]
    assert rates == sorted(rates), rates  # a bigger pool never looks worse
    # served-only is the old, misleading figure: it is higher where requests were refused
    assert cap[0]["served_hit_rate"] > cap[0]["hit_rate"]
    assert cap[0]["hit_rate"] == pytest.approx(cap[0]["cached_tokens"] / total, abs=1e-6)


def test_sweep_json_says_the_same(tmp_path, capsys):
    trace = tmp_path / "small.jsonl"
    trace.write_text("".join(json.dumps({"id": f"r{i}", "tokens": list(range(i, i + 64 * (1 + i % 3)))}) + "\n"
                             for i in range(6)))
    assert main(["sweep", str(trace), "--block-sizes", "16", "--capacities", "4,64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    small = next(p for p in out["points"] if p["series"] == "capacity" and p["capacity_blocks"] == 4)
    assert small["refused_requests"] > 0
    assert small["prompt_tokens"] == sum(64 * (1 + i % 3) for i in range(6))
    assert {"served_hit_rate", "refused_tokens"} <= set(small)


def test_sweep_view_plots_refusals_and_says_why_block_size_is_fixed(qtbot, ctx, mooncake_2000):
    view = SweepView(ctx)
    qtbot.addWidget(view)
    result = sweep(mooncake_2000[:600], capacities=[16, 64, 1024])
    result["kind"] = "mooncake"
    view.show_result(result)
    refused = view.curve_refused.getData()[1]
    assert refused[0] > 0 and refused[-1] == 0
    assert list(view.curve_cap.getData()[1]) == pytest.approx([100 * p["hit_rate"] for p in result["points"]])
    # the empty block-size axis steps aside; the capacity plot says why the size is fixed
    assert view.plot_bs.isHidden() and "512" in view.bs_note.textItem.toPlainText()
    assert "fixed by the trace" in view.plot_cap.plotItem.titleLabel.text
    assert "refused" in view.status.text()


# ---- ticks ---------------------------------------------------------------------------------

@pytest.mark.parametrize("lo, hi, width", [(0, 486_000, 300), (0, 486_000, 640), (0, 12_031, 180),
                                           (0, 1_000_000, 900), (0, 40, 120)])
def test_bottom_ticks_never_overlap(qtbot, lo, hi, width):
    axis = CountAxis("bottom")
    (step, values), = axis.tickValues(lo, hi, width)
    texts = axis.tickStrings(values, 1.0, step)
    assert len(values) >= 2
    fm = QFontMetrics(axis.style.get("tickFont") or axis.font())
    px = [(v - lo) / (hi - lo) * width for v in values]
    half = [fm.horizontalAdvance(t) / 2 for t in texts]
    for i in range(len(values) - 1):
        assert px[i + 1] - px[i] >= half[i] + half[i + 1] + 4, (texts[i], texts[i + 1])


def test_left_ticks_leave_a_line_per_label(qtbot):
    axis = CountAxis("left")
    (step, values), = axis.tickValues(0, 16384, 60)
    fm = QFontMetrics(axis.style.get("tickFont") or axis.font())
    assert step / 16384 * 60 >= fm.height()


def test_blocks_timeline_scales_to_the_data_not_the_pool(ctx, qtbot):
    view = TimelineView(ctx)
    qtbot.addWidget(view)
    bus = ctx.new_event_bus(engine_info(block_size=4, num_blocks=4096))
    mgr = PrefixCacheManager(4096, 4, BlockHasher(seed=0), bus)
    mgr.allocate(Request("a", list(range(40))))
    mgr.finish("a")
    mgr.allocate(Request("b", list(range(20))))
    ctx.bridge.flush(everything=True)
    view.refresh(force=True)
    top = view.p_blocks.vb.viewRange()[1][1]
    assert 10 <= top < 100  # 10 blocks hold data in a pool of 4,096
    assert not view.pool_line.isVisible() and "4,096" in view.pool_label.textItem.toPlainText()
    assert view.p_used.vb.viewRange()[1][1] < 20  # in-use gets its own scale


# ---- the hash chain view at trace scale ----------------------------------------------------

def test_hash_chains_at_trace_scale_draw_few_labels_that_never_overlap(ctx, qtbot, mooncake_2000):
    view = HashChainView(ctx)
    qtbot.addWidget(view)
    view.resize(1000, 560)
    view.show()
    qtbot.waitExposed(view)
    open_mooncake(ctx, mooncake_2000)
    view.refresh(force=True)
    view.layout_labels()
    assert len(view.tree.segments) > MAX_LABELS  # more runs than labels
    runs = [t for t in view.label_texts if t.endswith("blocks")]
    assert 0 < len(runs) <= MAX_LABELS < len(view._runs)  # runs that would collide go unlabelled
    rects = view.label_rects
    assert all(not a.intersects(b) for i, a in enumerate(rects) for b in rects[i + 1:])
    # the chosen request's path is still drawn, over the tree
    assert view.path_record is not None and view.path_hashes
    assert view.path_new.zValue() > view.edges.zValue()
    # zooming in shows labels for shorter runs, still without overlap
    view.zoom_to_path()
    view.layout_labels()
    zoomed = view.label_rects
    assert all(not a.intersects(b) for i, a in enumerate(zoomed) for b in zoomed[i + 1:])


def test_only_this_request_and_search(ctx, qtbot, mooncake_2000):
    view = HashChainView(ctx)
    qtbot.addWidget(view)
    open_mooncake(ctx, mooncake_2000)
    view.refresh(force=True)
    everything = view.tree.num_nodes
    rec = view.path_record
    view.only_box.setChecked(True)
    assert view.tree.num_nodes == len(view.path_hashes) < everything
    assert set(view.tree.positions) <= set(rec.block_hashes)
    view.only_box.setChecked(False)
    assert view.tree.num_nodes == everything
    target = view.path_hashes[0]
    seen = []
    ctx.selection.sigBlockSelected.connect(seen.append)
    assert view.find(target.hex()[:10]) == [target]
    assert seen[-1] == ctx.state.projection.block_of_hash(target)
    assert view.find("no such thing") == [] and "no cached block matches" in view.summary.text()


# ---- block details -------------------------------------------------------------------------

def test_clicking_a_block_shows_its_details(ctx, qtbot):
    table = BlockTableView(ctx)
    details = BlockDetailsView(ctx)
    qtbot.addWidget(table)
    qtbot.addWidget(details)
    bus = ctx.new_event_bus(engine_info(block_size=4, num_blocks=16))
    mgr = PrefixCacheManager(16, 4, BlockHasher(seed=0), bus)
    mgr.allocate(Request("a", list(range(1, 14))))
    mgr.allocate(Request("b", list(range(1, 9)) + [99, 98, 97, 96, 95]))
    ctx.bridge.flush(everything=True)
    table.resize(500, 400)
    table.show()
    details.show()
    qtbot.waitExposed(table)
    block = mgr.block_table("a")[1]  # shared by a and b: ref count 2
    scene = table.vb.mapViewToScene(table.view_point_of(block))
    qtbot.mouseClick(table.glw.viewport(), Qt.MouseButton.LeftButton, pos=table.glw.mapFromScene(scene))
    qtbot.waitUntil(lambda: details.block_id == block)
    info = ctx.state.projection.block_info(block)
    d = details.description
    assert d.block_hash == info.block_hash.hex() and d.ref_count == 2
    assert set(d.requests) == {"a", "b"} and d.parent_hash == info.parent_hash.hex()
    shown = details.text.text()
    assert info.block_hash.hex()[:16] in shown and "ref count" in shown
    mgr.finish("a")
    mgr.finish("b")
    ctx.bridge.flush(everything=True)
    free = describe_block(ctx.state.projection, block)
    assert free.ref_count == 0 and free.lru_position is not None


# ---- exports and the glossary ----------------------------------------------------------------

def test_exports_write_valid_png_svg_and_csv(ctx, qtbot, tmp_path, mooncake_2000):
    view = HashChainView(ctx)
    qtbot.addWidget(view)
    view.resize(800, 500)
    view.show()
    qtbot.waitExposed(view)
    open_mooncake(ctx, mooncake_2000[:300])
    view.refresh(force=True)
    png = export_plot(view.plot, tmp_path / "chains.png")
    img = QImage(str(png))
    assert not img.isNull() and img.width() > 100
    svg = export_plot(view.plot, tmp_path / "chains.svg")
    assert ET.parse(svg).getroot().tag.endswith("svg")
    path = export_table(view.runs_table(), tmp_path / "runs.csv")
    rows = list(csv.reader(path.open(encoding="utf-8")))
    assert rows[0][:3] == ["first_position", "last_position", "num_blocks"]
    assert len(rows) - 1 == len(view.tree.segments)
    assert sum(int(r[2]) for r in rows[1:]) == view.tree.num_nodes
    with pytest.raises(ValueError, match="png or .svg"):
        export_plot(view.plot, tmp_path / "chains.jpg")


def test_table_model_export(ctx, qtbot, tmp_path):
    from PySide6.QtWidgets import QTableWidget, QTableWidgetItem

    table = QTableWidget(2, 2)
    qtbot.addWidget(table)
    table.setHorizontalHeaderLabels(["id", "cost, $"])
    for r in range(2):
        for c in range(2):
            table.setItem(r, c, QTableWidgetItem(f"{r},{c}"))
    path = export_table(model_table(table.model()), tmp_path / "t.csv")
    assert list(csv.reader(path.open(encoding="utf-8"))) == [["id", "cost, $"], ["0,0", "0,1"], ["1,0", "1,1"]]


def test_glossary_covers_the_words_the_views_use(qtbot):
    terms = {t for t, _ in GLOSSARY}
    for word in ("block", "block hash", "hash chain", "ref count", "LRU", "eviction", "prefix hit",
                 "partial block", "salt / tenant", "TTFT"):
        assert word in terms
    dlg = GlossaryDialog()
    qtbot.addWidget(dlg)
    dlg.filter.setText("evict")
    assert "eviction" in dlg.text.text() and "TTFT" not in dlg.text.text()
    assert "No entry" in glossary_html("zzzz")


def test_help_menu_opens_the_glossary(qtbot, tmp_path):
    from app.window.main_window import MainWindow

    context = make_test_context(tmp_path)
    window = MainWindow(context, load_model=False)
    qtbot.addWidget(window)
    try:
        assert window.act_glossary in window.menuBar().actions()[-1].menu().actions()
        window.act_glossary.trigger()
        dlg = window.findChild(GlossaryDialog)
        assert dlg is not None and dlg.isVisible()
        assert "block_details" in window.docks
    finally:
        context.shutdown()



@pytest.mark.parametrize("width", [620, 1260])
def test_billing_and_sweep_show_whole_labels_in_a_laptop_dock(ctx, qtbot, width):
    from PySide6.QtWidgets import QLabel

    from app.views.tools.billing_view import BillingView

    for cls in (BillingView, SweepView):
        view = cls(ctx)
        qtbot.addWidget(view)
        view.resize(width, 420)
        view.show()
        qtbot.waitExposed(view)
        qtbot.wait(20)
        assert view.minimumSizeHint().width() <= width, cls.__name__
        for label in view.findChildren(QLabel):
            if label.isVisible() and not label.wordWrap() and label.text():
                assert label.width() >= label.sizeHint().width(), (cls.__name__, label.text())
    field = view.block_sizes  # the sweep's list fields show their whole default text
    assert field.width() >= QFontMetrics(field.font()).horizontalAdvance(field.text())


def test_every_engine_view_exports_its_table(ctx, qtbot, tmp_path, mooncake_2000):
    from app.views.pool.kv_memory_view import KvMemoryView
    from app.views.pool.metrics_view import MetricsView

    table, timeline, metrics, kv = BlockTableView(ctx), TimelineView(ctx), MetricsView(ctx), KvMemoryView(ctx)
    for view in (table, timeline, metrics, kv):
        qtbot.addWidget(view)
    open_mooncake(ctx, mooncake_2000[:200], capacity=512)
    p = ctx.state.projection
    blocks = list(csv.reader(export_table(table.blocks_table(), tmp_path / "b.csv").open(encoding="utf-8")))
    assert len(blocks) - 1 == p.num_blocks
    assert sum(r[1] == "cached, free" for r in blocks[1:]) == p.num_cached_free
    series = list(csv.reader(export_table(timeline.series_table(), tmp_path / "s.csv").open(encoding="utf-8")))
    assert len(series) - 1 == len(ctx.state.log.series.seq)
    reqs = list(csv.reader(export_table(metrics.requests_table(), tmp_path / "r.csv").open(encoding="utf-8")))
    assert len(reqs) - 1 == len([r for r in p.request_records() if r.miss is not None])
    for view in (table, timeline, metrics, kv):
        assert view.export.menu().actions() and view.actions()  # the button's menu is the right-click menu too
