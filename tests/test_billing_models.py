"""Billing prices each request by the model it names (issue 21's loose end).

On the shipped WEKA kv-cache-tester traces, billed as a file and as a stored session: the
figures below are worked out by hand from the trace and resources/billing_rules.json
(Anthropic: writes 1.25x, reads 0.1x, 20-block lookback; claude-opus-4-5 $5 and
claude-haiku-4-5 $1 per million input tokens, both with a 4,096-token minimum).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from engine.analysis import billing

WEKA = Path(__file__).resolve().parents[1] / "resources" / "traces" / "weka"
OPUS, HAIKU = "claude-opus-4-5-20251101", "claude-haiku-4-5-20251001"

# trace_0303: six requests, t in seconds. Each model keys its own cache, so haiku's first
# request reads nothing of opus's identical first blocks; opus's third request shares 39
# blocks (2,496 tokens) with its first, but they lie more than 20 blocks before its only
# breakpoint (block 99), so it writes all 6,411; the last three read their whole prompt.
BY_HAND_0303 = [  # (model, prompt, read, write, cost in USD)
    (OPUS, 12343, 0, 12343, 12343 * 1.25 * 5 / 1e6),
    (HAIKU, 12236, 0, 12236, 12236 * 1.25 * 1 / 1e6),
    (OPUS, 6411, 0, 6411, 6411 * 1.25 * 5 / 1e6),
    (OPUS, 6411, 6411, 0, 6411 * 0.1 * 5 / 1e6),
    (HAIKU, 12236, 12236, 0, 12236 * 0.1 * 1 / 1e6),
    (OPUS, 12343, 12343, 0, 12343 * 0.1 * 5 / 1e6),
]


def _billing_json(capsys, *argv) -> dict:
    assert main(["billing", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _check_0303(out: dict) -> None:
    rows = sorted(out["requests"], key=lambda r: r["index"])
    got = [(r["model"], r["prompt_tokens"], r["read_tokens"], r["write_tokens"], r["cost_usd"]) for r in rows]
    assert [g[:4] for g in got] == [b[:4] for b in BY_HAND_0303]
    assert [g[4] for g in got] == pytest.approx([b[4] for b in BY_HAND_0303], abs=1e-8)
    opus = sum(b[4] for b in BY_HAND_0303 if b[0] == OPUS)
    haiku = sum(b[4] for b in BY_HAND_0303 if b[0] == HAIKU)
    assert out["models"][OPUS]["totals"]["cost_usd"] == pytest.approx(opus, abs=1e-8)
    assert out["models"][HAIKU]["totals"]["cost_usd"] == pytest.approx(haiku, abs=1e-8)
    assert out["totals"]["cost_usd"] == pytest.approx(opus + haiku, abs=1e-8) == pytest.approx(0.1431081)
    # without caching: every prompt token at its model's base price
    assert out["totals"]["cost_without_cache_usd"] == pytest.approx((12343 * 2 + 6411 * 2) * 5e-6 + 12236 * 2 * 1e-6)
    assert out["models"][OPUS]["rules"]["min_cacheable_tokens"] == 4096
    assert out["model"] == "per request"


def test_a_weka_file_with_two_models_is_billed_per_model(capsys):
    _check_0303(_billing_json(capsys, str(WEKA / "trace_0303.json")))


def test_a_stored_weka_session_is_billed_as_its_file(tmp_path, capsys):
    db = tmp_path / "s.db"
    assert main(["sessions", "import", str(WEKA / "trace_0303.json"), "--db", str(db)]) == 0
    capsys.readouterr()
    out = _billing_json(capsys, "1", "--db", str(db))
    _check_0303(out)
    assert "64-token blocks" in out["token_counts"] and "seconds" in out["token_counts"]


def test_a_stored_session_and_its_file_give_the_same_bill(tmp_path, capsys):
    # trace_0009: one model (claude-sonnet-4-5, $3), 51 requests over minutes, so the
    # lifetimes (seconds, not the milliseconds of other traces) matter; sub-agents keep
    # their own streams. The stored session must not drift from the file.
    db = tmp_path / "s.db"
    assert main(["sessions", "import", str(WEKA / "trace_0009.json"), "--db", str(db)]) == 0
    capsys.readouterr()
    from_file = _billing_json(capsys, str(WEKA / "trace_0009.json"))
    from_db = _billing_json(capsys, "session:1", "--db", str(db))
    strip = ("id", "index")
    assert ([{k: v for k, v in r.items() if k not in strip} for r in from_db["requests"]]
            == [{k: v for k, v in r.items() if k not in strip} for r in from_file["requests"]])
    assert from_db["totals"] == from_file["totals"]
    assert set(from_db["models"]) == {"claude-sonnet-4-5-20250929"}
    first = min(from_file["requests"], key=lambda r: r["index"])
    assert first["cost_usd"] == pytest.approx(first["write_tokens"] * 1.25 * 3e-6, abs=1e-8)


def test_model_prices_every_request_as_one_model(capsys):
    out = _billing_json(capsys, str(WEKA / "trace_0303.json"), "--model", "claude-sonnet-4-5")
    assert out["model"] == "claude-sonnet-4-5" and "models" not in out
    assert all("model" not in r for r in out["requests"])
    # sonnet's price ($3) for all; the caches stay keyed by each request's model
    first_two = sorted(out["requests"], key=lambda r: r["index"])[:2]
    assert [r["write_tokens"] for r in first_two] == [12343, 12236]
    assert first_two[0]["cost_usd"] == pytest.approx(12343 * 1.25 * 3e-6)


def unpriced_copy(tmp_path: Path) -> str:
    """trace_0104 with its model renamed to one the rules file has no table for."""
    path = tmp_path / "trace_0104_unpriced.json"
    path.write_text((WEKA / "trace_0104.json").read_text().replace("claude-opus-4-6", "claude-opus-4-9"))
    return str(path)


@pytest.mark.parametrize("stored", [False, True], ids=["file", "session"])
def test_a_model_without_a_price_table_is_one_sentence(tmp_path, capsys, stored):
    # claude-opus-4-9 has no table in the rules file (it is not a dated claude-opus-4)
    source = unpriced_copy(tmp_path)
    argv = [source]
    if stored:
        db = tmp_path / "s.db"
        assert main(["sessions", "import", source, "--db", str(db)]) == 0
        capsys.readouterr()
        argv = ["1", "--db", str(db)]
    assert main(["billing", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "names model 'claude-opus-4-9', which has no anthropic price table" in err[0]
    assert "--model" in err[0]


def test_dated_ids_belong_to_their_family_and_nothing_else():
    models = billing.load_rules()["providers"]["anthropic"]["models"]
    assert billing._match_family("claude-sonnet-4-5-20250929", models) == "claude-sonnet-4-5"
    assert billing._match_family("claude-sonnet-4-20250514", models) == "claude-sonnet-4"
    assert billing._match_family("claude-opus-4-9", models) is None
    assert billing._match_family("claude-opus-4-6", models) == "claude-opus-4-6"
    legacy = billing.load_rules()["providers"]["openai-legacy"]["models"]
    assert billing._match_family("gpt-4o-mini-2024-07-18", legacy) == "gpt-4o-mini"
    assert billing._match_family("gpt-5-mini", legacy) == "gpt-5-mini"


def test_requests_without_a_model_bill_as_before():
    # a token trace names no model: rules_for_models finds none, and bill() gives the same
    # JSON with or without it (no per-model keys)
    reqs = [billing.BillingRequest("a", billing.chain_segments([("sys", range(2000))]), 0.0),
            billing.BillingRequest("b", billing.chain_segments([("sys", range(2000))]), 1.0)]
    rules = billing.provider_rules("anthropic")
    assert billing.rules_for_models(reqs, "anthropic") == {}
    assert billing.bill(reqs, rules, (-1,), {}) == billing.bill(reqs, rules, (-1,))


def test_opus_4_6_sessions_are_billed_at_its_price(capsys):
    # trace_0104 is a real Claude Code session on claude-opus-4-6 ($5 / MTok input, 4,096
    # tokens the smallest cacheable prefix, as Opus 4.5: DESIGN.md section 6)
    out = _billing_json(capsys, str(WEKA / "trace_0104.json"))
    assert set(out["models"]) == {"claude-opus-4-6"}
    first = min(out["requests"], key=lambda r: r["index"])
    assert first["write_tokens"] > 4096
    assert first["cost_usd"] == pytest.approx(first["write_tokens"] * 1.25 * 5e-6
                                              + first.get("uncached_tokens", 0) * 5e-6, rel=1e-6)
