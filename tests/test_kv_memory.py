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
