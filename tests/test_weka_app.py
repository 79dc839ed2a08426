"""The app opens a kv-cache-tester trace, a folder of them and a usage log: the Traces panel
shows models, sub-agents and per-request blocks held, the usage log's mismatches explained,
and the Billing panel plots observed and predicted cost per turn."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.runtime.context import make_test_context
from app.window.main_window import MainWindow
from engine.resources import resource_path

WEKA = resource_path("traces", "weka")
USAGE = Path(__file__).resolve().parent / "data" / "usage"


@pytest.fixture(scope="module")
def window(qapp, tmp_path_factory):
    ctx = make_test_context(tmp_path_factory.mktemp("weka"))
    w = MainWindow(ctx, load_model=False)
    w.show()
    yield w
    ctx.shutdown()
    w.close()
    w.deleteLater()
    qapp.processEvents()


def _open(qtbot, window, path, opener=None):
    done: list = []
    (opener or window.open_file)(path, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=120_000)
    # the folder's events reach the views in batches after the replay is done: at load 7
    # that took over 30 s (the timeouts only turn a hang into a failure; nothing is timed)
    qtbot.waitUntil(lambda: window.ctx.bridge.num_pending == 0, timeout=120_000)
    window.ctx.bridge.flush(everything=True)
    assert done[0] is not None, window.ctx.errors
    return done[0]


def test_a_weka_file_shows_models_subagents_and_held_blocks(qtbot, window):
    summary = _open(qtbot, window, WEKA / "trace_0287.json")
    view = window.panels["traces"]
    assert view.weka is summary
    assert view.summary.item(0, 0).text() == "trace_0287"
    assert (view.summary.item(0, 3).text(), view.summary.item(0, 4).text()) == ("95.5", "95.5")
    assert view.rows.rowCount() == 40
    streams = {view.rows.item(i, 3).text() for i in range(view.rows.rowCount())}
    assert "trace_0287/agent_001 (sub-agent)" in streams
    # the model filter: one row per request of that model only, both ways
    index = view.model_filter.findData("claude-haiku-4-5-20251001")
    with qtbot.waitSignal(view.sigFilterChanged) as sig:
        view.model_filter.setCurrentIndex(index)
    assert sig.args == ["claude-haiku-4-5-20251001"] and view.rows.rowCount() == 14
    view.model_filter.setCurrentIndex(0)
    assert view.rows.rowCount() == 40
    # the pool views got the replay's events: the block table holds 64-token blocks
    assert window.ctx.state.engine_info["block_size"] == 64 and len(window.ctx.state.log) > 0


def test_a_folder_is_six_concurrent_users_and_the_legend_stays_inside_the_plot(qtbot, window):
    summary = _open(qtbot, window, WEKA)  # six traces, five models
    view = window.panels["traces"]
    assert view.summary.rowCount() == 6 and summary["totals"]["requests"] == 641
    assert {view.model_filter.itemData(i) for i in range(1, view.model_filter.count())} >= {
        "claude-opus-4-6", "claude-haiku-4-5-20251001"}
    # the legend of the same opened folder (one replay of it, not a second open) at any width
    window.docks["traces"].show()
    window.docks["traces"].raise_()
    for width in (560, 900, 1400):
        view.resize(width, 700)
        qtbot.wait(50)
        vb = view.plot.plotItem.vb
        legend = view.legend
        assert len(legend.items) == 5
        right = legend.mapRectToScene(legend.boundingRect()).right()
        assert right <= vb.sceneBoundingRect().right() + 0.5, (width, legend.columnCount)


def test_a_usage_log_lists_mismatches_and_plots_cost_per_turn(qtbot, window):
    result = _open(qtbot, window, USAGE / "vllm_chat_usage.jsonl")
    view = window.panels["traces"]
    assert view.usage is result and view.rows.rowCount() == 9
    assert all(r["difference"] == 0 for r in result["requests"])  # the recorded server's block size and pool
    assert "edited history" in view.note.text() and "changed setting" in view.note.text()
    billing = window.panels["billing"]
    assert billing.usage is result
    xs, ys = billing.cost_lines["observed"].getData()
    assert len(xs) == 9 and list(ys) == [r["observed"]["weighted_tokens"] for r in result["requests"]]
    _, pred = billing.cost_lines["predicted"].getData()
    assert list(pred) == list(ys)


def test_a_broken_weka_file_is_one_dialog_sentence(qtbot, window, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "x", "block_size": 64, "hash_id_scope": "global", "requests": [{"t": 0}]}')
    window.ctx.errors.clear()
    assert not window.open_file(bad)
    assert len(window.ctx.errors) == 1 and "requests[0]" in window.ctx.errors[0]


def test_an_opened_trace_is_what_billing_and_sweep_show(qtbot, window, capsys):
    import json

    from app.cli import main

    def cli(*argv):
        capsys.readouterr()
        assert main([*argv, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    window.ctx.errors.clear()
    path = str(WEKA / "trace_0287.json")
    _open(qtbot, window, path)  # File > Open
    billing, sweep = window.panels["billing"], window.panels["sweep"]
    window.docks["billing"].show()
    window.docks["billing"].raise_()
    qtbot.waitUntil(lambda: billing.result is not None and billing.result["source"] == path, timeout=120_000)
    assert json.loads(json.dumps(billing.result)) == cli("billing", path)
    assert "Open a" not in billing.total_label.text()
    window.docks["sweep"].show()
    window.docks["sweep"].raise_()
    assert sweep.trace.text() == path and "trace_0287.json" in sweep.status.text()
    with qtbot.waitSignal(sweep.sigSweepDone, timeout=120_000) as sig:
        sweep.run_button.click()
    assert json.loads(json.dumps(sig.args[0])) == cli("sweep", path)
    # a token trace next: the Traces panel drops the kv-cache-tester summary and says why
    tokens = str(resource_path("traces", "demo_tokens.jsonl"))
    _open(qtbot, window, tokens)
    traces = window.panels["traces"]
    assert traces.weka is None and traces.rows.rowCount() == 0 and not traces.legend.items
    assert "not a kv-cache-tester trace" in traces.heading.text()
    assert sweep.result is None and sweep.trace.text() == tokens
    window.docks["billing"].raise_()
    qtbot.waitUntil(lambda: billing.result is not None and billing.result["source"] == tokens, timeout=120_000)
    assert json.loads(json.dumps(billing.result)) == cli("billing", tokens)
    assert window.ctx.errors == []


def test_a_usage_log_becomes_the_subject(qtbot, window):
    """An opened usage log is the window's subject, as a trace is: the title, the panels
    that follow the subject (Traces, Billing, Sweep), and an empty pool, not the last trace's."""
    from app.runtime.context import Subject

    ctx = window.ctx
    _open(qtbot, window, WEKA / "trace_0303.json")
    assert len(ctx.state.log) > 0
    log = USAGE / "openai_chat_pairs.jsonl"
    subjects: list = []
    ctx.sigSubjectChanged.connect(subjects.append)
    try:
        result = _open(qtbot, window, log)
    finally:
        ctx.sigSubjectChanged.disconnect(subjects.append)
    assert [(s.kind, s.title, s.source) for s in subjects] == [("usage", log.name, str(log))]
    assert ctx.subject == subjects[0] and window.windowTitle().startswith(log.name)
    assert ctx.state.engine_info["num_blocks"] == 0 and len(ctx.state.log) == 0  # the trace's pool is gone
    traces, billing, sweep = window.panels["traces"], window.panels["billing"], window.panels["sweep"]
    assert traces.usage is result and billing.usage is result and billing.source.text() == ""
    assert "usage log \u201copenai_chat_pairs.jsonl\u201d is not a trace to sweep" in sweep.status.text()
    assert sweep.trace.text() == ""
    assert str(log) in window.recent_files()
    # the log's comparison is dropped when another subject was opened before it was done
    done: list = []
    window.open_file(log, on_done=done.append)
    assert "Reading the usage log" in traces.heading.text()
    ctx.open_subject(Subject("session", "New session"))
    qtbot.waitUntil(lambda: bool(done), timeout=120_000)
    assert done == [None] and traces.usage is None and billing.usage is None
    assert ctx.subject.kind == "session" and ctx.errors == []
    # unsaved work the user keeps: the log is not opened
    ctx.mark_unsaved(True)
    ctx.answer_replace = False
    try:
        assert not window.open_file(log)
        assert ctx.subject.kind == "session"
    finally:
        ctx.answer_replace = None
        ctx.mark_unsaved(False)
