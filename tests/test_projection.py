"""The projection rebuilt from events equals the manager's own snapshot, at every step.

A hypothesis state machine drives a real PrefixCacheManager; a replay of the real
Mooncake trace checks `EventLog.state_at` against snapshots taken while it ran.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.errors import CapacityError, ResetRefusedError
from engine.core.events import BlockEvicted, BlockStored, CacheReset, EventBus, RequestFinished
from engine.core.hashing import BlockHasher
from engine.core.manager import PrefixCacheManager, Request
from engine.core.projection import CACHED_FREE, EMPTY, IN_USE, EventLog, PoolProjection
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace

MOONCAKE = Path(__file__).resolve().parents[1] / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [7, 7, 7, 7, 7, 7]]


def comparable(snapshot):
    # Hash collisions are counted by lookups that emit nothing; events cannot see them.
    return dataclasses.replace(snapshot, counters=dataclasses.replace(snapshot.counters, num_hash_collisions=0))


class ProjectionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bus = EventBus()
        self.mgr = PrefixCacheManager(10, 3, BlockHasher(seed=1), self.bus)
        # Tiny checkpoint spacing so that thinning and replay from checkpoints both run.
        self.log = EventLog(10, 3, checkpoint_every=5, max_checkpoints=4)
        self.bus.subscribe(self.log.append)
        self.moments: list[tuple[int, object]] = []
        self.next_id = 0

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 5), max_size=7),
          salt=st.sampled_from([None, None, "t1"]))
    def allocate(self, prefix, tail, salt):
        rid = f"r{self.next_id}"
        self.next_id += 1
        try:
            self.mgr.allocate(Request(rid, prefix + tail, salt=salt))
        except CapacityError:
            pass

    @precondition(lambda self: self.mgr.running_request_ids)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 5), min_size=1, max_size=5))
    def append(self, data, tokens):
        rid = data.draw(st.sampled_from(sorted(self.mgr.running_request_ids)))
        try:
            self.mgr.append(rid, token_ids=tokens)
        except CapacityError:
            pass

    @precondition(lambda self: self.mgr.running_request_ids)
    @rule(data=st.data(), aborted=st.booleans())
    def finish(self, data, aborted):
        rid = data.draw(st.sampled_from(sorted(self.mgr.running_request_ids)))
        self.mgr.finish(rid, aborted=aborted)

    @rule()
    def reset(self):
        try:
            self.mgr.reset()
        except ResetRefusedError:
            pass

    @invariant()
    def projection_equals_snapshot(self):
        snap = comparable(self.mgr.snapshot())
        assert self.log.live.snapshot() == snap
        p = self.log.live
        cats = [p.category(b) for b in range(p.num_blocks)]
        assert (cats.count(EMPTY), cats.count(CACHED_FREE), cats.count(IN_USE)) == (
            p.num_empty, p.num_cached_free, p.num_in_use)
        assert p.max_ref_count == max(p.ref_counts)
        if self.log.last_seq is not None:
            self.moments.append((self.log.last_seq, snap))

    @invariant()
    def past_states_rebuild(self):
        # Every earlier moment is rebuilt exactly, from the nearest checkpoint.
        for seq, snap in self.moments[-3:] + self.moments[:1]:
            assert self.log.state_at(seq).snapshot() == snap
        assert self.log.num_checkpoints <= 4


TestProjectionMachine = ProjectionMachine.TestCase
TestProjectionMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_empty_projection_and_bad_sizes():
    p = PoolProjection(4, 2)
    assert (p.num_empty, p.num_cached_free, p.num_in_use) == (4, 0, 0)
    assert list(p.free) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="block size"):
        PoolProjection(4, 0)
    with pytest.raises(ValueError, match="blocks"):
        PoolProjection(-1, 16)
    with pytest.raises(ValueError, match="not in this pool"):
        p.block_info(9)


def test_events_out_of_order_are_refused():
    bus = EventBus()
    events = []
    bus.subscribe(events.append)
    mgr = PrefixCacheManager(4, 2, BlockHasher(seed=0), bus)
    mgr.allocate(Request("a", [1, 2, 3]))
    log = EventLog(4, 2)
    log.extend(events[1:])
    with pytest.raises(ValueError, match="in order"):
        log.append(events[0])


def test_chain_tenant_and_owners_follow_the_events():
    bus = EventBus()
    log = EventLog(8, 2)
    bus.subscribe(log.append)
    mgr = PrefixCacheManager(8, 2, BlockHasher(seed=0), bus)
    mgr.allocate(Request("a", [1, 2, 3, 4, 5, 6, 7], salt="acme"))
    mgr.allocate(Request("b", [1, 2, 3, 4, 9, 8], salt="acme"))
    p = log.live
    table_a = mgr.block_table("a")
    assert p.running["a"] == table_a
    # b reuses a's first two blocks: shared, ref count 2, owned by both
    info = p.block_info(table_a[1])
    assert info.ref_count == 2 and set(info.owners) == {"a", "b"}
    assert info.tenant == "acme" and info.salt is None  # the salt sits on the first block only
    assert p.chain_of(table_a[2]) == list(table_a[:3])
    rec = p.requests["b"]
    assert (rec.num_cached_tokens, rec.num_computed_tokens, rec.num_hit_blocks) == (4, 2, 2)
    assert rec.miss is not None and (rec.miss.reason, rec.miss.divergence_token) == ("new_content", 4)


def test_remote_pool_without_block_ids():
    """vLLM's stored/removed/cleared events name hashes only; slots are assigned by hash."""
    p = PoolProjection(0, 16)
    h1, h2, h3 = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    p.apply(BlockStored(seq=0, time=0.0, request_id="", block_id=-1, block_hash=h1, parent_hash=None,
                        token_ids=tuple(range(16)), salt=None))
    p.apply(BlockStored(seq=1, time=0.0, request_id="", block_id=-1, block_hash=h2, parent_hash=h1,
                        token_ids=tuple(range(16, 32)), salt=None))
    assert p.num_blocks == 2 and p.num_cached_free == 2 and p.num_hashed == 2
    assert p.chain_of(p.block_of_hash(h2)) == [p.block_of_hash(h1), p.block_of_hash(h2)]
    p.apply(BlockEvicted(seq=2, time=0.0, block_id=-1, block_hash=h1, by_request_id=""))
    assert p.block_of_hash(h1) is None and p.counters.num_evicted_blocks == 1
    # the emptied slot is reused before the pool grows
    p.apply(BlockStored(seq=3, time=0.0, request_id="", block_id=-1, block_hash=h3, parent_hash=None,
                        token_ids=(), salt="x"))
    assert p.num_blocks == 2
    p.apply(CacheReset(seq=4, time=0.0, num_blocks_cleared=2))
    assert p.num_hashed == 0 and p.num_empty == 2 and not p.by_hash


@pytest.mark.skipif(not MOONCAKE.exists(), reason="the shared Mooncake trace is not on this machine")
def test_mooncake_replay_state_at_matches_snapshots():
    requests = load_trace(MOONCAKE, block_size=512)[:400]
    config = ReplayConfig(block_size=512, capacity_blocks=300, seed=0, concurrency=4)
    bus = EventBus()
    log = EventLog(config.capacity_blocks, config.block_size, checkpoint_every=97, max_checkpoints=8)
    bus.subscribe(log.append)
    mgr = PrefixCacheManager(config.capacity_blocks, config.block_size, BlockHasher(seed=0), bus)
    moments: list[tuple[int, object]] = []

    def on_event(event):
        # RequestFinished is the last event a finish emits: the manager is consistent here.
        if isinstance(event, RequestFinished):
            moments.append((event.seq, comparable(mgr.snapshot())))

    bus.subscribe(on_event)
    result = replay(requests, config, manager=mgr).to_dict()
    assert result["totals"]["evicted_blocks"] > 0, "the pool should be small enough to evict"
    assert log.live.snapshot() == comparable(mgr.snapshot())
    assert log.live.counters.num_evicted_blocks == result["totals"]["evicted_blocks"]
    evictions = sum(isinstance(e, BlockEvicted) for e in log.events)
    assert log.series.evicted[-1] == evictions
    rng = random.Random(6)
    base = None
    for seq, snap in sorted(rng.sample(moments, 25)):
        # walking forward reuses the previous state as a base
        base = log.state_at(seq, base=base)
        assert base.snapshot() == snap
    for seq, snap in rng.sample(moments, 10):
        assert log.state_at(seq).snapshot() == snap
    assert log.num_checkpoints <= 8
