"""CacheBlend on the real model: reuse per-chunk KV at any position, recompute a few tokens.

CacheBlend (Yao et al., "CacheBlend: Fast Large Language Model Serving for RAG with
Cached Knowledge Fusion", EuroSys 2025; the `blend` path of LMCache) serves a RAG prompt
whose retrieved chunks were each prefilled on their own, in another request and at another
position. It does three things, all implemented here on a transformers Llama-style model:

1. Re-position: a chunk's keys were rotated (RoPE) for positions 0..L-1; rotating each key
   by the position delta puts them at o..o+L-1 exactly, since R(o + i) = R(o) R(i)
   (`rerotate_keys`). Values carry no position.
2. Select: the first layer's inputs are token embeddings only, so its KV does not depend on
   the context. From the check layer (layer 1, as LMCache's `blend_check_layers = [1]`)
   on, a chunk's reused KV misses the cross-attention to the chunks before it. All tokens
   are computed for layers 0..check; the chunk tokens whose values deviate most from the
   freshly computed ones (the paper's HKVD tokens, ~15%) are kept (`select_tokens`).
3. Recompute: on every later layer only the selected tokens and the new suffix (the
   question) are computed; their K and V replace the reused ones, and they attend over the
   whole mixed cache.

`blend_prefill` does 1-3 and returns a ready `DynamicCache` (transformers 5.x: per-layer
`keys`/`values`) and the logits of the last prompt token; `recompute_ratio=0` is plain
concatenation of the re-positioned chunk caches, `1` recomputes everything (full prefill).
The demo at the end measures it against full prefill on the shipped RAG prompts.
"""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from engine.core.errors import InputError
from engine.demos.env import Demo, DemoEnv, load_resource

# torch is imported in the functions that run the model: listing the demos (the Demos menu at
# the window's start, `cachescope demo --list`) imports this module and must not wait seconds.
if TYPE_CHECKING:
    import torch

DEFAULT_RECOMPUTE_RATIO = 0.15  # the paper's and LMCache's default share of chunk tokens
DEFAULT_CHECK_LAYER = 1  # LMCache's blend_check_layers = [1]
# Rotary variants whose angle is a fixed frequency times the position, so rotations compose.
_ROTATION_ROPE_TYPES = ("default", "linear", "llama3")


# ---------------------------------------------------------------------------- the model's parts
@dataclass(slots=True, frozen=True)
class _Parts:
    embed: Any
    layers: Any
    norm: Any
    lm_head: Any
    rotary: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int
    cache_kwarg: str


def _parts(model: Any) -> _Parts:
    """The decoder pieces CacheBlend drives layer by layer; a clear refusal otherwise."""
    base = getattr(model, "model", None)
    names = ("embed_tokens", "layers", "norm", "rotary_emb")
    if base is None or not all(hasattr(base, n) for n in names) or not hasattr(model, "lm_head"):
        raise InputError(f"CacheBlend here needs a Llama-style decoder (embed_tokens, layers, norm, rotary_emb); "
                         f"{type(model).__name__} has another layout")
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in _ROTATION_ROPE_TYPES:
        raise InputError(f"CacheBlend re-positions keys by rotating them, which needs a rotary embedding whose "
                         f"angle is a fixed frequency times the position; rope type {rope_type!r} is not")
    attn = base.layers[0].self_attn
    params = inspect.signature(model.forward).parameters
    return _Parts(base.embed_tokens, base.layers, base.norm, model.lm_head, base.rotary_emb,
                  cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim,
                  "cache" if "cache" in params else "past_key_values")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _cos_sin(parts: _Parts, like: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[1, n, head_dim]` for `positions`, as the model's own rotary embedding makes them."""
    return parts.rotary(like, positions.unsqueeze(0))


def rerotate_keys(model: Any, keys: torch.Tensor, delta: int) -> torch.Tensor:
    """Keys `[batch, kv_heads, n, head_dim]` rotated for positions p moved to p + `delta`.

    RoPE rotates each pair of key dimensions by an angle proportional to the position, so
    rotating a stored key once more by the angle of `delta` is exactly the key computed at
    the new position. The rotary embedding's attention scaling is divided out (it is 1 for
    the default, linear and llama3 types).
    """
    if delta == 0:
        return keys
    cos, sin = _rotation(_parts(model), keys, delta)
    return keys * cos + _rotate_half(keys) * sin


def _rotation(parts: _Parts, like: torch.Tensor, delta: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[1, 1, 1, head_dim]` of a rotation by `delta` positions."""
    import torch

    cos, sin = _cos_sin(parts, like, torch.tensor([delta], dtype=torch.long))
    scale = float(getattr(parts.rotary, "attention_scaling", 1.0) or 1.0)
    return (cos / scale).unsqueeze(1).to(like.dtype), (sin / scale).unsqueeze(1).to(like.dtype)


# ---------------------------------------------------------------------------- chunk caches
@dataclass(slots=True)
class ChunkKV:
    """The KV of `token_ids` prefilled on their own, keys rotated for positions `start`.. ."""

    token_ids: tuple[int, ...]
    keys: list[torch.Tensor]  # per layer [1, kv_heads, n, head_dim]
    values: list[torch.Tensor]
    start: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def prefill_chunk(model: Any, token_ids: Sequence[int], start: int = 0) -> ChunkKV:
    """Prefill `token_ids` alone at positions `start`.. and keep the KV of every layer
    (read from the `DynamicCache`'s layers, transformers 5.x)."""
    import torch

    if not token_ids:
        raise InputError("a chunk needs at least one token")
    parts = _parts(model)
    cache = _new_cache(model)
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    positions = torch.arange(start, start + len(token_ids), dtype=torch.long).unsqueeze(0)
    with torch.inference_mode():
        model(input_ids=ids, position_ids=positions, use_cache=True, **{parts.cache_kwarg: cache})
    return ChunkKV(tuple(int(t) for t in token_ids), [layer.keys.clone() for layer in cache.layers],
                   [layer.values.clone() for layer in cache.layers], start)


def full_prefill(model: Any, token_ids: Sequence[int]) -> tuple[Any, torch.Tensor]:
    """The reference: the model's own forward over the whole prompt; (cache, last logits)."""
    import torch

    parts = _parts(model)
    cache = _new_cache(model)
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    positions = torch.arange(len(token_ids), dtype=torch.long).unsqueeze(0)
    kwargs: dict[str, Any] = {parts.cache_kwarg: cache, "use_cache": True, "position_ids": positions}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1
    with torch.inference_mode():
        out = model(input_ids=ids, **kwargs)
    return cache, out.logits[0, -1].float()


def prefill_after(model: Any, cache: Any, token_ids: Sequence[int], start: int) -> torch.Tensor:
    """Extend `cache` (holding `start` tokens) with `token_ids`; the last position's logits."""
    import torch

    parts = _parts(model)
    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    positions = torch.arange(start, start + len(token_ids), dtype=torch.long).unsqueeze(0)
    with torch.inference_mode():
        out = model(input_ids=ids, position_ids=positions, use_cache=True, **{parts.cache_kwarg: cache})
    return out.logits[0, -1].float()


def _eos_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        ids.update([value] if isinstance(value, int) else list(value or ()))
    return ids


def greedy_continue(model: Any, cache: Any, logits: torch.Tensor, position: int, num_tokens: int) -> list[int]:
    """Up to `num_tokens` greedy tokens from `logits` on, decoding with `cache` at
    `position`..; stops after an end-of-sequence token (what follows it means nothing)."""
    import torch

    eos = _eos_ids(model)
    out = [int(torch.argmax(logits))]
    for step in range(num_tokens - 1):
        if out[-1] in eos:
            break
        logits = prefill_after(model, cache, [out[-1]], position + step)
        out.append(int(torch.argmax(logits)))
    return out


# ---------------------------------------------------------------------------- blending
@dataclass(slots=True)
class BlendResult:
    """What `blend_prefill` made: a full-prompt cache and the last token's logits."""

    cache: Any
    logits: torch.Tensor
    token_ids: list[int]
    num_chunk_tokens: int
    recomputed_positions: list[int]  # chunk-token positions recomputed past the check layer
    deviation: torch.Tensor | None  # per chunk token, the check layer's value deviation (L2)
    ms: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def recomputed_fraction(self) -> float:
        return len(self.recomputed_positions) / self.num_chunk_tokens if self.num_chunk_tokens else 0.0


def select_tokens(deviation: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices (ascending) of the `round(ratio * n)` largest deviations, ties by position."""
    import torch

    k = int(round(ratio * deviation.numel()))
    if k <= 0:
        return torch.empty(0, dtype=torch.long)
    top = torch.topk(deviation, k, largest=True, sorted=False).indices
    return torch.sort(top).values


def _check_args(parts: _Parts, chunks: Sequence[ChunkKV], suffix: Sequence[int], ratio: float, check_layer: int) -> None:
    if not chunks:
        raise InputError("CacheBlend needs at least one cached chunk")
    if not suffix:
        raise InputError("CacheBlend needs a suffix (the question) to compute; it is empty")
    if not 0.0 <= ratio <= 1.0:
        raise InputError(f"the recompute ratio is a share of the chunk tokens between 0 and 1, not {ratio}")
    if not 0 <= check_layer < len(parts.layers):
        raise InputError(f"the check layer must be one of the model's layers, 0 to {len(parts.layers) - 1}, "
                         f"not {check_layer}")
    n = len(parts.layers)
    if any(len(c.keys) != n or len(c.values) != n for c in chunks):
        raise InputError(f"a chunk cache holds a different number of layers than this model's {n}")


def blend_prefill(model: Any, prefix: ChunkKV | None, chunks: Sequence[ChunkKV], suffix_ids: Sequence[int],
                  recompute_ratio: float = DEFAULT_RECOMPUTE_RATIO,
                  check_layer: int = DEFAULT_CHECK_LAYER) -> BlendResult:
    """Prefill `prefix + chunks + suffix` from cached KV, recomputing a share of the chunk tokens.

    `prefix` is an exact prefix cache (its KV is at positions 0.., as prefix caching keeps
    it) or None. Each chunk's KV is moved to where the chunk now sits (`rerotate_keys`).
    Layers 0..`check_layer` are computed for every chunk and suffix token; at the check
    layer the `recompute_ratio` share of chunk tokens with the largest value deviation
    (L2 over heads and dimensions, fresh against reused) is selected, and only they and
    the suffix are computed on the later layers, over the mixed cache. Returns the cache
    of the whole prompt and the last token's logits; decode on from there as usual.
    """
    import torch

    parts = _parts(model)
    _check_args(parts, chunks, suffix_ids, recompute_ratio, check_layer)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    P = len(prefix) if prefix is not None else 0
    token_ids = list(prefix.token_ids if prefix is not None else ()) + [t for c in chunks for t in c.token_ids]
    C = len(token_ids)
    token_ids += [int(t) for t in suffix_ids]
    T = len(token_ids)
    # The reused cache of the whole prompt: prefix as is, chunks moved, room for the suffix.
    keys, values = [], []
    offsets = [P + sum(len(c) for c in chunks[:i]) for i in range(len(chunks))]
    rotations = [_rotation(parts, c.keys[0], o - c.start) if o != c.start else None for c, o in zip(chunks, offsets)]
    for layer in range(len(parts.layers)):
        k_parts = [prefix.keys[layer]] if prefix is not None else []
        v_parts = [prefix.values[layer]] if prefix is not None else []
        for c, rot in zip(chunks, rotations):
            k = c.keys[layer]
            k_parts.append(k if rot is None else k * rot[0] + _rotate_half(k) * rot[1])
            v_parts.append(c.values[layer])
        k, v = torch.cat(k_parts, dim=-2), torch.cat(v_parts, dim=-2)
        pad = k.new_zeros((*k.shape[:2], T - C, k.shape[-1]))
        keys.append(torch.cat([k, pad], dim=-2))
        values.append(torch.cat([v, pad.clone()], dim=-2))
    timings["reposition_ms"] = (time.perf_counter() - t0) * 1000.0

    with torch.inference_mode():
        active = torch.arange(P, T, dtype=torch.long)  # chunk and suffix tokens
        ids = torch.tensor([token_ids], dtype=torch.long)
        hidden = parts.embed(ids[:, active])
        all_pos = torch.arange(T, dtype=torch.long)
        cos_all, sin_all = _cos_sin(parts, hidden, all_pos)
        groups = parts.num_heads // parts.num_kv_heads
        deviation, selected = None, None
        for index, layer in enumerate(parts.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            n = x.shape[1]
            q = attn.q_proj(x).view(1, n, parts.num_heads, parts.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, n, parts.num_kv_heads, parts.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, n, parts.num_kv_heads, parts.head_dim).transpose(1, 2)
            cos, sin = cos_all[:, active].unsqueeze(1), sin_all[:, active].unsqueeze(1)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if index == check_layer:
                chunk_rows = active < C
                fresh = v[:, :, chunk_rows]
                reused = values[index][:, :, active[chunk_rows]]
                deviation = (fresh - reused).pow(2).sum(dim=(0, 1, 3)).sqrt()
            keys[index][:, :, active] = k
            values[index][:, :, active] = v
            kk = keys[index].repeat_interleave(groups, dim=1) if groups > 1 else keys[index]
            vv = values[index].repeat_interleave(groups, dim=1) if groups > 1 else values[index]
            mask = all_pos.unsqueeze(0) <= active.unsqueeze(1)  # [n, T]: causal by position
            out = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask,
                                                                   scale=attn.scaling)
            out = attn.o_proj(out.transpose(1, 2).reshape(1, n, -1))
            hidden = hidden + out
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            if index == check_layer:
                # From here on only the selected chunk tokens and the suffix go on.
                selected = select_tokens(deviation, recompute_ratio)
                keep = torch.cat([selected, torch.arange(C - P, T - P, dtype=torch.long)])
                hidden = hidden[:, keep]
                active = active[keep]
                timings["select_ms"] = (time.perf_counter() - t0) * 1000.0
        logits = parts.lm_head(parts.norm(hidden[:, -1:]))[0, -1].float()
        cache = _new_cache(model)
        for index in range(len(parts.layers)):
            cache.update(keys[index], values[index], index)
    recomputed = [] if selected is None else [P + int(i) for i in selected]
    return BlendResult(cache, logits, token_ids, C - P, recomputed,
                       deviation, (time.perf_counter() - t0) * 1000.0, timings)


# ---------------------------------------------------------------------------- the demo
GREEDY_TOKENS = 10
TIMING_REPEATS = 3


def _median_ms(fn: Any, repeats: int = TIMING_REPEATS) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(times), out


def rag_pieces(tokenizer: Any, spec: dict[str, Any], order: Sequence[str],
               question: str) -> tuple[list[int], list[list[int]], list[int]]:
    """The prefix, chunk and suffix token ids of a shipped RAG prompt, laid out as
    `prefix.REORDERED_RAG_CHUNKS` lays it out (system message, "Documents:", one chunk per
    document, the question). The chat template frames it; the pieces are cut at the text
    boundaries, so each chunk tokenizes the same wherever it stands."""
    from engine.demos.prefix import _rag_messages
    from engine.model.chat import render_chat

    marker_docs, marker_q = "\u2063DOCS\u2063", "\u2063QUESTION\u2063"
    framed = _rag_messages({"system": spec["system"], "documents": {}}, [], marker_q)
    framed[1]["content"] = f"Documents:\n\n{marker_docs}Question: {marker_q}"
    text = tokenizer.decode(render_chat(tokenizer, framed))
    head, rest = text.split(marker_docs)
    between, tail = rest.split(marker_q)

    def enc(s: str) -> list[int]:
        return list(tokenizer.encode(s, add_special_tokens=False))

    return enc(head), [enc(f"{d}: {spec['documents'][d]}\n\n") for d in order], enc(between + question + tail)


def _logit_stats(full: torch.Tensor, other: torch.Tensor) -> dict[str, Any]:
    import torch

    pf, po = torch.log_softmax(full, -1), torch.log_softmax(other, -1)
    return {"max_abs_logit_diff": round(float((full - other).abs().max()), 4),
            "mean_abs_logit_diff": round(float((full - other).abs().mean()), 4),
            "kl_from_full": round(float(torch.sum(pf.exp() * (pf - po))), 5),
            "same_first_token": int(torch.argmax(full)) == int(torch.argmax(other))}


def greedy_agreement(model: Any, cache: Any, logits: torch.Tensor, position: int, reference: list[int]) -> int:
    """How many leading tokens a greedy decode from (`cache`, `logits`) shares with
    `reference`. Teacher-forced in one forward: greedy decoding reproduces the reference
    exactly as long as every argmax matches, so the first mismatch is where it would part."""
    import torch

    if int(torch.argmax(logits)) != reference[0]:
        return 0
    if len(reference) == 1:
        return 1
    parts = _parts(model)
    ids = torch.tensor([reference[:-1]], dtype=torch.long)
    positions = torch.arange(position, position + len(reference) - 1, dtype=torch.long).unsqueeze(0)
    with torch.inference_mode():
        out = model(input_ids=ids, position_ids=positions, use_cache=True, **{parts.cache_kwarg: cache})
    predicted = out.logits[0].argmax(-1).tolist()
    lead = 1
    for got, want in zip(predicted, reference[1:]):
        if got != want:
            break
        lead += 1
    return lead


def _cacheblend(env: DemoEnv) -> dict[str, Any]:
    import torch

    spec = load_resource("prefix_scenarios.json")["rag"]
    loaded = env.model
    model, tok = loaded.model, loaded.tokenizer
    names = list(spec["documents"])
    requests = spec["requests"]
    head, _, _ = rag_pieces(tok, spec, names, requests[0]["question"])
    # Offline, once: every document's KV on its own (at position 0), and the exact prefix cache.
    t = time.perf_counter()
    pieces = dict(zip(names, rag_pieces(tok, spec, names, requests[0]["question"])[1]))
    chunk_kv = {d: prefill_chunk(model, pieces[d]) for d in names}
    prefix_kv = prefill_chunk(model, head)
    env.step("prefill every document once on its own and the shared prefix (offline: not part of any TTFT)",
             chunk_tokens={d: len(pieces[d]) for d in names}, prefix_tokens=len(head),
             chunk_cache_bytes=sum(c.num_bytes for c in chunk_kv.values()),
             offline_ms=round((time.perf_counter() - t) * 1000.0, 1))
    full_prefill(model, head + pieces[names[0]])  # warm the kernels once, untimed (see env.WARMUP_TOKENS)
    # What the engine's prefix cache reuses of the same prompts, served in order on the real model.
    runner = env.runner()
    served = {}
    for qi, request in enumerate(requests, 1):
        h, chunks, suffix = rag_pieces(tok, spec, request["retrieved"], request["question"])
        served[qi] = env.generate(runner, f"prefix-caching-{qi}", h + [t for c in chunks for t in c] + suffix,
                                  f"prefix caching: question {qi} with its chunks in order "
                                  f"{', '.join(request['retrieved'])}", max_new_tokens=1)
    rows = []
    for qi, request in enumerate(requests, 1):
        order, question = request["retrieved"], request["question"]
        h, chunks, suffix = rag_pieces(tok, spec, order, question)
        if h != head or chunks != [pieces[d] for d in order]:
            raise RuntimeError("a document tokenized differently in another position")
        prompt = head + [t for c in chunks for t in c] + suffix
        full_ms, (cache, full_logits) = _median_ms(lambda: full_prefill(model, prompt))
        reference = greedy_continue(model, cache, full_logits, len(prompt), GREEDY_TOKENS)

        def prefix_only() -> torch.Tensor:  # prefix caching: only the system prefix is reused
            c = _new_cache(model)
            for i in range(len(prefix_kv.keys)):
                c.update(prefix_kv.keys[i].clone(), prefix_kv.values[i].clone(), i)
            return prefill_after(model, c, prompt[len(head):], len(head))

        prefix_ms, _ = _median_ms(prefix_only)
        row: dict[str, Any] = {"question": question, "order": list(order), "prompt_tokens": len(prompt),
                               "prefix_tokens": len(head), "chunk_tokens": sum(map(len, chunks)),
                               "suffix_tokens": len(suffix), "full_prefill_ttft_ms": round(full_ms, 2),
                               "prefix_caching_ttft_ms": round(prefix_ms, 2),
                               "prefix_caching_cached_tokens": served[qi]["cached_tokens"],
                               "full_output_tokens": len(reference),
                               "full_output_text": tok.decode(reference, skip_special_tokens=True)}
        for label, ratio in (("concat", 0.0), ("blend", DEFAULT_RECOMPUTE_RATIO)):
            ms, res = _median_ms(lambda r=ratio: blend_prefill(model, prefix_kv, [chunk_kv[d] for d in order],
                                                             suffix, recompute_ratio=r))
            lead = greedy_agreement(model, res.cache, res.logits, len(prompt), reference)
            row[label] = {"ttft_ms": round(ms, 2), "speedup_over_full_prefill": round(full_ms / ms, 2),
                          "recomputed_chunk_tokens": len(res.recomputed_positions),
                          "recomputed_fraction": round(res.recomputed_fraction, 3),
                          **_logit_stats(full_logits, res.logits),
                          "greedy_matching_tokens": lead, "greedy_identical": lead == len(reference)}
        rows.append(row)
        env.step(f"question {qi}, chunks in order {', '.join(order)}: full prefill, plain concatenation, CacheBlend",
                 prompt_tokens=len(prompt), full_prefill_ttft_ms=row["full_prefill_ttft_ms"],
                 concat_ttft_ms=row["concat"]["ttft_ms"], blend_ttft_ms=row["blend"]["ttft_ms"],
                 concat_kl_from_full=row["concat"]["kl_from_full"], blend_kl_from_full=row["blend"]["kl_from_full"],
                 concat_greedy_matching_tokens=row["concat"]["greedy_matching_tokens"],
                 blend_greedy_matching_tokens=row["blend"]["greedy_matching_tokens"])

    def mean(label: str, key: str) -> float:
        return round(statistics.fmean(float(r[label][key]) for r in rows), 4)

    # The share of the full prefill's token-layers CacheBlend computes: all chunk and suffix
    # tokens up to the check layer, then the selected tokens and the suffix.
    n_layers = loaded.num_layers
    work = statistics.fmean(((DEFAULT_CHECK_LAYER + 1) * (r["chunk_tokens"] + r["suffix_tokens"])
                             + (n_layers - DEFAULT_CHECK_LAYER - 1)
                             * (r["blend"]["recomputed_chunk_tokens"] + r["suffix_tokens"]))
                            / (n_layers * r["prompt_tokens"]) for r in rows)
    return {"model": loaded.name, "layers": n_layers, "recompute_ratio": DEFAULT_RECOMPUTE_RATIO,
            "check_layer": DEFAULT_CHECK_LAYER, "prompts": len(rows), "greedy_tokens": GREEDY_TOKENS,
            "per_prompt": rows,
            "blend_speedup_over_full_prefill": mean("blend", "speedup_over_full_prefill"),
            "concat_speedup_over_full_prefill": mean("concat", "speedup_over_full_prefill"),
            "prefix_caching_speedup_over_full_prefill": round(statistics.fmean(r["full_prefill_ttft_ms"] / r["prefix_caching_ttft_ms"]
                                                                  for r in rows), 2),
            "blend_kl_from_full": mean("blend", "kl_from_full"), "concat_kl_from_full": mean("concat", "kl_from_full"),
            "blend_max_abs_logit_diff": mean("blend", "max_abs_logit_diff"),
            "concat_max_abs_logit_diff": mean("concat", "max_abs_logit_diff"),
            "blend_same_first_token": sum(r["blend"]["same_first_token"] for r in rows),
            "concat_same_first_token": sum(r["concat"]["same_first_token"] for r in rows),
            "blend_greedy_matching_tokens": mean("blend", "greedy_matching_tokens"),
            "concat_greedy_matching_tokens": mean("concat", "greedy_matching_tokens"),
            "blend_compute_fraction_of_full": round(work, 3), "blend_ideal_speedup": round(1 / work, 2),
            "paper_claim": "2-3x faster first token at full-prefill quality (CacheBlend, EuroSys 2025; LMCache)",
            "why_short_of_the_paper": _shortfall(rows, work),
            "diff_messages": {"a": _rag_messages_of(spec, requests[0]), "b": _rag_messages_of(spec, requests[1])}}


def _shortfall(rows: list[dict[str, Any]], work: float) -> str:
    """Where this run falls short of the paper's figure, in its own numbers."""
    chunk = statistics.fmean(r["chunk_tokens"] / len(r["order"]) for r in rows)
    speedup = statistics.fmean(r["blend"]["speedup_over_full_prefill"] for r in rows)
    lead = statistics.fmean(r["blend"]["greedy_matching_tokens"] for r in rows)
    ref = statistics.fmean(r["full_output_tokens"] for r in rows)
    if speedup >= 2.0:
        speed = (f"Speed: {speedup:.1f}x, in the paper's range, against the {1 / work:.1f}x that computing "
                 f"{work:.0%} of the full prefill's token-layers would give (chunks of about {chunk:.0f} tokens; "
                 f"timed on a shared CPU, so the figure moves from run to run).")
    else:
        speed = (f"Speed: {speedup:.1f}x, short of the paper's 2-3x and of the {1 / work:.1f}x that computing "
                 f"{work:.0%} of the full prefill's token-layers would give: with chunks of about {chunk:.0f} tokens "
                 f"(the paper's hold hundreds to thousands) a forward pass on a CPU costs nearly as much for a few "
                 f"tokens as for many, so the two whole layers, the re-rotation and per-layer overhead weigh more "
                 f"than the tokens saved.")
    return (f"{speed} Quality: the "
            f"first token's distribution is close to full prefill's, but greedy text keeps only {lead:.1f} of "
            f"{ref:.1f} tokens on average, short of 'full-prefill quality'. Likely causes, not measured here: a "
            f"135M model's near-tied candidates flip at small deviations, and the paper's 7B-70B models and "
            f"answer-quality scores (F1, Rouge-L) tolerate the deviation of the 85% of chunk tokens left as they "
            f"were better than exact greedy agreement does.")


def _rag_messages_of(spec: dict[str, Any], request: dict[str, Any]) -> list[dict[str, str]]:
    from engine.demos.prefix import _rag_messages

    return _rag_messages(spec, request["retrieved"], request["question"])


CACHEBLEND_RAG = Demo(
    "cacheblend-rag", "CacheBlend reuses reordered RAG chunks",
    "per-document KV computed once, re-rotated to the new order, ~15% of tokens recomputed: TTFT and quality against full prefill",
    "Prefix caching cannot reuse a document that moved, because everything after the first moved chunk "
    "misses. CacheBlend keeps each document's KV, rotates its keys to the document's new position and "
    "recomputes only the 15% of tokens whose values deviate most from full attention, chosen at layer 1. "
    "On the bundled 135M model that brings the first token's distribution much closer to full prefill than "
    "plain concatenation of the chunk caches, at a fraction of the compute; the findings say where it falls "
    "short of the paper's two to three times faster first token at full-prefill quality, and why.",
    frozenset({"model"}), _cacheblend)


__all__ = ["CACHEBLEND_RAG", "BlendResult", "ChunkKV", "blend_prefill", "full_prefill", "greedy_continue",
           "greedy_agreement", "prefill_after", "prefill_chunk", "rag_pieces", "rerotate_keys", "select_tokens"]
