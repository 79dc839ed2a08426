"""What a block pool looks like from outside: its counters and snapshots of its blocks.
The manager produces them and the event projection rebuilds them from events, so both
import them from here. Plain values, no behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Counters:
    """Plain counters, as vLLM's prefix-cache metrics."""

    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_stored_blocks: int = 0
    num_evicted_blocks: int = 0
    num_refused_requests: int = 0
    num_finished_requests: int = 0
    num_hash_collisions: int = 0

    @property
    def num_computed_tokens(self) -> int:
        return self.num_prompt_tokens - self.num_cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0


@dataclass(slots=True, frozen=True)
class BlockView:
    """One block as a snapshot shows it."""

    block_id: int
    ref_count: int
    block_hash: bytes | None
    parent_hash: bytes | None
    token_ids: tuple[int, ...]
    salt: str | None
    external_id: int | None
    free_rank: int | None  # 0 = next to be evicted; None while in use
    last_used: int


@dataclass(slots=True, frozen=True)
class PoolSnapshot:
    block_size: int
    blocks: tuple[BlockView, ...]
    num_free_blocks: int
    num_used_blocks: int
    num_cached_blocks: int
    running: dict[str, tuple[int, ...]]
    counters: Counters
