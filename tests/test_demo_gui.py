"""The Demos menu runs a demo on the worker and every view follows its engine's events."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("pytestqt")

from app.demos.runner import install_demos  # noqa: E402
from engine.demos import DEMOS, get_demo  # noqa: E402

DEMO_TIMEOUT_MS = 300_000  # a shared, busy test machine; the demo itself takes seconds


def _action(win, name):
    title = get_demo(name).title
    return next(a for a in win.demos_menu.actions() if a.text() == title)


def test_menu_lists_every_demo(window, default_model):
    install_demos(window, model=default_model)
    titles = [a.text() for a in window.demos_menu.actions()]
    assert titles == [d.title for d in DEMOS]
    assert all(a.statusTip() for a in window.demos_menu.actions())
    assert "demo_guide" in window.docks


def test_eviction_demo_from_menu_reaches_the_views(qtbot, window, default_model):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # shared cores: see tests/test_demos.py
    try:
        runner = install_demos(window, model=default_model)
        state = window.ctx.state
        with qtbot.waitSignal(runner.sigFinished, timeout=DEMO_TIMEOUT_MS) as blocker:
            _action(window, "eviction-under-pressure").trigger()
            assert runner.running == "eviction-under-pressure"
    finally:
        torch.set_num_threads(threads)
    result = blocker.args[0]
    findings = result["findings"]
    qtbot.waitUntil(lambda: window.ctx.bridge.num_pending == 0)
    # The views were reset to the demo's small pool and received all of its events.
    assert state.engine_info["num_blocks"] == findings["num_blocks"]
    kinds = Counter(e.kind for e in state.log.events)
    assert kinds == Counter(result["events"])
    records = {r.request_id: r for r in state.projection.request_records()}
    again = records["doc-A-again"]
    assert again.miss.reason == "evicted" and again.miss.evicted_by_seq == findings["A_again"]["evicted_by_seq"]
    assert state.projection.counters.num_evicted_blocks == kinds["block_evicted"] >= 1
    assert set(state.timings) == {"doc-A", "doc-B", "doc-C", "doc-A-again"}
    # The guide explains what was shown, and the block table drew the new state.
    assert result["title"] in runner.guide.browser.toPlainText()
    grid = window.panels.get("block_table")
    if grid is not None:
        qtbot.waitUntil(lambda: grid._drawn_version == state.version)
        assert grid.cell_colors.shape[0] == findings["num_blocks"]
    assert window.ctx.errors == []


def test_second_demo_while_one_runs_is_refused(qtbot, window, default_model):
    runner = install_demos(window, model=default_model)
    with qtbot.waitSignal(runner.sigFinished, timeout=DEMO_TIMEOUT_MS):
        assert runner.run("prompt-caching-bill")
        assert not runner.run("tenant-salt")
    assert window.ctx.errors and "still running" in window.ctx.errors[0]
    assert not runner.run("no-such-demo")
    assert "no demo called" in window.ctx.errors[-1]
