"""The model runner on the paged KV pool: reuse is exact, really skips prefill, and the
pool's bookkeeping (decode blocks, fan-out ref counts, capacity) matches the engine."""

from __future__ import annotations

import pytest
import torch

from engine.core.errors import CapacityError
from engine.core.events import BlockStored, EventBus
from engine.model.kv_pool import KVPool, KVShape
from engine.model.runner import ModelRunner
from engine.core.trace import common_prefix_length


def _count_prefilled_tokens(model):
    """Count token positions that really go through the network (embedding lookups)."""
    seen: list[int] = []
    handle = model.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[-1]))
    return seen, handle


def _assert_same(a, b, tol=1e-4):
    assert a.output_token_ids == b.output_token_ids
    assert float((a.first_logits - b.first_logits).abs().max()) <= tol
    assert float((a.last_logits - b.last_logits).abs().max()) <= tol


# ---------------------------------------------------------------- KV pool
def test_pool_write_gather_round_trip_on_scattered_blocks():
    shape = KVShape(num_layers=3, num_kv_heads=2, head_dim=8)
    pool = KVPool(shape, block_size=4, num_blocks=10)
    blocks = [7, 2, 9]
    layers = [(torch.randn(1, 2, 11, 8), torch.randn(1, 2, 11, 8)) for _ in range(3)]
    pool.write(blocks, 0, [(k[:, :, :5], v[:, :, :5]) for k, v in layers])
    pool.write(blocks, 5, [(k[:, :, 5:], v[:, :, 5:]) for k, v in layers])
    got = pool.gather(blocks, 11)
    for (k, v), (gk, gv) in zip(layers, got):
        assert torch.equal(k, gk) and torch.equal(v, gv)
    assert torch.equal(pool.block(2)[1, 0, :, 0], layers[1][0][0, :, 4])  # block id indexes directly


def test_pool_capacity_from_memory_budget_and_measured_bytes():
    shape = KVShape(num_layers=30, num_kv_heads=3, head_dim=64, dtype=torch.float32)
    per_block = 2 * 30 * 3 * 64 * 4 * 16
    pool = KVPool(shape, block_size=16, memory_bytes=10 * per_block + 5)
    assert pool.num_blocks == 10
    assert pool.nbytes == 10 * per_block == sum(pool.per_layer_bytes())
    assert pool.bytes_per_token == shape.bytes_per_token == 2 * 30 * 3 * 64 * 4
    with pytest.raises(ValueError, match="does not hold one block"):
        KVPool(shape, block_size=16, memory_bytes=per_block - 1)


def test_model_kv_bytes_equal_the_formula(tiny_model):
    runner = ModelRunner(tiny_model, num_blocks=8, block_size=4)
    seq_tokens = list(range(100, 123))
    from transformers import DynamicCache

    cache = DynamicCache(config=tiny_model.model.config)
    with torch.inference_mode():
        tiny_model.model(input_ids=torch.tensor([seq_tokens]), cache=cache, use_cache=True)
    measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    m = tiny_model
    assert measured == 2 * m.num_layers * m.num_kv_heads * m.head_dim * 4 * len(seq_tokens)
    assert runner.kv_pool.bytes_per_token * len(seq_tokens) == measured


# ---------------------------------------------------------------- tiny random Llama
def test_reuse_is_exact_on_tiny_model(tiny_model):
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=4)
    history = list(range(300, 341))
    for turn in range(3):
        warm = runner.generate(history, max_new_tokens=6)
        cold = runner.generate(history, max_new_tokens=6, use_cache=False)
        _assert_same(warm, cold)
        assert warm.num_cached_tokens > 0 or turn == 0
        history = history + warm.output_token_ids + [400 + turn, 401, 402, 403, 404]
    runner.manager.check_invariants()


def test_working_buffers_of_different_sizes_are_reused_exactly(tiny_model):
    runner = ModelRunner(tiny_model, num_blocks=400, block_size=16)
    short, long = list(range(30, 60)), list(range(100, 700))
    results = [runner.generate(p, max_new_tokens=3) for p in (short, long, short, long, long[:-5])]
    for prompt, warm in zip((short, long, short, long, long[:-5]), results):
        _assert_same(warm, runner.generate(prompt, max_new_tokens=3, use_cache=False))
    assert len(runner._spare_buffers) <= 2


def test_hit_really_skips_prefill(tiny_model):
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=4)
    prompt = list(range(500, 530))
    runner.generate(prompt, max_new_tokens=1)
    seen, handle = _count_prefilled_tokens(tiny_model.model)
    try:
        again = runner.generate(prompt + [7, 8, 9], max_new_tokens=1)
    finally:
        handle.remove()
    assert again.num_cached_tokens == 28  # 7 full blocks of 4; tokens 28.. computed
    assert again.num_computed_tokens == again.num_prompt_tokens - again.num_cached_tokens == 5
    assert seen == [5]  # only the suffix went through the network


def test_decode_blocks_are_stored_and_reused(tiny_model):
    bus = EventBus()
    stored: list[BlockStored] = []
    bus.subscribe(lambda e: stored.append(e) if isinstance(e, BlockStored) else None)
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=4, events=bus)
    prompt = list(range(600, 610))  # 2 full blocks + 2 tokens
    first = runner.generate(prompt, max_new_tokens=9)
    assert len(first.output_token_ids) == 9 and first.finish_reason == "length"
    # KV exists for 10 + 8 tokens: blocks 0..3 full, two of them filled during decoding
    assert len(stored) == 4 and stored[-1].token_ids == tuple((prompt + first.output_token_ids)[12:16])
    nxt = runner.generate(prompt + first.output_token_ids + [5, 6], max_new_tokens=2)
    assert nxt.num_cached_tokens == 16
    cold = runner.generate(nxt.prompt_token_ids, max_new_tokens=2, use_cache=False)
    _assert_same(nxt, cold)


def test_a_probe_reuses_the_cache_but_leaves_nothing_behind(tiny_model):
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=4)
    runner.generate(list(range(40, 53)), max_new_tokens=1)
    prompt = list(range(40, 53)) + list(range(60, 70))
    cached_before = runner.manager.snapshot().num_cached_blocks
    probes = [runner.generate(prompt, max_new_tokens=1, probe=True) for _ in range(2)]
    assert runner.manager.snapshot().num_cached_blocks == cached_before
    real = runner.generate(prompt, max_new_tokens=1)
    assert [p.num_cached_tokens for p in probes] == [real.num_cached_tokens] * 2 == [12, 12]
    assert runner.manager.snapshot().num_cached_blocks == cached_before + 2  # prompt blocks 3 and 4
    _assert_same(probes[0], real)


def test_fan_out_prefills_the_shared_prefix_once(tiny_model):
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=4)
    prefix = list(range(700, 724))  # 6 blocks
    prompts = [prefix + [1, 2, 3], prefix + [4, 5, 6, 7, 8], prefix + [9]]
    shared_blocks: list[tuple[int, ...]] = []
    ref_counts: list[list[int]] = []

    def watch(token_id: int, text: str) -> None:
        running = runner.manager.running_request_ids
        tables = [runner.manager.block_table(r) for r in running]
        shared_blocks.append(tables[0][:6])
        ref_counts.append([runner.manager.block(b).ref_count for b in tables[0][:6]])

    seen, handle = _count_prefilled_tokens(tiny_model.model)
    try:
        results = runner.generate_batch(prompts, max_new_tokens=3, on_token=watch)
    finally:
        handle.remove()
    assert seen[:3] == [27, 5, 1]  # the prefix went through the network once
    assert [r.num_cached_tokens for r in results] == [0, 24, 24]
    assert all(counts == [3] * 6 for counts in ref_counts)  # ref count N while all N run
    tables = [r.block_ids for r in results]
    assert tables[0][:6] == tables[1][:6] == tables[2][:6]
    own = [set(t[6:]) for t in tables]
    assert not (own[0] & own[1]) and not (own[1] & own[2]) and not (own[0] & own[2])
    for prompt, warm in zip(prompts, results):
        _assert_same(warm, runner.generate(prompt, max_new_tokens=3, use_cache=False))
    runner.manager.check_invariants()
    assert runner.manager.num_free_blocks == 64


def test_fan_out_reserves_room_for_every_output(tiny_model):
    runner = ModelRunner(tiny_model, num_blocks=7, block_size=4)
    prefix = list(range(800, 808))
    prompts = [prefix + [1, 2], prefix + [3, 4], prefix + [5, 6]]  # 2 shared blocks, 2 own each with output
    with pytest.raises(CapacityError):
        runner.generate_batch(prompts, max_new_tokens=7)  # admitting the third would starve a decode
    assert runner.manager.running_request_ids == () and runner.manager.num_free_blocks == 7
    runner.manager.check_invariants()
    assert len(runner.generate_batch(prompts[:2], max_new_tokens=7)) == 2


def test_refused_request_changes_nothing(tiny_model):
    runner = ModelRunner(tiny_model, num_blocks=4, block_size=4)
    before = runner.manager.snapshot()
    with pytest.raises(CapacityError):
        runner.generate(list(range(20)), max_new_tokens=2)
    after = runner.manager.snapshot()
    assert before.blocks == after.blocks and after.num_free_blocks == 4


def test_sampling_is_seeded_and_streams(tiny_model):
    outs = []
    for _ in range(2):
        runner = ModelRunner(tiny_model, num_blocks=32, block_size=4, seed=7)
        pieces: list[str] = []
        res = runner.generate(list(range(50, 60)), max_new_tokens=5, temperature=0.8, top_p=0.9,
                              on_token=lambda t, s: pieces.append(s))
        assert "".join(pieces) == res.output_text
        outs.append(res.output_token_ids)
    assert outs[0] == outs[1]
    with pytest.raises(ValueError, match="top_p"):
        runner.generate([1, 2], top_p=0.0)
    with pytest.raises(ValueError, match="vocabulary"):
        runner.generate([1, 10**7])
    assert runner.manager.running_request_ids == ()


# ---------------------------------------------------------------- the real default model

@pytest.mark.model
def test_multi_turn_chat_reuse_is_exact_on_default_model(default_model):
    runner = ModelRunner(default_model, num_blocks=128, block_size=16)
    messages = [{"role": "system", "content": "You are terse. Answer in a few words."},
                {"role": "user", "content": "Name a primary colour."}]
    follow_ups = ["Name another one.", "And a third?"]
    with_kv: list[int] = []  # tokens of the previous turn whose KV went into the pool
    decode_blocks_reused = 0
    previous_prompt = 0
    for turn in range(3):
        warm = runner.chat(messages, max_new_tokens=10)
        cold = runner.generate(warm.prompt_token_ids, max_new_tokens=10, use_cache=False)
        _assert_same(warm, cold)
        assert warm.num_computed_tokens == warm.num_prompt_tokens - warm.num_cached_tokens
        if turn:
            # reuse is exactly the whole blocks shared with the previous turn's KV
            common = min(common_prefix_length(with_kv, warm.prompt_token_ids), warm.num_prompt_tokens - 1)
            assert warm.num_cached_tokens == common // 16 * 16 > 0
            decode_blocks_reused += warm.num_cached_tokens > previous_prompt // 16 * 16
        previous_prompt = warm.num_prompt_tokens
        with_kv = warm.prompt_token_ids + warm.output_token_ids[:-1]
        messages += [{"role": "assistant", "content": warm.output_text},
                     {"role": "user", "content": follow_ups[turn] if turn < 2 else "Thanks."}]
    assert decode_blocks_reused >= 1  # blocks filled while decoding were hits on a later turn
    runner.manager.check_invariants()


def test_kept_alive_baseline_of_the_ttft_bench_agrees_with_cold(tiny_model):
    from engine.bench.ttft import KeptAliveChat

    runner = ModelRunner(tiny_model, num_blocks=32, block_size=4)
    kept = KeptAliveChat(tiny_model.model)
    first = list(range(900, 913))
    token, _, reused = kept.first_token(first)
    assert reused == 0 and token == runner.generate(first, max_new_tokens=1, use_cache=False).output_token_ids[0]
    kept.extend([token, 5])
    edited = first[:10] + [1, 2, 3]  # diverges inside the kept history: the cache is cropped
    token, _, reused = kept.first_token(edited)
    assert reused == 10 and kept.cache.get_seq_length() == len(edited)
    assert token == runner.generate(edited, max_new_tokens=1, use_cache=False).output_token_ids[0]
