"""The inspector's panes in the app: the Compare window (worker run, linked selection), the
Statistics pane with its filter bar, the Bookmarks pane stepped with keys, and the
`--event N` deep link, on real replays of the bundled traces."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402
import numpy as np  # noqa: E402

from app.runtime.context import make_test_context  # noqa: E402
from app.ui.filter_bar import FilterBar  # noqa: E402
from app.views.compare.compare_window import CompareWindow  # noqa: E402
from app.views.tools.bookmarks_view import BookmarksView, EventLink  # noqa: E402
from app.views.tools.statistics_view import StatisticsView  # noqa: E402
from engine.core.events import EventBus  # noqa: E402
from engine.core.replay import ReplayConfig, replay  # noqa: E402
from engine.core.trace import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "resources" / "traces" / "demo_tokens.jsonl"
MOONCAKE = ROOT / "resources" / "traces" / "mooncake_conversation_trace.jsonl"


@pytest.fixture
def ctx(qtbot, tmp_path):
    c = make_test_context(tmp_path)
    c.suppress_dialogs = True
    yield c
    c.shutdown()


def load_demo(ctx, capacity: int = 60) -> list:
    bus = EventBus()
    events: list = []
    bus.subscribe(events.append)
    replay(load_trace(DEMO), ReplayConfig(block_size=16, capacity_blocks=capacity, seed=0), bus)
    ctx.state.set_engine({"num_blocks": capacity, "block_size": 16})
    ctx.state.apply_events(events)
    return events


def test_compare_window_runs_on_the_worker_and_links_selection(qtbot, ctx):
    w = CompareWindow(ctx)
    qtbot.addWidget(w)
    w.set_sides(str(MOONCAKE), str(MOONCAKE), 16, 64)
    w.limit.setValue(300)
    with qtbot.waitSignal(w.sigCompared, timeout=120_000) as blocker:
        w.run_compare()
    doc = blocker.args[0].to_dict()
    assert ctx.errors == []
    assert doc["a"]["config"]["block_size"] == 16 and doc["b"]["config"]["block_size"] == 64
    assert w.table_a.rowCount() == w.table_b.rowCount() == 300
    assert w.metrics.item(4, 1).text() == f"{doc['a']['totals']['hit_rate']:.2%}"
    # the first differing request is picked in both tables and both plots
    first = next(i for i, r in enumerate(doc["requests"]) if r["cached_delta"])
    assert w.picked == first and w.lines[0].value() == first
    # picking in A picks in B (and the plots), and the other way round
    w.table_a.selectRow(7)
    assert w.picked == 7 and w.table_b.selectionModel().selectedRows()[0].row() == 7
    w.table_b.selectRow(11)
    assert w.picked == 11 and w.table_a.selectionModel().selectedRows()[0].row() == 11
    assert w.lines[1].value() == 11 and "request 11" in w.detail.text()
    header, rows = w._delta_table()
    assert len(rows) == 300 and "cached_delta" in header


def test_compare_window_says_what_is_missing(qtbot, ctx, tmp_path):
    w = CompareWindow(ctx)
    qtbot.addWidget(w)
    w.run_compare()
    assert ctx.errors[-1] == "Pick both runs to compare: A and B."
    w.set_sides(str(tmp_path / "nope.jsonl"), str(DEMO))
    with qtbot.waitSignal(ctx.worker.sigFailed, timeout=30_000):
        w.run_compare()
    qtbot.waitUntil(lambda: "no such file" in ctx.errors[-1], timeout=5_000)
    assert w.run_button.isEnabled()


def test_filter_bar_checks_as_you_type(qtbot, ctx):
    bar = FilterBar(ctx.settings)
    qtbot.addWidget(bar)
    bar.edit.setText("kind:evicted and tier")
    assert bar.error is not None and bar.message.isVisibleTo(bar)
    assert bar.message.text() == "at 22: expected an operator (: = != < <= > >=) after 'tier'"
    with qtbot.waitSignal(bar.sigFilterChanged, timeout=2_000) as got:
        bar.edit.setText("kind:evicted and tier:GPU")
    assert got.args[0].text == "kind:evicted and tier:GPU" and not bar.message.isVisibleTo(bar)
    assert bar.save_current() and bar.saved_filters() == ["kind:evicted and tier:GPU"]
    bar.set_text("tenant:bob")
    assert bar.filter.text == "tenant:bob"


def test_statistics_pane_on_a_replay_and_filtered(qtbot, ctx):
    events = load_demo(ctx)
    v = StatisticsView(ctx)
    qtbot.addWidget(v)
    with qtbot.waitSignal(v.sigComputed, timeout=30_000):
        v.refresh()
    from engine.analysis.statistics import compute

    expected = compute([e.to_dict() for e in events], block_size=16)
    assert v.stats.tables() == expected.tables()
    assert v.t_killers.rowCount() == len(expected.killers)
    assert v.t_groups.item(0, 0).text() in ("alice", "bob")
    with qtbot.waitSignal(v.sigComputed, timeout=30_000):
        v.filter_bar.set_text("tenant:bob")
    assert v.filter_bar.count.text().endswith(f"of {len(events):,}")
    assert [g.group for g in v.stats.hit_rates["tenant"]] == ["bob"]
    assert v.stats.to_csv("hit_rate_by_tenant").splitlines()[1].startswith("bob,")


def test_bookmarks_pane_steps_with_keys_and_scrubs(qtbot, ctx):
    events = load_demo(ctx)
    v = BookmarksView(ctx)
    qtbot.addWidget(v)
    v.show()
    v.activateWindow()
    qtbot.waitExposed(v)
    qtbot.waitUntil(v.isActiveWindow, timeout=3_000)
    evicted = next(e for e in events if e.kind == "block_evicted")
    v.add_event(5, "five")
    v.add_request("q81-t2", "bob again")
    v.add_event(evicted.seq, "first eviction")
    assert v.list.count() == 3 and "not a saved session" in v.where.text()
    v.current_id = None
    qtbot.keyClick(v, Qt.Key.Key_F2)
    assert ctx.state.current_seq == 5
    qtbot.keyClick(v, Qt.Key.Key_F2)
    started = next(e for e in events if e.kind == "request_started" and e.request_id == "q81-t2")
    assert ctx.state.current_seq == started.seq
    qtbot.keyClick(v, Qt.Key.Key_F2)
    assert ctx.state.current_seq == evicted.seq
    qtbot.keyClick(v, Qt.Key.Key_F2)  # wraps to the first
    assert ctx.state.current_seq == 5
    qtbot.keyClick(v, Qt.Key.Key_F2, Qt.KeyboardModifier.ShiftModifier)
    assert ctx.state.current_seq == evicted.seq
    ctx.state.scrub_to(40)
    qtbot.keyClick(v, Qt.Key.Key_B, Qt.KeyboardModifier.ControlModifier)
    assert v.bookmarks()[-1].event_seq == 40 and v.list.count() == 4
    v.note.setPlainText("why this matters")
    qtbot.waitUntil(lambda: v.bookmarks()[-1].note == "why this matters", timeout=3_000)


def test_bookmarks_of_a_saved_session_live_in_its_database(qtbot, tmp_path):
    from engine.store.bookmarks import Bookmarks
    from engine.store.database import Store
    from engine.store.sessions import import_file

    store = Store(tmp_path / "s.db")
    (sid,) = import_file(store, DEMO)
    c = make_test_context(tmp_path, store=store)
    c.suppress_dialogs = True
    try:
        v = BookmarksView(c)
        qtbot.addWidget(v)
        c.set_session(sid)
        v.add_event(3, "three")
        assert [b.event_seq for b in Bookmarks(store).list(sid)] == [3]
        assert "saved with it" in v.where.text()
    finally:
        c.shutdown()


def test_event_deep_link(qtbot, ctx):
    events = load_demo(ctx)
    link = EventLink(ctx, 42)
    qtbot.waitUntil(lambda: link.done, timeout=5_000)
    assert ctx.state.current_seq == 42 and not ctx.state.is_live
    bad = EventLink(ctx, 10**6)
    qtbot.waitUntil(lambda: bad.done, timeout=5_000)
    assert ctx.errors[-1] == f"There is no event 1000000 to open at: its events are 0 to {events[-1].seq}."


def test_gui_takes_the_deep_link_and_compare_arguments(capsys):
    from app.cli import build_parser

    args = build_parser().parse_args(["gui", "walk.cachescope.json", "--event", "12", "--compare", "a.jsonl", "b.jsonl"])
    assert args.event == 12 and args.compare == ["a.jsonl", "b.jsonl"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["gui", "x.jsonl", "--event", "-1"])
    assert "must be at least 0" in capsys.readouterr().err


def test_the_side_by_side_block_tables_are_the_main_block_tables_colours(qtbot, ctx):
    """After the comparison, picking a request shows each side's pool just after it; the
    main block table, scrubbed to the same event of the same replay, draws the same cells."""
    from app.views.pool.block_table_view import BlockTableView

    w = CompareWindow(ctx)
    qtbot.addWidget(w)
    w.set_sides(str(DEMO), str(DEMO), 16, 32)
    w.side_a.capacity.setValue(60 * 16)  # 60 blocks of 16 against 30 of 32: the same memory
    w.side_b.capacity.setValue(60 * 16)
    with qtbot.waitSignal(w.sigCompared, timeout=60_000):
        w.run_compare()
    c = w.comparison
    assert c.b.evicted_blocks > 0  # the small pool evicts, so the "just evicted" flash is checked too
    table = BlockTableView(ctx)
    qtbot.addWidget(table)
    for side, run, bs, blocks in (("a", c.a, 16, 60), ("b", c.b, 32, 30)):
        events: list = []
        bus = EventBus()
        bus.subscribe(events.append)
        replay(load_trace(DEMO), ReplayConfig(block_size=bs, capacity_blocks=blocks, seed=0), bus)
        ctx.state.set_engine({"num_blocks": blocks, "block_size": bs})
        ctx.state.apply_events(events)
        evicting = [e.by_request_id for e in events if e.kind == "block_evicted"]
        for position in (0, next(i for i, r in enumerate(run.requests) if r.id in evicting), len(run.requests) - 1):
            w.pick(position)
            grid = w.pools.a if side == "a" else w.pools.b
            rid = run.requests[position].id
            ctx.state.scrub_to(run.end_seqs[rid])
            table.redraw()
            assert grid.cell_colors.shape == (blocks, 4)
            assert np.array_equal(grid.cell_colors, table.cell_colors), (side, position)
            # the request's blocks outlined: those that still hold its prompt's hashes
            rec = ctx.state.projection.requests.get(rid)
            assert set(grid.outlined) <= {b for b in map(ctx.state.projection.block_of_hash, rec.block_hashes)
                                          if b is not None}
            assert all(grid.request_of_block(b) == rid for b in grid.outlined)
    # a click on a block of B's pool picks, in both, the request that last held it
    from PySide6.QtCore import QPointF

    w.pick(len(c.b.requests) - 1)
    grid = w.pools.b
    last = c.b.requests[-1].id
    block = next(b for b in range(grid.projection.num_blocks)
                 if grid.request_of_block(b) not in (None, last))
    earlier = grid.request_of_block(block)
    scene = grid.vb.mapViewToScene(QPointF(block % grid.cols + 0.5, block // grid.cols + 0.5))
    qtbot.mouseClick(grid.glw.viewport(), Qt.MouseButton.LeftButton, pos=grid.glw.mapFromScene(scene))
    want = next(i for i, r in enumerate(w.rows) if r["id_b"] == earlier)
    assert w.picked == want and w.table_a.selectionModel().selectedRows()[0].row() == want


def test_the_compare_window_draws_pools_and_costs_for_both_sides(qtbot, ctx):
    w = CompareWindow(ctx)
    qtbot.addWidget(w)
    w.set_sides(str(MOONCAKE), str(MOONCAKE), 16, 64)
    w.limit.setValue(30)
    with qtbot.waitSignal(w.sigCompared, timeout=120_000):
        w.run_compare()
    cost = w.cost
    assert cost["unknown"] == [] and len(cost["requests"]) == 30
    ys = w.cost_a.getData()[1]
    assert list(ys) == [r["cost_usd_a"] for r in cost["requests"]]
    labels = [w.metrics.item(i, 0).text() for i in range(w.metrics.rowCount())]
    row = labels.index("pool (tokens)")
    ta, tb = w.totals
    assert ta["pool_tokens"] == w.comparison.a.config["capacity_blocks"] * 16
    assert tb["pool_tokens"] == w.comparison.b.config["capacity_blocks"] * 64
    assert w.metrics.item(row, 1).text() == f"{ta['pool_tokens']:,}"
    # in use peaks while a request runs; shares of each pool, so they compare across sizes
    use_a, use_b = (np.asarray(d.getData()[1]) for d in (w.pool_a["in_use"], w.pool_b["in_use"]))
    assert len(use_a) == 30 and 0 < use_a.max() <= 1 and 0 < use_b.max() <= 1
    w.pick(3)
    assert "billed A $" in w.detail.text() and w.pools.a.projection is not None
    header, rows = w._delta_table()
    assert "cost_delta_usd" in header and len(rows) == 30


def test_two_fleet_servers_side_by_side(qtbot, ctx, tmp_path):
    from test_compare import recorded_fleet

    from engine.store.database import Store

    db = tmp_path / "fleet.db"
    run = recorded_fleet(db)
    ctx.store = Store(db)  # the window reads run:ID from the app's session database
    w = CompareWindow(ctx)
    qtbot.addWidget(w)
    w.set_sides(f"run:{run}@10.0.0.11:8000", f"run:{run}@10.0.0.13:8000")
    with qtbot.waitSignal(w.sigCompared, timeout=60_000):
        w.run_compare()
    assert ctx.errors == [] and w.rows == []
    assert w.tabs.currentWidget() is w.pools
    # .11 ends with A's first two blocks (it removed the last two), .13 with all four of C
    assert w.pools.a.projection.num_hashed == 2 and w.pools.b.projection.num_hashed == 4
    assert "A <b>2</b>, B <b>4</b>, both 2" in w.detail.text()
    w.set_sides(f"run:{run}@10.0.0.99:8000", f"run:{run}@10.0.0.13:8000")
    with qtbot.waitSignal(ctx.worker.sigFailed, timeout=30_000):
        w.run_compare()
    qtbot.waitUntil(lambda: bool(ctx.errors), timeout=5_000)
    assert "has no server '10.0.0.99:8000'" in ctx.errors[-1] and w.run_button.isEnabled()
    ctx.store.close()
