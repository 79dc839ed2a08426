"""Replaying conversations on the real model (`cachescope replay CONVERSATION`): each user
turn is one request through a fresh `ModelRunner`, so the reuse comes from the engine alone.
Token-level and block-level traces without a model are `engine.core.replay`'s business.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from engine.core.errors import CapacityError, InputError
from engine.core.events import EventBus
from engine.core.manager import Request
from engine.core.replay import ReplayConfig
from engine.core.served import ReplayTotals, ServedRequest
from engine.store.formats import Conversation, load_conversations

DEFAULT_CAPACITY_BLOCKS = 4096  # 64K tokens at block size 16: no eviction for any normal chat


@dataclass(slots=True, frozen=True)
class ModelReplayConfig:
    block_size: int = 16
    capacity_blocks: int | None = DEFAULT_CAPACITY_BLOCKS
    kv_memory_bytes: int | None = None
    seed: int | None = 0
    hash: str = "sha256"
    max_new_tokens: int = 32
    verify: bool = False
    teacher_forced: bool = False
    model: str | None = None
    hash_seed: str | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise InputError(f"--block-size must be at least 1, not {self.block_size}")
        if self.capacity_blocks is not None and self.capacity_blocks < 1:
            raise InputError(f"the capacity must be at least one block, not {self.capacity_blocks}")
        if self.max_new_tokens < 1:
            raise InputError("--max-new-tokens must be at least 1 for a model replay")


def _chat_messages(messages: Sequence[Any]) -> list[dict[str, str]]:
    # Chat templates know system/user/assistant; a developer message is a system message.
    role_map = {"developer": "system", "function": "tool"}
    return [{"role": role_map.get(m.role, m.role), "content": m.content} for m in messages]


def replay_conversations(conversations: Sequence[Conversation], loaded: Any, config: ModelReplayConfig,
                         events: EventBus | None = None) -> dict[str, Any]:
    """Run every user turn of `conversations` through one fresh runner, in order.

    Recorded assistant turns are replaced by the generated replies unless
    `teacher_forced`, which keeps them (the generated reply is then only measured).
    With `verify` each request is repeated without reuse and compared.
    """
    from engine.model.runner import ModelRunner

    runner = ModelRunner(loaded, num_blocks=config.capacity_blocks if config.kv_memory_bytes is None else None,
                         kv_memory_bytes=config.kv_memory_bytes, block_size=config.block_size, seed=config.seed,
                         hash_name=config.hash, events=events, hash_seed=config.hash_seed)
    rows: list[dict[str, Any]] = []
    served_requests: list[ServedRequest] = []
    for conv_index, conv in enumerate(conversations):
        if conv.kind != "chat":
            raise InputError(f"conversation {conv_index + 1} is a trace, not a chat; replay it without a model")
        history: list[dict[str, str]] = []
        messages = _chat_messages(conv.messages)
        turn = 0
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                if config.teacher_forced:
                    history.append(message)
                continue
            history.append(message)
            if message["role"] != "user":
                continue
            served, row = _run_turn(runner, history, config, len(rows), f"{conv_index}:{turn}", conv)
            served_requests.append(served)
            rows.append(row)
            turn += 1
            if not config.teacher_forced and not served.refused:
                history.append({"role": "assistant", "content": served.output_text or ""})
    return _result(served_requests, rows, runner, config)


def _run_turn(runner: Any, history: list[dict[str, str]], config: ModelReplayConfig, index: int,
              request_id: str, conv: Conversation) -> tuple[ServedRequest, dict[str, Any]]:
    prompt = runner.render_chat(history)
    try:
        result = runner.generate(prompt, max_new_tokens=config.max_new_tokens, request_id=request_id)
    except CapacityError as exc:
        miss = runner.manager.lookup(Request(request_id, prompt)).miss
        served = ServedRequest(index, request_id, None, len(prompt), miss_reason=miss.reason,
                               first_miss_block=miss.first_miss_block, divergence_token=miss.divergence_token,
                               refused=True, output_text="")
        return served, _row(served, conv, error=str(exc))
    served = ServedRequest.from_result(index, result, None)
    served.ttft_ms, served.prefill_ms = round(result.ttft_ms, 3), round(result.prefill_ms, 3)
    served.decode_ms, served.finish_reason = round(result.decode_ms, 3), result.finish_reason
    row = _row(served, conv)
    if config.verify:
        cold = runner.generate(prompt, max_new_tokens=config.max_new_tokens, use_cache=False,
                               request_id=f"{request_id}:verify")
        diffs = [float((a - b).abs().max()) for a, b in ((result.first_logits, cold.first_logits),
                                                         (result.last_logits, cold.last_logits))
                 if a is not None and b is not None and a.shape == b.shape]
        row.update(outputs_identical=result.output_token_ids == cold.output_token_ids,
                   max_logit_diff=max(diffs) if diffs else None, cold_ttft_ms=round(cold.ttft_ms, 3))
    return served, row


def _row(served: ServedRequest, conv: Conversation, **extra: Any) -> dict[str, Any]:
    """The replay contract's row plus which conversation the request came from."""
    return {**served.to_dict(), "conversation": conv.title or None, **extra}


def _result(served_requests: list[ServedRequest], rows: list[dict[str, Any]], runner: Any,
            config: ModelReplayConfig) -> dict[str, Any]:
    served = [r for r in rows if not r.get("refused")]
    totals = ReplayTotals.of(served_requests, runner.manager.counters).to_dict()
    totals.update(output_tokens=sum(r["output_tokens"] for r in served),
                  ttft_ms=round(sum(r["ttft_ms"] for r in served), 3),
                  prefill_ms=round(sum(r["prefill_ms"] for r in served), 3),
                  decode_ms=round(sum(r["decode_ms"] for r in served), 3))
    if config.verify:
        diffs = [r["max_logit_diff"] for r in served if r.get("max_logit_diff") is not None]
        totals["outputs_identical"] = all(r["outputs_identical"] for r in served)
        totals["max_logit_diff"] = max(diffs) if diffs else None
    out_config = asdict(config)
    out_config.update(capacity_blocks=runner.manager.num_blocks, concurrency=1, model=runner.loaded.name,
                      model_id=runner.loaded.model_id)
    return {"config": out_config, "totals": totals, "requests": rows}


def replay_conversation_command(args: argparse.Namespace, events: EventBus | None = None) -> dict[str, Any]:
    """`cachescope replay CONVERSATION ...` with a model: parse, load, run, return the JSON."""
    conversations = [c for c in load_conversations(args.trace) if c.kind == "chat"]
    if not conversations:
        raise InputError(f"{args.trace}: holds no chat conversation to replay on a model")
    block_size = args.block_size
    capacity = DEFAULT_CAPACITY_BLOCKS
    if getattr(args, "capacity_blocks", None) is not None:
        capacity = args.capacity_blocks
    elif getattr(args, "capacity_tokens", None) is not None:
        capacity = ReplayConfig.capacity_from_tokens(args.capacity_tokens, block_size)
    kv_memory = getattr(args, "kv_memory", None)
    config = ModelReplayConfig(
        block_size=block_size, capacity_blocks=None if kv_memory is not None else capacity,
        kv_memory_bytes=kv_memory, seed=None if getattr(args, "random_seed", False) else args.seed,
        hash=args.hash, max_new_tokens=args.max_new_tokens, verify=args.verify,
        teacher_forced=args.teacher_forced, model=args.model, hash_seed=getattr(args, "hash_seed", None))
    from engine.model.loader import load_model

    loaded = load_model(args.model)
    try:
        result = replay_conversations(conversations, loaded, config, events)
    except ValueError as exc:  # a memory budget too small for one block, and the like
        if isinstance(exc, InputError):
            raise
        raise InputError(str(exc)) from None
    result["config"]["trace"] = str(args.trace)
    return result
