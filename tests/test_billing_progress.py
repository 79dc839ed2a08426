"""A long bill reports its progress and stops when told (engine.analysis.billing), and the
Billing panel shows it: every row of a 12,031-request bill in its table, Cancel (the
panel's and the window's) stopping a bill mid-way, another subject freeing the worker."""

from __future__ import annotations

import csv
import json

import pytest

from engine.analysis import billing
from engine.resources import resource_path

MOONCAKE = str(resource_path("traces", "mooncake_conversation_trace.jsonl"))
TIMEOUT = 120_000


def _token_trace(path, n: int):
    path.write_text("".join(json.dumps({"id": f"r{i}", "tokens": [1, 2, 3, i + 10], "timestamp": i}) + "\n"
                            for i in range(n)))
    return str(path)


def test_bill_and_load_report_every_progress_step(tmp_path):
    n = 2 * billing.PROGRESS_EVERY + 5
    source = _token_trace(tmp_path / "t.jsonl", n)
    read: list[tuple[int, int]] = []
    reqs, _ = billing.load_billing_requests(source, progress=lambda d, t: read.append((d, t)))
    assert read == [(billing.PROGRESS_EVERY, 0), (2 * billing.PROGRESS_EVERY, 0)]
    rules = billing.provider_rules("anthropic")
    done: list[tuple[int, int]] = []
    with_progress = billing.bill(reqs, rules, progress=lambda d, t: done.append((d, t)))
    assert done == [(billing.PROGRESS_EVERY, n), (2 * billing.PROGRESS_EVERY, n)]
    assert with_progress == billing.bill(reqs, rules)  # reporting changes nothing


def test_an_exception_from_progress_stops_the_bill(tmp_path):
    reqs, _ = billing.load_billing_requests(_token_trace(tmp_path / "t.jsonl", 3 * billing.PROGRESS_EVERY))
    seen: list[int] = []

    def stop(done: int, total: int) -> None:
        seen.append(done)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        billing.bill(reqs, billing.provider_rules("anthropic"), progress=stop)
    assert seen == [billing.PROGRESS_EVERY]


# ---- the panel ------------------------------------------------------------------------------

pytest.importorskip("pytestqt")


@pytest.fixture
def ctx(qtbot, tmp_path):
    from app.runtime.context import make_test_context

    c = make_test_context(tmp_path)
    yield c
    c.shutdown()


def _worker_idle(qtbot, ctx) -> None:
    done: list = []
    ctx.worker.submit(lambda: None, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=TIMEOUT)


def test_every_row_of_a_whole_trace_bill_is_in_the_table_and_its_export(qtbot, ctx, tmp_path):
    from app.ui.export import export_table, model_table
    from app.views.tools.billing_view import COLUMNS, BillingView

    view = BillingView(ctx)
    qtbot.addWidget(view)
    view.resize(1280, 800)
    view.show()
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT) as sig:
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
    from PySide6.QtCore import Qt

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
    qtbot.waitUntil(lambda: not view.is_billing, timeout=TIMEOUT)
    return progress


def test_the_panels_cancel_stops_a_bill_mid_way(qtbot, ctx):
    from app.views.tools.billing_view import BillingView

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
    with qtbot.waitSignal(view.sigBillDone, timeout=TIMEOUT) as sig:  # Enter bills it again, whole
        view.source.returnPressed.emit()
    assert sig.args[0]["totals"]["requests"] == 12_031


def test_the_windows_cancel_stops_a_running_bill(qtbot, ctx):
    from app.views.tools.billing_view import BillingView

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
    from app.runtime.context import Subject
    from app.views.tools.billing_view import BillingView

    view = BillingView(ctx)
    qtbot.addWidget(view)
    view.show()
    progress = _cancel_at_first_progress(qtbot, view, lambda: ctx.open_subject(Subject("session", "New session")))
    _worker_idle(qtbot, ctx)
    assert max(d for d, _ in progress) < 12_031
    assert view.result is None and view.table_model.rowCount() == 0 and "New session" in view.total_label.text()
    assert ctx.errors == [] and ctx.job is None


def test_a_queued_bill_cancelled_before_it_starts_never_runs(qtbot, ctx, tmp_path):
    import threading

    from app.views.tools.billing_view import BillingView

    view = BillingView(ctx)
    qtbot.addWidget(view)
    gate = threading.Event()
    ctx.worker.submit(gate.wait, 30)  # the worker is busy: the bill waits in the queue
    view.set_source(_token_trace(tmp_path / "t.jsonl", 3))
    assert view.cancel()
    gate.set()
    qtbot.waitUntil(lambda: not view.is_billing, timeout=TIMEOUT)
    assert view.result is None and "Bill cancelled" in view.total_label.text() and not view.cancel()
