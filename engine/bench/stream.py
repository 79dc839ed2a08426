"""`cachescope bench stream`: a 214M-block trace replayed headless through the kernel, streamed.

The six WEKA kv-cache-tester files (resources/traces/weka, copied from
../shared/data/traces/weka; only their hash ids, sizes and models matter here) are read once and replayed many times over, one copy per chunk,
through `engine.kernel.stream.replay_stream` until about 214 million block references
(the whole WEKA set's size) have gone through. Peak RSS is measured after the first copies
and at the end: bounded memory means it stops growing.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from engine.core.errors import InputError
from engine.core.replay import ReplayConfig
from engine.kernel.stream import StreamChunk, replay_stream
from engine.resources import RESOURCES

TARGET_BLOCKS = 214_000_000
SETTLED_COPY = 10  # peak RSS growth is counted from this copy on (the 5th in a quick run of 10)
TARGET_GROWTH_MB = 50


def weka_folder() -> Path:
    """The six WEKA files bundled in resources/traces/weka (copies of ../shared/data/traces/weka)."""
    folder = RESOURCES / "traces" / "weka"
    if not any(folder.glob("trace_*.json")):
        raise InputError(f"{folder} holds no WEKA traces (trace_*.json): the bundled resources are incomplete")
    return folder


def load_weka(folder: Path) -> tuple[StreamChunk, int]:
    """All requests of every file in the folder, in file order, as one chunk; and the
    number of distinct models."""
    nprompt, nout, models, lists = [], [], [], []
    model_ids: dict[str, int] = {}
    block_size = None
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        block_size = block_size or data.get("block_size")
        todo = list(reversed(data["requests"]))
        while todo:  # a sub-agent's own requests follow it, in file order
            r = todo.pop()
            if r.get("type") == "subagent":
                todo.extend(reversed(r.get("requests") or []))
                continue
            nprompt.append(int(r["in"]))
            nout.append(int(r["out"]))
            models.append(model_ids.setdefault(r.get("model") or "", len(model_ids)))
            lists.append(r.get("hash_ids") or [])
    offsets = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    items = np.fromiter((h for x in lists for h in x), np.uint64, count=int(offsets[-1])).view(np.int64)
    n = len(nprompt)
    chunk = StreamChunk(np.array(nprompt, np.int64), np.array(nout, np.int64), np.arange(n, dtype=np.int32),
                        np.array(models, np.int32), offsets, items)
    return chunk, len(model_ids)


def _copies(base: StreamChunk, copies: int, marks: list, settled: int) -> Iterator[StreamChunk]:
    n = len(base.num_prompt_tokens)
    for c in range(copies):
        if c in (1, settled, copies // 2):
            marks.append((c, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
        yield StreamChunk(base.num_prompt_tokens, base.num_output_tokens, (base.uid + c * n).astype(np.int32),
                          base.model, base.offsets, base.items)


def run_bench(quick: bool = False) -> dict[str, Any]:
    t0 = time.perf_counter()
    base, num_models = load_weka(weka_folder())
    t_load = time.perf_counter() - t0
    per_copy = int(np.minimum(np.diff(base.offsets), base.num_prompt_tokens // 64).sum())
    copies = 10 if quick else -(-TARGET_BLOCKS // per_copy)
    settled = min(SETTLED_COPY, copies // 2)  # the pool and the key table have reached their size
    config = ReplayConfig(block_size=64, capacity_blocks=8192, concurrency=8)
    replay_stream([base], config, num_models)  # compiled or loaded from the cache here, not timed
    marks: list = []
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    totals = replay_stream(_copies(base, copies, marks, settled), config, num_models, num_uids=copies * len(base.uid))
    t_run = time.perf_counter() - t0
    rss_end = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    blocks = totals.lookup_blocks
    rss_settled = dict(marks)[settled]
    growth = round((rss_end - rss_settled) / 1024, 1)
    return {
        "files": "six WEKA kv-cache-tester traces", "requests_per_copy": len(base.uid), "blocks_per_copy": per_copy,
        "copies": copies, "requests": totals.requests, "lookup_blocks": blocks,
        "capacity_blocks": config.capacity_blocks, "concurrency": config.concurrency, "block_size": 64,
        "hit_rate": totals.hit_rate, "evicted_blocks": totals.evicted_blocks, "distinct_blocks": totals.distinct_blocks,
        "load_s": round(t_load, 2), "replay_s": round(t_run, 1), "blocks_per_s": round(blocks / t_run),
        "peak_rss_mb_before": round(rss0 / 1024, 1),
        "peak_rss_mb_after_copies": {str(c): round(kb / 1024, 1) for c, kb in marks},
        "settled_at_copy": settled, "peak_rss_mb_settled": round(rss_settled / 1024, 1),
        "peak_rss_mb_end": round(rss_end / 1024, 1),
        "targets": {
            "blocks_replayed": {"value": blocks, "target": f">= {TARGET_BLOCKS}", "met": blocks >= TARGET_BLOCKS}
            if not quick else {"value": blocks, "target": "quick run", "met": True},
            "bounded_memory_mb_growth_after_settling": {
                "value": growth, "target": f"< {TARGET_GROWTH_MB}", "met": growth < TARGET_GROWTH_MB,
                "from_copy": settled},
        },
    }
