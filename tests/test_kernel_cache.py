"""The kernel's compiled code and numba's disk cache (`engine.kernel.jit`, `engine.warmup`).

numba keys a cached function on its own file and bytecode, not on what it calls, so every
compiled function of the kernel lives in `engine.kernel.loop`: an edit anywhere in that
code then invalidates all of it. `kernel_jit` must cache across processes and, where no
cache can be written, compile in memory and give the same answer. The cache behaviour is
checked on a small module compiled with `kernel_jit` in fresh processes (the kernel itself
takes a minute to compile), the structure on the kernel's own modules.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

numba = pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[1]

MODULE = textwrap.dedent('''
    import numpy as np
    from engine.kernel.jit import kernel_jit

    @kernel_jit()
    def _step(x):
        return x * 3 + 1

    @kernel_jit()
    def total(a):
        s = 0
        for v in a:
            s += _step(v)
        return s
''')

CHILD = textwrap.dedent('''
    import json, sys
    import numpy as np
    import tiny_kernel
    value = int(tiny_kernel.total(np.arange(10, dtype=np.int64)))
    d = tiny_kernel.total
    print(json.dumps({"value": value, "hits": sum(d.stats.cache_hits.values()),
                      "misses": sum(d.stats.cache_misses.values()), "cache": type(d._cache).__name__}))
''')


def _run(tmp_path: Path, **env: str) -> dict:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "mod"), str(ROOT)]), **env}
    if "NUMBA_CACHE_DIR" not in env:
        full.pop("NUMBA_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", CHILD], env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def module(tmp_path: Path) -> Path:
    (tmp_path / "mod").mkdir()
    path = tmp_path / "mod" / "tiny_kernel.py"
    path.write_text(MODULE)
    return path


EXPECTED = sum(3 * v + 1 for v in range(10))


def test_a_function_compiled_once_is_loaded_by_the_next_process(tmp_path, module):
    cache = tmp_path / "cache"
    first = _run(tmp_path, NUMBA_CACHE_DIR=str(cache))
    second = _run(tmp_path, NUMBA_CACHE_DIR=str(cache))
    assert first == {"value": EXPECTED, "hits": 0, "misses": 1, "cache": "FunctionCache"}
    assert second == {"value": EXPECTED, "hits": 1, "misses": 0, "cache": "FunctionCache"}
    module.write_text(MODULE.replace("x * 3 + 1", "x * 3 + 2"))  # an edit: the cached copy is stale
    third = _run(tmp_path, NUMBA_CACHE_DIR=str(cache))
    assert third == {"value": EXPECTED + 10, "hits": 0, "misses": 1, "cache": "FunctionCache"}


def test_with_no_writable_cache_anywhere_it_compiles_in_memory(tmp_path, module):
    # The source's __pycache__ and the user's cache directory are regular files, and no
    # NUMBA_CACHE_DIR: numba finds no cache locator, which raises at decoration time.
    (tmp_path / "mod" / "__pycache__").write_text("not a directory")
    (tmp_path / "xdg").write_text("not a directory")
    got = _run(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path / "xdg"))
    assert got["value"] == EXPECTED and got["hits"] == 0
    assert got["cache"] == "NullCache"  # compiled in memory: njit without cache=True


def test_a_cache_that_cannot_be_written_at_save_time_is_skipped(tmp_path, module):
    # The directory was writable when the module was imported and is gone (a file in its
    # place) when the compiled function is saved: the call still answers.
    cache = tmp_path / "cache"
    child = CHILD.replace("import tiny_kernel\n", textwrap.dedent(f'''
        import tiny_kernel, shutil, pathlib
        shutil.rmtree({str(cache)!r})
        pathlib.Path({str(cache)!r}).write_text("not a directory")
    '''))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "mod"), str(ROOT)]),
           "NUMBA_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["value"] == EXPECTED


def test_every_compiled_function_of_the_kernel_is_in_one_file():
    import engine.kernel.dispatch
    import engine.kernel.intern
    import engine.kernel.loop
    import engine.kernel.replay
    import engine.kernel.stream  # noqa: F401 - their globals are what is checked
    from numba.core.registry import CPUDispatcher

    seen = 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith("engine.kernel"):
            continue
        for value in vars(mod).values():
            if isinstance(value, CPUDispatcher):
                seen += 1
                assert value.py_func.__module__ == "engine.kernel.loop", (name, value.py_func.__qualname__)
    assert seen >= 12


def test_the_install_warm_up_names_a_failing_part_and_does_not_fail(monkeypatch):
    import io

    from engine import warmup

    def broken() -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(warmup, "PARTS", (("remote pool", broken),))
    out, err = io.StringIO(), io.StringIO()
    report = warmup.warm_all(out, err)
    assert report["remote pool"]["ok"] is False
    assert err.getvalue().count("\n") == 1 and "remote pool not cached (OSError: read-only file system)" in err.getvalue()
    assert "cachescope warm-up:" in out.getvalue()


def test_the_warm_up_refuses_an_unknown_part_in_one_sentence(capsys):
    from engine import warmup

    assert warmup.main(["no such part"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no part named 'no such part'" in err and "'replay kernel'" in err
