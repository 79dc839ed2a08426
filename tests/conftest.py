"""Shared test set-up: offline, headless, and deterministic."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread for torch and BLAS in every worker and the commands it starts, as the
# app gives the model on a 2-core machine (app.runtime.jobs.model_threads): the suite's
# workers share the cores, and a parallel matmul waits at every barrier for a thread that
# another worker's test has descheduled. Measured under load: test_compare's model demo
# took 163 s (76 s CPU) with torch's default of 2 threads, 38 s (35 s CPU) with 1.
os.environ.setdefault("OMP_NUM_THREADS", "1")


import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

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

    if "torch" in sys.modules:  # imported before this file (a plugin): OMP_NUM_THREADS came too late
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    loader._load = counting(loader._load)
    semantic_cache.Embedder.__init__ = counting(semantic_cache.Embedder.__init__)
    if _is_xdist_controller(config):
        config.option.loadscopereorder = False  # files start in the workers' order: see LONGEST_FILES
        _start_numba_warmup(config)
    _hold_numba_until_warm(config)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
    if hasattr(config, "workerinput"):
        items[:] = _longest_files_first(items)


# ---------------------------------------------------------------- the order files start in
# `make test` gives each worker whole files (--dist loadfile) in the order the workers
# collected them (xdist's own reorder, by number of tests, is turned off above): a long file
# that starts last ends last while the other workers idle. So the files that took longest
# start first (measured one by one, CPU seconds under load, 2026-12-01); the rest follow by
# number of tests, as xdist would order them. A file missing from the list only starts later.
# The second row on: a whole -n 2 run at load 5-7 (2026-12-03), its 80 slowest tests summed
# by file (wall s): few tests each, so by number of tests they started among the last.
LONGEST_FILES = (
    "test_hostile_round2.py", "test_compare.py", "test_demos.py", "test_demos_perf.py",  # 155, 106, 94, 73
    "test_models.py", "test_cacheblend.py", "test_gui_shell.py", "test_weka.py",  # 47, 47, 45, 43
    "test_selftest.py", "test_weka_app.py", "test_hostile_app.py",  # 38, 37, 30
    "test_demos_prompts.py", "test_boundaries.py", "test_compare_gui.py", "test_packaging.py",  # 40, 31, 24, 21
    "test_window_layout.py", "test_kernel_cache.py",  # 18, 17
)
# Long files of few tests whose commands subscribe in a subprocess (the subscriber compiles
# fastwire, and only the workers wait for the warm-up): not first, while the pool part may
# still be compiling, nor last; they start among the files of about this many tests.
MIDDLE_FILES = ("test_fleet_attach.py", "test_subscriber_close.py", "test_vllm_publish.py",  # 33, 23, 22
                "test_attach_hostile.py", "test_sglang_attach.py")  # 17, 16
MIDDLE_AS_TESTS = 20


def _longest_files_first(items: list) -> list:
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}

    def key(path: str) -> tuple[int, int]:
        name = path.rsplit("/", 1)[-1]
        return rank.get(name, len(rank)), -(MIDDLE_AS_TESTS if name in MIDDLE_FILES else len(files[path]))

    return [item for path in sorted(files, key=key) for item in files[path]]


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


# ---------------------------------------------------------------- numba, compiled once a run
# Under pytest-xdist the controller compiles the engine's numba functions into numba's disk
# cache (tests/_warmup.py: the kernel and the columnar pool, two processes side by side)
# while the workers start, collect and run their first tests, and a worker's first call of a
# function they compile waits for its part (`_hold_numba_until_warm`): a fresh clone
# compiles them once, not once per worker at the same moment.
# With a warm cache they load in a few seconds of CPU.
_WARMUP_ENV = "CACHESCOPE_TEST_NUMBA_WARMUP"  # the files the warm-ups write when they end
_WARMUP_PARTS = ("kernel", "pool")
_WARMUP_WAIT_S = 600.0
_WARMUP_KEY = pytest.StashKey[tuple]()  # controller: (processes, done files, folder)


def _is_xdist_controller(config) -> bool:
    return (not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") != "no"
            and bool(getattr(config.option, "tx", None)) and not config.getoption("collectonly"))


def _start_numba_warmup(config) -> None:
    folder = Path(tempfile.mkdtemp(prefix="cachescope-warmup-"))
    procs, dones = [], []
    for part in _WARMUP_PARTS:
        done = folder / f"{part}.done"
        with open(folder / f"{part}.log", "w") as log:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_warmup.py")), part, str(done)],
                                    stdout=log, stderr=subprocess.STDOUT, cwd=str(config.rootpath))

        def reap(proc=proc, done=done, part=part) -> None:  # a crash writes no file: say so, so no one waits
            code = proc.wait()
            if not done.exists():
                done.write_text(f"{part} failed: exit status {code}\n")

        threading.Thread(target=reap, name=f"numba-warmup-{part}", daemon=True).start()
        procs.append(proc)
        dones.append(done)
    os.environ[_WARMUP_ENV] = os.pathsep.join(map(str, dones))  # workers spawn after configure: they inherit it
    config.stash[_WARMUP_KEY] = (procs, dones, folder)


def _wait_for_warmup(parts) -> None:
    dones = dict(zip(_WARMUP_PARTS, os.environ[_WARMUP_ENV].split(os.pathsep)))
    start = time.monotonic()
    deadline = start + _WARMUP_WAIT_S
    while not all(Path(dones[part]).exists() for part in parts) and time.monotonic() < deadline:
        time.sleep(0.1)
    _extend_test_timeout(time.monotonic() - start)


def _extend_test_timeout(seconds: float) -> None:
    """The wait for the warm-up does not count against the waiting test's pytest-timeout
    (300 s, pyproject.toml): the pool part took 305-324 s on a loaded machine, and a test
    whose first compiled call waited for it would be killed mid-wait. pytest-timeout's
    signal method arms ITIMER_REAL for the test; it is moved on by the wait."""
    import signal

    if seconds < 0.5 or threading.current_thread() is not threading.main_thread():
        return
    remaining, interval = signal.getitimer(signal.ITIMER_REAL)
    if remaining > 0:
        signal.setitimer(signal.ITIMER_REAL, remaining + seconds, interval)


# The modules whose compiled functions the pool part of the warm-up compiles; every other
# engine function is the kernel part's (the kernel, the logs' passes, the statistics).
_POOL_MODULES = ("engine.remote.", "engine.core.live_journal")


def _part_of(dispatcher) -> str:
    module = getattr(getattr(dispatcher, "py_func", None), "__module__", "") or ""
    return "pool" if module.startswith(_POOL_MODULES) else "kernel"


def _hold_numba_until_warm(config) -> None:
    """On a worker, a compiled function's first call (numba's `_compile_for_args`: compile,
    or load from the disk cache) waits until the warm-up part that compiles it has written
    numba's cache; nothing else waits. Importing compiles nothing (the engine's functions
    compile at their first call, and no test module calls one at import), so collection,
    the tests that need no compiled code and the warm-up share the cores instead of taking
    turns; a worker whose first tests are the kernel's waits for the kernel part alone."""
    if not hasattr(config, "workerinput") or _WARMUP_ENV not in os.environ:
        return
    from numba.core import dispatcher

    compile_for_args = dispatcher._DispatcherBase._compile_for_args
    warm: set[str] = set()

    def waiting(self, *args, **kws):
        part = _part_of(self)
        if part not in warm:
            _wait_for_warmup((part,))
            warm.add(part)
        return compile_for_args(self, *args, **kws)

    dispatcher._DispatcherBase._compile_for_args = waiting


def pytest_terminal_summary(terminalreporter, config):
    started = config.stash.get(_WARMUP_KEY, None)
    if started is None:
        return
    procs, dones, folder = started
    for part, done in zip(_WARMUP_PARTS, dones):
        status = done.read_text().strip() if done.exists() else f"{part} stopped: no test waited for it"
        terminalreporter.write_line(f"numba cache warm-up (tests/_warmup.py): {status.splitlines()[0]}")
        if "failed" in status.splitlines()[0]:
            terminalreporter.write_line((folder / f"{part}.log").read_text()[-3000:])


def pytest_unconfigure(config):
    started = config.stash.get(_WARMUP_KEY, None)
    if started is None:
        return
    procs, _dones, folder = started
    for proc in procs:
        if proc.poll() is None:  # an interrupted run: the warm-up is ours to stop
            proc.terminate()
            proc.wait(timeout=30)
    os.environ.pop(_WARMUP_ENV, None)
    shutil.rmtree(folder, ignore_errors=True)


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
