"""Issue 24's last sweep case: a sweep's up-front memory estimate is honest.

The estimate (`engine.analysis.sweep.point_memory`) bounds what a point really costs: the
distinct blocks a trace can store are bounded from its sorted prompts (never below what a
replay stores), a point's measured peak stays under its estimate, and a sweep that cannot
fit is refused in one line before it runs, or while its trace is still being read.
"""

from __future__ import annotations

import json
import random

import pytest

from engine.analysis import sweep as sw
from engine.core.errors import InputError
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import TraceRequest, load_trace
from tests.test_hostile_round2 import MiB, cachescope

from pathlib import Path

MOONCAKE = Path(__file__).resolve().parents[1] / "resources" / "traces" / "mooncake_conversation_trace.jsonl"


def _req(i: int, tokens, tenant=None, model=None, output: int = 0) -> TraceRequest:
    tokens = tuple(tokens)
    return TraceRequest(i, 0, f"r{i}", tenant, tokens, (), None, len(tokens), output, None, model)


def _stored(reqs, block_size: int) -> int:
    cap = sum(r.input_length + r.output_length for r in reqs) // block_size + 1
    return replay(reqs, ReplayConfig(block_size=block_size, capacity_blocks=cap)).totals.stored_blocks


def test_distinct_blocks_are_the_prompt_trie_by_hand():
    a = list(range(100))
    reqs = [_req(0, a), _req(1, a[:70] + [7] * 30), _req(2, a[:70] + [7] * 30), _req(3, a, tenant="t")]
    bounds = sw.stored_block_bounds(reqs, [1, 16, 64])
    # bs 1: a's 100, the second's 30 new, the third nothing new, the tenant's 100 apart, and
    # each block-aligned prompt may store its last block twice (the third one does).
    # bs 16: 6 + (6 - 4) + 0 + 6; bs 64: 1 + 0 + 0 + 1 (the 70 shared tokens hold one 64-block)
    assert bounds == {1: 230 + 4, 16: 14, 64: 2}
    assert {bs: _stored(reqs, bs) for bs in (1, 16, 64)} == {1: 231, 16: 14, 64: 2}


@pytest.mark.parametrize("seed", range(6))
def test_the_bound_is_never_below_what_a_replay_stores(seed):
    rng = random.Random(seed)
    base = [rng.randrange(50) for _ in range(200)]
    reqs = []
    for i in range(40):
        cut = rng.randrange(len(base))
        tail = [rng.randrange(3) for _ in range(rng.randrange(40))]
        reqs.append(_req(i, base[:cut] + tail, tenant=rng.choice([None, "x"]),
                         model=rng.choice([None, "m"]), output=rng.randrange(20)))
    for bs in (1, 2, 16):
        assert sw.stored_block_bounds(reqs, [bs])[bs] >= _stored(reqs, bs)


def test_the_bound_on_the_mooncake_trace():
    reqs = load_trace(MOONCAKE)[:400]
    bound = sw.stored_block_bounds(reqs, [512])[512]
    stored = replay(reqs, ReplayConfig(block_size=512, capacity_blocks=bound + 1)).totals.stored_blocks
    assert stored <= bound <= sum((r.input_length + r.output_length) // 512 for r in reqs)


def test_a_sweep_that_cannot_fit_is_refused_before_its_first_point(monkeypatch):
    reqs = [_req(i, range(i * 5000, (i + 1) * 5000)) for i in range(20)]  # 100,000 distinct tokens
    monkeypatch.setattr(sw.validation, "available_memory", lambda: 20 * MiB)
    ran = []
    monkeypatch.setattr(sw, "_point", lambda *a: ran.append(a))
    with pytest.raises(InputError) as exc:
        sw.sweep(reqs, block_sizes=[1, 16], capacities=[64])
    need = sw.point_memory(1, 100_000, 100_000 + 20, 5000)  # (each prompt block-aligned: one copy more)
    assert ran == [] and sw.validation.human_bytes(need) in str(exc.value)
    assert "block size 1 (a pool of 100,000 blocks, up to 100,000 of them stored)" in str(exc.value)


def test_the_guard_refuses_while_reading_and_only_on_a_lower_bound(monkeypatch):
    guard = sw.MemoryGuard(block_size=1, capacity_tokens=None, available=100 * MiB)
    for i in range(10):
        guard.add(_req(i, range(i * 1000, (i + 1) * 1000)))  # 10,000 tokens: ~10 MB, fits
    with pytest.raises(InputError, match="needs at least"):
        guard.add(_req(10, range(200_000)))  # one prompt of 200,000 blocks is past 100 MiB
    assert sw.MemoryGuard.for_sweep([], None) is None


# ---------------------------------------------------------------------------- measured, under the cap
def _token_trace(path: Path, lines: int, tokens_per_line: int, distinct: bool) -> Path:
    with open(path, "w") as fh:
        for i in range(lines):
            toks = range(i * tokens_per_line, (i + 1) * tokens_per_line) if distinct else [12345] * tokens_per_line
            fh.write(json.dumps({"id": f"t{i}", "tokens": list(toks)}) + "\n")
    return path


@pytest.mark.parametrize("distinct", [True, False], ids=["distinct", "shared-prefix"])
def test_a_point_costs_no_more_than_its_estimate(tmp_path, distinct):
    # 400,000 tokens at block size 1: the point's pool, stores and largest request, measured
    # as the whole run's peak less the same run with only small points.
    path = _token_trace(tmp_path / "t.jsonl", 4, 100_000, distinct)
    small = cachescope(tmp_path, "sweep", str(path), "--block-sizes", "64", "--capacities", "64", "--json")
    big = cachescope(tmp_path, "sweep", str(path), "--block-sizes", "1", "--capacities", "64", "--json")
    assert small.returncode == big.returncode == 0, big.stderr
    reqs = load_trace(path)
    estimate = sw.point_memory(1, 400_000, sw.stored_block_bounds(reqs, [1])[1], 100_000)
    measured = (big.peak_mib - small.peak_mib) * MiB
    print(f"measured {measured / MiB:.0f} MiB, estimated {estimate / MiB:.0f} MiB")
    assert 0.5 * estimate < measured <= estimate


# The 33M-token refusal and a trace that fits, under the cap: tests/test_hostile_round2.py.
