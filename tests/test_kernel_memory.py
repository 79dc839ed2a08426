"""What the app's trace open keeps in memory, and that keeping less changes nothing.

`prepare(..., keep_content=False)` (the app's worker reads a trace this way) takes each
request's ids into the arrays as the file is read and keeps the request without them; the
arrays, the replay's result and every recorded row must be those of `prepare` on the whole
parsed trace, and the Python engine (the reference) must agree with both. The recorded log
owns exactly its rows (not the kernel's grown buffers), and the worker's result carries
the settings and totals the CLI prints for the same file.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.core.events import EventBus
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace, read_trace
from engine.kernel.replay import TraceArrays, prepare, replay_kernel
from engine.resources import RESOURCES

TRACES = RESOURCES / "traces"
CASES = [  # (file, block size, pool blocks, requests kept): token and hash-id traces, pools that evict
    ("demo_tokens.jsonl", 16, 40, None),
    ("mooncake_conversation_trace.jsonl", 512, 600, 800),
    ("mooncake_synthetic_trace.jsonl", 512, 300, 400),
]


def _slice(tmp_path: Path, name: str, keep: int | None) -> Path:
    src = TRACES / name
    if keep is None:
        return src
    out = tmp_path / name
    with src.open("rb") as fh:
        out.write_bytes(b"".join(line for _, line in zip(range(keep), fh)))
    return out


@pytest.mark.parametrize("name,bs,blocks,keep", CASES)
def test_a_trace_prepared_as_it_is_read_replays_identically(tmp_path, name, bs, blocks, keep):
    path = _slice(tmp_path, name, keep)
    whole = prepare(load_trace(path, bs), bs)
    lean = prepare(read_trace(path, bs), bs, keep_content=False)
    for f in dataclasses.fields(TraceArrays):
        if f.name in ("requests", "prepare_s"):
            continue
        a, b = getattr(whole, f.name), getattr(lean, f.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), f.name
        else:
            assert a == b, f.name
    assert all(r.tokens is None and r.output_tokens is None and r.hash_ids is None for r in lean.requests)
    assert [dataclasses.replace(r, tokens=None, output_tokens=None, hash_ids=None) for r in whole.requests] \
        == lean.requests
    config = ReplayConfig(block_size=bs, capacity_blocks=blocks)
    ref = replay_kernel(whole, config, record=True)
    got = replay_kernel(lean, config, record=True)
    events: list = []
    bus = EventBus(clock=lambda: 0.0)
    bus.subscribe(events.append)
    python = replay(load_trace(path, bs), config, bus)
    assert got.result.to_dict() == ref.result.to_dict() == python.to_dict()
    assert python.totals.evicted_blocks > 0  # the pool is small enough to evict
    for col in ("kind", "tier", "seq", "request", "block", "hash", "a", "b", "flag"):
        assert np.array_equal(got.log.col(col), ref.log.col(col)), col
    assert list(got.log.events(time=0.0)) == events


def test_the_recorded_log_owns_only_its_rows():
    requests = load_trace(TRACES / "mooncake_conversation_trace.jsonl", 512)[:300]
    log = replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=500), record=True).log
    for col in ("kind", "tier", "seq", "request", "block", "hash", "a", "b", "flag"):
        arr = log.col(col)
        assert arr.base is None or arr.base.nbytes == arr.nbytes, col  # no grown kernel buffer behind it
        assert len(arr) == log.num_rows


def test_the_workers_result_is_the_clis_settings_and_totals(tmp_path):
    from app.runtime.replays import kernel_replay_job

    path = _slice(tmp_path, "mooncake_conversation_trace.jsonl", 500)
    result, log = kernel_replay_job(str(path), 512, 700)
    cli = subprocess.run([sys.executable, "-m", "app", "replay", str(path), "--no-model", "--block-size", "512",
                          "--capacity-blocks", "700", "--json", "--totals-only"], capture_output=True, text=True,
                         cwd=RESOURCES.parent, check=True)
    assert result["totals"] == json.loads(cli.stdout)["totals"]
    assert "requests" not in result  # the per-request rows are the log's, not repeated in a dict each
    assert log.live.counters.num_requests == result["totals"]["requests"] == 500
