"""CacheBlend's math (engine.demos.cacheblend) on a small random Llama, and its demo on the real model."""

from __future__ import annotations

import json

import pytest
import torch

from engine.core.errors import InputError
from engine.demos import cacheblend as cb


@pytest.fixture(scope="module")
def tiny(default_tokenizer):
    from engine.model.loader import tiny_random_model

    # Four layers, so layers past the check layer (1) run on the selected tokens only.
    return tiny_random_model(seed=3, num_layers=4, tokenizer=default_tokenizer).model


def _ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, 4000, (n,), generator=g).tolist()


@pytest.fixture(scope="module")
def pieces():
    return _ids(7, 0), [_ids(11, 1), _ids(9, 2), _ids(13, 3)], _ids(5, 4)


def test_rerotated_keys_equal_keys_computed_at_the_new_position(tiny):
    chunk = _ids(12, 7)
    at_zero, at_forty = cb.prefill_chunk(tiny, chunk, 0), cb.prefill_chunk(tiny, chunk, 40)
    for layer in range(len(at_zero.keys)):
        moved = cb.rerotate_keys(tiny, at_zero.keys[layer], 40)
        torch.testing.assert_close(moved, at_forty.keys[layer], atol=1e-5, rtol=1e-4)
        # Attention sees relative positions only, so a lone chunk's values do not move.
        torch.testing.assert_close(at_zero.values[layer], at_forty.values[layer], atol=1e-5, rtol=1e-4)
    # And the rotation really does something: unrotated keys are far from the moved ones.
    assert float((at_zero.keys[1] - at_forty.keys[1]).abs().max()) > 1e-2


def test_recomputing_every_token_is_full_prefill(tiny, pieces):
    prefix, chunks, suffix = pieces
    prompt = prefix + [t for c in chunks for t in c] + suffix
    cache, logits = cb.full_prefill(tiny, prompt)
    res = cb.blend_prefill(tiny, cb.prefill_chunk(tiny, prefix), [cb.prefill_chunk(tiny, c) for c in chunks],
                           suffix, recompute_ratio=1.0)
    assert res.token_ids == prompt
    assert res.recomputed_positions == list(range(len(prefix), len(prefix) + sum(map(len, chunks))))
    torch.testing.assert_close(res.logits, logits, atol=1e-4, rtol=1e-4)
    for mine, ref in zip(res.cache.layers, cache.layers):
        torch.testing.assert_close(mine.keys, ref.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(mine.values, ref.values, atol=1e-4, rtol=1e-4)
    # Decoding on from the blended cache gives the same greedy tokens as from full prefill.
    n = len(prompt)
    assert cb.greedy_continue(tiny, res.cache, res.logits, n, 6) == cb.greedy_continue(tiny, cache, logits, n, 6)


def test_plain_concatenation_differs_and_blending_recomputes_the_share_asked(tiny, pieces):
    prefix, chunks, suffix = pieces
    prompt = prefix + [t for c in chunks for t in c] + suffix
    _, logits = cb.full_prefill(tiny, prompt)
    pk, kv = cb.prefill_chunk(tiny, prefix), [cb.prefill_chunk(tiny, c) for c in chunks]
    concat = cb.blend_prefill(tiny, pk, kv, suffix, recompute_ratio=0.0)
    blend = cb.blend_prefill(tiny, pk, kv, suffix, recompute_ratio=0.3)
    n_chunk = sum(map(len, chunks))
    assert concat.recomputed_positions == [] and concat.num_chunk_tokens == n_chunk
    assert len(blend.recomputed_positions) == round(0.3 * n_chunk)
    assert all(len(prefix) <= p < len(prefix) + n_chunk for p in blend.recomputed_positions)
    # The chunks lost their context, so reusing them as they are changes the result.
    assert float((concat.logits - logits).abs().max()) > 1e-3
    # The selected tokens are the ones whose layer-1 values deviate most.
    dev = blend.deviation
    chosen = {p - len(prefix) for p in blend.recomputed_positions}
    rest = [float(dev[i]) for i in range(n_chunk) if i not in chosen]
    assert min(float(dev[i]) for i in chosen) >= max(rest)
    assert dev.shape == (n_chunk,) and float(dev.min()) >= 0 and float(dev.max()) > 0


def test_select_tokens_takes_the_largest_in_position_order():
    dev = torch.tensor([0.1, 5.0, 0.3, 4.0, 0.2, 3.0])
    assert cb.select_tokens(dev, 0.5).tolist() == [1, 3, 5]
    assert cb.select_tokens(dev, 0.0).tolist() == []
    assert cb.select_tokens(dev, 1.0).tolist() == list(range(6))


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"recompute_ratio": 1.5}, "between 0 and 1"),
    ({"recompute_ratio": -0.1}, "between 0 and 1"),
    ({"check_layer": 4}, "0 to 3"),
])
def test_bad_arguments_are_refused_in_one_sentence(tiny, pieces, kwargs, words):
    prefix, chunks, suffix = pieces
    with pytest.raises(InputError, match=words):
        cb.blend_prefill(tiny, None, [cb.prefill_chunk(tiny, chunks[0])], suffix, **kwargs)


def test_missing_chunks_or_suffix_are_refused(tiny, pieces):
    _, chunks, suffix = pieces
    with pytest.raises(InputError, match="at least one cached chunk"):
        cb.blend_prefill(tiny, None, [], suffix)
    with pytest.raises(InputError, match="suffix"):
        cb.blend_prefill(tiny, None, [cb.prefill_chunk(tiny, chunks[0])], [])
    with pytest.raises(InputError, match="at least one token"):
        cb.prefill_chunk(tiny, [])


def test_a_rotary_embedding_that_is_not_a_rotation_is_refused(tiny, monkeypatch):
    monkeypatch.setattr(tiny.config, "rope_parameters", {"rope_type": "dynamic", "rope_theta": 10000.0})
    with pytest.raises(InputError, match="rope type 'dynamic'"):
        cb.rerotate_keys(tiny, torch.zeros(1, 2, 3, 16), 5)


# ---------------------------------------------------------------------------- the demo, real model
@pytest.fixture(scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # shared cores: see tests/test_demos.py
    yield
    torch.set_num_threads(before)


@pytest.mark.model
def test_cacheblend_demo_on_the_shipped_rag_prompts(default_model, one_torch_thread):
    from engine.demos import DemoEnv, run_demo

    r = run_demo("cacheblend-rag", DemoEnv(model=default_model))
    json.dumps(r)
    f = r["findings"]
    assert f["prompts"] == 2 and len(f["per_prompt"]) == 2
    for row in f["per_prompt"]:
        n = row["chunk_tokens"]
        assert row["prompt_tokens"] == row["prefix_tokens"] + n + row["suffix_tokens"]
        assert row["concat"]["recomputed_chunk_tokens"] == 0
        assert row["blend"]["recomputed_chunk_tokens"] == round(0.15 * n)
        # Recomputing the deviating tokens brings the first token's distribution closer
        # to full prefill than plain concatenation of the chunk caches does.
        assert row["blend"]["kl_from_full"] < row["concat"]["kl_from_full"]
        assert row["blend"]["same_first_token"]
        assert row["blend"]["greedy_matching_tokens"] >= row["concat"]["greedy_matching_tokens"]
        assert row["full_prefill_ttft_ms"] > 0 and row["blend"]["ttft_ms"] > 0
    # The engine's prefix cache reuses the second prompt only up to its first moved chunk.
    second = f["per_prompt"][1]
    assert second["prefix_caching_cached_tokens"] < second["prefix_tokens"] + 16
    assert r["events"]["request_started"] == 2
    assert f["blend_kl_from_full"] < f["concat_kl_from_full"]
    # Plain concatenation fails somewhere: a different first token or greedy text that parts at once.
    assert any(not row["concat"]["same_first_token"] or row["concat"]["greedy_matching_tokens"] <= 1
               for row in f["per_prompt"])
    assert 0 < f["blend_compute_fraction_of_full"] < 0.5
    assert f["why_short_of_the_paper"] and f["diff_messages"]["a"] != f["diff_messages"]["b"]
