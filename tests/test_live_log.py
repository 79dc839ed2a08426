"""The live columnar log (engine.core.live_log) against the Python `EventLog`, the reference.

Real flows: the Mooncake conversation trace replayed by the Python engine (evicting, and
with no pool size announced: the pool grows as the events name blocks), the token trace
recorded beside vLLM, a model-less manager with tenants, a cache reset and a freed
request, and a recorded demo's events; each fed in batches of several sizes, compared
after every batch and at many scrub points (early events, the first, the last, gaps).
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest

from engine.core.events import CacheReset, EventBus, SemanticStored
from engine.core.hashing import BlockHasher
from engine.core.live_log import LiveColumnarLog
from engine.core.manager import PrefixCacheManager, Request
from engine.core.projection import EventLog
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
TOKENS = ROOT / "resources" / "traces" / "demo_tokens.jsonl"
SERIES = ("seq", "in_use", "cached_free", "empty", "max_ref", "evicted", "cached_tokens", "prompt_tokens",
          "refusal_seqs", "reset_seqs")


def _events_of_trace(path: Path, num_requests: int, capacity: int, block_size: int) -> list:
    lines = path.read_bytes().splitlines(keepends=True)[:num_requests]
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    with tempfile.TemporaryDirectory(prefix="cachescope-test-") as folder:  # nothing left in /tmp
        sliced = Path(folder) / f"{path.stem}_{num_requests}.jsonl"
        sliced.write_bytes(b"".join(lines))
        replay(load_trace(sliced, block_size), ReplayConfig(block_size=block_size, capacity_blocks=capacity, seed=0),
               bus)
    return events


def _events_of_manager() -> list:
    """Tenants, shared prefixes, an abort, a refusal, a cache reset and a semantic event."""
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    mgr = PrefixCacheManager(24, 4, BlockHasher(seed=0), bus)
    rng = random.Random(3)
    base = [rng.randrange(1000) for _ in range(20)]
    live: list[str] = []
    for i in range(40):
        if i == 25:
            for rid in live:
                mgr.finish(rid)
            live.clear()
            mgr.reset()
        prompt = base[:rng.randrange(4, 20)] + [rng.randrange(1000) for _ in range(rng.randrange(0, 9))]
        req = Request(f"r{i}", prompt, salt=("tenant-a" if i % 3 == 0 else None))
        look = mgr.lookup(req)
        if i % 11 == 5:  # another engine on the same bus (the semantic cache)
            bus.emit(SemanticStored, entry_id=i, prompt="not a pool event")
        if not mgr.can_allocate(req, look):
            for rid in live:
                mgr.finish(rid, aborted=(i % 2 == 0))
            live.clear()
            continue
        mgr.allocate(req, look)
        live.append(req.request_id)
        if len(live) > 2:
            mgr.finish(live.pop(0))
    return events


def _check_same(col: LiveColumnarLog, ref: EventLog, where: str) -> None:
    assert len(col) == len(ref) and list(col.seqs) == list(ref.seqs), where
    for name in SERIES:
        assert list(getattr(col.series, name)) == list(getattr(ref.series, name)), (where, name)
    _check_projection(col.live, ref.live, where)


def _check_projection(p, q, where) -> None:
    n = q.num_blocks
    assert p.num_blocks == n, where
    assert list(p.ref_counts) == q.ref_counts, where
    for name in ("hashes", "parents", "token_ids", "salts", "tenants", "external_ids"):
        assert [getattr(p, name)[b] for b in range(n)] == getattr(q, name), (where, name)
    assert list(p.free) == list(q.free) and p.num_free_blocks == q.num_free_blocks, where
    assert p.counters == q.counters, where
    assert (p.num_in_use, p.num_cached_free, p.num_hashed, p.num_empty, p.max_ref_count) == \
        (q.num_in_use, q.num_cached_free, q.num_hashed, q.num_empty, q.max_ref_count), where
    assert [p.category(b) for b in range(n)] == [q.category(b) for b in range(n)], where
    assert dict(p.running) == q.running, where
    assert p.request_records() == q.request_records(), where
    assert (p.last_request_id, p.last_eviction_seq, p.num_resets, p.seq) == \
        (q.last_request_id, q.last_eviction_seq, q.num_resets, q.seq), where
    assert list(p.evicted_seq) == q.evicted_seq, where
    assert [p.last_seq[b] for b in range(n)] == q.last_seq and [p.last_used[b] for b in range(n)] == q.last_used
    assert p.by_hash == q.by_hash, where
    for b in range(0, n, max(1, n // 7)):
        assert p.block_info(b) == q.block_info(b), (where, b)
        assert p.chain_of(b) == q.chain_of(b), (where, b)


def _feed(events: list, num_blocks: int, block_size: int, sizes: list[int], every_batch: bool = True,
          checkpoint_rows: int | None = None) -> tuple[LiveColumnarLog, EventLog]:
    col = LiveColumnarLog(num_blocks, block_size, checkpoint_rows=checkpoint_rows)
    ref = EventLog(num_blocks, block_size)
    i = k = 0
    while i < len(events):
        batch = events[i:i + sizes[k % len(sizes)]]
        i += len(batch)
        k += 1
        col.extend(batch)
        ref.extend(batch)
        if every_batch:
            _check_same(col, ref, f"after batch {k}")
    _check_same(col, ref, "at the end")
    return col, ref


def _scrub_points(ref: EventLog) -> list[int]:
    seqs = ref.seqs
    n = len(seqs)
    picks = {0, 1, 2, 7, n // 5, n // 3, n // 2, (2 * n) // 3, n - 2, n - 1}
    return sorted({seqs[i] for i in picks if 0 <= i < n})


def _check_scrubbing(col: LiveColumnarLog, ref: EventLog, extra: tuple[int, ...] = ()) -> None:
    for seq in [*_scrub_points(ref), *extra]:
        _check_projection(col.state_at(seq), ref.state_at(seq), f"scrubbed to {seq}")
    for seq in (-5, ref.seqs[-1] + 10):
        assert col.count_upto(seq) == ref.count_upto(seq)


def _strip_times(events) -> list[dict]:
    return [e.to_dict() | {"time": e.time} for e in events]


def test_the_mooncake_trace_streamed_in_batches_equals_the_reference():
    events = _events_of_trace(MOONCAKE, 120, 160, 512)
    col, ref = _feed(events, 160, 512, [1, 7, 64, 500, 3], every_batch=False, checkpoint_rows=256)
    assert ref.live.counters.num_evicted_blocks > 0  # the slice evicts
    assert col.num_checkpoints > 2
    _check_scrubbing(col, ref)
    # the very events, times included, built from the rows
    assert _strip_times(col.events) == _strip_times(ref.events)
    n = len(ref)
    assert _strip_times(col.events[n // 3:n // 3 + 50]) == _strip_times(ref.events[n // 3:n // 3 + 50])


def test_batches_are_compared_one_by_one_on_the_token_trace():
    events = _events_of_trace(TOKENS, 60, 64, 16)
    col, ref = _feed(events, 64, 16, [5, 1, 33], checkpoint_rows=128)
    _check_scrubbing(col, ref)


def test_a_pool_announced_without_a_size_grows_as_the_reference_does():
    events = _events_of_trace(MOONCAKE, 60, 4096, 512)
    col, ref = _feed(events, 0, 512, [9, 40], every_batch=False, checkpoint_rows=200)
    assert ref.live.num_blocks > 100  # it grew from 0
    _check_scrubbing(col, ref)


def test_tenants_a_cache_reset_aborts_and_other_events():
    events = _events_of_manager()
    kinds = {e.kind for e in events}
    assert {"cache_reset", "semantic_stored", "request_finished", "block_evicted"} <= kinds
    col, ref = _feed(events, 24, 4, [1, 2, 5], checkpoint_rows=16)
    assert col.live.num_resets == ref.live.num_resets == 1
    _check_scrubbing(col, ref)
    assert _strip_times(col.events) == _strip_times(ref.events)
    reset_at = next(i for i, e in enumerate(ref.events) if isinstance(e, CacheReset))
    assert col.kind_names()[reset_at] == "cache_reset"
    other = next(i for i, e in enumerate(ref.events) if e.kind == "semantic_stored")
    assert col.kind_names()[other] == "semantic_stored" and col.events[other] == ref.events[other]


def test_seq_gaps_and_an_out_of_order_batch():
    events = _events_of_trace(TOKENS, 20, 64, 16)
    # a bus shared with another engine numbers past the gaps: every third seq is not ours
    gapped = [dataclasses.replace(e, seq=e.seq + e.seq // 2 + 1) for e in events]
    col, ref = _feed(gapped, 64, 16, [4, 11])
    _check_scrubbing(col, ref, extra=tuple(range(0, 20)))  # seqs in the gaps too
    for seq in range(12):
        assert (col.position_of(seq) is None) == (ref.event_at_seq(seq) is None)
    with pytest.raises(ValueError, match="must be in order"):
        col.extend(gapped[-2:])
    _check_same(col, ref, "after a refused batch")  # nothing of it was kept


def test_series_and_checkpoints_move_on_without_starting_over():
    events = _events_of_trace(MOONCAKE, 80, 200, 512)
    col = LiveColumnarLog(200, 512, checkpoint_rows=64)
    first_state = col.columnar._cp_states[0]
    col.extend(events[:len(events) // 2])
    half = col.series.in_use.copy()
    cps = list(col.columnar._cp_rows)
    col.extend(events[len(events) // 2:])
    # the first half's samples and checkpoints are the same values: appended to, not rebuilt
    assert np.array_equal(col.series.in_use[:len(half)], half)
    assert col.columnar._cp_states[0] is first_state
    assert set(col.columnar._cp_rows) >= set(cps) or col.columnar.checkpoint_rows > 64
    # past the budget, every other checkpoint goes and the interval doubles
    col.columnar.num_blocks = col.columnar.num_blocks  # unchanged pool; a tiny budget instead:
    small = LiveColumnarLog(200, 512, checkpoint_rows=8)
    for i in range(0, len(events), 50):
        small.extend(events[i:i + 50])
    assert small.num_checkpoints <= 64 and small.columnar.checkpoint_rows > 8
    ref = EventLog(200, 512)
    ref.extend(events)
    _check_scrubbing(small, ref)


def test_a_snapshot_for_a_worker_stays_as_it_was():
    events = _events_of_trace(TOKENS, 40, 64, 16)
    col = LiveColumnarLog(64, 16)
    col.extend(events[:200])
    frozen = col.snapshot()
    n = len(frozen)
    col.extend(events[200:])
    assert len(frozen) == n == 200 and len(col) == len(events)
    ref = EventLog(64, 16)
    ref.extend(events[:200])
    assert [e.to_dict() | {"time": 0} for e in frozen.events] == [e.to_dict() | {"time": 0} for e in ref.events]
    _check_projection(frozen.live, ref.live, "snapshot")


# ---------------------------------------------------------------------------- an attached server
# vLLM names hashes, not blocks: each stored copy takes a slot of its own, a removal frees
# the oldest copy in its rank, tier and group, a rank's clear only its own slots.

def _remote_events(frames: list[tuple[int, bytes]], num_ranks: int = 1, reset_every: int = 0) -> list:
    from engine.remote import fastwire
    from engine.remote.pool import RemotePool
    from engine.remote.wire import MalformedFrame

    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    pools = [RemotePool(f"tcp://10.0.0.5:{5557 + r}", r, bus) for r in range(num_ranks)]
    for i, (seq, payload) in enumerate(frames):
        pool = pools[i % num_ranks]
        if reset_every and i and i % reset_every == 0:
            pool.reset(seq)
        try:
            pool.apply(fastwire.decode_batch(seq, payload))
        except MalformedFrame:
            continue
    return events


def _remote_fixtures() -> dict[str, list]:
    from tests.test_fastwire import FIXTURES

    return FIXTURES


@pytest.mark.parametrize("name", sorted(_remote_fixtures()))
def test_a_recorded_server_on_the_live_log_equals_the_reference(name):
    events = _remote_events(_remote_fixtures()[name])
    if not events:
        pytest.skip("the fixture's frames carry no block event")
    col, ref = _feed(events, 0, 16, [1, 13, 200], every_batch=False, checkpoint_rows=64)
    _check_scrubbing(col, ref)
    assert _strip_times(col.events) == _strip_times(ref.events)


@pytest.mark.parametrize("num_ranks, reset_every", [(1, 7), (2, 5), (3, 0)])
def test_ranks_copies_and_clears_of_a_synthetic_stream_equal_the_reference(num_ranks, reset_every):
    from tests.test_colpool import _synthetic

    events = _remote_events(_synthetic(160, num_ranks), num_ranks, reset_every)
    kinds = {e.kind for e in events}
    assert {"block_stored", "block_evicted", "cache_reset"} <= kinds
    col, ref = _feed(events, 0, 16, [3, 1, 40], checkpoint_rows=32)
    assert ref.live.num_blocks > 50
    _check_scrubbing(col, ref)
    assert _strip_times(col.events) == _strip_times(ref.events)
