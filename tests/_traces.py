"""The bundled Mooncake conversation trace, and the first requests of a trace as a file of their own."""

from __future__ import annotations

from pathlib import Path

MOONCAKE = Path(__file__).resolve().parents[1] / "resources" / "traces" / "mooncake_conversation_trace.jsonl"


def trace_head(folder: Path, num_requests: int, trace: Path = MOONCAKE) -> Path:
    """The first `num_requests` lines of `trace` written to `folder`/NAME_N.jsonl, its path."""
    path = folder / f"{trace.stem.split('_')[0]}_{num_requests}.jsonl"
    with trace.open("rb") as src:
        path.write_bytes(b"".join(line for _, line in zip(range(num_requests), src)))
    return path
