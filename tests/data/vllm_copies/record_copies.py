"""Record vLLM 0.33.0's KV events for physical copies of one block hash (run by hand).

Drives vLLM's own `KVCacheManager` (one full-attention group, block size 16, prefix
caching and KV events on, `init_none_hash(sha256)`) the way its scheduler does: per
request `get_computed_blocks`, then `allocate_slots`, then `free` when it finishes; one
`take_events()` per engine step becomes one batch, encoded as `ZmqEventPublisher` encodes
it (msgspec msgpack, `data_parallel_rank` 0). After each batch it also writes what vLLM
holds: the number of physical blocks per (hash, group) in its prefix cache.

Not part of the test suite and not importable from it: it needs vLLM and torch, which the
project's environment does not have (never install vLLM there). Use an environment of its
own: torch 2.13.0 (the CPU wheel) first, then what vLLM's imports ask for (msgspec,
pydantic, pyzmq, transformers, fastapi, openai and a dozen more) with pip constrained to
that torch, and vLLM's pure-Python tree on PYTHONPATH (its compiled parts are not needed):

    python3 -m venv /tmp/vllmcopies/venv
    /tmp/vllmcopies/venv/bin/pip install torch==2.13.0 ...
    unzip vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl -x '*.so' -d /tmp/vllmcopies/src
    PYTHONPATH=/tmp/vllmcopies/src /tmp/vllmcopies/venv/bin/python record_copies.py

It rewrites `vllm_copies_events.jsonl` beside it, byte for byte the same on every run;
README.md says what each scenario shows.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import msgspec
import torch

import vllm
from vllm.distributed.kv_events import KVEventBatch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_block_hash, get_group_id, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

BLOCK_SIZE = 16
NUM_BLOCKS = 10  # vLLM keeps block 0 as its null block: 9 usable, so evictions come soon
T0 = 1_796_200_000.0  # batch clocks: one step every 0.1 s (time.time() in vLLM; fixed here)
OUT = Path(__file__).resolve().parent / "vllm_copies_events.jsonl"

# Prompts: P is 4 full blocks (block-aligned), Q exactly one block.
P = list(range(1000, 1064))
Q = list(range(2000, 2016))


class Server:
    """One vLLM KV cache manager and the batches it published."""

    def __init__(self, scenario: str, report_mode: str) -> None:
        config = KVCacheConfig(
            num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer.0"], FullAttentionSpec(
                block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32))])
        self.manager = KVCacheManager(config, max_model_len=4096, scheduler_block_size=BLOCK_SIZE,
                                      hash_block_size=BLOCK_SIZE, enable_caching=True,
                                      enable_kv_cache_events=True)
        self.hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self.scenario = scenario
        self.report_mode = report_mode
        self.encoder = msgspec.msgpack.Encoder()
        self.rows: list[dict] = []
        self.seq = 0
        self.step_no = 0
        self.num_requests = 0

    def request(self, tokens: list[int]) -> Request:
        self.num_requests += 1
        params = SamplingParams(max_tokens=1, extra_args={"kv_cache_report_mode": self.report_mode})
        return Request(f"{self.scenario}-{self.num_requests}", list(tokens), params, None,
                       arrival_time=T0, block_hasher=self.hasher)

    def schedule(self, request: Request) -> None:
        """What the scheduler does for a waiting request: prefix-cache hit, then slots."""
        blocks, num_hit, _ = self.manager.get_computed_blocks(request)
        num_new = request.num_tokens - num_hit
        allocated = self.manager.allocate_slots(request, num_new, num_new_computed_tokens=num_hit,
                                                new_computed_blocks=blocks)
        if allocated is None:
            raise RuntimeError(f"{request.request_id} found no free blocks; raise NUM_BLOCKS")
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = request.num_tokens

    def step(self, note: str, *, schedule: list[Request] = (), finish: list[Request] = ()) -> None:
        """One engine step: finished requests freed, waiting ones scheduled, events published."""
        for r in finish:
            self.manager.free(r)
        for r in schedule:
            self.schedule(r)
        ts = T0 + 0.1 * self.step_no
        self.step_no += 1
        events = self.manager.take_events()
        if not events:
            self.rows.append({"scenario": self.scenario, "note": note, "seq": None, "held": self.held()})
            return
        batch = KVEventBatch(ts=ts, events=events)
        batch.data_parallel_rank = 0  # what ZmqEventPublisher.publish fills in
        payload = self.encoder.encode(batch)
        self.rows.append({"scenario": self.scenario, "note": note, "seq": self.seq,
                          "payload": base64.b64encode(payload).decode(), "held": self.held()})
        self.seq += 1

    def held(self) -> dict[str, dict[str, int]]:
        """group -> {event hash (16 hex digits) -> physical blocks holding it}, from vLLM's own map."""
        out: dict[str, dict[str, int]] = {}
        cache = self.manager.block_pool.cached_block_hash_to_block._cache
        for key, blocks in cache.items():
            n = len(blocks) if isinstance(blocks, dict) else 1
            h = (int.from_bytes(get_block_hash(key), "big") & ((1 << 64) - 1)).to_bytes(8, "big").hex()
            out.setdefault(str(get_group_id(key)), {})[h] = n
        return {g: dict(sorted(v.items())) for g, v in sorted(out.items())}

    def fill(self, num_steps: int) -> None:
        """New prompts (a full block and one token), one per step and finished in the next:
        each takes free blocks, so vLLM evicts its oldest cached blocks, copy by copy."""
        for i in range(num_steps):
            r = self.request([50_000 + 16 * (self.step_no + i) + j for j in range(BLOCK_SIZE + 1)])
            self.step(f"a new prompt takes a free block (filler {i})", schedule=[r])
            self.step(f"filler {i} finishes", finish=[r])


def copies(server: Server) -> None:
    """Two concurrent requests with P, then P regenerated; vLLM evicts every copy."""
    r1, r2 = server.request(P), server.request(P)
    server.step("two requests with the block-aligned prompt P in one step", schedule=[r1, r2])
    server.step("both finish", finish=[r1, r2])
    r3 = server.request(P)
    server.step("P regenerated", schedule=[r3])
    server.step("the regenerated request finishes", finish=[r3])
    r4 = server.request(P + [7, 7, 7, 7, 7])
    server.step("P plus 5 tokens: every full block hits, nothing new is stored", schedule=[r4])
    server.step("it finishes", finish=[r4])
    if server.report_mode == "incremental":
        one_block(server)
    server.fill(9)


def one_block(server: Server) -> None:
    """The one-block prompt Q twice: the second computes block 0 again (no parent)."""
    q1, q2 = server.request(Q), server.request(Q)
    server.step("the one-block prompt Q", schedule=[q1])
    server.step("Q again while the first runs: a hit is capped at 15 tokens, so block 0 is "
                "computed again", schedule=[q2])
    server.step("both finish", finish=[q1, q2])


def main() -> None:
    if vllm.__version__ != "0.33.0":
        sys.exit(f"recorded with vLLM 0.33.0, not {vllm.__version__}")
    init_none_hash(sha256)
    rows: list[dict] = []
    for scenario, mode in (("incremental", "incremental"), ("full", "full")):
        server = Server(scenario, mode)
        copies(server)
        rows.extend(server.rows)
    # What the pool cannot tell apart: reuse reports before the first one the batch
    # continues, and a copy without a parent once the server has sent reports.
    server = Server("full-first-report", "full")
    a = server.request(P + [7])
    server.step("P plus one token", schedule=[a])
    b = server.request(P + [8])
    server.step("P plus another token: every full block hits and is reported, and nothing "
                "follows the report", schedule=[b])
    server.step("both finish", finish=[a, b])
    c = server.request(P)
    server.step("P: a hit of 3 blocks is reported, then block 3 is computed again", schedule=[c])
    server.step("it finishes", finish=[c])
    one_block(server)
    server.fill(9)
    rows.extend(server.rows)
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} steps to {OUT}")


if __name__ == "__main__":
    main()
