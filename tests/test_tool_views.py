"""Diff, Billing and Sweeps panels offscreen: model to view and view to model, on real data;
Billing and Sweep follow the subject (an opened trace is billed as `cachescope billing` bills
it and offered to sweep as `cachescope sweep` sweeps it; another subject clears them); a
bill of a whole trace shows every row and stops at Cancel (the panel's or the window's)."""

from __future__ import annotations

import csv
import json
import threading
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import Qt  # noqa: E402

from app.cli import main  # noqa: E402
from app.ui.export import export_table, model_table  # noqa: E402
from app.runtime.context import Subject, make_test_context  # noqa: E402
from app.views.tools.billing_view import COLUMNS, BillingView, saving_words  # noqa: E402
from app.views.tools.diff_view import DiffView  # noqa: E402
from app.views.tools.sweep_view import SweepView  # noqa: E402
from engine.resources import resource_path  # noqa: E402

WEKA = resource_path("traces", "weka")
USAGE = Path(__file__).resolve().parent / "data" / "usage"

TIMEOUT = 60_000  # the first job may load the tokenizer


@pytest.fixture
def ctx(qtbot, tmp_path):
    c = make_test_context(tmp_path)
    yield c
    c.shutdown()


def test_diff_view_both_directions(qtbot, ctx, default_tokenizer, tmp_path):
    view = DiffView(ctx, tokenizer=default_tokenizer)
    qtbot.addWidget(view)
    # model -> view
    with qtbot.waitSignal(view.sigDiffDone, timeout=TIMEOUT) as sig:
        view.set_texts("Current time: 2025-05-17 10:31:07. Summarise the report.",
                       "Current time: 2025-05-17 10:32:44. Summarise the report.")
    result = sig.args[0]
    assert result.cause == "timestamp_or_id"
    assert "timestamp or id" in view.cause_label.text()
    assert view.strip_a.num_tokens == result.a["num_tokens"]
    assert view.strip_a.count("cached") == result.first_divergent_token
    # view -> model: typing in B re-runs the diff (debounced) with the new text
    with qtbot.waitSignal(view.sigDiffDone, timeout=TIMEOUT) as sig:
        view.edit_b.setPlainText("Current time: 2025-05-17 10:31:07. Summarise the report.\n")
    assert sig.args[0].cause == "whitespace"
    # view -> model: the block size box changes the matching block count
    d = view.result.first_divergent_token
    with qtbot.waitSignal(view.sigDiffDone, timeout=TIMEOUT) as sig:
        view.block_size.setValue(4)
    assert sig.args[0].matching_blocks == d // 4
    # view -> model: a tenant salt
    with qtbot.waitSignal(view.sigDiffDone, timeout=TIMEOUT) as sig:
        view.salt_b.setText("globex")
    assert sig.args[0].cause == "tenant_salt" and view.strip_b.count("cached") == 0
    view.grab().save(str(tmp_path / "diff.png"))
    assert (tmp_path / "diff.png").stat().st_size > 1000


def test_diff_view_json_messages(qtbot, ctx, default_tokenizer):
    view = DiffView(ctx, tokenizer=default_tokenizer)
    qtbot.addWidget(view)
    a = json.dumps([{"role": "user", "content": "Hi"}])
    b = json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})
    with qtbot.waitSignal(view.sigDiffDone, timeout=TIMEOUT) as sig:
        view.set_texts(a, b)
    assert sig.args[0].cause == "default_system_prompt"


@pytest.fixture
def hand_trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    lines = [{"tokens": list(range(1, 1501)), "timestamp": 0},
             {"tokens": list(range(1, 1501)) + [5, 6, 7], "timestamp": 1000}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_billing_view_both_directions(qtbot, ctx, hand_trace, tmp_path):
    view = BillingView(ctx)
    qtbot.addWidget(view)
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT) as sig:
        view.set_source(str(hand_trace))
    result = sig.args[0]
    assert [r["read_tokens"] for r in result["requests"]] == [0, 1500]
    assert view.table_model.rowCount() == 2
    assert view.table_model.index(1, 3).data() == "1500"  # the read column
    assert "$0.0" in view.total_label.text() and "saves" in view.total_label.text()
    heights = view.bars["read"].opts["height"]
    assert list(heights) == [0, 1500]
    assert list(view.bars["write"].opts["height"]) == [1500, 3]
    # view -> model: switching provider re-bills under OpenAI's older rules (0.5x reads, 128 steps)
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT) as sig:
        view.provider.setCurrentText("openai-legacy")
    result = sig.args[0]
    assert result["provider"] == "openai-legacy" and result["model"] == "gpt-4o"
    assert result["requests"][1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 1024 + 3 * 128
    assert not view.breakpoints.isEnabled()
    # view -> model: a 4096-token minimum leaves the 1503-token prompt uncached, with a note
    view.provider.setCurrentText("anthropic")
    qtbot.waitUntil(lambda: view.result["provider"] == "anthropic", timeout=TIMEOUT)
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT) as sig:
        view.model.setCurrentText("claude-haiku-4-5")
    rows = sig.args[0]["requests"]
    assert all(r["read_tokens"] == 0 and r["write_tokens"] == 0 for r in rows)
    assert "below the 4096-token minimum" in view.table_model.index(0, 8).data()


def test_billing_view_reports_bad_source(qtbot, ctx, tmp_path):
    view = BillingView(ctx)
    qtbot.addWidget(view)
    view.set_source(str(tmp_path / "missing.json"))
    qtbot.waitUntil(lambda: bool(ctx.errors), timeout=TIMEOUT)
    assert "no such file" in ctx.errors[-1]


def test_sweep_view_both_directions(qtbot, ctx, tmp_path):
    a = list(range(1000, 1100))
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"tokens": a}) + "\n" + json.dumps({"tokens": a[:70] + list(range(9, 39))}) + "\n")
    view = SweepView(ctx)
    qtbot.addWidget(view)
    # view -> model: the fields drive the sweep
    view.set_trace(str(path))
    view.block_sizes.setText("1,16,128")
    view.capacities.setText("7,64")
    with qtbot.waitSignal(view.sigSweepDone, timeout=TIMEOUT) as sig:
        view.run_button.click()
    result = sig.args[0]
    x, y = view.curve_bs.getData()
    assert list(x) == [0.0, 4.0, 7.0]
    assert list(y) == pytest.approx([100 * 70 / 200, 100 * 64 / 200, 0.0])  # in %
    assert len(view.curve_cap.getData()[0]) == 2
    # model -> view: a result given directly is drawn
    result["points"] = [p for p in result["points"] if p["series"] == "capacity"]
    view.show_result(result)
    assert view.curve_bs.getData()[0] is None or len(view.curve_bs.getData()[0]) == 0
    assert "fixed" in view.plot_bs.plotItem.titleLabel.text


def test_the_sweep_panel_runs_the_engines_sweep_file(qtbot, ctx, tmp_path, monkeypatch, capsys):
    """The panel's sweep is engine.analysis.sweep.sweep_file (the command's), not a copy of its steps."""
    from engine.analysis import sweep as engine_sweep

    path = tmp_path / "t.jsonl"
    a = list(range(1000, 1100))
    path.write_text(json.dumps({"tokens": a}) + "\n" + json.dumps({"tokens": a[:70] + list(range(9, 39))}) + "\n")
    calls: list[tuple] = []
    real = engine_sweep.sweep_file

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_sweep, "sweep_file", spy)
    view = SweepView(ctx)
    qtbot.addWidget(view)
    view.set_trace(str(path))
    view.block_sizes.setText("1,16")
    view.capacities.setText("4,64")
    view.limit.setValue(1)
    with qtbot.waitSignal(view.sigSweepDone, timeout=TIMEOUT) as sig:
        view.run_button.click()
    assert len(calls) == 1 and calls[0][0][:3] == (str(path), [1, 16], [4, 64]) and calls[0][1]["limit"] == 1
    assert _as_json(sig.args[0]) == _cli_json(capsys, "sweep", str(path), "--block-sizes", "1,16",
                                              "--capacities", "4,64", "--limit", "1")


def test_sweep_view_rejects_bad_list(qtbot, ctx, tmp_path):
    view = SweepView(ctx)
    qtbot.addWidget(view)
    view.set_trace(str(tmp_path / "x.jsonl"))
    view.block_sizes.setText("1,zero")
    view.run_sweep()
    assert ctx.errors and "block sizes" in ctx.errors[-1]


# ---- Billing and Sweep follow the subject ------------------------------------------------------

def _cli_json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _as_json(result: dict) -> dict:
    return json.loads(json.dumps(result))


def _worker_idle(qtbot, ctx) -> None:
    """Wait until every job submitted so far has run (the worker runs them in order)."""
    done: list = []
    ctx.worker.submit(lambda: None, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=TIMEOUT)


def test_saving_words():
    assert saving_words(0.125) == "saves <b>12.5%</b>"
    assert saving_words(0.0) == "saves <b>0.0%</b>"
    assert saving_words(-0.25) == "costs <b>25.0%</b> more"


def test_billing_says_when_caching_costs_more(qtbot, ctx, tmp_path):
    # two prompts that share nothing: each pays Anthropic's 1.25x write and reads nothing
    path = tmp_path / "apart.jsonl"
    path.write_text(json.dumps({"tokens": list(range(1, 1501)), "timestamp": 0}) + "\n"
                    + json.dumps({"tokens": list(range(5001, 6501)), "timestamp": 1000}) + "\n")
    view = BillingView(ctx)
    qtbot.addWidget(view)
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT) as sig:
        view.set_source(str(path))
    assert sig.args[0]["totals"]["savings_fraction"] == pytest.approx(-0.25)
    text = view.total_label.text()
    assert "costs <b>25.0%</b> more" in text and "saves" not in text


def _tick_values(axis, lo: float, hi: float, size: float) -> list[float]:
    return [v for _, values in axis.tickValues(lo, hi, size) for v in values]


def test_billing_request_and_turn_axes_tick_whole_numbers(qtbot, ctx, hand_trace):
    view = BillingView(ctx)
    qtbot.addWidget(view)
    view.resize(900, 500)
    view.show()
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT):
        view.set_source(str(hand_trace))
    axis = view.plot.getAxis("bottom")
    lo, hi = view.plot.viewRange()[0]
    assert (lo, hi) == pytest.approx((-0.6, 1.6))  # two requests: pyqtgraph's own axis ticked 0.5 steps here
    for size in (120, 400, 1200):
        values = _tick_values(axis, lo, hi, size)
        assert values and all(v == int(v) for v in values), values
    assert axis.tickStrings([0.0, 1.0], 1.0, 1.0) == ["0", "1"]


def test_billing_and_sweep_follow_an_opened_trace(qtbot, ctx, capsys):
    source = str(WEKA / "trace_0303.json")  # two models: each request is priced by its own
    billing, sweep = BillingView(ctx), SweepView(ctx)
    for view in (billing, sweep):
        qtbot.addWidget(view)
        view.resize(1000, 600)
        view.show()
    with qtbot.waitSignal(billing.sigBillDone, timeout=TIMEOUT) as sig:
        ctx.open_subject(Subject("trace", "trace_0303.json", source=source))
    bill = sig.args[0]
    assert billing.source.text() == source and billing.model.currentData() is None
    assert _as_json(bill) == _cli_json(capsys, "billing", source)
    assert set(bill["models"]) == {"claude-opus-4-5-20251101", "claude-haiku-4-5-20251001"}
    assert billing.table_model.rowCount() == bill["totals"]["requests"]
    assert "per request" in billing.rules_label.text()
    # the sweep is offered, not run: a sweep replays the trace once per point
    assert sweep.trace.text() == source and sweep.result is None and sweep.run_button.isEnabled()
    assert "trace_0303.json" in sweep.status.text() and "Run sweep" in sweep.status.text()
    with qtbot.waitSignal(sweep.sigSweepDone, timeout=TIMEOUT) as sig:
        sweep.run_button.click()
    # the CLI's steps: a kv-cache-tester file at its own 64-token blocks, not Mooncake's 512
    assert _as_json(sig.args[0]) == _cli_json(capsys, "sweep", source)
    assert sig.args[0]["block_size"] == 64 and sig.args[0]["kind"] == "weka"
    # another subject clears both
    ctx.open_subject(Subject("demo", "Some demo", source="tenant-salt"))
    assert billing.result is None and billing.table_model.rowCount() == 0 and billing.source.text() == ""
    assert len(billing.bars["read"].opts["height"]) == 0
    assert "Some demo" in billing.total_label.text()
    assert sweep.result is None and sweep.trace.text() == "" and sweep.curve_cap.getData()[0] is None
    assert "Some demo" in sweep.status.text()
    assert ctx.errors == []


def test_a_bill_or_sweep_of_the_last_subject_is_dropped(qtbot, ctx, hand_trace):
    billing, sweep = BillingView(ctx), SweepView(ctx)
    for view in (billing, sweep):
        qtbot.addWidget(view)
    billing.set_source(str(hand_trace))  # on the worker
    sweep.set_trace(str(hand_trace))
    sweep.run_sweep()
    ctx.open_subject(Subject("session", "New session"))  # before either job is back
    _worker_idle(qtbot, ctx)
    qtbot.wait(50)
    assert billing.result is None and billing.table_model.rowCount() == 0
    assert sweep.result is None and sweep.run_button.isEnabled()


def test_a_hidden_billing_panel_bills_the_trace_when_shown(qtbot, ctx, hand_trace):
    view = BillingView(ctx)
    qtbot.addWidget(view)
    ctx.open_subject(Subject("trace", hand_trace.name, source=str(hand_trace)))
    _worker_idle(qtbot, ctx)
    assert view.result is None  # nothing queued ahead of the replay while nobody looks
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT) as sig:
        view.show()
    assert sig.args[0]["source"] == str(hand_trace)


def test_an_unpriced_model_in_a_followed_trace_is_said_in_the_panel(qtbot, ctx, tmp_path):
    view = BillingView(ctx)
    qtbot.addWidget(view)
    view.show()
    path = tmp_path / "trace_0104_unpriced.json"  # claude-opus-4-9: no price table
    path.write_text((WEKA / "trace_0104.json").read_text().replace("claude-opus-4-6", "claude-opus-4-9"))
    source = str(path)
    ctx.open_subject(Subject("trace", "trace_0104.json", source=source))
    qtbot.waitUntil(lambda: "No bill" in view.total_label.text(), timeout=TIMEOUT)
    assert "claude-opus-4-9" in view.total_label.text() and "pick a model above" in view.total_label.text()
    assert ctx.errors == []  # the panel followed the subject: no dialog
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT) as sig:
        view.model.setCurrentText("claude-opus-4-5")  # the user picks one: every request billed as it
    assert sig.args[0]["model"] == "claude-opus-4-5"


def test_billing_follows_a_usage_logs_provider(qtbot, ctx, hand_trace):
    from app.window.files import _usage_job

    view = BillingView(ctx)
    qtbot.addWidget(view)
    assert view.provider.currentText() == "anthropic"
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT):
        view.set_source(str(hand_trace))  # a bill first: its bars' y0 once broke the usage log's empty bars
    result = _usage_job(str(USAGE / "openai_chat_pairs.jsonl"))
    assert result["apis"] == ["openai"]
    view.show_usage(result)
    assert view.provider.currentText() == "openai" and view.usage is result
    assert view.model.currentData() is None  # the log names gpt-4o and gpt-4o-mini: priced per request
    assert view.source.text() == ""  # a usage log is not a source to re-bill
    assert view.result is None and view.table_model.rowCount() == len(result["requests"])
    assert len(view.bars["read"].opts["height"]) == 0 and len(view.cost_lines["observed"].getData()[0]) == 4
    # the next subject gets the user's provider back: the log's was the log's
    ctx.open_subject(Subject("trace", hand_trace.name, source=str(hand_trace)))
    assert (view.provider.currentText(), view.model.currentData()) == ("anthropic", None)
    view.show_usage(result)
    view.provider.setCurrentText("openai-legacy")  # still the user's to change, and then kept
    ctx.open_subject(Subject("session", "New session"))
    assert view.provider.currentText() == "openai-legacy" and ctx.errors == []


@pytest.mark.model  # the 70B demo reads the bundled model's shape
def test_a_demo_then_another_demo_clears_the_bill(qtbot, window):
    from app.demos.runner import install_demos

    runner = install_demos(window)
    billing = window.panels["billing"]
    with qtbot.waitSignal(runner.sigFinished, timeout=300_000):
        assert runner.run("breakpoint-on-user-message")  # the tokenizer only
    qtbot.waitUntil(lambda: billing.result is not None, timeout=TIMEOUT)
    first = billing.result
    assert first["totals"]["read_tokens"] == 0 and first["totals"]["savings_fraction"] < 0
    assert "costs <b>25.0%</b> more" in billing.total_label.text()
    with qtbot.waitSignal(runner.sigStarted, timeout=TIMEOUT):
        assert runner.run("kv-memory-70b-128k")  # a demo with no bill
    # cleared as soon as the next demo is the subject, not left beside it
    assert billing.result is None and billing.table_model.rowCount() == 0 and billing.source.text() == ""
    assert len(billing.bars["write"].opts["height"]) == 0
    with qtbot.waitSignal(runner.sigFinished, timeout=300_000):
        pass
    assert billing.result is None and "No bill for the demo" in billing.total_label.text()
    # the billing demo again: its bill is back
    with qtbot.waitSignal(runner.sigFinished, timeout=300_000):
        assert runner.run("breakpoint-on-user-message")
    qtbot.waitUntil(lambda: billing.result is not None, timeout=TIMEOUT)
    assert billing.result["totals"] == first["totals"]
    # a trace next: the demo's breakpoints and model were the demo's, the panel's own are back
    window.ctx.open_subject(Subject("trace", "demo_tokens.jsonl",
                                    source=str(resource_path("traces", "demo_tokens.jsonl"))))
    assert (billing.provider.currentText(), billing.model.currentData(), billing.breakpoints.text()) == (
        "anthropic", None, "auto")
    assert window.ctx.errors == []


def test_a_long_sweep_of_the_last_subject_stops_at_its_next_point(qtbot, ctx):
    # 12,031 requests: each capacity point replays the whole trace on the worker
    source = str(resource_path("traces", "mooncake_conversation_trace.jsonl"))
    view = SweepView(ctx)
    qtbot.addWidget(view)
    ctx.open_subject(Subject("trace", "mooncake_conversation_trace.jsonl", source=source))
    view.capacities.setText("64,128,256,512,1024,2048,4096")
    progress: list[tuple[int, int]] = []
    view._sigProgress.connect(lambda _g, done, total: progress.append((done, total)))
    with qtbot.waitSignal(view._sigProgress, timeout=300_000):
        view.run_button.click()
    assert "1 of 7 points" in view.status.text()
    ctx.open_subject(Subject("session", "New session"))
    _worker_idle(qtbot, ctx)  # the worker is free again once the point in flight is done
    qtbot.wait(50)
    assert progress and max(done for done, _ in progress) < 7
    assert view.result is None and view.run_button.isEnabled() and ctx.errors == []


def test_an_opened_trace_past_the_auto_bill_limit_is_not_billed_by_itself(qtbot, ctx, tmp_path, monkeypatch):
    """A trace of more requests than the panel bills when it opens is said in the panel,
    not loaded (a million requests' bill rows cost gigabytes); Enter in the source field still bills it."""
    from app.views.tools import billing_view

    monkeypatch.setattr(billing_view, "AUTO_BILL_MAX_REQUESTS", 5)
    path = tmp_path / "six.jsonl"
    path.write_text("".join(f'{{"id": "r{i}", "tokens": [{i}, 1, 2]}}\n' for i in range(6)))
    view = BillingView(ctx)
    qtbot.addWidget(view)
    view.show()
    ctx.open_subject(Subject("trace", path.name, source=str(path)))
    qtbot.waitUntil(lambda: "No bill" in view.total_label.text(), timeout=TIMEOUT)
    assert "more than the 5 requests" in view.total_label.text() and view.result is None
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT) as sig:
        view.recompute()
    assert sig.args[0]["totals"]["requests"] == 6


# ---- a bill of a whole trace: every row, and Cancel -----------------------------------------

MOONCAKE = str(resource_path("traces", "mooncake_conversation_trace.jsonl"))
LONG = 120_000  # the 12,031-request trace is read and billed on a loaded machine


def _three_requests(tmp_path) -> str:
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "tokens": [1, 2, 3, i + 10]}) + "\n" for i in range(3)))
    return str(path)


def test_every_row_of_a_whole_trace_bill_is_in_the_table_and_its_export(qtbot, ctx, tmp_path):

    view = BillingView(ctx)
    qtbot.addWidget(view)
    view.resize(1280, 800)
    view.show()
    with qtbot.waitSignal(view.sigBillDone, timeout=LONG) as sig:
        view.set_source(MOONCAKE)
    rows = sig.args[0]["requests"]
    assert len(rows) == 12_031 and view.table_model.rowCount() == len(rows)  # the table showed 2,000 before
    m = view.table_model
    last = rows[-1]
    assert [m.index(len(rows) - 1, c).data() for c in range(len(COLUMNS))] == [
        str(last["index"]), str(last["id"]), str(last["prompt_tokens"]), str(last["read_tokens"]),
        str(last["write_tokens"]), str(last["uncached_tokens"]), f"${last['cost_usd']:.6f}",
        f"${last['cost_without_cache_usd']:.6f}", "; ".join(last["notes"])]
    noted = next(i for i, r in enumerate(rows) if r["notes"])
    assert m.index(noted, len(COLUMNS) - 1).data(Qt.ItemDataRole.ToolTipRole) == "\n".join(rows[noted]["notes"])
    assert m.index(noted, 0).data(Qt.ItemDataRole.ToolTipRole) is None
    out = export_table(model_table(m), tmp_path / "bill.csv")
    with out.open(newline="") as fh:
        table = list(csv.reader(fh))
    assert table[0] == list(COLUMNS) and len(table) == 1 + len(rows)
    assert [int(r[3]) for r in table[1:]] == [r["read_tokens"] for r in rows]
    assert not view.cancel_button.isVisible() and ctx.errors == []


def _cancel_at_first_progress(qtbot, view, cancel) -> list[tuple[int, int]]:
    progress: list[tuple[int, int]] = []

    def seen(_run, done: int, total: int) -> None:
        progress.append((done, total))
        if len(progress) == 1:
            cancel()

    view._sigProgress.connect(seen)
    view.set_source(MOONCAKE)
    assert view.cancel_button.isVisibleTo(view) and view.is_billing
    qtbot.waitUntil(lambda: not view.is_billing, timeout=LONG)
    return progress


def test_the_panels_cancel_stops_a_bill_mid_way(qtbot, ctx):
    view = BillingView(ctx)
    qtbot.addWidget(view)
    view.show()
    done: list = []
    view.sigBillDone.connect(done.append)
    progress = _cancel_at_first_progress(qtbot, view, lambda: view.cancel_button.click())
    _worker_idle(qtbot, ctx)
    assert progress and max(d for d, _ in progress) < 12_031  # stopped while reading, not at the end
    assert done == [] and view.result is None and not view.cancel_button.isVisibleTo(view)
    assert "Bill cancelled" in view.total_label.text() and ctx.errors == []
    with qtbot.waitSignal(view.sigBillDone, timeout=LONG) as sig:  # Enter bills it again, whole
        view.source.returnPressed.emit()
    assert sig.args[0]["totals"]["requests"] == 12_031


def test_the_windows_cancel_stops_a_running_bill(qtbot, ctx):
    view = BillingView(ctx)
    qtbot.addWidget(view)
    view.show()
    names: list[str] = []
    ctx.sigJobChanged.connect(names.append)
    progress = _cancel_at_first_progress(qtbot, view, lambda: (names.append(ctx.job_name), ctx.cancel_job()))
    _worker_idle(qtbot, ctx)
    assert names[0] == "billing mooncake_conversation_trace.jsonl" and names[-1] == "" and ctx.job is None
    assert max(d for d, _ in progress) < 12_031 and view.result is None
    assert "Bill cancelled" in view.total_label.text() and ctx.errors == []


def test_another_subject_stops_the_running_bill(qtbot, ctx):
    view = BillingView(ctx)
    qtbot.addWidget(view)
    view.show()
    progress = _cancel_at_first_progress(qtbot, view, lambda: ctx.open_subject(Subject("session", "New session")))
    _worker_idle(qtbot, ctx)
    assert max(d for d, _ in progress) < 12_031
    assert view.result is None and view.table_model.rowCount() == 0 and "New session" in view.total_label.text()
    assert ctx.errors == [] and ctx.job is None


def test_a_queued_bill_cancelled_before_it_starts_never_runs(qtbot, ctx, tmp_path):
    view = BillingView(ctx)
    qtbot.addWidget(view)
    gate = threading.Event()
    ctx.worker.submit(gate.wait, 30)  # the worker is busy: the bill waits in the queue
    view.set_source(_three_requests(tmp_path))
    assert view.cancel()
    gate.set()
    qtbot.waitUntil(lambda: not view.is_billing, timeout=LONG)
    assert view.result is None and "Bill cancelled" in view.total_label.text() and not view.cancel()


def test_a_bill_is_made_with_the_collector_paused_and_frozen_after(qtbot, ctx, hand_trace, monkeypatch):
    """Full collections the worker set off while making a bill walked every object holding
    the GIL (the window stalled 0.2-0.5 s, seven times for the Mooncake trace's bill): the
    collector is off during the job, the bill's objects frozen out of later collections, and
    the collector on again after."""
    import gc

    from app.views.tools import billing_view

    seen: list[bool] = []
    real = billing_view._bill_job

    def job(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(billing_view, "_bill_job", job)
    frozen = gc.get_freeze_count()
    view = BillingView(ctx)
    qtbot.addWidget(view)
    try:
        with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT) as sig:
            view.set_source(str(hand_trace))
        assert seen == [False] and gc.isenabled()
        assert gc.get_freeze_count() > frozen and sig.args[0]["totals"]["requests"] == 2
    finally:
        gc.unfreeze()  # the rest of the suite collects as it did
