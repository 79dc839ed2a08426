"""The model runner: a transformers causal LM driven by the prefix-cache engine.

A request looks up its cached blocks, gathers them from the KV pool into a `DynamicCache`,
prefills only the uncached suffix, decodes, and writes every block that fills back to the
pool. Bookkeeping stays in `manager`; tensors stay in `kv_pool`; transformers stays here.
"""

from __future__ import annotations

import inspect
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from engine.core.events import EventBus, MissInfo
from engine.core.blocks import cdiv
from engine.core.hashing import BlockHasher
from engine.model.kv_pool import KVPool, KVShape
from engine.core.manager import PrefixCacheManager, Request
from engine.model.loader import LoadedModel
from engine.model.chat import render_chat

DEFAULT_NUM_BLOCKS = 1024
_BUFFER_STEP = 512  # working-cache capacity is rounded up to this many tokens, so buffers get reused
_MAX_SPARE_BUFFERS = 2
OnToken = Callable[[int, str], None]


@dataclass(slots=True)
class GenerationResult:
    """One finished request: what was reused, what was computed, what came out, how long.

    `miss` is None when `use_cache=False` (nothing was looked up). `first_logits` are the
    logits at the last prompt position, `last_logits` those the last token was sampled
    from (float32, on the CPU). `timings` splits the work in milliseconds: hash, lookup,
    allocate, gather, store (pool writes and block bookkeeping), prefill, decode.
    """

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_text: str
    num_prompt_tokens: int
    num_cached_tokens: int
    num_computed_tokens: int
    miss: MissInfo | None
    block_ids: tuple[int, ...]
    ttft_ms: float
    prefill_ms: float
    decode_ms: float
    last_logits: torch.Tensor | None
    first_logits: torch.Tensor | None = None
    finish_reason: str = "length"  # "length" | "stop" (an end-of-sequence token)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def bookkeeping_ms(self) -> float:
        t = self.timings
        return sum(t.get(k, 0.0) for k in ("hash_ms", "lookup_ms", "allocate_ms", "gather_ms", "store_ms"))


@dataclass(slots=True)
class _RunningRequest:
    """A request in flight: its tokens, its DynamicCache and its engine blocks."""

    request_id: str
    prompt: list[int]
    cache: Any
    block_ids: list[int]
    num_written: int  # tokens from the front whose KV is in the pool (whole blocks)
    managed: bool
    output: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


class _BufferedLayer(DynamicLayer):
    """A DynamicLayer whose K and V live in a preallocated `[1, kv_heads, capacity, head_dim]`
    buffer: the gathered prefix is copied in once and new tokens are written in place, where
    the stock layer would concatenate (copy the whole past) on every forward."""

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor) -> None:
        super().__init__()
        self.key_buffer, self.value_buffer = key_buffer, value_buffer
        self.dtype, self.device = key_buffer.dtype, key_buffer.device
        self.is_initialized = True
        self.set_length(0)

    def set_length(self, length: int) -> None:
        self.length = length
        self.keys = self.key_buffer[:, :, :length]
        self.values = self.value_buffer[:, :, :length]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        if end > self.key_buffer.shape[-2]:  # more tokens than planned: grow, copying once
            grow = max(end, 2 * self.key_buffer.shape[-2])
            self.key_buffer = torch.cat([self.keys, self.key_buffer.new_empty(
                (*self.key_buffer.shape[:2], grow - self.length, self.key_buffer.shape[-1]))], dim=-2)
            self.value_buffer = torch.cat([self.values, self.value_buffer.new_empty(
                (*self.value_buffer.shape[:2], grow - self.length, self.value_buffer.shape[-1]))], dim=-2)
        self.key_buffer[:, :, self.length:end] = key_states
        self.value_buffer[:, :, self.length:end] = value_states
        self.set_length(end)
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        self.set_length(max(0, self.length + tokens_to_remove))

    def reset(self) -> None:
        self.set_length(0)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


class ModelRunner:
    """Runs a `LoadedModel` over a paged prefix cache of `num_blocks` blocks (or as many as
    `kv_memory_bytes` holds). `seed` seeds both the hash root and sampling."""

    def __init__(self, loaded: LoadedModel, num_blocks: int | None = None, kv_memory_bytes: int | None = None,
                 block_size: int = 16, seed: int | None = 0, hash_name: str = "sha256",
                 events: EventBus | None = None, hash_seed: str | None = None) -> None:
        if num_blocks is not None and kv_memory_bytes is not None:
            raise ValueError("give the pool size as a number of blocks or as a KV memory budget, not both")
        if num_blocks is None and kv_memory_bytes is None:
            num_blocks = DEFAULT_NUM_BLOCKS
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.events = events if events is not None else EventBus()
        shape = KVShape(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, loaded.dtype)
        self.kv_pool = KVPool(shape, block_size, num_blocks=num_blocks, memory_bytes=kv_memory_bytes,
                              device=next(self.model.parameters()).device)
        self.block_size = block_size
        self.manager = PrefixCacheManager(self.kv_pool.num_blocks, block_size,
                                          BlockHasher(hash_name, seed, loaded.model_id, hash_seed), self.events)
        self.generator = torch.Generator(device="cpu")
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        params = inspect.signature(self.model.forward).parameters
        # transformers 5.x renamed `past_key_values` to `cache`; accept models of either kind.
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._keep_last_logits = "logits_to_keep" in params
        self._ids = itertools.count()
        self._spare_buffers: list[torch.Tensor] = []
        self._eos_ids = self._find_eos_ids()

    def _find_eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.model.config, self.tokenizer):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return frozenset(ids)

    # ---------------------------------------------------------------- public API
    def render_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` through the model's chat template, ready for the reply."""
        return render_chat(self.tokenizer, messages)

    def chat(self, messages: list[dict], **kwargs: Any) -> GenerationResult:
        return self.generate(self.render_chat(messages), **kwargs)

    def generate(self, prompt_token_ids: Sequence[int], max_new_tokens: int = 32, salt: str | None = None,
                 temperature: float = 0.0, top_p: float = 1.0, on_token: OnToken | None = None,
                 use_cache: bool = True, request_id: str | None = None, probe: bool = False) -> GenerationResult:
        """Generate up to `max_new_tokens` tokens after `prompt_token_ids`.

        With `use_cache` the prompt goes through the prefix cache (hit blocks are gathered,
        only the rest is prefilled, filled blocks are stored); without it the whole prompt
        is prefilled afresh and the pool is not touched. A `probe` is a what-if run: it
        reuses what is cached but finishes as aborted, so nothing it stored stays findable.
        """
        self._check_sampling(max_new_tokens, temperature, top_p)
        start = time.perf_counter()
        running, result = self._start(list(prompt_token_ids), max_new_tokens, salt, use_cache, request_id, start)
        aborted = True
        try:
            logits = self._prefill(running, result)
            self._decode(running, result, logits, max_new_tokens, temperature, top_p, on_token, start)
            aborted = probe
        finally:
            if running.managed:
                self.manager.finish(running.request_id, aborted=aborted)
            self._release_cache(running.cache)
        return result

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32, salt: str | None = None,
                       temperature: float = 0.0, top_p: float = 1.0, on_token: OnToken | None = None,
                       use_cache: bool = True) -> list[GenerationResult]:
        """Fan-out: several prompts over a shared prefix, admitted together.

        Requests are admitted and prefilled in order, so the shared prefix is computed once
        (by the first) and is in the pool before the others look up; they hit its blocks
        (ref count N while all N run) and get their own blocks from the first divergent
        block on. The pool holds the shared prefix once; each continuation gathers it
        straight into its working cache (the one copy). Decoding runs request by request;
        no request finishes before all are done.
        """
        self._check_sampling(max_new_tokens, temperature, top_p)
        prompts = [list(p) for p in prompts]
        started: list[tuple[_RunningRequest, GenerationResult, torch.Tensor, float]] = []
        aborted = True
        try:
            for prompt in prompts:
                t0 = time.perf_counter()
                # Keep room for the outputs of the requests already admitted.
                reserve = sum(self._blocks_still_needed(s, max_new_tokens) for s, _, _, _ in started)
                running, result = self._start(prompt, max_new_tokens, salt, use_cache, None, t0,
                                          reserve * self.block_size)
                started.append((running, result, torch.empty(0), t0))
                logits = self._prefill(running, result)
                started[-1] = (running, result, logits, t0)
            for running, result, logits, t0 in started:
                self._decode(running, result, logits, max_new_tokens, temperature, top_p, on_token, t0)
            aborted = False
        finally:
            for running, _, _, _ in started:
                if running.managed:
                    self.manager.finish(running.request_id, aborted=aborted)
                self._release_cache(running.cache)
        return [result for _, result, _, _ in started]

    # ---------------------------------------------------------------- steps
    def _check_sampling(self, max_new_tokens: int, temperature: float, top_p: float) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, not {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must not be negative, not {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], not {top_p}")

    def _blocks_still_needed(self, running: _RunningRequest, max_new_tokens: int) -> int:
        if not running.managed:
            return 0
        total = len(running.prompt) + max_new_tokens - 1
        return max(0, cdiv(total, self.block_size) - len(running.block_ids))

    def _start(self, prompt: list[int], max_new_tokens: int, salt: str | None, use_cache: bool,
               request_id: str | None, start: float, reserve_tokens: int = 0) -> tuple[_RunningRequest, GenerationResult]:
        """Hash, look up and allocate (or, without the cache, just set up a cold request)."""
        if not prompt:
            raise ValueError("the prompt is empty; it needs at least one token")
        vocab = self.model.get_input_embeddings().num_embeddings
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"the prompt holds token ids outside this model's vocabulary of {vocab}")
        rid = request_id if request_id is not None else f"gen-{next(self._ids)}"
        timings: dict[str, float] = {}
        miss: MissInfo | None = None
        block_ids: list[int] = []
        num_cached = 0
        if use_cache:
            request = Request(rid, prompt, salt=salt)
            t = time.perf_counter()
            hashes = self.manager.hash_request(request)
            timings["hash_ms"] = _ms(t)
            t = time.perf_counter()
            lookup = self.manager.lookup(request, hashes)
            timings["lookup_ms"] = _ms(t)
            t = time.perf_counter()
            # Admit only when the whole output fits, so decoding never runs out of blocks.
            allocation = self.manager.allocate(request, lookup, num_lookahead_tokens=max_new_tokens - 1 + reserve_tokens)
            timings["allocate_ms"] = _ms(t)
            block_ids = list(allocation.block_ids)
            num_cached = allocation.num_cached_tokens
            miss = allocation.miss
        running = _RunningRequest(rid, prompt, self._new_cache(len(prompt) + max_new_tokens), block_ids, num_cached,
                        use_cache, timings=timings)
        result = GenerationResult(rid, prompt, running.output, "", len(prompt), num_cached, len(prompt) - num_cached,
                                  miss, (), 0.0, 0.0, 0.0, None, timings=timings)
        return running, result

    def _new_cache(self, capacity: int) -> Any:
        """A DynamicCache whose full-attention layers append into one preallocated buffer."""
        cache = DynamicCache(config=self.model.config)
        shape = self.kv_pool.shape
        if len(cache.layers) != shape.num_layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
            return cache  # sliding-window or hybrid models keep transformers' own layers
        fitting = [i for i, b in enumerate(self._spare_buffers) if b.shape[4] >= capacity]
        if fitting:
            buffer = self._spare_buffers.pop(min(fitting, key=lambda i: self._spare_buffers[i].shape[4]))
        else:
            capacity = cdiv(capacity, _BUFFER_STEP) * _BUFFER_STEP
            buffer = torch.empty((shape.num_layers, 2, 1, shape.num_kv_heads, capacity, shape.head_dim),
                                 dtype=shape.dtype, device=self.kv_pool.tensor.device)
        cache.layers = [_BufferedLayer(buffer[i, 0], buffer[i, 1]) for i in range(shape.num_layers)]
        cache.kv_buffer = buffer
        return cache

    def _release_cache(self, cache: Any) -> None:
        """Keep a finished request's buffer for the next one: its pages are already mapped,
        where a fresh allocation would fault in (and zero) every page again."""
        buffer = getattr(cache, "kv_buffer", None)
        if buffer is None:
            return
        cache.layers = []
        self._spare_buffers.append(buffer)
        if len(self._spare_buffers) > _MAX_SPARE_BUFFERS:
            self._spare_buffers.sort(key=lambda b: b.shape[4])
            del self._spare_buffers[0]  # keep the largest: they serve any request

    def _fill_cache(self, running: _RunningRequest) -> None:
        """Put the cached prefix, gathered from the pool, into the request's working cache."""
        n = running.num_written
        if n == 0:
            return
        t = time.perf_counter()
        cache = running.cache
        buffer = getattr(cache, "kv_buffer", None)
        if buffer is not None:
            self.kv_pool.gather_into(running.block_ids, n, buffer[:, :, 0])
            for layer in cache.layers:
                layer.set_length(n)
        else:
            for index, (k, v) in enumerate(self.kv_pool.gather(running.block_ids, n)):
                cache.update(k, v, index)
        running.timings["gather_ms"] = running.timings.get("gather_ms", 0.0) + _ms(t)

    def _forward(self, running: _RunningRequest, token_ids: list[int], start: int) -> torch.Tensor:
        ids = torch.tensor([token_ids], dtype=torch.long)
        positions = torch.arange(start, start + len(token_ids), dtype=torch.long).unsqueeze(0)
        kwargs: dict[str, Any] = {self._cache_kwarg: running.cache, "use_cache": True, "position_ids": positions}
        if self._keep_last_logits:
            kwargs["logits_to_keep"] = 1
        with torch.inference_mode():
            out = self.model(input_ids=ids, **kwargs)
        return out.logits[0, -1].float()

    def _prefill(self, running: _RunningRequest, result: GenerationResult) -> torch.Tensor:
        self._fill_cache(running)
        t = time.perf_counter()
        logits = self._forward(running, running.prompt[running.num_written:], running.num_written)
        result.prefill_ms = _ms(t)
        running.timings["prefill_ms"] = result.prefill_ms
        if running.managed:
            t = time.perf_counter()
            self._write_full_blocks(running, len(running.prompt))
            running.timings["store_ms"] = _ms(t)
        result.first_logits = logits
        return logits

    def _write_full_blocks(self, running: _RunningRequest, num_tokens: int) -> None:
        """Copy the request's newly filled blocks (up to `num_tokens` tokens of KV) to the pool."""
        end = (num_tokens // self.block_size) * self.block_size
        start = running.num_written
        if end <= start:
            return
        layers = [(layer.keys[:, :, start:end], layer.values[:, :, start:end]) for layer in running.cache.layers]
        self.kv_pool.write(running.block_ids, start, layers)
        running.num_written = end

    def _decode(self, running: _RunningRequest, result: GenerationResult, logits: torch.Tensor, max_new_tokens: int,
                temperature: float, top_p: float, on_token: OnToken | None, start: float) -> None:
        t_decode = time.perf_counter()
        decoded_text = ""
        position = len(running.prompt)
        store_ms = 0.0
        while True:
            token = self._sample(logits, temperature, top_p)
            running.output.append(token)
            if len(running.output) == 1:
                result.ttft_ms = _ms(start)
                t_decode = time.perf_counter()
            if on_token is not None:
                text = self.tokenizer.decode(running.output, skip_special_tokens=True)
                on_token(token, text[len(decoded_text):])
                decoded_text = text
            if token in self._eos_ids:
                result.finish_reason = "stop"
                break
            if len(running.output) >= max_new_tokens:
                break
            logits = self._forward(running, [token], position)
            position += 1
            if running.managed:
                t = time.perf_counter()
                new_blocks = self.manager.append(running.request_id, token_ids=[token])
                running.block_ids.extend(new_blocks)
                self._write_full_blocks(running, position)
                store_ms += _ms(t)
        result.decode_ms = _ms(t_decode)
        running.timings["decode_ms"] = result.decode_ms
        running.timings["decode_store_ms"] = store_ms
        result.last_logits = logits
        result.output_text = self.tokenizer.decode(running.output, skip_special_tokens=True)
        result.block_ids = tuple(running.block_ids)

    def _sample(self, logits: torch.Tensor, temperature: float, top_p: float) -> int:
        if temperature == 0.0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / temperature, dim=-1)
        if top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p  # always keeps the first
            sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
            choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=self.generator)
            return int(order[choice])
        return int(torch.multinomial(probs, 1, generator=self.generator))
