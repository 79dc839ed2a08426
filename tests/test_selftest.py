"""`cachescope selftest` from the source tree: the bundled model converted in a fresh cache
folder, a two-turn chat whose second turn reuses the first turn's blocks, outputs equal to a
run without reuse. The desktop bundle's smoke test runs the same subcommand."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app import version
from app.cli import main

pytestmark = [pytest.mark.model, pytest.mark.slow]


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"cachescope {version()}"
    assert version()[0].isdigit()


def _listing(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*")) if folder.is_dir() else []


def test_selftest_converts_in_a_fresh_cache_and_reuses_blocks(capsys):
    from engine.model.loader import cache_dir

    # The user's own cache (where the suite's model already lives) must not be written to.
    user_cache = cache_dir()
    env_before = os.environ.get("CACHESCOPE_CACHE_DIR")
    before = _listing(user_cache)
    assert main(["selftest", "--max-new-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 1, "selftest prints exactly one JSON line on stdout"
    report = json.loads(lines[0])
    assert report["ok"] is True and report["frozen"] is False
    assert report["fresh_cache"] is True and report["converted_now"] is True
    assert report["model"] == "SmolLM2-135M-Instruct"
    first, second = report["turns"]
    assert first["cached_tokens"] == 0
    assert report["reused_blocks"] >= report["first_turn_prompt_blocks"] >= 1
    assert second["cached_tokens"] == report["reused_blocks"] * report["block_size"]
    assert second["cached_tokens"] + second["computed_tokens"] == second["prompt_tokens"]
    assert report["outputs_identical"] is True and report["max_logit_diff"] <= 1e-4
    # The temporary cache folder is gone and the environment is restored.
    assert not Path(report["cache_dir"]).exists()
    assert os.environ.get("CACHESCOPE_CACHE_DIR") == env_before
    assert cache_dir() == user_cache and _listing(user_cache) == before


def test_selftest_reports_a_missing_model_in_one_line(capsys, tmp_path):
    assert main(["selftest", "--model", str(tmp_path / "nope.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no such model file" in err


def test_selftest_reports_a_broken_model_as_a_failed_check(capsys, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    assert main(["selftest", "--model", str(bad)]) == 1
    # Above it stderr may hold the conversion's progress bar; the verdict is the last line.
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("cachescope: selftest failed: cannot load the model") and "corrupt" in last
