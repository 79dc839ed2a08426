"""The prefix-cache engine's decisions, one behaviour per test."""

from __future__ import annotations

import pytest

from engine.core.errors import CapacityError, ResetRefusedError
from engine.core.events import BlockEvicted, BlockStored, EventBus, LookupDone
from engine.core.hashing import BlockHasher
from engine.core.manager import PrefixCacheManager, Request

BS = 4


def make(num_blocks: int = 16, block_size: int = BS, seed: int | None = 0) -> tuple[PrefixCacheManager, list]:
    bus = EventBus()
    events: list = []
    bus.subscribe(events.append)
    mgr = PrefixCacheManager(num_blocks, block_size, BlockHasher(seed=seed), bus)
    return mgr, events


def run(mgr: PrefixCacheManager, rid: str, tokens: list[int], output: list[int] = (), salt: str | None = None,
        finish: bool = True):
    alloc = mgr.allocate(Request(rid, tokens, salt=salt))
    if len(output) > 1:
        mgr.append(rid, token_ids=list(output[:-1]))
    if finish:
        mgr.finish(rid)
    mgr.check_invariants()
    return alloc


def test_partial_tail_is_never_cached():
    mgr, events = make()
    run(mgr, "a", list(range(10)))  # 2 full blocks + 2-token tail
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [e.token_ids for e in stored] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert mgr.pool.num_cached_blocks == 2
    again = mgr.lookup(Request("b", list(range(10))))
    assert again.num_cached_tokens == 8
    assert again.miss.reason == "partial_block" and again.miss.first_miss_block == 2


def test_hit_raises_ref_counts_and_takes_free_cached_blocks_off_the_queue():
    mgr, _ = make()
    run(mgr, "a", list(range(9)))
    hit_ids = mgr.lookup(Request("x", list(range(9)))).hit_block_ids
    assert len(hit_ids) == 2
    assert all(mgr.pool.free_queue.contains(mgr.block(b)) for b in hit_ids)
    free_before = mgr.num_free_blocks
    run(mgr, "b", list(range(9)), finish=False)
    for b in hit_ids:
        assert mgr.block(b).ref_count == 1
        assert not mgr.pool.free_queue.contains(mgr.block(b))
    # two hits left the queue and one new block was taken for the tail
    assert mgr.num_free_blocks == free_before - 3
    run(mgr, "c", list(range(9)), finish=False)
    assert [mgr.block(b).ref_count for b in hit_ids] == [2, 2]


def test_finished_request_tail_is_evicted_before_its_shared_prefix():
    mgr, events = make(num_blocks=4)
    run(mgr, "a", list(range(16)))  # four full blocks, all cached, freed tail first
    order = [b.block_id for b in mgr.pool.free_queue]
    table = list(mgr.lookup(Request("q", list(range(16)))).hit_block_ids) + [None]
    # free queue: tail block of "a" first, its first block last
    assert order[0] != table[0] and order[-1] == table[0]
    run(mgr, "b", [100, 101, 102, 103, 104])  # needs two blocks -> evicts the two tail-most
    evicted = [e for e in events if isinstance(e, BlockEvicted)]
    assert len(evicted) == 2
    assert mgr.lookup(Request("q", list(range(16)))).num_hit_blocks == 2  # prefix survived


def test_taking_a_block_evicts_its_old_hash_and_lookups_no_longer_find_it():
    mgr, events = make(num_blocks=3)
    run(mgr, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    h = mgr.lookup(Request("q", [1, 2, 3, 4, 5])).block_hashes[0]
    assert mgr.is_cached(h)
    run(mgr, "b", [50, 51, 52, 53, 54, 55, 56, 57, 58])
    assert not mgr.is_cached(h)
    ev = [e for e in events if isinstance(e, BlockEvicted)]
    assert h in {e.block_hash for e in ev}
    look = mgr.lookup(Request("q", [1, 2, 3, 4, 5]))
    assert look.num_hit_blocks == 0
    assert look.miss.reason == "evicted"
    assert look.miss.evicted_by_seq in {e.seq for e in ev if e.block_hash == h}


def test_just_hit_block_is_not_evicted_while_other_free_blocks_exist():
    mgr, _ = make(num_blocks=6)
    run(mgr, "a", [1, 2, 3, 4, 9])      # block A cached
    run(mgr, "b", [5, 6, 7, 8, 9])      # block B cached, freed after A
    run(mgr, "c", [1, 2, 3, 4, 10])     # hit A again: A moves to the tail
    ha = mgr.lookup(Request("q", [1, 2, 3, 4, 0])).block_hashes[0]
    hb = mgr.lookup(Request("q", [5, 6, 7, 8, 0])).block_hashes[0]
    # The three partial blocks went back to the head: 4 empties go first, then the LRU
    # cached block, which is B (A was hit after it)
    run(mgr, "d", list(range(200, 219)))
    assert mgr.is_cached(ha)
    assert not mgr.is_cached(hb)


def test_refusal_leaves_every_ref_count_unchanged():
    mgr, events = make(num_blocks=4)
    run(mgr, "a", [1, 2, 3, 4, 5, 6, 7, 8], finish=False)
    before = [(b.ref_count, b.block_hash) for b in mgr.pool.blocks]
    free_before = [b.block_id for b in mgr.pool.free_queue]
    n_events = len(events)
    with pytest.raises(CapacityError) as info:
        mgr.allocate(Request("big", [1, 2, 3, 4] + list(range(100, 112))))
    assert "refused" in str(info.value)
    assert [(b.ref_count, b.block_hash) for b in mgr.pool.blocks] == before
    assert [b.block_id for b in mgr.pool.free_queue] == free_before
    assert mgr.counters.num_refused_requests == 1
    assert [e.kind for e in events[n_events:]] == ["request_refused"]
    mgr.check_invariants()


def test_reset_refused_while_in_use_then_clears_the_map():
    mgr, events = make()
    run(mgr, "a", list(range(12)), finish=False)
    with pytest.raises(ResetRefusedError):
        mgr.reset()
    assert mgr.pool.num_cached_blocks == 3
    mgr.finish("a")
    assert mgr.reset() == 3
    assert mgr.pool.num_cached_blocks == 0 and not mgr.pool.blocks_by_hash
    assert events[-1].kind == "cache_reset"
    look = mgr.lookup(Request("q", list(range(12))))
    assert look.num_hit_blocks == 0 and look.miss.reason == "evicted"
    mgr.check_invariants()


def test_same_salt_hits_different_salt_misses_salt_only_in_block_zero():
    mgr, _ = make()
    tokens = list(range(13))
    run(mgr, "a", tokens, salt="tenant-1")
    assert mgr.lookup(Request("b", tokens, salt="tenant-1")).num_hit_blocks == 3
    other = mgr.lookup(Request("c", tokens, salt="tenant-2"))
    assert other.num_hit_blocks == 0
    assert other.miss.reason == "salt" and other.miss.other_salt == "tenant-1"
    # the salt changes block 0's digest, and through the chain every later one,
    # but only block 0's hash input carries it
    h = mgr.hasher
    b0_a = h.hash_block(None, tokens[:4], "tenant-1")
    b0_b = h.hash_block(None, tokens[:4], "tenant-2")
    assert b0_a != b0_b
    assert h.hash_block(b0_a, tokens[4:8]) == h.hash_block(b0_a, tokens[4:8], None)
    assert h.hash_block(b0_a, tokens[4:8], "tenant-1") == h.hash_block(b0_a, tokens[4:8], "tenant-2")


def test_reuse_never_exceeds_prompt_len_minus_one():
    mgr, events = make()
    tokens = list(range(12))  # block aligned: 3 full blocks
    run(mgr, "a", tokens)
    look = mgr.lookup(Request("b", tokens))
    assert look.num_cached_tokens == 8 and look.num_computed_tokens == 4
    assert look.miss.reason == "last_token" and look.miss.first_miss_block == 2
    for n in range(1, 13):
        look = mgr.lookup(Request("c", tokens[:n]))
        assert look.num_cached_tokens <= n - 1
    # one token past a block boundary: the full blocks are reused, only the last token computed
    run(mgr, "d", list(range(13)))
    look = mgr.lookup(Request("e", list(range(13))))
    assert look.num_cached_tokens == 12 and look.miss.reason == "last_token"


def test_decode_filled_blocks_are_reused_by_the_next_turn():
    mgr, events = make()
    prompt = [1, 2, 3, 4, 5, 6]
    output = [7, 8, 9, 10, 11, 12]  # KV for prompt + 5 outputs = 11 tokens -> 2 full blocks
    run(mgr, "turn1", prompt, output)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [e.token_ids for e in stored] == [(1, 2, 3, 4), (5, 6, 7, 8)]
    assert stored[1].request_id == "turn1"
    turn2 = prompt + output + [13, 14, 15]
    look = mgr.lookup(Request("turn2", turn2))
    assert look.num_cached_tokens == 8
    assert look.miss.reason == "new_content" and look.miss.first_miss_block == 2
    # tokens 8..10 were computed by turn 1 but that block never filled, so never cached
    assert look.miss.divergence_token == 8


def test_new_content_reports_the_divergence_token():
    mgr, _ = make()
    run(mgr, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    look = mgr.lookup(Request("b", [1, 2, 3, 4, 5, 6, 99, 8, 9]))
    assert look.miss.reason == "new_content"
    assert look.miss.first_miss_block == 1
    assert look.miss.divergence_token == 6


def test_hashes_repeat_with_a_seed_and_differ_without():
    tokens = list(range(40))
    a = BlockHasher(seed=7).hash_chain(tokens, 16)
    b = BlockHasher(seed=7).hash_chain(tokens, 16)
    c = BlockHasher(seed=8).hash_chain(tokens, 16)
    d = BlockHasher().hash_chain(tokens, 16)
    e = BlockHasher().hash_chain(tokens, 16)
    assert a == b and len(a) == 2
    assert a != c and d != e and a != d
    x = BlockHasher("xxh3", seed=7).hash_chain(tokens, 16)
    assert x == BlockHasher("xxh3", seed=7).hash_chain(tokens, 16)
    assert len(x[0]) == 16 and len(a[0]) == 32


def test_model_identity_separates_caches():
    assert BlockHasher(seed=1, model_id="m1").hash_chain([1, 2], 2) != \
        BlockHasher(seed=1, model_id="m2").hash_chain([1, 2], 2)


def test_collision_guard_compares_token_ids():
    mgr, _ = make()
    run(mgr, "a", [1, 2, 3, 4, 5])
    # Forge a collision: make the cached block claim other tokens under the same digest.
    h = mgr.lookup(Request("q", [1, 2, 3, 4, 5])).block_hashes[0]
    block = mgr.pool.get_cached_block(h)
    block.token_ids = (9, 9, 9, 9)
    look = mgr.lookup(Request("b", [1, 2, 3, 4, 5]))
    assert look.num_hit_blocks == 0
    assert mgr.counters.num_hash_collisions == 1


def test_concurrent_requests_share_blocks_with_ref_counts_above_one():
    mgr, _ = make(num_blocks=32)
    system = list(range(8))
    for i in range(3):
        mgr.allocate(Request(f"r{i}", system + [100 + i, 101 + i]))
    shared = mgr.block_table("r0")[:2]
    assert mgr.block_table("r1")[:2] == shared and mgr.block_table("r2")[:2] == shared
    assert [mgr.block(b).ref_count for b in shared] == [3, 3]
    mgr.append("r1", token_ids=[5, 6])
    mgr.finish("r0")
    assert [mgr.block(b).ref_count for b in shared] == [2, 2]
    mgr.check_invariants()
    mgr.finish("r2")
    mgr.finish("r1")
    assert mgr.pool.num_used_blocks == 0
    mgr.check_invariants()


def test_append_refusal_changes_nothing():
    mgr, _ = make(num_blocks=2)
    mgr.allocate(Request("a", [1, 2, 3, 4, 5, 6, 7, 8]))
    with pytest.raises(CapacityError):
        mgr.append("a", token_ids=[9])
    assert mgr.num_tokens("a") == 8 and len(mgr.block_table("a")) == 2
    mgr.check_invariants()


def test_lookup_event_carries_miss_info():
    mgr, events = make()
    run(mgr, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    run(mgr, "b", [1, 2, 3, 4, 0, 6, 7, 8, 9])
    lookups = [e for e in events if isinstance(e, LookupDone)]
    assert lookups[1].num_hit_blocks == 1
    assert lookups[1].miss.reason == "new_content" and lookups[1].miss.divergence_token == 4


def test_bad_arguments_are_sentences():
    with pytest.raises(ValueError, match="block size"):
        PrefixCacheManager(4, 0)
    with pytest.raises(ValueError, match="at least one block"):
        PrefixCacheManager(0, 4)
    with pytest.raises(ValueError, match="empty prompt"):
        Request("x", [])
    with pytest.raises(ValueError, match="unknown hash"):
        BlockHasher("md5")
