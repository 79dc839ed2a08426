"""Hosted prompt-caching bills: exact numbers worked out by hand, the rules file, the command."""

from __future__ import annotations

import json

from pathlib import Path

import pytest

from app.cli import main
from engine.analysis import billing
from engine.analysis.billing import BillingRequest, bill, chain_segments, parse_breakpoints, provider_rules
from engine.core.errors import InputError

MOONCAKE = str(Path(__file__).resolve().parents[1] / "resources" / "traces" / "mooncake_conversation_trace.jsonl")


def req(rid: str, sizes: list[int], t: float = 0.0, first: int = 0) -> BillingRequest:
    """A request whose block i holds `sizes[i]` distinct tokens; same sizes -> same prefix."""
    parts = [(str(i), list(range((first + i) * 100_000, (first + i) * 100_000 + n))) for i, n in enumerate(sizes)]
    return BillingRequest(rid, chain_segments(parts), t)


def test_anthropic_write_then_read_exact_numbers():
    rules = provider_rules("anthropic", "claude-sonnet-4-5")
    assert (rules.write_multiplier, rules.read_multiplier, rules.min_cacheable_tokens) == (1.25, 0.1, 1024)
    out = bill([req("1", [1500, 100]), req("2", [1500, 100, 50, 30], t=60)], rules)
    r1, r2 = out["requests"]
    assert r1["usage"] == {"cache_creation_input_tokens": 1600, "cache_read_input_tokens": 0, "input_tokens": 0}
    assert r1["cost_usd"] == pytest.approx(1600 * 1.25 * 3 / 1e6)  # $0.006
    assert r1["cost_without_cache_usd"] == pytest.approx(1600 * 3 / 1e6)
    assert r2["usage"] == {"cache_creation_input_tokens": 80, "cache_read_input_tokens": 1600, "input_tokens": 0}
    assert r2["cost_usd"] == pytest.approx((1600 * 0.1 + 80 * 1.25) * 3 / 1e6)  # $0.00078
    t = out["totals"]
    assert t["prompt_tokens"] == 3280 == t["read_tokens"] + t["write_tokens"] + t["uncached_tokens"]
    assert t["savings_usd"] == pytest.approx((3280 - (2000 + 260)) * 3 / 1e6)


def test_input_tokens_after_the_last_breakpoint():
    rules = provider_rules("anthropic")
    # Breakpoint on block 0 only: the 200 tokens after it are plain input.
    out = bill([req("1", [1200, 200])], rules, (0,))
    assert out["requests"][0]["usage"] == {"cache_creation_input_tokens": 1200, "cache_read_input_tokens": 0,
                                           "input_tokens": 200}


def test_below_minimum_prefix_is_silently_uncached():
    rules = provider_rules("anthropic", "claude-haiku-4-5")  # 4096-token minimum
    out = bill([req("1", [3000, 50]), req("2", [3000, 50])], rules)
    for row in out["requests"]:
        assert row["usage"] == {"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "input_tokens": 3050}
        assert any("below the 4096-token minimum" in n and "silently" in n for n in row["notes"])
        assert row["cost_usd"] == row["cost_without_cache_usd"]
    # The same prompt on Sonnet 4.5 (1024 minimum) is cached.
    out = bill([req("1", [3000, 50]), req("2", [3000, 50])], provider_rules("anthropic", "claude-sonnet-4-5"))
    assert out["requests"][1]["read_tokens"] == 3050


def test_ttl_expires_between_timestamps_and_refreshes_on_hit():
    rules = provider_rules("anthropic")
    out = bill([req("1", [2000]), req("2", [2000, 10], t=301)], rules)
    r2 = out["requests"][1]
    assert r2["read_tokens"] == 0 and r2["write_tokens"] == 2010
    assert any("expired" in n and "300 s time to live" in n for n in r2["notes"])
    # Hits at 200 s and 450 s: each refreshes the 5-minute clock, so the third still reads.
    out = bill([req("1", [2000]), req("2", [2000], t=200), req("3", [2000], t=450)], rules)
    assert [r["read_tokens"] for r in out["requests"]] == [0, 2000, 2000]
    # The 1-hour option keeps it and writes at 2x.
    long = provider_rules("anthropic", ttl="1h")
    out = bill([req("1", [2000]), req("2", [2000, 10], t=1800)], long)
    assert out["requests"][1]["read_tokens"] == 2000
    assert out["requests"][0]["weighted_tokens"] == pytest.approx(4000)


def test_lookback_of_20_blocks():
    rules = provider_rules("anthropic")
    first = req("1", [2000, 10])
    many = req("2", [2000, 10] + [5] * 25, t=1)
    out = bill([first, many], rules)
    r2 = out["requests"][1]
    assert r2["read_tokens"] == 0
    assert any("outside the lookback" in n for n in r2["notes"])
    # 19 blocks later the earlier breakpoint is still inside the window (the breakpoint counts).
    out = bill([first, req("2", [2000, 10] + [5] * 19, t=1)], rules)
    assert out["requests"][1]["read_tokens"] == 2010
    # A second breakpoint on the system block reads it however long the conversation grows.
    out = bill([first, many], rules, parse_breakpoints("0,-1", rules))
    assert out["requests"][1]["read_tokens"] == 2000


def test_breakpoint_arguments():
    rules = provider_rules("anthropic")
    assert parse_breakpoints("auto", rules) == (-1,)
    assert parse_breakpoints(None, rules) == (-1,)
    assert parse_breakpoints("0, -1", rules) == (0, -1)
    with pytest.raises(InputError, match="at most 4"):
        parse_breakpoints("0,1,2,3,4", rules)
    with pytest.raises(InputError, match="block index"):
        parse_breakpoints("system", rules)
    with pytest.raises(InputError, match="no breakpoints"):
        parse_breakpoints("0", provider_rules("openai-legacy"))
    assert parse_breakpoints(None, provider_rules("openai")) is None


def test_openai_legacy_hits_grow_in_128_token_steps():
    rules = provider_rules("openai-legacy", "gpt-4o")
    a = BillingRequest("1", chain_segments([("p", list(range(2000)))]))
    b = BillingRequest("2", chain_segments([("p", list(range(1500)) + [9_999_999] * 500)]), 10)
    out = bill([a, b], rules, None)
    r1, r2 = out["requests"]
    assert r1["usage"] == {"prompt_tokens": 2000, "prompt_tokens_details": {"cached_tokens": 0}}
    assert r1["cost_usd"] == pytest.approx(2000 * 2.5 / 1e6)  # writes cost 1x: no surcharge
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == 1024 + 3 * 128  # 1500 shared -> 1408
    assert r2["cost_usd"] == pytest.approx((1408 * 0.5 + 592) * 2.5 / 1e6)


def test_openai_writes_at_125_and_reads_at_01():
    rules = provider_rules("openai", price_per_mtok=2.0)
    a = BillingRequest("1", chain_segments([("p", list(range(2000)))]))
    b = BillingRequest("2", chain_segments([("p", list(range(1500)) + [7] * 100)]), 10)
    r1, r2 = bill([a, b], rules, None)["requests"]
    assert r1["usage"] == {"prompt_tokens": 2000, "cached_tokens": 0, "cache_write_tokens": 2000}
    assert r2["usage"] == {"prompt_tokens": 1600, "cached_tokens": 1500, "cache_write_tokens": 100}
    assert r2["cost_usd"] == pytest.approx((1500 * 0.1 + 100 * 1.25) * 2.0 / 1e6)
    # No price in the rules file for this model: costs are unknown, the fraction is not.
    out = bill([a, b], provider_rules("openai"), None)
    assert out["totals"]["cost_usd"] is None
    assert out["totals"]["savings_fraction"] == pytest.approx(1 - (2500 + 150 + 125) / 3600, abs=1e-6)


def test_rules_file_has_the_documented_table():
    data = billing.load_rules()
    assert data["checked"]
    a = data["providers"]["anthropic"]
    assert a["lookback_blocks"] == 20 and a["max_breakpoints"] == 4 and a["ttl_seconds"] == 300
    assert a["models"]["claude-opus-4-5"]["min_cacheable_tokens"] == 4096
    assert a["models"]["claude-sonnet-4-6"]["min_cacheable_tokens"] == 2048
    assert data["providers"]["openai-legacy"]["hit_step_tokens"] == 128
    assert provider_rules("anthropic", "claude-sonnet-4-5-20250929").min_cacheable_tokens == 1024
    with pytest.raises(InputError, match="unknown anthropic model"):
        provider_rules("anthropic", "gpt-4o")


def test_mooncake_trace_bill_is_consistent():
    from engine.core.trace import load_trace

    reqs = billing.requests_from_trace(load_trace(MOONCAKE)[:400])
    for provider in ("anthropic", "openai-legacy"):
        out = bill(reqs, provider_rules(provider))
        t = out["totals"]
        assert t["requests"] == 400
        assert t["read_tokens"] > 0, provider
        for row in out["requests"]:
            assert row["read_tokens"] + row["write_tokens"] + row["uncached_tokens"] == row["prompt_tokens"]
            # whole 512-token blocks, or a whole repeated prompt
            assert row["read_tokens"] % 512 == 0 or row["read_tokens"] == row["prompt_tokens"]
        assert t["cost_usd"] < t["cost_without_cache_usd"] * 1.25


def test_conversation_with_real_tokenizer(default_tokenizer, tmp_path):
    system = " ".join(f"Rule {i}: check the opening hours of museum {i}." for i in range(120))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Plan a day in Lisbon."},
            {"role": "assistant", "content": "Morning in Alfama, afternoon in Belem."},
            {"role": "user", "content": "Make it cheaper."}]
    reqs = billing.requests_from_conversations([msgs], default_tokenizer)
    assert [r.request_id for r in reqs] == ["0/1", "0/3"]
    out = bill(reqs, provider_rules("anthropic"))
    r1, r2 = out["requests"]
    assert r1["read_tokens"] == 0 and r1["write_tokens"] == r1["prompt_tokens"] > 1024
    assert r2["read_tokens"] == r1["prompt_tokens"]
    assert r2["write_tokens"] == r2["prompt_tokens"] - r1["prompt_tokens"] > 0


def test_billing_command(tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    lines = [{"tokens": list(range(1, 1501)), "timestamp": 0},
             {"tokens": list(range(1, 1501)) + [5, 6, 7], "timestamp": 1000},
             {"tokens": list(range(1, 1501)) + [5, 6, 7, 8], "timestamp": 400_000}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert main(["billing", str(path), "--provider", "anthropic", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    usage = [r["usage"] for r in out["requests"]]
    assert usage[0] == {"cache_creation_input_tokens": 1500, "cache_read_input_tokens": 0, "input_tokens": 0}
    assert usage[1] == {"cache_creation_input_tokens": 3, "cache_read_input_tokens": 1500, "input_tokens": 0}
    assert usage[2]["cache_read_input_tokens"] == 0  # 399 s after the last use: expired
    assert any("expired" in n for n in out["requests"][2]["notes"])
    with pytest.raises(SystemExit) as exc:
        main(["billing", str(path), "--provider", "bogus"])
    assert exc.value.code == 2
    assert main(["billing", str(path), "--breakpoints", "1,2,3,4,5"]) == 2
    err = capsys.readouterr().err
    assert "at most 4" in err and "Traceback" not in err
    assert main(["billing", str(tmp_path / "missing.json")]) == 2


def test_billing_a_stored_session(default_tokenizer, tmp_path, capsys):
    from engine.store.database import Store

    system = " ".join(f"Rule {i}: check the opening hours of museum {i}." for i in range(120))
    db = tmp_path / "s.db"
    with Store(db) as store:
        sid = store.create_session("bill")
        for role, text in (("system", system), ("user", "Plan a day."), ("assistant", "Alfama, then Belem."),
                           ("user", "Cheaper?")):
            store.add_message(sid, role, text)
    assert main(["billing", f"session:{sid}", "--db", str(db), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    r1, r2 = out["requests"]
    assert r2["read_tokens"] == r1["prompt_tokens"] == r1["write_tokens"]
    assert "approximate" in out["token_counts"]
    assert main(["billing", "session:999", "--db", str(db)]) == 2
