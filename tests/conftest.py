"""Shared test set-up: offline, headless, and deterministic."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402

# ---------------------------------------------------------------- the `model` marker
# `-m "not model"` must be a run that loads no model: a test that asks for the real model
# is marked here, and one that loads weights some other way without the marker errors.
MODEL_FIXTURES = frozenset({"default_model", "embedder"})
_LOADS_KEY = pytest.StashKey[list]()  # config: loads so far, in a one-item list
_LOADS_BEFORE = pytest.StashKey[int]()  # item: loads when its setup began


def pytest_configure(config):
    import engine.model.loader as loader
    import engine.semantic.cache as semantic_cache

    loads = [0]
    config.stash[_LOADS_KEY] = loads  # read back by the setup/teardown hooks below

    def counting(fn):
        def wrapper(*args, **kwargs):
            result = fn(*args, **kwargs)  # a load that fails (a corrupt file) loaded nothing
            loads[0] += 1
            return result
        wrapper.__wrapped__ = fn
        return wrapper

    loader._load = counting(loader._load)
    semantic_cache.Embedder.__init__ = counting(semantic_cache.Embedder.__init__)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


def pytest_runtest_setup(item):
    item.stash[_LOADS_BEFORE] = item.config.stash[_LOADS_KEY][0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the test's own fixtures are torn down first
    before = item.stash.get(_LOADS_BEFORE, None)
    loaded = before is not None and item.config.stash[_LOADS_KEY][0] > before
    if loaded and item.get_closest_marker("model") is None:
        raise AssertionError(f"{item.nodeid} loads a model but has no @pytest.mark.model: "
                             "-m 'not model' would not be model-free")


# ---------------------------------------------------------------- shared model fixtures
# Loaded once per test session: the real default model takes ~1 s after its first
# conversion (which takes ~20 s and is cached in the user cache directory).


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
    from app.runtime.context import make_test_context
    from app.window.main_window import MainWindow

    ctx = make_test_context(tmp_path)
    win = MainWindow(ctx, load_model=False)
    qtbot.addWidget(win)
    yield win
    ctx.shutdown()
