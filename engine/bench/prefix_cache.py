"""`cachescope bench engine`: block hashing against vLLM's recipe, and a Mooncake replay.

Both sides of each ratio are measured in the same run on the same inputs.
"""

from __future__ import annotations

import hashlib
import pickle
import random
import time
from pathlib import Path
from typing import Any

from engine.core.hashing import BlockHasher
from engine.core.replay import ReplayConfig, replay
from engine.core.trace import load_trace
from engine.resources import RESOURCES

TRACE_NAME = "mooncake_conversation_trace.jsonl"


def find_trace(name: str = TRACE_NAME) -> Path:
    """The bundled copy in resources/traces, else the shared data folder beside the repo."""
    root = RESOURCES.parent
    for candidate in (RESOURCES / "traces" / name, root.parent / "shared" / "data" / "traces" / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{name} is neither in resources/traces nor in ../shared/data/traces")


def _vllm_recipe(requests: list[list[int]], block_size: int) -> list[bytes]:
    # vLLM's sha256 request hashing: per full block,
    # sha256(pickle.dumps((parent, tuple(block_tokens), extra_keys)))
    out = []
    for tokens in requests:
        parent: bytes | None = None
        for i in range(len(tokens) // block_size):
            block = tokens[i * block_size:(i + 1) * block_size]
            parent = hashlib.sha256(pickle.dumps((parent, tuple(block), None),
                                                 protocol=pickle.HIGHEST_PROTOCOL)).digest()
            out.append(parent)
    return out


def _ours(hasher: BlockHasher, requests: list[list[int]], block_size: int) -> list[bytes]:
    out = []
    for tokens in requests:
        out.extend(hasher.hash_chain(tokens, block_size))
    return out


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_hashing(num_blocks: int = 20000, block_size: int = 16, repeats: int = 5) -> dict[str, Any]:
    # Requests of 2K tokens (128 blocks of 16), hashed the way each engine hashes a prompt.
    rng = random.Random(0)
    per_request = 128
    requests = [[rng.randrange(49152) for _ in range(per_request * block_size)]
                for _ in range(max(1, num_blocks // per_request))]
    num_blocks = len(requests) * per_request
    sha = BlockHasher("sha256", seed=0)
    xxh = BlockHasher("xxh3", seed=0)
    # Interleave the three so that load from other processes hits each side alike.
    t_vllm = t_sha = t_xxh = float("inf")
    for _ in range(repeats):
        t_vllm = min(t_vllm, _best_of(lambda: _vllm_recipe(requests, block_size), 1))
        t_sha = min(t_sha, _best_of(lambda: _ours(sha, requests, block_size), 1))
        t_xxh = min(t_xxh, _best_of(lambda: _ours(xxh, requests, block_size), 1))
    return {
        "blocks": num_blocks, "block_size": block_size,
        "vllm_pickle_sha256_blocks_per_s": round(num_blocks / t_vllm),
        "cachescope_sha256_blocks_per_s": round(num_blocks / t_sha),
        "cachescope_xxh3_blocks_per_s": round(num_blocks / t_xxh),
        "sha256_speedup_vs_vllm": round(t_vllm / t_sha, 2),
        "xxh3_speedup_vs_vllm": round(t_vllm / t_xxh, 2),
    }


def bench_replay(limit: int | None = None, capacity_blocks: int = 20000) -> dict[str, Any]:
    path = find_trace()
    t0 = time.perf_counter()
    requests = load_trace(path, 512)
    t_load = time.perf_counter() - t0
    if limit is not None:
        requests = requests[:limit]
    t0 = time.perf_counter()
    result = replay(requests, ReplayConfig(block_size=512, capacity_blocks=capacity_blocks))
    t_replay = time.perf_counter() - t0
    blocks = sum(len(r.hash_ids or ()) for r in requests)
    return {
        "trace": path.name, "requests": len(requests), "blocks": blocks,
        "load_s": round(t_load, 3), "replay_s": round(t_replay, 3), "total_s": round(t_load + t_replay, 3),
        "requests_per_s": round(len(requests) / t_replay), "blocks_per_s": round(blocks / t_replay),
        "hit_rate": result.totals.hit_rate,
    }


def run_bench(quick: bool = False) -> dict[str, Any]:
    hashing = bench_hashing(num_blocks=5000 if quick else 20000, repeats=5 if quick else 15)
    rep = bench_replay(limit=3000 if quick else None)
    targets = {
        "hash_speedup_vs_vllm": {"value": hashing["sha256_speedup_vs_vllm"], "target": ">= 2", "met": hashing["sha256_speedup_vs_vllm"] >= 2},
    }
    if not quick:
        targets["mooncake_replay_seconds"] = {"value": rep["total_s"], "target": "< 3", "met": rep["total_s"] < 3}
    return {"hashing": hashing, "replay": rep, "targets": targets}
