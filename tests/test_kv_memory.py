"""KV memory: presets, configs, the formula, and measured bytes of real tensors."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from engine.core.errors import InputError
from engine.model.kv_memory import PRESETS, kv_memory_report, preset, shape_from_config
from engine.model.kv_pool import measure_loaded_model


def _run_json(capsys, *argv: str) -> dict:
    assert main(["kv-memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_llama_8b_preset_matches_published_figure(capsys):
    # Llama 3.1 8B in bf16: 128 KiB per token (32 layers * 8 KV heads * 128 * 2 * 2 bytes)
    r = _run_json(capsys, "--preset", "llama-3.1-8b", "--tokens", "1000")
    assert r["bytes_per_token"] == 131072
    assert r["total_bytes"] == 131072 * 1000 == sum(r["per_layer_bytes"])
    assert len(r["per_layer_bytes"]) == 32 and (r["layers"], r["kv_heads"], r["head_dim"]) == (32, 8, 128)
    assert r["formula"] == "2 * layers * kv_heads * head_dim * bytes_per_value * tokens"


@pytest.mark.parametrize("dtype,expected", [("fp32", 4), ("fp16", 2), ("fp8", 1), ("int4", 0.5)])
def test_dtypes_scale_the_bytes(dtype, expected):
    r = kv_memory_report(preset("smollm2-135m"), 64, dtype)
    assert r["total_bytes"] == int(2 * 30 * 3 * 64 * expected * 64)


def test_deepseek_latent_attention_is_not_two_times_heads():
    r = kv_memory_report(PRESETS["deepseek-v3"], 1, "bf16")
    assert r["attention"] == "mla"
    assert r["bytes_per_token"] == 61 * (512 + 64) * 2
    assert "latent" in r["note"] and "512" in r["note"] and "64" in r["note"]


def test_config_file_and_bad_configs(tmp_path, capsys):
    cfg = {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = _run_json(capsys, "--config", str(path), "--tokens", "10")
    assert r["bytes_per_token"] == kv_memory_report(PRESETS["qwen2.5-7b"], 1)["bytes_per_token"]
    mla = shape_from_config({"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                             "num_attention_heads": 128, "qk_nope_head_dim": 128, "v_head_dim": 128})
    assert mla == PRESETS["deepseek-v3"].__class__(mla.name, 61, 1, 576, 1, "mla", mla.note)
    path.write_text("{not json")
    assert main(["kv-memory", "--config", str(path), "--tokens", "1"]) == 2
    assert "config.json, line 1: not valid JSON" in capsys.readouterr().err
    with pytest.raises(InputError, match="num_hidden_layers"):
        shape_from_config({"hidden_size": 1})
    assert main(["kv-memory", "--preset", "gpt-9", "--tokens", "1"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.model
def test_measured_bytes_of_the_default_model_equal_the_formula(default_model):
    r = kv_memory_report(shape_from_config(default_model.model.config.to_dict()), 2048, "fp32")
    m = measure_loaded_model(default_model, 2048, "fp32")
    assert m["pool_measured_directly"]
    assert m["per_layer_bytes"] == r["per_layer_bytes"] and m["total_bytes"] == r["total_bytes"]
    assert r["total_bytes"] == 2 * 30 * 3 * 64 * 4 * 2048
    assert m["dynamic_cache_bytes_per_token"] == r["bytes_per_token"]


# ---------------------------------------------------------------------------- the panel
def _open(qtbot, window, path):
    done: list = []
    window.ctx.answer_replace = True
    assert window.open_file(path, on_done=done.append)
    qtbot.waitUntil(lambda: bool(done), timeout=300_000)
    window.ctx.bridge.flush(everything=True)
    assert done[0] is not None
    return done[0]


def _trace_tokens(path) -> int:
    """Tokens of the pool File > Open sizes for `path` (blocks from the trace, times its block size)."""
    from app.runtime.jobs import trace_block_size
    from app.runtime.replays import capacity_of
    from engine.core.trace import load_trace

    bs = trace_block_size(path)
    return capacity_of(load_trace(path, bs), bs) * bs


def test_the_panel_follows_every_opened_trace(qtbot, window, tiny_model):
    """Built before two traces are opened, the panel's what-if counts the second one's pool
    (it kept the first one's 1,888 tokens), and says so in the figure it prints."""
    from engine.core.events import EventBus
    from engine.model.runner import ModelRunner
    from engine.resources import resource_path

    ctx = window.ctx
    ctx.suppress_dialogs = True
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=4, seed=0, events=EventBus())
    ctx.set_runner(runner)
    kv = window.panels["kv_memory"]  # built now, on the model's pool, before any trace
    assert not kv.plot.isHidden() and kv.per_layer == list(runner.kv_pool.per_layer_bytes())
    assert kv.tokens_box.value() == 64 * 4
    traces = resource_path("traces")
    first, second = traces / "demo_tokens.jsonl", traces / "mooncake_synthetic_trace.jsonl"
    _open(qtbot, window, first)
    assert kv.tokens_box.value() == _trace_tokens(first) == 1_888
    # the user's own count stands over a redraw (a theme change) ...
    kv.tokens_box.setValue(5_000)
    window.apply_theme("light", save=False)
    assert kv.tokens_box.value() == 5_000
    # ... until the next engine: the second trace's pool, whatever was typed
    _open(qtbot, window, second)
    tokens = _trace_tokens(second)
    assert tokens != 1_888 and kv.tokens_box.value() == tokens
    assert ctx.state.engine_info["num_blocks"] * ctx.state.engine_info["block_size"] == tokens
    kv.preset_box.setCurrentIndex(kv.preset_box.findData("llama-3.1-8b"))
    kv.dtype_box.setCurrentText("bfloat16")
    assert kv.what_if_bytes == kv_memory_report(PRESETS["llama-3.1-8b"], tokens, "bf16")["total_bytes"]
    assert f"{tokens:,}" in kv.what_if.text()
    # a trace has no model pool: no bars, though the model's runner stays loaded behind it
    assert ctx.runner is runner
    assert kv.plot.isHidden() and "replayed without a model" in kv.totals.text()
    assert "File > New session" in kv.totals.text()
    assert ctx.errors == []


def test_the_panel_follows_an_adopted_log_the_engine_did_not_size(qtbot, tmp_path):
    """A trace cancelled before the worker sized its pool: the engine says 0 blocks, the
    adopted log holds the pool, and the what-if counts that."""
    from app.runtime.context import make_test_context
    from app.runtime.replays import kernel_replay_job
    from app.views.pool.kv_memory_view import KvMemoryView
    from engine.resources import resource_path

    ctx = make_test_context(tmp_path)
    try:
        view = KvMemoryView(ctx)
        qtbot.addWidget(view)
        _, log = kernel_replay_job(str(resource_path("traces") / "demo_tokens.jsonl"), 16, 37)
        ctx.state.set_engine({"num_blocks": 0, "block_size": 16})
        assert view.tokens_box.value() == 1  # nothing to follow yet
        ctx.state.adopt_log(log)
        assert view.tokens_box.value() == 37 * 16
    finally:
        ctx.shutdown()


def test_the_bar_plot_fits_the_dock_beside_a_long_text(qtbot, window):
    """The text column scrolls by itself: the panel is never taller than its dock, so the
    plot's x axis stays in view (with the quantized findings the plot ran off the bottom)."""
    from app.runtime.context import engine_info
    from engine.model.kv_memory import kv_bytes

    ctx = window.ctx
    per_layer = [kv_bytes(1, 3, 64, 4, 16 * 64)] * 30
    ctx.new_event_bus(engine_info(block_size=16, num_blocks=64, model="SmolLM2-135M-Instruct", num_layers=30,
                                  num_kv_heads=3, head_dim=64, dtype="float32", per_layer_bytes=per_layer))
    kv = window.panels["kv_memory"]
    row = {"context": "long", "tokens_with_kv": 264, "fp32_bytes": 2 * 30 * 3 * 64 * 4 * 264,
           "bf16_bytes": 2 * 30 * 3 * 64 * 2 * 264, "quantized_bytes": 685_440, "capacity_vs_bf16": 1.75,
           "fp32_ttft_ms": 596.0, "quantized_ttft_ms": 578.0, "fp32_decode_ms_per_token": 155.0,
           "quantized_decode_ms_per_token": 191.0, "decode_logit_max_abs_diff": 3.37}
    kv.show_quantized({"nbits": 4, "group_size": 64, "backend": "optimum-quanto", "unpack": "torch",
                       "contexts": [dict(row, context="short", tokens_with_kv=52), row],
                       "refusal": {"group_size": 48, "engine_refusal": "a quantization group of 48 values does "
                                   "not divide the head dimension 64"}})
    window.show()
    qtbot.waitExposed(window)
    dock = window.docks["kv_memory"]
    dock.raise_()
    for size in ((1600, 1000), (1280, 800)):
        window.resize(*size)
        qtbot.wait(50)
        holder = dock.widget()
        assert kv.height() <= holder.viewport().height()  # no scrolling of the whole panel
        bottom = kv.plot.mapTo(kv, kv.plot.rect().bottomLeft()).y()
        assert kv.plot.isVisible() and bottom < kv.height()
        assert kv.text_area.geometry().bottom() < kv.height()
        assert kv.text_area.verticalScrollBar().maximum() > 0  # the text scrolls instead
    # a tall dock stacks them: the text takes what its lines need, the plot the rest, both inside
    from app.views.pool.kv_memory_view import KvMemoryView

    tall = KvMemoryView(ctx)
    qtbot.addWidget(tall)
    tall.show()
    tall.resize(796, 526)
    qtbot.waitUntil(lambda: tall.text_area.geometry().top() > tall.plot.geometry().bottom())
    assert tall.text_area.geometry().bottom() < tall.height() and tall.plot.height() > 200
    assert tall.text_area.verticalScrollBar().maximum() == 0  # the short text fits whole


@pytest.fixture
def kv_alone(qtbot, tmp_path):
    """A KV memory panel on a fresh context of its own: no model, no window."""
    from app.runtime.context import make_test_context
    from app.views.pool.kv_memory_view import KvMemoryView

    ctx = make_test_context(tmp_path)
    view = KvMemoryView(ctx)
    qtbot.addWidget(view)
    yield view, ctx
    ctx.shutdown()


def test_each_state_without_a_pool_says_what_to_do(kv_alone):
    """No measured pool: why, and what the user can do, in each real state."""
    from types import SimpleNamespace

    from app.runtime.context import Subject

    view, ctx = kv_alone
    text = view.totals.text
    assert "No model loaded yet" in text() and "Engine > Load model" in text() and "what-if" in text()
    assert view.plot.isHidden()
    ctx.model_error = "The model could not be loaded: OSError: no such file (model.safetensors)."
    view.show()  # the panel looks again when it is shown
    assert "no such file (model.safetensors). Load it again with Engine > Load model" in text()
    ctx.model_error = None
    ctx.set_runner(SimpleNamespace(), activate=False)  # loaded, not run in this session yet
    assert text().startswith("The model is loaded: send a message")
    for subject, words in ((Subject("trace", "t.jsonl"), "The trace \u201ct.jsonl\u201d is replayed without a model"),
                           (Subject("demo", "Some demo"), "The demo \u201cSome demo\u201d runs without the model"),
                           (Subject("server", "vLLM tcp://h:5557"),
                            "The server \u201cvLLM tcp://h:5557\u201d keeps its KV tensors on its own GPUs"),
                           (Subject("usage", "log.jsonl"), "The usage log \u201clog.jsonl\u201d records an API's")):
        ctx.open_subject(subject)
        assert text().startswith(words) and "File > New session" in text(), text()
        assert "No model pool yet" not in text()
    ctx.open_subject(Subject("trace", "<b>x</b>.jsonl"))  # the label is rich text: a name is shown as it is
    assert "\u201c&lt;b&gt;x&lt;/b&gt;.jsonl\u201d" in text()


def test_a_measured_pool_replaces_the_sentence(kv_alone):
    from app.runtime.bridge import engine_info
    from app.runtime.context import Subject
    from engine.model.kv_memory import kv_bytes

    view, ctx = kv_alone
    ctx.open_subject(Subject("session", "New session"))
    per_layer = [kv_bytes(1, 3, 64, 4, 16 * 64)] * 30
    ctx.new_event_bus(engine_info(block_size=16, num_blocks=64, model="SmolLM2-135M-Instruct", num_layers=30,
                                  num_kv_heads=3, head_dim=64, dtype="float32", per_layer_bytes=per_layer))
    assert "\u2713 equals" in view.totals.text() and not view.plot.isHidden()
