"""Every guided demo runs on the bundled models and its findings prove its behaviour."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.demos import DEMO_NAMES, DemoEnv, list_demos, run_demo

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # The test machine's cores are shared; intra-op threads oversubscribe them and make
    # small-batch decoding several times slower. Restored for the rest of the suite.
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def env(default_model):
    return DemoEnv(model=default_model)


def _check_shape(result: dict, name: str) -> None:
    assert result["name"] == name
    for key in ("title", "explanation", "steps", "findings"):
        assert result[key], key
    assert 2 <= result["explanation"].count(". ") + 1 <= 5
    assert all(s["step"] == i for i, s in enumerate(result["steps"], 1))
    json.dumps(result)  # JSON-ready


def test_list_names_every_demo_once():
    names = [d["name"] for d in list_demos()]
    assert names == list(DEMO_NAMES)
    assert len(set(names)) == len(names) >= 12  # other modules add demos; none twice
    assert all(d["summary"] and "\n" not in d["summary"] for d in list_demos())


def test_kv_grows_per_step(env):
    r = run_demo("kv-grows-per-step", env)
    _check_shape(r, "kv-grows-per-step")
    f = r["findings"]
    steps = f["per_step"]
    assert len(steps) >= 8
    assert f["all_steps_match_formula"] and f["same_tokens_as_paged_runner"]
    assert [s["tokens_with_kv"] for s in steps] == list(range(f["prompt_tokens"], f["prompt_tokens"] + len(steps)))
    # One token more per step: 2 * 30 layers * 3 KV heads * 64 * 4 bytes.
    assert set(f["growth_per_step_bytes"]) == {2 * 30 * 3 * 64 * 4}
    assert all(len(s["per_layer_bytes"]) == 30 for s in steps)
    # The paged pool holds whole blocks: enough for the tokens, never a block too many.
    for s in steps:
        assert s["pool_blocks"] == -(-s["tokens_with_kv"] // f["block_size"])
    assert r["events"]["blocks_allocated"] >= 2


def test_multi_turn_reuse(env):
    r = run_demo("multi-turn-reuse", env)
    _check_shape(r, "multi-turn-reuse")
    turns = r["findings"]["turns"]
    assert len(turns) == 4 and turns[0]["cached_tokens"] == 0
    for prev, turn in zip(turns, turns[1:]):
        assert turn["cached_tokens"] >= (prev["prompt_tokens"] // 16) * 16 > 0
        assert turn["computed_tokens"] < turn["prompt_tokens"] / 2
        assert turn["cold_ttft_ms"] > 0 and turn["ttft_ms"] > 0
    assert len(r["timings"]) == 4 and all(t["cold_ttft_ms"] for t in r["timings"])


def test_edit_invalidates(env):
    r = run_demo("edit-invalidates", env)
    _check_shape(r, "edit-invalidates")
    f = r["findings"]
    assert f["miss_reason"] == "new_content"
    assert f["invalidated_from_block"] == f["divergence_token"] // 16
    assert f["token_diff"]["first_divergent_token"] == f["divergence_token"]
    # The edit lies inside the edited message, so nothing before that message is lost.
    assert f["edited_message_block"] <= f["invalidated_from_block"]
    assert f["cached_tokens_after"] == f["invalidated_from_block"] * 16
    assert f["edit_cost_tokens"] > 0 and f["blocks_invalidated"] > 0


def test_timestamp_at_front(env):
    r = run_demo("timestamp-at-front", env)
    _check_shape(r, "timestamp-at-front")
    f = r["findings"]
    assert all(x["first_miss_block"] == 0 and x["cached_tokens"] == 0 and x["miss_reason"] == "new_content"
               for x in f["front"])
    assert f["token_diff_front"]["cause"] == "timestamp_or_id"
    assert f["token_diff_front"]["first_divergent_token"] < 16
    assert all(x["cached_tokens"] >= f["system_prompt_blocks"] * 16 > 0 for x in f["end"][1:])
    assert f["tokens_saved_by_moving"] > 0


def test_partial_block(env):
    r = run_demo("partial-block", env)
    _check_shape(r, "partial-block")
    f = r["findings"]
    un, al = f["unaligned"], f["aligned"]
    assert un["tail_tokens"] >= 2 and al["tail_tokens"] == 0
    assert un["first"]["cached_tokens"] == al["first"]["cached_tokens"] == 0
    assert un["second"]["miss_reason"] == "partial_block"
    assert un["second"]["computed_tokens"] == un["tail_tokens"]
    assert al["second"]["miss_reason"] == "last_token"
    assert al["second"]["computed_tokens"] == 16
    assert al["second"]["cached_tokens"] == al["prompt_tokens"] - 16


def test_tenant_salt(env):
    r = run_demo("tenant-salt", env)
    _check_shape(r, "tenant-salt")
    f = r["findings"]
    assert f["cross_tenant_cached_tokens"] == 0 and f["cross_tenant_miss_reason"] == "salt"
    assert f["requests"][1]["other_salt"] == "acme"
    assert f["same_tenant_cached_tokens"] == (f["requests"][2]["prompt_tokens"] - 1) // 16 * 16 > 0
    assert f["token_diff"]["cause"] == "tenant_salt"


def test_eviction_under_pressure(env):
    r = run_demo("eviction-under-pressure", env)
    _check_shape(r, "eviction-under-pressure")
    f = r["findings"]
    again = f["A_again"]
    assert f["evictions_by_C"] >= 1 and f["tail_first"]
    assert again["miss_reason"] == "evicted" and again["hit_blocks"] >= 1
    # The named event is a real eviction of the block A missed at.
    ev = f["eviction_event"]
    assert ev["kind"] == "block_evicted" and ev["seq"] == again["evicted_by_seq"] and ev["by_request_id"] == "doc-C"
    assert again["first_miss_block"] == min(f["evicted_positions_in_A"])
    assert r["events"]["block_evicted"] >= f["evictions_by_C"]


def test_reordered_rag_chunks(env):
    r = run_demo("reordered-rag-chunks", env)
    _check_shape(r, "reordered-rag-chunks")
    f = r["findings"]
    assert f["token_diff_retrieval_order"]["cause"] == "reordered"
    moved = f["token_diff_retrieval_order"]["first_divergent_token"]
    assert f["cached_tokens_reordered"] == moved // 16 * 16
    assert f["cached_tokens_sorted"] == f["shared_document_tokens_sorted"] // 16 * 16
    assert f["cached_tokens_sorted"] > 4 * f["cached_tokens_reordered"]


def test_kv_memory_70b_128k(env):
    r = run_demo("kv-memory-70b-128k", env)
    _check_shape(r, "kv-memory-70b-128k")
    f = r["findings"]
    assert f["preset_matches_config"]
    by = {row["dtype"]: row for row in f["per_dtype"]}
    assert by["bf16"]["per_request_bytes"] == 2 * 80 * 8 * 128 * 2 * 131072  # 40 GiB
    assert by["fp8"]["per_request_bytes"] * 2 == by["bf16"]["per_request_bytes"] == by["int4"]["per_request_bytes"] * 4
    assert by["bf16"]["per_batch_gib"]["8"] == 320.0
    d = f["default_model"]
    assert d["per_request_bytes_bf16_measured"] == d["per_request_bytes_bf16"] == 2 * 30 * 3 * 64 * 2 * 131072
    assert d["dynamic_cache_bytes_per_token_measured"] == 2 * 30 * 3 * 64 * 4


def test_semantic_false_positive(env):
    r = run_demo("semantic-false-positive", env)
    _check_shape(r, "semantic-false-positive")
    f = r["findings"]
    wrong = [q for q in f["queries"] if q["served_wrong_answer"]]
    assert any(q["score"] >= 0.9 and q["category"] == "negation" for q in wrong)
    assert any(q["score"] >= 0.9 and q["category"] == "changed_number" for q in wrong)
    assert all(q["guard_caught"] and q["flags"] for q in wrong)
    assert f["num_right_answers_blocked_by_guard"] == 0 and f["paraphrase_still_served_in_guarded_mode"]
    assert r["events"]["semantic_lookup"] == 2 * len(f["queries"])


def test_prompt_caching_bill(env):
    r = run_demo("prompt-caching-bill", env)
    _check_shape(r, "prompt-caching-bill")
    f = r["findings"]
    assert (f["write_multiplier"], f["read_multiplier"]) == (1.25, 0.1)
    long_, short = f["long_system_prompt"], f["short_system_prompt"]
    first, *rest = long_["requests"]
    assert first["cache_creation_input_tokens"] == first["prompt_tokens"] >= 1024
    for prev, row in zip(long_["requests"], rest):
        assert row["cache_read_input_tokens"] == prev["prompt_tokens"]
    for row in long_["requests"]:
        expected = (row["input_tokens"] + 1.25 * row["cache_creation_input_tokens"]
                    + 0.1 * row["cache_read_input_tokens"])
        assert row["weighted_tokens"] == pytest.approx(expected)
    assert long_["cost_usd"] < long_["cost_without_cache_usd"]
    assert short["silently_uncached_requests"] == len(short["requests"])
    assert short["cost_usd"] == short["cost_without_cache_usd"]


def test_default_system_prompt_diff(env):
    r = run_demo("default-system-prompt-diff", env)
    _check_shape(r, "default-system-prompt-diff")
    f = r["findings"]
    assert "SmolLM" in f["default_system_prompt"]
    assert f["token_diff"]["cause"] == "default_system_prompt"
    assert f["token_diff"]["first_divergent_token"] < 16
    assert f["cached_tokens_turn_2"] == 0 and f["turn_2"]["first_miss_block"] == 0
    assert f["cached_tokens_fixed_turn_2"] > 0


# ---------------------------------------------------------------------------- command line
def test_cli_list(capsys):
    assert main(["demo", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(DEMO_NAMES)


def test_cli_bad_name_is_one_line_exit_2(capsys):
    assert main(["demo", "no-such-demo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no-such-demo" in err and "--list" in err
    assert main(["demo"]) == 2


def test_cli_json(capsys):
    assert main(["demo", "prompt-caching-bill", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["name"] == "prompt-caching-bill"
    assert out["findings"]["long_system_prompt"]["savings_fraction"] > 0.5


def test_cli_human_output(capsys):
    assert main(["demo", "prompt-caching-bill"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("What hosted prompt caching bills\n")
    assert "silently not cached" in out and "\nfindings:\n" in out
