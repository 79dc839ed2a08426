"""The paged KV storage: one preallocated tensor holding K and V of every layer for every
block, indexed directly by block id, and measuring what real KV tensors take. Bookkeeping
(which block holds what) lives in `manager`; the formula and presets in `kv_memory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from engine.core.blocks import cdiv
from engine.core.validation import check_memory
from engine.model.kv_memory import TORCH_DTYPES, kv_bytes, normalise_dtype


@dataclass(slots=True, frozen=True)
class KVShape:
    """What one token's KV needs: per layer, K and V of `num_kv_heads x head_dim` values."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32

    @property
    def bytes_per_value(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes(self.num_layers, self.num_kv_heads, self.head_dim, self.bytes_per_value, 1)

    def bytes_per_block(self, block_size: int) -> int:
        return self.bytes_per_token * block_size


class KVPool:
    """`num_blocks` blocks of `block_size` token slots, laid out layer-major as
    `[layers, 2, kv_heads, num_blocks, block_size, head_dim]`.

    Layer-major keeps a block's slots adjacent to its neighbours' so that gathering any
    list of blocks is a single `index_select` whose result is already the
    `[kv_heads, tokens, head_dim]` layout attention wants, with no second copy.
    """

    def __init__(self, shape: KVShape, block_size: int, num_blocks: int | None = None,
                 memory_bytes: int | None = None, device: str | torch.device = "cpu") -> None:
        if block_size < 1:
            raise ValueError(f"block size must be at least 1, not {block_size}")
        if (num_blocks is None) == (memory_bytes is None):
            raise ValueError("give the KV pool size either as a number of blocks or as a memory budget, not both")
        if memory_bytes is not None:
            num_blocks = memory_bytes // shape.bytes_per_block(block_size)
            if num_blocks < 1:
                raise ValueError(f"a KV memory budget of {memory_bytes} bytes does not hold one block "
                                 f"({shape.bytes_per_block(block_size)} bytes for {block_size} tokens)")
        assert num_blocks is not None
        if num_blocks < 1:
            raise ValueError(f"the KV pool needs at least one block, not {num_blocks}")
        # Refuse up front what cannot fit: the lazy pages would otherwise fail (or swap) only
        # once the blocks are written, deep inside a run.
        check_memory(num_blocks * shape.bytes_per_block(block_size), f"a KV pool of {num_blocks:,} blocks")
        self.shape = shape
        self.block_size = block_size
        self.num_blocks = num_blocks
        # torch.empty: pages the OS has not touched cost nothing until a block is written.
        self.tensor = torch.empty((shape.num_layers, 2, shape.num_kv_heads, num_blocks, block_size, shape.head_dim),
                                  dtype=shape.dtype, device=device)
        # The same storage with (block, slot) flattened, so token slots index it directly.
        self._slots = self.tensor.view(shape.num_layers, 2, shape.num_kv_heads, num_blocks * block_size,
                                       shape.head_dim)

    # ---------------------------------------------------------------- sizes (measured)
    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def per_layer_bytes(self) -> list[int]:
        """Bytes each layer's K and V take in this pool, measured from the tensor itself."""
        return [layer.numel() * layer.element_size() for layer in self.tensor.unbind(0)]

    @property
    def bytes_per_token(self) -> int:
        return self.nbytes // (self.num_blocks * self.block_size)

    def block(self, block_id: int) -> torch.Tensor:
        """A view of one block: `[layers, 2, kv_heads, block_size, head_dim]`."""
        return self.tensor[:, :, :, block_id]

    # ---------------------------------------------------------------- data movement
    def _token_slots(self, block_ids: Sequence[int], start_token: int, num_tokens: int) -> torch.Tensor:
        bs = self.block_size
        end = start_token + num_tokens
        if end > len(block_ids) * bs:
            raise ValueError(f"{end} tokens do not fit in {len(block_ids)} blocks of {bs}")
        blocks = torch.as_tensor(list(block_ids), dtype=torch.long, device=self.tensor.device)
        positions = torch.arange(start_token, end, device=self.tensor.device)
        return blocks[positions // bs] * bs + positions % bs

    def gather(self, block_ids: Sequence[int], num_tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """K and V of the first `num_tokens` tokens held by `block_ids`, per layer, each of
        shape `[1, kv_heads, num_tokens, head_dim]`. One copy for all layers together."""
        slots = self._token_slots(block_ids, 0, num_tokens)
        gathered = self._slots.index_select(3, slots)  # [layers, 2, heads, tokens, dim], contiguous
        return [(layer[0].unsqueeze(0), layer[1].unsqueeze(0)) for layer in gathered.unbind(0)]

    def gather_into(self, block_ids: Sequence[int], num_tokens: int, out: torch.Tensor) -> None:
        """Copy the first `num_tokens` tokens held by `block_ids` into `out[..., :num_tokens, :]`,
        where `out` is `[layers, 2, kv_heads, capacity, head_dim]`: one strided copy per run of
        consecutive block ids, with no temporary in between."""
        bs = self.block_size
        ids = list(block_ids[:cdiv(num_tokens, bs)])
        if len(ids) * bs < num_tokens:
            raise ValueError(f"{num_tokens} tokens do not fit in {len(ids)} blocks of {bs}")
        j = 0
        while j < len(ids):
            k = j
            while k + 1 < len(ids) and ids[k + 1] == ids[k] + 1:
                k += 1
            first, last = j * bs, min((k + 1) * bs, num_tokens)
            src = ids[j] * bs
            out[:, :, :, first:last].copy_(self._slots[:, :, :, src:src + last - first])
            j = k + 1

    def write(self, block_ids: Sequence[int], start_token: int,
              layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store tokens `start_token ...` of a sequence whose blocks are `block_ids`.

        `layers_kv[l]` is (K, V) of layer l, shaped `[1, kv_heads, n, head_dim]` (or without
        the batch dimension) for the n tokens from `start_token` on.
        """
        if len(layers_kv) != self.shape.num_layers:
            raise ValueError(f"expected KV for {self.shape.num_layers} layers, got {len(layers_kv)}")
        num_tokens = layers_kv[0][0].shape[-2]
        if num_tokens == 0:
            return
        slots = self._token_slots(block_ids, start_token, num_tokens)
        for layer, (k, v) in enumerate(layers_kv):
            if k.dim() == 4:
                k, v = k[0], v[0]
            self._slots[layer, 0].index_copy_(1, slots, k.to(self.shape.dtype))
            self._slots[layer, 1].index_copy_(1, slots, v.to(self.shape.dtype))


def measure_loaded_model(loaded: Any, tokens: int, dtype: str) -> dict[str, Any]:
    """Measure real tensors of a loaded model: a one-block KV pool in `dtype` and the
    DynamicCache transformers builds on a short prompt (in the model's own dtype)."""
    from transformers import DynamicCache

    key = normalise_dtype(dtype)
    out: dict[str, Any] = {}
    torch_name = TORCH_DTYPES.get(key)
    if torch_name is not None and hasattr(torch, torch_name):
        shape = KVShape(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, getattr(torch, torch_name))
        # A pool of exactly `tokens` one-token blocks; torch.empty pages cost nothing until written.
        # Beyond a few GiB, measure a one-token pool and scale, rather than reserve the address space.
        direct = 0 < tokens and shape.bytes_per_token * tokens <= 4 * 2**30
        pool = KVPool(shape, block_size=1, num_blocks=tokens if direct else 1)
        per_layer = pool.per_layer_bytes() if direct else [b * tokens for b in pool.per_layer_bytes()]
        out.update(pool_dtype=key, pool_bytes_per_token=pool.bytes_per_token, per_layer_bytes=per_layer,
                   total_bytes=sum(per_layer), pool_measured_directly=direct)
    else:
        out["pool_dtype"] = None  # torch has no int4 tensor to measure
    probe = 16
    cache = DynamicCache(config=loaded.model.config)
    ids = torch.arange(probe).unsqueeze(0) % max(2, int(loaded.model.config.vocab_size))
    with torch.inference_mode():
        loaded.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    measured = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    out.update(model_dtype=normalise_dtype(str(loaded.dtype)), dynamic_cache_bytes_per_token=measured // probe)
    return out
