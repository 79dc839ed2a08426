"""Model loading: the bundled SmolLM2 GGUF, its cached conversion, and clear errors."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from engine.core.errors import InputError
from engine.model.loader import _converted_dir, default_gguf_path, load_model, load_tokenizer, resolve_model


def test_default_model_shape_and_chat_template(default_model):
    assert default_model.name == "SmolLM2-135M-Instruct"
    assert (default_model.num_layers, default_model.num_kv_heads, default_model.head_dim) == (30, 3, 64)
    assert str(default_model.dtype) == "torch.float32"
    assert default_model.tokenizer.chat_template
    ids = default_model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                                      add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>assistant" in ids


def test_conversion_is_cached_as_plain_safetensors(default_model):
    folder = _converted_dir(default_gguf_path()) / "model"
    assert any(folder.glob("*.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config  # a plain float checkpoint, loadable by anyone
    assert config["num_key_value_heads"] == 3


def test_tokenizer_alone_matches_the_model_tokenizer(default_model, default_tokenizer):
    tokenizer = default_tokenizer  # load_tokenizer(), shared by the session
    text = "Cachescope shows what the KV cache holds."
    assert tokenizer(text)["input_ids"] == default_model.tokenizer(text)["input_ids"]


def test_local_folder_loads(default_model, tmp_path):
    folder = tmp_path / "smol"
    shutil.copytree(_converted_dir(default_gguf_path()) / "model", folder)
    for f in (_converted_dir(default_gguf_path()) / "tokenizer").iterdir():
        shutil.copy(f, folder / f.name)
    loaded = load_model(str(folder))
    assert loaded.num_layers == 30 and loaded.model_id.startswith("folder:")


@pytest.fixture()
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CACHESCOPE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_truncated_gguf_is_one_clear_sentence(private_cache):
    bad = private_cache / "cut.gguf"
    with default_gguf_path().open("rb") as src:
        bad.write_bytes(src.read(300_000))
    with pytest.raises(InputError, match="truncated or corrupt|truncated") as info:
        load_model(str(bad))
    assert str(bad) in str(info.value) and "\n" not in str(info.value)
    assert not any((private_cache / "cache").rglob("*.safetensors"))


def test_corrupt_gguf_is_one_clear_sentence(private_cache):
    bad = private_cache / "junk.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    with pytest.raises(InputError, match="corrupt"):
        load_model(str(bad))
    not_gguf = private_cache / "text.gguf"
    not_gguf.write_text("hello")
    with pytest.raises(InputError, match="not a GGUF"):
        load_tokenizer(str(not_gguf))


def test_missing_paths_and_uncached_hub_ids(private_cache):
    with pytest.raises(InputError, match="no such model"):
        resolve_model(str(private_cache / "nowhere.gguf"))
    (private_cache / "empty").mkdir()
    with pytest.raises(InputError, match="config.json"):
        resolve_model(str(private_cache / "empty"))
    (private_cache / "weights.bin").write_bytes(b"x")
    with pytest.raises(InputError, match=".gguf"):
        resolve_model(str(private_cache / "weights.bin"))
    with pytest.raises(InputError, match="HF_HUB_OFFLINE"):
        load_model("cachescope-tests/no-such-model")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # the 540 MB of weights, without writing them again
    except OSError:
        shutil.copy2(src, dst)


@pytest.mark.slow
@pytest.mark.model
def test_a_damaged_conversion_in_the_cache_is_redone(tmp_path, monkeypatch):
    real = _converted_dir(default_gguf_path())
    monkeypatch.setenv("CACHESCOPE_CACHE_DIR", str(tmp_path / "cache"))
    # a private copy of the default GGUF, so the shared cache is left alone
    gguf = tmp_path / "smol.gguf"
    shutil.copy(default_gguf_path(), gguf)
    folder = _converted_dir(gguf)
    shutil.copytree(real / "tokenizer", folder / "tokenizer")
    (folder / "model").mkdir()
    shutil.copy(real / "model" / "config.json", folder / "model" / "config.json")
    (folder / "model" / "model.safetensors").write_bytes(b"\x00" * 1000)  # as after a crash or a bad disk
    tokenizer_before = (folder / "tokenizer").stat().st_ino
    import gguf as gguf_py

    reader, name_map = gguf_py.GGUFReader, gguf_py.get_tensor_name_map
    loaded = load_model(str(gguf))
    assert loaded.num_layers == 30
    assert (folder / "model" / "model.safetensors").stat().st_size > 100_000_000
    # only the part that failed to load is converted again: the tokenizer folder is the same one
    assert (folder / "tokenizer").stat().st_ino == tokenizer_before
    # the conversion parsed the GGUF once (engine.model.loader._gguf_read_once) and put gguf back
    assert (gguf_py.GGUFReader, gguf_py.get_tensor_name_map) == (reader, name_map)


@pytest.mark.slow
@pytest.mark.model
def test_a_damaged_tokenizer_in_the_cache_is_redone_and_the_weights_kept(tmp_path, monkeypatch, default_tokenizer):
    real = _converted_dir(default_gguf_path())
    monkeypatch.setenv("CACHESCOPE_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "smol.gguf"
    shutil.copy(default_gguf_path(), gguf)
    folder = _converted_dir(gguf)
    shutil.copytree(real / "model", folder / "model", copy_function=_link_or_copy)
    shutil.copytree(real / "tokenizer", folder / "tokenizer")
    (folder / "tokenizer" / "tokenizer.json").write_text('{"version": "1.0", "model": ')  # cut short
    weights_before = (folder / "model").stat().st_ino
    loaded = load_model(str(gguf))
    assert loaded.num_layers == 30
    text = "Cachescope shows what the KV cache holds."
    assert loaded.tokenizer(text)["input_ids"] == default_tokenizer(text)["input_ids"]
    assert json.loads((folder / "tokenizer" / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert (folder / "model").stat().st_ino == weights_before


def test_a_conversion_under_way_elsewhere_is_waited_for_and_cancellable(private_cache):
    """Another process converting the same GGUF holds its lock: this load waits (saying so
    through progress, where Cancel can stop it) instead of converting it a second time."""
    import fcntl

    from engine.model import loader

    gguf = private_cache / "smol.gguf"
    shutil.copy(default_gguf_path(), gguf)
    folder = _converted_dir(gguf)
    folder.parent.mkdir(parents=True)
    steps = []

    def progress(text: str, fraction: float) -> None:
        steps.append(text)
        if len(steps) == 3:
            raise loader.LoadCancelled("cancelled")

    with open(folder.parent / f"{folder.name}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(loader.LoadCancelled):
            load_model(str(gguf), progress=progress)
    assert steps == [f"waiting for another cachescope to convert {gguf.name}"] * 3
    assert not folder.exists(), "nothing was converted while the other process held the lock"
