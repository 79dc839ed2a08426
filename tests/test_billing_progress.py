"""A long bill reports its progress and stops when told (engine.analysis.billing); the
Billing panel's use of it (Cancel, every row in the table) is in tests/test_tool_views.py."""

from __future__ import annotations

import json

import pytest

from engine.analysis import billing


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
