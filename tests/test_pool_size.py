"""A vLLM server's own block count (`num_gpu_blocks`, null block included) as a pool size:
on the command line, in the Pool size dialog, and in the window's engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from engine.core.blocks import usable_blocks_of_vllm

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "resources" / "traces" / "demo_tokens.jsonl"
MOONCAKE = ROOT / "resources" / "traces" / "mooncake_conversation_trace.jsonl"


def replay_json(capsys, *argv: str) -> dict:
    assert main(["replay", *argv, "--no-model", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_vllm_block_count_is_one_more_than_the_usable_blocks():
    assert usable_blocks_of_vllm(2) == 1
    assert usable_blocks_of_vllm(65) == 64
    for bad in (1, 0, -3, True, 2.5):
        with pytest.raises(ValueError, match="null block"):
            usable_blocks_of_vllm(bad)


def test_replay_with_num_gpu_blocks_is_the_pool_one_block_smaller(capsys, tmp_path):
    # A slice of the real Mooncake trace in a pool small enough to evict: N from a server's
    # log must replay as N - 1 blocks, and N blocks evicts differently.
    head = tmp_path / "head.jsonl"
    head.write_text("".join(MOONCAKE.read_text().splitlines(keepends=True)[:300]))
    as_server = replay_json(capsys, str(head), "--num-gpu-blocks", "201", "--block-size", "512")
    usable = replay_json(capsys, str(head), "--capacity-blocks", "200", "--block-size", "512")
    one_more = replay_json(capsys, str(head), "--capacity-blocks", "201", "--block-size", "512")
    assert as_server == usable
    assert as_server["config"]["capacity_blocks"] == 200
    assert as_server["totals"]["evicted_blocks"] > 0
    assert as_server["totals"]["evicted_blocks"] != one_more["totals"]["evicted_blocks"]


@pytest.mark.parametrize("argv, message", [
    (["replay", str(DEMO), "--no-model", "--num-gpu-blocks", "1"], "at least 2"),
    (["replay", str(DEMO), "--no-model", "--num-gpu-blocks", "9", "--capacity-blocks", "8"], "not allowed with"),
    (["sessions", "replay", "1", "--num-gpu-blocks", "x"], "not a whole number"),
])
def test_a_bad_block_count_is_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]
    assert "Traceback" not in "\n".join(err)


def test_sessions_replay_takes_a_vllm_block_count(capsys, tmp_path):
    db = str(tmp_path / "s.db")
    assert main(["sessions", "import", str(DEMO), "--db", db, "--json"]) == 0
    sid = json.loads(capsys.readouterr().out)["session_ids"][0]
    assert main(["sessions", "replay", str(sid), "--db", db, "--num-gpu-blocks", "9", "--no-record",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["capacity_blocks"] == 8


def test_the_dialog_takes_a_server_count_as_such(qtbot):
    from app.dialogs.pool_size_dialog import PoolSize, PoolSizeDialog

    dlg = PoolSizeDialog(PoolSize(256, 16))
    qtbot.addWidget(dlg)
    dlg.blocks.setValue(1000)
    assert dlg.pool_size() == PoolSize(1000, 16)
    dlg.as_vllm.setChecked(True)
    assert dlg.pool_size().num_blocks == 999
    assert "999 usable blocks" in dlg.usable.text()
    dlg.blocks.setValue(1)
    assert "null block" in dlg.error.text()
    dlg.accept()
    assert dlg.isVisible() is False and dlg.result() == 0  # refused: the dialog did not accept


@pytest.mark.model
def test_the_window_rebuilds_the_model_engine_on_the_server_sized_pool(qtbot, window, default_model):
    from app.dialogs.pool_size_dialog import PoolSize
    from engine.model.runner import ModelRunner

    window.ctx.set_runner(ModelRunner(default_model, num_blocks=256))
    window.set_pool_size(PoolSize(usable_blocks_of_vllm(100), 16, for_traces=True))
    qtbot.waitUntil(lambda: window.ctx.runner.manager.num_blocks == 99, timeout=30_000)
    assert window.ctx.runner.kv_pool.num_blocks == 99
    assert window.ctx.state.projection.num_blocks == 99  # the views follow the new engine
    assert window.trace_num_blocks == 99
    result = window.ctx.runner.generate(window.ctx.runner.render_chat([{"role": "user", "content": "Hi"}]),
                                        max_new_tokens=4)
    assert result.num_prompt_tokens > 0
