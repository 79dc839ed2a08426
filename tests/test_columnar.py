"""The columnar event log (engine.core.columnar) against the reference projection.

`ColumnarLog.state_at` (checkpoints plus vectorised code) must equal
`engine.core.projection.PoolProjection` fed the same events one by one, at every
checkpoint and at random events, scrubbing forward and back; a log appended from the
Python engine's live events must equal the kernel's.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from engine.core.columnar import ColumnarLog
from engine.core.events import EventBus
from engine.core.projection import PoolProjection
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace
from engine.kernel import replay_kernel
from engine.resources import RESOURCES

TRACES = RESOURCES / "traces"


def reference_states(events, num_blocks, block_size, seqs):
    """seq -> the reference projection's view after that event."""
    proj = PoolProjection(num_blocks, block_size)
    wanted = set(seqs)
    out = {}
    for e in events:
        proj.apply(e)
        if e.seq in wanted:
            out[e.seq] = (list(proj.ref_counts), list(proj.hashes), list(proj.free),
                          dataclasses.replace(proj.counters), dict(proj.running))
    return out


def view_of(log: ColumnarLog, seq: int):
    st = log.state_at(seq)
    hashes = [log.keys.digest(k) if k >= 0 else None for k in st.hash_keys.tolist()]
    return st.ref_counts.tolist(), hashes, st.free_order().tolist(), st.counters, log.running_at(seq)


def assert_views_equal(mine, ref):
    names = ("ref counts", "hashes", "free queue order", "counters", "running requests")
    for name, a, b in zip(names, mine, ref):
        assert a == b, name


CASES = [
    ("mooncake_conversation_trace.jsonl", 512, 300, 3, 400),
    ("mooncake_synthetic_trace.jsonl", 512, 900, 1, 300),
    ("demo_tokens.jsonl", 16, 40, 2, None),
]


@pytest.mark.parametrize("name,bs,capacity,concurrency,limit", CASES)
def test_state_at_equals_the_reference_projection(name, bs, capacity, concurrency, limit):
    requests = load_trace(TRACES / name, bs)[:limit]
    config = ReplayConfig(block_size=bs, capacity_blocks=capacity, concurrency=concurrency)
    run = replay_kernel(requests, config, record=True)
    log = run.log
    log.build_checkpoints(every=max(64, log.num_rows // 9))
    assert len(log._cp_rows) >= 5
    seqs_col = log.col("seq")
    checkpoint_seqs = [int(seqs_col[r - 1]) for r in log._cp_rows if r > 0]
    rng = random.Random(7)
    random_seqs = [rng.randrange(len(log)) for _ in range(25)]
    targets = sorted(set(checkpoint_seqs + random_seqs + [0, 1, len(log) - 1]))
    events = list(log.events())
    ref = reference_states(events, capacity, bs, targets)
    assert run.result.totals.evicted_blocks > 0
    # late first, then back to early events: scrubbing never depends on the last position
    for seq in sorted(targets, reverse=True) + targets[:5]:
        assert_views_equal(view_of(log, seq), ref[seq])
    final = log.state_at(None)
    assert final.counters.num_evicted_blocks == run.result.totals.evicted_blocks
    assert final.counters.num_stored_blocks == run.result.totals.stored_blocks


def test_live_appends_equal_the_kernel_log():
    requests = load_trace(TRACES / "demo_tokens.jsonl")
    config = ReplayConfig(block_size=16, capacity_blocks=40, concurrency=2)
    events = []
    bus = EventBus(clock=lambda: 0.0)
    bus.subscribe(events.append)
    replay(requests, config, bus)
    live = ColumnarLog(40, 16, checkpoint_rows=100)
    live.append_events(events[:300])
    live.append_events(events[300:])
    live.build_checkpoints()
    assert list(live.events()) == events
    kernel = replay_kernel(requests, config, record=True).log
    for seq in (0, 17, 150, 299, 300, 301, len(events) - 1):
        a, b = live.state_at(seq), kernel.state_at(seq)
        assert np.array_equal(a.ref_counts, b.ref_counts)
        assert np.array_equal(a.free_order(), b.free_order())
        assert a.counters == b.counters
        assert [live.keys.digest(k) if k >= 0 else None for k in a.hash_keys.tolist()] == \
            [kernel.keys.digest(k) if k >= 0 else None for k in b.hash_keys.tolist()]


def test_the_comparison_can_fail():
    """A state one event off differs from the reference: the checks above can fail."""
    requests = load_trace(TRACES / "mooncake_conversation_trace.jsonl", 512)[:200]
    log = replay_kernel(requests, ReplayConfig(block_size=512, capacity_blocks=300), record=True).log
    events = list(log.events())
    seq = len(log) // 2
    while type(events[seq]).__name__ != "RefCountsChanged":
        seq += 1
    ref = reference_states(events, 300, 512, [seq])[seq]
    with pytest.raises(AssertionError):
        assert_views_equal(view_of(log, seq - 1), ref)


def test_a_large_pool_gets_few_checkpoints_within_the_budget_and_the_same_states(monkeypatch):
    """Snapshots are 16 bytes a block: 64 of a 9.3M-block pool were 9.5 GB (the whole
    Mooncake trace compared at block size 16). The budget bounds them; scrubbing still
    gives the reference's states."""
    import engine.core.columnar as columnar

    requests = load_trace(TRACES / "mooncake_synthetic_trace.jsonl", 512)  # 718K rows
    config = ReplayConfig(block_size=512, capacity_blocks=900, concurrency=1)
    log = replay_kernel(requests, config, record=True).log
    monkeypatch.setattr(columnar, "CHECKPOINT_MIN_ROWS", 65536)  # below the budget's spacing
    monkeypatch.setattr(columnar, "CHECKPOINT_BYTES", 16 * 900 * 3)  # room for three snapshots
    log.checkpoint_rows = None
    log.build_checkpoints()
    assert log.checkpoint_rows == log.num_rows // 3 + 1
    assert len(log._cp_states) == 3  # the initial state and two more
    monkeypatch.setattr(columnar, "CHECKPOINT_BYTES", 1 << 40)
    log.checkpoint_rows = None
    log.build_checkpoints()
    assert len(log._cp_states) == log.num_rows // 65536 + 1  # a small pool: as before
    rng = random.Random(3)
    targets = sorted({rng.randrange(len(log)) for _ in range(12)} | {0, len(log) - 1})
    ref = reference_states(list(log.events()), 900, 512, targets)
    for seq in reversed(targets):
        assert_views_equal(view_of(log, seq), ref[seq])
