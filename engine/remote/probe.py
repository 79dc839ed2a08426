"""Simulated against observed: how much of a prompt an attached server holds, and why not more.

The prompt's block hashes are computed with the server's scheme (`BlockHasher` with
`vllm-sha256`, `vllm-sha256-cbor` or `sglang-sha256`, the same salt and block size) and looked up in the
remote pools. The first missing block gets one reason: never stored; stored, then removed
at event N; held under another salt; or the partial last block. No Qt, no sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from engine.core.hashing import BlockHasher
from engine.remote.pool import RemotePool


@dataclass(slots=True, frozen=True)
class ProbeResult:
    """The answer for one prompt; `source` names the rank's pool that holds the most."""

    prompt_tokens: int
    cached_tokens: int
    first_missing_block: int | None
    reason: str
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "first_missing_block": self.first_missing_block, "reason": self.reason}


def prompt_keys(hasher: BlockHasher, token_ids: Sequence[int], block_size: int, salt: str | None = None) -> list[bytes]:
    """A prompt's full blocks as a server's events name them: vLLM's digests (a pool
    matches their 8-byte tail too), SGLang's first 8 bytes (`BlockHasher.event_key`)."""
    chain = hasher.hash_chain(list(token_ids), block_size, salt)
    if hasher.algorithm == "sglang-sha256":
        return [hasher.event_key(h) for h in chain]
    return chain


def _num_hits(pool: RemotePool, hashes: Sequence[bytes]) -> int:
    n = 0
    for h in hashes:
        if pool.find(h) is None:
            break
        n += 1
    return n


@dataclass(slots=True)
class PromptProbe:
    """One prompt watched against changing pools: its hashes are computed once per block
    size (the server's, learned from its events, unless `block_size` is fixed)."""

    token_ids: tuple[int, ...]
    hasher: BlockHasher
    salt: str | None = None
    block_size: int | None = None
    _hashes: dict[int, list[bytes]] = field(default_factory=dict)

    def check(self, pools: Sequence[RemotePool]) -> ProbeResult:
        bs = self.block_size_of(pools)
        return probe_prompt(pools, self.token_ids, self.hasher, bs, self.salt, self.keys(bs))

    def keys(self, block_size: int) -> list[bytes]:
        """The prompt's block hashes at `block_size`, as the server's events name them."""
        hashes = self._hashes.get(block_size)
        if hashes is None:
            hashes = self._hashes[block_size] = prompt_keys(self.hasher, self.token_ids, block_size, self.salt)
        return hashes

    def block_size_of(self, pools: Sequence[RemotePool]) -> int:
        return self.block_size or next((p.block_size for p in pools if p.block_size), None) or 16


def probe_prompt(pools: Sequence[RemotePool], token_ids: Sequence[int], hasher: BlockHasher, block_size: int,
                 salt: str | None = None, hashes: list[bytes] | None = None) -> ProbeResult:
    """Probe every pool (one per rank) and answer for the one that holds the longest prefix."""
    if block_size < 1:
        raise ValueError(f"the block size must be at least 1, not {block_size}")
    tokens = list(token_ids)
    if hashes is None:
        hashes = prompt_keys(hasher, tokens, block_size, salt)
    n_full = len(hashes)
    best: RemotePool | None = None
    hits = -1
    for pool in pools:
        n = _num_hits(pool, hashes)
        if n > hits:
            best, hits = pool, n
    hits = max(hits, 0)
    cached = hits * block_size
    source = best.source if best is not None else None
    if hits == n_full:
        rest = len(tokens) - n_full * block_size
        if rest:
            return ProbeResult(len(tokens), cached, n_full,
                               f"partial last block: the last {rest} token(s) do not fill a block of "
                               f"{block_size}, and only full blocks are cached", source)
        return ProbeResult(len(tokens), cached, None, f"all {n_full} block(s) cached", source)
    return ProbeResult(len(tokens), cached, hits, _why_missing(best, tokens, hasher, block_size, salt, hashes[hits],
                                                               hits), source)


def _why_missing(pool: RemotePool | None, tokens: list[int], hasher: BlockHasher, block_size: int,
                 salt: str | None, missing: bytes, index: int) -> str:
    if pool is None:
        return "never stored (no pool attached yet)"
    removal = pool.removal_of(missing)
    if removal is not None:
        event_seq, batch_seq = removal
        where = f"event {event_seq} (vLLM batch {batch_seq})" if event_seq is not None else f"vLLM batch {batch_seq}"
        return f"stored, then removed at {where}"
    prefix = tokens[:(index + 1) * block_size]
    for other in sorted(pool.tenants - {salt} if salt is not None else pool.tenants) + ([None] if salt else []):
        chain = prompt_keys(hasher, prefix, block_size, other)
        if pool.find(chain[index]) is not None:
            held = f"under the salt {other!r}" if other is not None else "without a salt"
            return f"held under another salt: block {index} is cached {held}"
    return "never stored"
