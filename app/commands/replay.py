"""`cachescope replay`: run a trace or a conversation through a fresh engine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.commands._common import byte_size, non_negative_int, positive_int, print_json, seed_int, vllm_gpu_blocks
from app.commands._publish import Publishing, add_publish_arguments
from app.commands._weka import is_weka_input, run_weka
from engine.core.errors import InputError
from engine.core.hashing import HASH_NAMES
from engine.core.sniff import is_request_trace

NAME = "replay"
HELP = "replay a token/block trace (no model) or a conversation (real model) through a fresh engine"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", metavar="TRACE", help="token-level or Mooncake JSONL trace, a WEKA kv-cache-tester file or "
                                                  "folder (concurrent users), or an OpenAI-style conversation JSON")
    p.add_argument("--no-model", action="store_true", help="bookkeeping only: no model, no tensors")
    p.add_argument("--model", metavar="M", default=None, help="local HF folder, .gguf file or hub id (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--block-size", type=positive_int, default=16, metavar="N", help="tokens per block (default 16)")
    cap = p.add_mutually_exclusive_group()
    cap.add_argument("--capacity-blocks", type=positive_int, metavar="N", help="pool size in blocks (a conversation replay on a model defaults to 4096 blocks, enough not to evict)")
    cap.add_argument("--capacity-tokens", type=positive_int, metavar="N", help="pool size in tokens")
    cap.add_argument("--num-gpu-blocks", type=vllm_gpu_blocks, metavar="N", dest="capacity_blocks",
                     help="pool size as a vLLM server's num_gpu_blocks (its null block included: N - 1 usable blocks)")
    cap.add_argument("--kv-memory", type=byte_size, metavar="SIZE", help="pool size as a KV memory budget, e.g. 512MiB (needs a model)")
    p.add_argument("--seed", type=seed_int, default=0, metavar="S", help="hash seed so digests repeat (default 0)")
    p.add_argument("--random-seed", action="store_true", help="use a random hash root instead of --seed")
    p.add_argument("--hash", choices=HASH_NAMES, default="sha256",
                   help="block hash (default sha256; vllm-sha256 and vllm-sha256-cbor equal a vLLM server's, "
                        "sglang-sha256 an SGLang server's)")
    p.add_argument("--hash-seed", default=None, metavar="SEED",
                   help="with a vllm-* hash: the server's PYTHONHASHSEED, if it was started with one")
    p.add_argument("--concurrency", type=positive_int, default=1, metavar="K", help="requests in flight at once (default 1)")
    p.add_argument("--max-new-tokens", type=non_negative_int, default=32, metavar="N", help="tokens to generate per turn (model replay)")
    p.add_argument("--verify", action="store_true", help="repeat the run without reuse and compare outputs and logits")
    p.add_argument("--teacher-forced", action="store_true", help="keep recorded assistant turns instead of generating them")
    p.add_argument("--totals-only", action="store_true", help="omit the per-request rows")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--shared-across-models", action="store_true",
                   help="what-if: one cache shared across models (by default a request's model is part of its cache key)")
    p.add_argument("--kernel", choices=("auto", "numba", "python"), default="auto",
                   help="bookkeeping of a no-model trace replay: numba (compiled, the same results and events), "
                        "python (the reference engine) or auto (numba where it can run the trace; default)")
    add_publish_arguments(p)


def run(args: argparse.Namespace) -> int:
    path = Path(args.trace)
    if not path.exists():
        raise InputError(f"{args.trace}: no such file")
    if args.hash_seed is not None and not args.hash.startswith("vllm-"):
        raise InputError("--hash-seed applies to the vllm-sha256 and vllm-sha256-cbor hashes")
    publishing = Publishing(args)
    try:
        bus = None
        if publishing.active:
            from engine.core.events import EventBus

            bus = EventBus()
            publishing.hook(bus, args.block_size)
        if is_weka_input(path):
            return run_weka(args, bus)
        if args.no_model or is_request_trace(path):
            result = _replay_trace(args, bus)
        else:
            from engine.analysis.model_replay import replay_conversation_command

            result = replay_conversation_command(args, bus)
    finally:
        publishing.close()
    if args.totals_only:
        result.pop("requests", None)
    if args.json:
        print_json(result)
    else:
        print_human(result)
    return 0


def _replay_trace(args: argparse.Namespace, events: object = None) -> dict:
    from engine.core.replay import ReplayConfig
    from engine.kernel.dispatch import replay_with
    from engine.core.trace import read_trace
    from engine.store.block_traces import check_block_sizes, declared_block_size

    declared = declared_block_size(args.trace)  # kvcache-simulator lines carry their block size
    if declared is not None:
        if args.block_size not in (16, declared):  # 16 is the option's default
            raise InputError(f"{args.trace}: its hash ids name {declared}-token blocks; give --block-size {declared} "
                             f"or leave it out")
        args.block_size = declared
        check_block_sizes(args.trace, declared)

    if args.kv_memory is not None:
        raise InputError("--kv-memory needs a model; with --no-model give --capacity-blocks, --capacity-tokens "
                         "or --num-gpu-blocks")
    if args.capacity_tokens is not None:
        capacity = ReplayConfig.capacity_from_tokens(args.capacity_tokens, args.block_size)
    elif args.capacity_blocks is not None:
        capacity = args.capacity_blocks
    else:
        raise InputError("give the pool size: --capacity-blocks N, --capacity-tokens N or --num-gpu-blocks N")
    config = ReplayConfig(block_size=args.block_size, capacity_blocks=capacity,
                          seed=None if args.random_seed else args.seed, hash=args.hash,
                          concurrency=args.concurrency, hash_seed=args.hash_seed)
    result = replay_with(args.kernel, read_trace(args.trace, args.block_size), config, events,  # type: ignore[arg-type]
                         source=str(args.trace))
    result.config["trace"] = str(args.trace)
    return result.to_dict()


def print_human(result: dict) -> None:
    """The replay contract as a short table (also used by `sessions replay`)."""
    t = result["totals"]
    out = sys.stdout
    out.write(f"requests {t['requests']}  prompt tokens {t['prompt_tokens']}  cached {t['cached_tokens']}  "
              f"computed {t['computed_tokens']}  hit rate {t['hit_rate']:.1%}\n")
    out.write(f"stored blocks {t['stored_blocks']}  evicted {t['evicted_blocks']}  refused {t['refused_requests']}\n")
    rows = result.get("requests") or []
    if rows:
        out.write(f"{'#':>5} {'id':<12} {'prompt':>7} {'cached':>7} {'computed':>8}  reason\n")
        for r in rows[:200]:
            out.write(f"{r['index']:>5} {str(r['id'])[:12]:<12} {r['prompt_tokens']:>7} {r['cached_tokens']:>7} "
                      f"{r['computed_tokens']:>8}  {r['miss_reason']}@{r['first_miss_block']}\n")
        if len(rows) > 200:
            out.write(f"... {len(rows) - 200} more (use --json)\n")
