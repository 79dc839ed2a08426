"""Record the vLLM twin fixtures: vLLM 0.33.0's own KVCacheManager driven through the
schedule of Cachescope's `engine.core.replay.replay()`.

Run by hand with a Python that has vLLM 0.33.0 (never the project's venv, never CI):

    env -u PYTHONHASHSEED /tmp/vllmenv/bin/python tests/data/vllm_twin/record_vllm_twin.py

It imports nothing from Cachescope: the workloads are generated here (seeded, so a rerun
writes the same files) and the schedule is re-implemented token by token, so a shortcut
in `replay()` that changes what vLLM would do shows up as a difference.
For each scenario it writes `<name>.trace.jsonl` (a token-level trace Cachescope reads)
and `<name>.vllm.json` (the config and what vLLM did).
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

if os.environ.get("PYTHONHASHSEED") is not None:
    sys.exit("unset PYTHONHASHSEED: the fixtures use vLLM's default root hash (seed 'vllm-none-hash')")
os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "0"  # events carry the 32-byte digests

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

HERE = Path(__file__).resolve().parent
BLOCK_SIZE = 16
VOCAB = 32000
MOONCAKE = HERE.parents[2] / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
MOONCAKE_BLOCK = 512  # the tokens one of the trace's hash_ids stands for
MOONCAKE_ROWS = 30  # 150 rows would make ~1.5 MB of fixtures (every block's tokens and hash is recorded)


@dataclass
class Item:
    id: str
    tokens: list[int]
    output_tokens: list[int]
    tenant: str | None = None

    def to_trace(self) -> dict:
        row = {"id": self.id, "tokens": self.tokens, "output_tokens": self.output_tokens}
        if self.tenant is not None:
            row["tenant"] = self.tenant
        return row


# ---------------------------------------------------------------- workloads
def toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, VOCAB) for _ in range(n)]


def chats(rng: random.Random, num_chats: int, num_turns: int, system: list[int], user=(8, 40),
          answer=(10, 60), retries: bool = True, tenant_of=lambda c: None, prefix: str = "c",
          aligned: bool = False) -> list[Item]:
    """Multi-turn chats, interleaved turn by turn; turn t's prompt is turn t-1's prompt plus
    its answer plus new user text. With `retries`, chat 0 re-sends its turn 1 identical and
    chat 1 regenerates it (same prompt, another answer, which the next turn builds on).
    `aligned` makes every prompt and every prompt + answer - 1 (the KV) block-aligned."""
    def length(bounds: tuple[int, int], pad: int) -> int:
        n = rng.randint(*bounds)
        return n + (-(n + pad) % BLOCK_SIZE) if aligned else n

    lines: list[list[Item]] = []
    for c in range(num_chats):
        tenant = tenant_of(c)
        mine: list[Item] = []
        prompt = system + toks(rng, length(user, len(system)))
        for t in range(num_turns):
            out = toks(rng, length(answer, len(prompt) - 1))
            mine.append(Item(f"{prefix}{c}-t{t}", prompt, out, tenant))
            if retries and t == 1 and c % 3 == 0:
                mine.append(Item(f"{prefix}{c}-t{t}-resent", prompt, out, tenant))
            if retries and t == 1 and c % 3 == 1:
                out = toks(rng, len(out) + (0 if aligned else rng.randint(-5, 5)))
                mine.append(Item(f"{prefix}{c}-t{t}-regen", prompt, out, tenant))
            prompt = prompt + out + toks(rng, length(user, len(prompt) + len(out)))
        lines.append(mine)
    order: list[Item] = []
    for i in range(max(len(m) for m in lines)):
        order.extend(m[i] for m in lines if i < len(m))
    return order


def mooncake(num_requests: int, max_output: int, seed: int) -> list[Item]:
    """The first `num_requests` rows of the Mooncake FAST'25 conversation trace as tokens, scaled
    by BLOCK_SIZE / 512: hash id h becomes the block of token ids 16h .. 16h + 15 (distinct for
    every h in the slice, so the prefix structure is the trace's exactly); the last block is cut
    to its share of `input_length` (at least one token). Outputs are scaled the same way (at
    least one token, at most `max_output`) and drawn from a seeded rng."""
    rng = random.Random(seed)
    items = []
    with MOONCAKE.open() as fh:
        for i, line in zip(range(num_requests), fh):
            row = json.loads(line)
            ids = row["hash_ids"]
            assert len(ids) == cdiv(row["input_length"], MOONCAKE_BLOCK), f"row {i}: hash_ids do not cover the input"
            assert max(ids) < (1 << 17) // BLOCK_SIZE, f"row {i}: token ids would repeat"
            rest = row["input_length"] - MOONCAKE_BLOCK * (len(ids) - 1)
            last = max(1, (rest * BLOCK_SIZE + MOONCAKE_BLOCK // 2) // MOONCAKE_BLOCK)
            tokens = [BLOCK_SIZE * h + j for h in ids for j in range(BLOCK_SIZE)]
            del tokens[BLOCK_SIZE * (len(ids) - 1) + last:]
            num_out = (row["output_length"] * BLOCK_SIZE + MOONCAKE_BLOCK // 2) // MOONCAKE_BLOCK
            items.append(Item(f"mc{i}", tokens, toks(rng, min(max(num_out, 1), max_output))))
    return items


def scenarios() -> list[dict]:
    out = []

    def add(name, description, num_gpu_blocks, concurrency, items):
        out.append(dict(name=name, description=description, num_gpu_blocks=num_gpu_blocks,
                        concurrency=concurrency, items=items))

    rng = random.Random(1)
    add("chat_retries_c1", "3 chats x 4 turns sharing a 37-token system prompt; a resent and a "
        "regenerated turn; concurrency 1, no eviction", 257, 1, chats(rng, 3, 4, toks(rng, 37)))
    rng = random.Random(2)
    add("chat_retries_c4", "the same shape with 5 chats, concurrency 4: turns of one chat overlap, "
        "shared blocks carry ref counts > 1", 257, 4, chats(rng, 5, 4, toks(rng, 37)))
    rng = random.Random(3)
    add("block_aligned_c2", "every prompt and every prompt + answer - 1 a multiple of 16: the last "
        "prompt block is always recomputed (duplicate hashes), no partial blocks; concurrency 2",
        129, 2, chats(rng, 3, 3, toks(rng, 32), aligned=True))
    rng = random.Random(4)
    items = chats(rng, 4, 4, toks(rng, 70), user=(30, 120), answer=(20, 70))
    items.insert(6, Item("too-big", toks(rng, 64 * 16 + 50), toks(rng, 4)))
    add("evict_pool64_c1", "4 long chats in 63 usable blocks: eviction on almost every request, "
        "one request larger than the pool (refused); concurrency 1", 64, 1, items)
    rng = random.Random(5)
    items = chats(rng, 4, 4, toks(rng, 70), user=(30, 100), answer=(20, 70))
    items.insert(9, Item("too-big", toks(rng, 64 * 16 + 50), toks(rng, 4)))
    add("evict_pool64_c4", "4 long chats in 63 usable blocks, concurrency 4: admissions wait for "
        "room, evictions while others decode, a too-big request waits then is refused", 64, 4, items)
    rng = random.Random(6)
    system = toks(rng, 40)
    items = chats(rng, 6, 3, system, tenant_of=lambda c: (None, "tenant-a", "tenant-b")[c % 3], retries=False)
    same = toks(rng, 50)
    items += [Item(f"same-{i}-{t or 'none'}", system + same, toks(rng, 12), t)
              for i, t in enumerate(("tenant-a", None, "tenant-b", "tenant-a"))]
    add("tenants_c2", "chats of three tenants (no salt, tenant-a, tenant-b) over one system prompt, "
        "then identical tokens under each salt; concurrency 2", 129, 2, items)
    rng = random.Random(7)
    a = Item("long-a", toks(rng, 160), toks(rng, 161))
    b = Item("follow-b", a.tokens + a.output_tokens[:150] + toks(rng, 20), toks(rng, 40))
    c = Item("other-c", toks(rng, 60), toks(rng, 30))
    add("decode_hits_wait_c2", "a request that waits for room while the one ahead of it decodes "
        "the blocks it will hit (its prompt extends that request's answer); 31 usable blocks, "
        "concurrency 2", 32, 2, [a, b, c])
    add("mooncake_slice_c4", f"the first {MOONCAKE_ROWS} requests of the Mooncake FAST'25 conversation "
        "trace as tokens (each 512-token hash id one 16-token block, lengths scaled by 16/512, outputs "
        "at most 24 tokens): real prefix structure (only the first block is shared in this slice), "
        "199 usable blocks for requests of up to 171 blocks, concurrency 4: admissions wait, hundreds of "
        "evictions", 200, 4, mooncake(MOONCAKE_ROWS, 24, 8))
    return out


# ---------------------------------------------------------------- the driver
@dataclass
class Live:
    item: Item
    req: Request
    num_kv_output: int  # output tokens that get KV: all but the last sampled
    num_appended: int = 0


@dataclass
class Run:
    requests: dict[str, dict] = field(default_factory=dict)
    schedule: list[list[str]] = field(default_factory=list)
    num_waits: int = 0  # admission checks that failed while others ran


def make_manager(num_gpu_blocks: int) -> KVCacheManager:
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=num_gpu_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    return KVCacheManager(config, max_model_len=1 << 16, scheduler_block_size=BLOCK_SIZE,
                          hash_block_size=BLOCK_SIZE, enable_caching=True, enable_kv_cache_events=True)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def drive(mgr: KVCacheManager, items: list[Item], concurrency: int) -> Run:
    """The schedule of Cachescope's replay(), one token per request per step.

    Admission: Cachescope checks a new request against room for its whole KV (prompt plus
    every output token but the last) plus the blocks the running requests will still take
    (`num_lookahead_tokens = kv_out + reserve * block_size`), but takes only the prompt's
    blocks. vLLM's `allocate_slots(num_lookahead_tokens=...)` would take the lookahead
    blocks at once (it is meant for speculative tokens), so the check is made here with
    vLLM's own count (`coordinator.get_num_blocks_to_allocate`, the one allocate_slots
    uses) and allocate_slots is called for the prompt alone.
    """
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    coordinator = mgr.coordinator
    pool = mgr.block_pool
    run = Run()
    pending = deque(items)
    running: list[Live] = []

    def outstanding(live: Live) -> int:
        total = len(live.item.tokens) + live.num_kv_output
        return cdiv(total, BLOCK_SIZE) - len(mgr.get_block_ids(live.req.request_id)[0])

    while pending or running:
        while pending and len(running) < concurrency:
            item = pending[0]
            req = Request(item.id, list(item.tokens), SamplingParams(max_tokens=max(len(item.output_tokens), 1)),
                          None, cache_salt=item.tenant, block_hasher=hasher)
            num_prompt = req.num_tokens
            kv_out = max(len(item.output_tokens) - 1, 0)
            reserve = sum(outstanding(live) for live in running)
            hit_blocks, num_hit, _ = mgr.get_computed_blocks(req)
            needed = coordinator.get_num_blocks_to_allocate(
                request_id=req.request_id, num_tokens=num_prompt + kv_out + reserve * BLOCK_SIZE,
                new_computed_blocks=hit_blocks.blocks, num_encoder_tokens=0,
                total_computed_tokens=num_hit, num_local_computed_tokens=num_hit,
                num_tokens_main_model=num_prompt, prefill_end=num_prompt)
            if needed > pool.get_num_free_blocks():
                if running:
                    run.num_waits += 1
                    break  # wait for running requests to free their blocks
                run.requests[item.id] = {"id": item.id, "refused": True}
                run.schedule.append(["refused", item.id])
                pending.popleft()
                continue
            pending.popleft()
            new = mgr.allocate_slots(req, num_prompt - num_hit, num_hit, hit_blocks)
            assert new is not None, f"{item.id}: allocate_slots refused after the admission check passed"
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_prompt
            run.requests[item.id] = {"id": item.id, "refused": False, "num_cached_tokens": num_hit}
            run.schedule.append(["started", item.id])
            running.append(Live(item, req, kv_out))
        if not running:
            continue
        for live in running:  # one decode step: the KV of one more output token each
            if live.num_appended < live.num_kv_output:
                live.req.append_output_token_ids(live.item.output_tokens[live.num_appended])
                new = mgr.allocate_slots(live.req, 1)
                assert new is not None, f"{live.item.id}: no block for a decode token"
                live.req.num_computed_tokens += 1
                live.num_appended += 1
        still: list[Live] = []
        for live in running:
            if live.num_appended >= live.num_kv_output:
                if live.item.output_tokens:  # the last sampled token: known, never computed
                    live.req.append_output_token_ids(live.item.output_tokens[-1])
                run.requests[live.item.id]["block_ids"] = mgr.get_block_ids(live.req.request_id)[0]
                mgr.free(live.req)
                run.schedule.append(["finished", live.item.id])
            else:
                still.append(live)
        running = still
    return run


def event_json(event) -> dict:
    if isinstance(event, BlockStored):
        return {"type": "BlockStored", "block_hashes": [h.hex() for h in event.block_hashes],
                "parent_block_hash": event.parent_block_hash.hex() if event.parent_block_hash else None,
                "token_ids": list(event.token_ids), "block_size": event.block_size,
                "extra_keys": event.extra_keys, "medium": event.medium}
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": [h.hex() for h in event.block_hashes],
                "medium": event.medium}
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"unexpected KV event {event!r}")


def cached_blocks(mgr: KVCacheManager) -> list[list]:
    """[vLLM block id, hash hex] of every entry of the hash -> block map, by block id."""
    rows = []
    for key, held in mgr.block_pool.cached_block_hash_to_block._cache.items():
        for block in (held.values() if isinstance(held, dict) else [held]):
            rows.append([block.block_id, get_block_hash(key).hex()])
    return sorted(rows)


def record(scn: dict) -> None:
    ids = [item.id for item in scn["items"]]
    assert len(set(ids)) == len(ids), f"{scn['name']}: request ids repeat"
    mgr = make_manager(scn["num_gpu_blocks"])
    run = drive(mgr, scn["items"], scn["concurrency"])
    events = [event_json(e) for e in mgr.take_events()]
    name = scn["name"]
    with (HERE / f"{name}.trace.jsonl").open("w") as fh:
        for item in scn["items"]:
            fh.write(json.dumps(item.to_trace(), separators=(",", ":")) + "\n")
    result = {
        "scenario": name, "description": scn["description"], "vllm_version": vllm.__version__,
        "config": {"num_gpu_blocks": scn["num_gpu_blocks"], "block_size": BLOCK_SIZE,
                   "concurrency": scn["concurrency"], "hash": "sha256", "none_hash_seed": "vllm-none-hash",
                   "trace": f"{name}.trace.jsonl"},
        "requests": [run.requests[item.id] for item in scn["items"]],
        "schedule": run.schedule,
        "num_admission_waits": run.num_waits,
        "events": events,
        "free_queue": [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()],
        "cached_blocks": cached_blocks(mgr),
    }
    text = json.dumps(result, separators=(",", ":"))
    (HERE / f"{name}.vllm.json").write_text(text + "\n")
    num_removed = sum(e["type"] == "BlockRemoved" for e in events)
    num_stored = sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockStored")
    print(f"{name}: {len(scn['items'])} requests, {num_stored} blocks stored, {num_removed} removed, "
          f"{sum(r['refused'] for r in run.requests.values())} refused, {run.num_waits} waits, "
          f"{len(text) // 1024} KiB")


def main() -> None:
    if vllm.__version__ != "0.33.0":
        sys.exit(f"these fixtures are recorded from vLLM 0.33.0, not {vllm.__version__}")
    init_none_hash(sha256)
    for scn in scenarios():
        record(scn)


if __name__ == "__main__":
    main()
