"""Issue 13, item 5: the app with a broken model goes on without it and always exits; a
deeply nested file is one sentence, never a RecursionError or an abort."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSION = ROOT / "resources" / "sessions" / "mt_bench_81_writing.cachescope.json"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "QT_QPA_PLATFORM": "offscreen"}


def gui(*argv: str) -> subprocess.CompletedProcess:
    # The timeout only turns a hang (the bug) into a failure; it measures nothing.
    return subprocess.run([sys.executable, "-m", "app", "gui", *argv], env=ENV, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def truncated_gguf(tmp_path_factory) -> Path:
    from engine.model.loader import resolve_model

    source = Path(resolve_model(None).location)
    if source.suffix != ".gguf":
        pytest.skip("the bundled model is not a GGUF file here")
    path = tmp_path_factory.mktemp("broken") / "truncated.gguf"
    with source.open("rb") as src:
        path.write_bytes(src.read(5_000_000))
    return path


def test_a_broken_model_is_reported_and_the_screenshots_still_come(tmp_path, truncated_gguf):
    shots = tmp_path / "shots"
    done = gui(str(SESSION), "--model", str(truncated_gguf), "--screenshot", str(shots))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "truncated.gguf" in lines[0], done.stderr
    assert (shots / "conversation.png").stat().st_size > 10_000
    assert (shots / "main_window.png").is_file()


@pytest.mark.parametrize("name", ["deep.json", "deep.jsonl"])
def test_a_deeply_nested_file_is_one_line(tmp_path, name):
    path = tmp_path / name
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    done = gui(str(path), "--no-model", "--screenshot", str(tmp_path / "shots"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "nested 100000 levels deep" in lines[0] and name in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr


def test_the_file_kind_probe_survives_a_nested_first_line(tmp_path):
    from app.runtime.jobs import classify_file, trace_capacity

    path = tmp_path / "deep.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    assert classify_file(path) == "conversation"  # the importer then says what is wrong
    assert trace_capacity(path, 16) == 64
