"""The store's rows as value objects: sessions, message versions, runs and served requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, frozen=True)
class SessionInfo:
    """One stored session. `kind` is "chat" (messages) or "trace" (token/block requests)."""

    id: int
    title: str
    kind: str
    model: str | None
    block_size: int
    capacity_blocks: int
    seed: int | None
    hash: str
    created: str
    source_path: str | None
    source_format: str | None
    settings: dict[str, Any]
    num_messages: int = 0
    num_runs: int = 0


@dataclass(slots=True, frozen=True)
class MessageRow:
    """One version of one message; `position` counts from 0, the system message included."""

    id: int
    session_id: int
    position: int
    version: int
    role: str
    content: str
    extra: dict[str, Any] | None
    created: str
    is_current: bool


@dataclass(slots=True, frozen=True)
class RunInfo:
    id: int
    session_id: int | None
    kind: str  # replay | edit | live
    created: str
    config: dict[str, Any]
    totals: dict[str, Any] | None
    status: str  # running | done | aborted (its process died before finishing it)


REQUEST_FIELDS = ("request_id", "tenant", "prompt_token_ids", "output_token_ids", "prompt_tokens",
                  "cached_tokens", "computed_tokens", "miss_reason", "first_miss_block",
                  "divergence_token", "message_position", "ttft_ms", "prefill_ms", "decode_ms",
                  "output_text", "refused")


@dataclass(slots=True, frozen=True)
class StoredRequest:
    """One request of a run as the engine served it."""

    id: int
    run_id: int
    idx: int
    request_id: str
    tenant: str | None
    prompt_token_ids: list[int] | None
    output_token_ids: list[int] | None
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    miss_reason: str | None
    first_miss_block: int | None
    divergence_token: int | None
    message_position: int | None
    ttft_ms: float | None
    prefill_ms: float | None
    decode_ms: float | None
    output_text: str | None
    refused: bool
    created: str
