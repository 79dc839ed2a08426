"""What serving requests produced, as typed values: one `ServedRequest` per request (served
or refused), the `ReplayTotals` of a run and the `ReplayResult` the replay commands print.
`to_dict()` gives the JSON rows of the replay contract; everything else passes the objects.
A compiled replay keeps its rows as columns (`RowColumns`): the JSON rows and the totals
are read from the arrays, and `ServedRequest` objects are made only when a caller asks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Protocol

# Optional fields in the order they follow the always-present ones in a JSON row; a field
# left None is not part of the row (a no-model replay has no timings, a trace no messages).
_OPTIONAL = ("message_position", "output_text", "ttft_ms", "prefill_ms", "decode_ms", "finish_reason",
             "miss_message", "cached_tokens_before")


@dataclass(slots=True)
class ServedRequest:
    """One request as the engine served it, like vLLM's `KVCacheBlocks` for its scheduler:
    how many prompt tokens were reused and computed, and why the first missing block missed.
    A refused request has `refused` set and nothing cached or computed."""

    index: int  # position in the input (file order), also the row's sort key
    id: str
    tenant: str | None  # who sent it; its salt keeps its blocks apart from other tenants'
    prompt_tokens: int
    cached_tokens: int = 0
    computed_tokens: int = 0
    output_tokens: int = 0
    miss_reason: str | None = None
    first_miss_block: int | None = None
    divergence_token: int | None = None
    refused: bool = False
    message_position: int | None = None  # the chat message the request was sent after
    output_text: str | None = None
    ttft_ms: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    finish_reason: str | None = None
    miss_message: int | None = None  # the chat message that holds the first missed token
    cached_tokens_before: int | None = None  # an edit's baseline: cached tokens of the unedited request

    @classmethod
    def from_result(cls, index: int, result: Any, tenant: str | None) -> ServedRequest:
        """The row of a model run's `GenerationResult` (timings in milliseconds as measured)."""
        miss = result.miss
        return cls(index, str(result.request_id), tenant, result.num_prompt_tokens, result.num_cached_tokens,
                   result.num_computed_tokens, len(result.output_token_ids),
                   miss.reason if miss is not None else None, miss.first_miss_block if miss is not None else None,
                   miss.divergence_token if miss is not None else None, output_text=result.output_text,
                   ttft_ms=result.ttft_ms, prefill_ms=result.prefill_ms, decode_ms=result.decode_ms)

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "index": self.index, "id": self.id, "tenant": self.tenant, "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens, "computed_tokens": self.computed_tokens,
            "output_tokens": self.output_tokens, "miss_reason": self.miss_reason,
            "first_miss_block": self.first_miss_block, "divergence_token": self.divergence_token}
        if self.refused:
            row["refused"] = True
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                row[name] = value
        return row


@dataclass(slots=True, frozen=True)
class ReplayTotals:
    """Sums over a run's requests; refused requests count in `requests` and nowhere else."""

    requests: int
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    hit_rate: float  # cached / prompt tokens of the served requests, 6 decimals
    stored_blocks: int
    evicted_blocks: int
    refused_requests: int

    @classmethod
    def of(cls, requests: Iterable[ServedRequest], counters: Any) -> ReplayTotals:
        """The totals of `requests` served on an engine whose `Counters` are `counters`."""
        rows = list(requests)
        served = [r for r in rows if not r.refused]
        prompt = sum(r.prompt_tokens for r in served)
        cached = sum(r.cached_tokens for r in served)
        return cls(len(rows), prompt, cached, prompt - cached, round(cached / prompt, 6) if prompt else 0.0,
                   counters.num_stored_blocks, counters.num_evicted_blocks, len(rows) - len(served))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RowColumns(Protocol):
    """Rows kept as columns (the compiled kernel's `engine.kernel.result.ServedColumns`):
    `rows()` makes the `ServedRequest` rows once, `to_dicts()` gives their JSON rows without
    making them."""

    def __len__(self) -> int: ...

    def rows(self) -> list[ServedRequest]: ...

    def to_dicts(self) -> list[dict[str, Any]]: ...


@dataclass(slots=True, init=False, eq=False)
class ReplayResult:
    """A replay: the settings it ran with, its totals and its requests in input order.
    `config` is what the JSON shows under "config" (the replay settings plus where they
    came from, such as the trace path or the session and run ids). `requests` may be
    given as `RowColumns`; its rows are then made on the first read of `requests`."""

    config: dict[str, Any]
    totals: ReplayTotals
    _rows: list[ServedRequest] | None
    columns: RowColumns | None

    def __init__(self, config: dict[str, Any], totals: ReplayTotals,
                 requests: list[ServedRequest] | RowColumns | None = None) -> None:
        self.config = config
        self.totals = totals
        rows = [] if requests is None else requests
        self.columns = None if isinstance(rows, list) else rows
        self._rows = rows if isinstance(rows, list) else None

    @property
    def requests(self) -> list[ServedRequest]:
        if self._rows is None:
            assert self.columns is not None
            self._rows = self.columns.rows()
        return self._rows

    @requests.setter
    def requests(self, rows: list[ServedRequest]) -> None:
        self._rows, self.columns = rows, None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReplayResult):
            return NotImplemented
        return (self.config, self.totals, self.requests) == (other.config, other.totals, other.requests)

    def __repr__(self) -> str:
        rows = len(self.columns) if self._rows is None and self.columns is not None else len(self.requests)
        return f"ReplayResult(config={self.config!r}, totals={self.totals!r}, {rows:,} requests)"

    def to_dict(self, with_requests: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"config": dict(self.config), "totals": self.totals.to_dict()}
        if with_requests:
            if self._rows is None and self.columns is not None:
                out["requests"] = self.columns.to_dicts()
            else:
                out["requests"] = [r.to_dict() for r in self.requests]
        return out
