"""Shared test set-up: offline, headless, and deterministic."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---------------------------------------------------------------- shared model fixtures
# Loaded once per test session: the real default model takes ~1 s after its first
# conversion (which takes ~20 s and is cached in the user cache directory).
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def default_tokenizer():
    """The tokenizer (with chat template) of the bundled SmolLM2-135M-Instruct."""
    from engine.model.loader import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def default_model():
    """The real default model, SmolLM2-135M-Instruct in float32, as an engine LoadedModel."""
    from engine.model.loader import load_model

    return load_model()


@pytest.fixture(scope="session")
def tiny_model(default_tokenizer):
    """A tiny randomly initialised Llama (2 layers, 2 KV heads, head dim 16) with the default tokenizer."""
    from engine.model.loader import tiny_random_model

    return tiny_random_model(seed=0, tokenizer=default_tokenizer)


@pytest.fixture
def window(qtbot, tmp_path):
    """The main window on a test context (settings in tmp_path), without a model."""
    from app.context import make_test_context
    from app.main_window import MainWindow

    ctx = make_test_context(tmp_path)
    win = MainWindow(ctx, load_model=False)
    qtbot.addWidget(win)
    yield win
    ctx.shutdown()
