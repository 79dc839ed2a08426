"""Diff, Billing and Sweeps panels offscreen: model to view and view to model, on real data."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pytestqt")

from app.runtime.context import make_test_context  # noqa: E402
from app.views.tools.billing_view import BillingView  # noqa: E402
from app.views.tools.diff_view import DiffView  # noqa: E402
from app.views.tools.sweep_view import SweepView  # noqa: E402

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
    assert view.table.rowCount() == 2
    assert view.table.item(1, 3).text() == "1500"  # the read column
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
    assert "below the 4096-token minimum" in view.table.item(0, 8).text()


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


def test_sweep_view_rejects_bad_list(qtbot, ctx, tmp_path):
    view = SweepView(ctx)
    qtbot.addWidget(view)
    view.set_trace(str(tmp_path / "x.jsonl"))
    view.block_sizes.setText("1,zero")
    view.run_sweep()
    assert ctx.errors and "block sizes" in ctx.errors[-1]
