"""The performance demos of issue 23 on the real model: the quantized KV cache, prefill-only
savings, the cost of hashing unique prompts, and deepcopy against shared blocks.

Timings are reported by the demos, never asserted here: these tests check what must hold
whatever the machine's load: bytes against their formulas, the same tokens out, nothing
reused where nothing can be, the blocks shared, and the refusal of a bad group size.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from app.cli import main
from engine.core.errors import InputError
from engine.demos import DEMO_NAMES, DemoEnv, run_demo
from engine.model.kv_memory import check_group_size, kv_bytes, quantized_kv_bytes

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PERF_DEMOS = ("quantized-kv-cache", "prefix-saves-prefill-only", "hashing-costs-something",
              "deepcopy-vs-shared-blocks")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    import torch  # shared cores: see tests/test_demos.py

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def results(default_model):
    """Each demo run once for the module, on the shared model."""
    env = DemoEnv(model=default_model)
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = run_demo(name, env)
        return cache[name]

    return get


# ---------------------------------------------------------------------------- arithmetic
def test_group_size_must_divide_head_dim():
    for group in (8, 16, 32, 64):
        check_group_size(64, group)
    for group in (48, 128, 0, 7):
        with pytest.raises(InputError) as err:
            check_group_size(64, group)
        message = str(err.value)
        assert str(group) in message and "64" in message and "\n" not in message
    with pytest.raises(InputError):
        quantized_kv_bytes(30, 3, 64, 100, nbits=4, group_size=48)
    with pytest.raises(InputError):
        quantized_kv_bytes(30, 3, 64, 100, nbits=3)


def test_quantized_bytes_formula():
    # 4 bits a value plus a float32 scale and zero point per 64 values: 0.625 bytes a value.
    values = 2 * 30 * 3 * 64 * 100
    assert quantized_kv_bytes(30, 3, 64, 100) == values // 2 + values // 64 * 8
    # The unquantized residual window is float32, like the model's own cache.
    assert quantized_kv_bytes(30, 3, 64, 0, residual_tokens=10) == kv_bytes(30, 3, 64, 4, 10)
    # Two bits halve the packed values; the scales stay.
    assert quantized_kv_bytes(30, 3, 64, 100, nbits=2) == values // 4 + values // 64 * 8


def test_every_perf_demo_is_listed():
    from engine.demos import get_demo

    assert set(PERF_DEMOS) <= set(DEMO_NAMES)
    for name in PERF_DEMOS:
        demo = get_demo(name)
        assert 2 <= demo.explanation.count(". ") + 1 <= 5 and "\n" not in demo.summary
        assert demo.needs == frozenset({"model"})


# ---------------------------------------------------------------------------- 1. quantized
def check_quantized_kv_cache(r: dict) -> None:
    """The quantized demo's result (run once, by the app: test_quantized_demo_fills_the_kv_memory_panel)."""
    f = r["findings"]
    assert f["backend"] == "optimum-quanto" and f["nbits"] == 4 and f["group_size"] == 64
    short, long = f["contexts"]
    assert short["prompt_tokens"] < long["prompt_tokens"]
    for c in (short, long):
        # Measured tensors against the formulas: float32 and its bf16 copy, and the 4-bit layout.
        assert c["fp32_bytes"] == c["fp32_formula_bytes"] == 2 * c["bf16_bytes"]
        assert c["quantized_bytes"] == c["quantized_formula_bytes"]
        assert c["quantized_bytes"] < c["bf16_bytes"] < c["fp32_bytes"]
        # The prompt's own logits come from the unquantized keys; decoding reads the quantized ones.
        assert c["first_token_logit_max_abs_diff"] == 0.0
        assert c["decode_logit_max_abs_diff"] > 0.0
        assert c["steps_compared"] >= 8
    # The residual window is a fixed cost, so a longer context gains more.
    assert long["capacity_vs_bf16"] > short["capacity_vs_bf16"] > 1.5
    assert long["capacity_vs_bf16"] >= 2.5
    refusal = f["refusal"]
    assert "48" in refusal["engine_refusal"] and "64" in refusal["engine_refusal"]
    checks = {(c["group_size"], c["prompt_tokens"] % 2): c for c in refusal["quanto_checks"]}
    assert not checks[(48, short["prompt_tokens"] % 2)]["quanto_refused"]  # quanto lets 48 straddle heads
    assert not checks[(128, 0)]["quanto_refused"] and checks[(128, 1)]["quanto_refused"]
    assert "divisor" in checks[(128, 1)]["quanto_error"]
    # The pure-torch unpack: quanto's C++ extension was never built or loaded.
    from optimum.quanto.library.extensions.cpp import ext

    assert ext._lib is None
    assert r["engines"] and r["engines"][0]["num_blocks"] * 16 >= long["tokens_with_kv"]


# ---------------------------------------------------------------------------- 2. prefill only
def test_prefix_saves_prefill_only(results):
    f = results("prefix-saves-prefill-only")["findings"]
    turns = f["turns"]
    assert len(turns) == 4 and turns[0]["cached_tokens"] == 0 and f["turns_with_reuse"] == 3
    for t in turns[1:]:
        assert t["computed_tokens"] < t["cold_computed_tokens"] == t["prompt_tokens"]
        assert t["decoded_tokens"] == t["cold_decoded_tokens"] == f["decode_tokens_per_turn"]
        assert t["cold_decode_ms_per_token"] > 0 and t["decode_ms_per_token"] > 0
    assert f["prefill_tokens_saved"] > 0 and f["decode_tokens_saved"] == 0
    assert f["all_outputs_identical"]
    for key in ("first_token_speedup", "end_to_end_speedup", "decode_ms_per_token_ratio"):
        assert f[key] > 0


# ---------------------------------------------------------------------------- 3. hashing costs
def test_hashing_costs_something(results):
    r = results("hashing-costs-something")
    f = r["findings"]
    assert f["prompts"] == 12 and f["cached_tokens"] == 0
    # Every full block was hashed and stored for nothing (decoding may fill a few more).
    assert r["events"]["block_stored"] == f["blocks_stored"] >= f["full_prompt_blocks"] > 0
    assert f["bookkeeping_ms"] > 0 and 0 < f["break_even_reuse_rate"] < 1
    assert f["all_outputs_identical"]
    assert {"on_throughput_tokens_per_s", "off_throughput_tokens_per_s", "throughput_on_lower"} <= set(f)


# ---------------------------------------------------------------------------- 7. deepcopy
@pytest.fixture(scope="module")
def deepcopy_by_cli():
    """`cachescope demo deepcopy-vs-shared-blocks --json`, run once in-process: the command
    loads the default model itself, and both tests below read its one JSON line."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["demo", "deepcopy-vs-shared-blocks", "--json"]) == 0
    return json.loads(out.getvalue())


@pytest.mark.model
def test_deepcopy_against_shared_blocks(deepcopy_by_cli):
    r = deepcopy_by_cli
    f = r["findings"]
    assert f["continuations"] == 4 and f["all_outputs_identical"]
    assert f["shared_blocks"] == f["shared_prefix_tokens"] // f["block_size"] > 0
    # A deepcopy holds the whole prefix again; a continuation of shared blocks only its own tail.
    assert f["deepcopy_bytes_per_continuation"] == f["shared_prefix_tokens"] * f["bytes_per_token"]
    assert f["block_bytes"] == f["block_size"] * f["bytes_per_token"]
    assert f["shared_bytes_per_continuation"] < f["deepcopy_bytes_per_continuation"]
    assert f["memory_ratio"] > 1
    # While all four run, the shared prefix's blocks are held once, by all four.
    assert f["max_ref_count_while_running"] == f["continuations"]
    assert f["blocks_at_max_ref_count"] == f["shared_blocks"]
    followers = [s for s in r["steps"] if s["action"].startswith("shared blocks")][1:]
    assert len(followers) == 3
    assert all(s["cached_tokens"] == f["shared_block_tokens"] for s in followers)


@pytest.mark.model
def test_cli_json_carries_the_numbers(deepcopy_by_cli):
    out = deepcopy_by_cli
    assert out["name"] == "deepcopy-vs-shared-blocks"
    assert out["findings"]["deepcopy_bytes_per_continuation"] > out["findings"]["shared_bytes_per_continuation"]
    assert out["findings"]["all_outputs_identical"]


# ---------------------------------------------------------------------------- the app
def test_quantized_demo_fills_the_kv_memory_panel(qtbot, window, default_model):
    pytest.importorskip("pytestqt")
    from app.demos.runner import install_demos

    runner = install_demos(window, model=default_model)
    with qtbot.waitSignal(runner.sigFinished, timeout=300_000) as blocker:
        assert runner.run("quantized-kv-cache")
    assert window.ctx.subject.kind == "demo" and window.ctx.subject.source == "quantized-kv-cache"
    findings = blocker.args[0]["findings"]
    check_quantized_kv_cache(blocker.args[0])  # the demo's own findings, from this one run
    view = window.panels["kv_memory"]
    text = view.quantized.text()
    assert not view.quantized.isHidden()
    assert "Group size 48 refused" in text and "4-bit" in text
    assert view.preset_box.currentData() is None and view.dtype_box.currentText() == "bfloat16"
    assert view.tokens_box.value() == findings["contexts"][-1]["tokens_with_kv"]
    # The panel measured the demo's pool of this model (float32, 30 layers).
    assert len(view.per_layer) == 30
    assert window.ctx.errors == []
