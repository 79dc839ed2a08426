"""A hypothesis state machine drives random allocate / append / finish / reset / lookup.

After every step the invariants hold: ref counts >= 0, in-use blocks never evicted,
free + used == capacity, and the hash map and the blocks agree.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.core.errors import CapacityError, ResetRefusedError
from engine.core.events import BlockEvicted, EventBus
from engine.core.hashing import BlockHasher
from engine.core.manager import PrefixCacheManager, Request

# A small vocabulary and shared prefixes make hits, partial hits and evictions common.
PREFIXES = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [7, 7, 7, 7, 7, 7]]


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bus = EventBus()
        self.events: list = []
        self.bus.subscribe(self.events.append)
        self.mgr = PrefixCacheManager(10, 3, BlockHasher(seed=1), self.bus)
        self.next_id = 0

    @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(0, 5), max_size=7),
          salt=st.sampled_from([None, None, "t1"]))
    def allocate(self, prefix, tail, salt):
        tokens = prefix + tail
        rid = f"r{self.next_id}"
        self.next_id += 1
        in_use_before = {b.block_id for b in self.mgr.pool.blocks if b.ref_count > 0}
        refs_before = [b.ref_count for b in self.mgr.pool.blocks]
        look = self.mgr.lookup(Request(rid, tokens, salt=salt))
        assert look.num_cached_tokens <= len(tokens) - 1
        n_before = len(self.events)
        try:
            alloc = self.mgr.allocate(Request(rid, tokens, salt=salt))
        except CapacityError:
            assert [b.ref_count for b in self.mgr.pool.blocks] == refs_before
            return
        evicted = {e.block_id for e in self.events[n_before:] if isinstance(e, BlockEvicted)}
        assert not (evicted & in_use_before), "an in-use block was evicted"
        assert alloc.num_cached_tokens == look.num_cached_tokens

    @precondition(lambda self: self.mgr.running_request_ids)
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 5), min_size=1, max_size=5))
    def append(self, data, tokens):
        rid = data.draw(st.sampled_from(sorted(self.mgr.running_request_ids)))
        in_use_before = {b.block_id for b in self.mgr.pool.blocks if b.ref_count > 0}
        n_before = len(self.events)
        try:
            self.mgr.append(rid, token_ids=tokens)
        except CapacityError:
            return
        evicted = {e.block_id for e in self.events[n_before:] if isinstance(e, BlockEvicted)}
        assert not (evicted & in_use_before)

    @precondition(lambda self: self.mgr.running_request_ids)
    @rule(data=st.data())
    def finish(self, data):
        rid = data.draw(st.sampled_from(sorted(self.mgr.running_request_ids)))
        self.mgr.finish(rid)

    @rule()
    def reset(self):
        busy = self.mgr.pool.num_used_blocks > 0
        try:
            self.mgr.reset()
        except ResetRefusedError:
            assert busy
            return
        assert not busy and self.mgr.pool.num_cached_blocks == 0

    @rule(prefix=st.sampled_from(PREFIXES))
    def lookup(self, prefix):
        look = self.mgr.lookup(Request("probe", prefix))
        for bid in look.hit_block_ids:
            assert self.mgr.block(bid).block_hash is not None

    @invariant()
    def invariants(self):
        self.mgr.check_invariants()
        pool = self.mgr.pool
        assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks
        assert all(b.ref_count >= 0 for b in pool.blocks)


EngineMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestEngineMachine = EngineMachine.TestCase
