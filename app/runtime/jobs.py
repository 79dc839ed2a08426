"""Work the main window hands to the model worker (loading the model, replaying a trace),
recognising what kind of file the user opened (`engine.core.sniff`), and turning failures into one sentence.
Jobs run on the worker thread and touch no widget.
"""

from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from engine.core import validation
from engine.core.sniff import file_kind, trace_format
from engine.core.trace import MAX_LINE_BYTES, MOONCAKE_BLOCK_SIZE
from engine.core.errors import InputError, TraceError


def classify_file(path: Path) -> str:
    """"trace" (token/block JSONL), "session" (a Cachescope database) or "conversation":
    what File > Open does with `path`, as `engine.core.sniff.file_kind` tells it."""
    return file_kind(path)


def trace_capacity(path: Path, block_size: int) -> int:
    """A pool about half the size of everything the trace ever holds, so that it fills and
    evicts (the interesting part) without thrashing; at least 64 blocks, at most 16K."""
    num_tokens = 0
    try:
        # The trace reader's own bounded lines: a regular file only, no line past the limit.
        with validation.open_input(path, "trace file", max_bytes=None) as fh:
            for _, raw in validation.iter_lines(fh, str(path), MAX_LINE_BYTES):
                obj = validation.loads(raw, str(path)) if raw.strip() else None
                if isinstance(obj, dict):
                    if isinstance(obj.get("tokens"), list):
                        num_tokens += len(obj["tokens"]) + len(obj.get("output_tokens") or [])
                    else:
                        num_tokens += int(obj.get("input_length") or 0) + int(obj.get("output_length") or 0)
    except (ValueError, TypeError):  # TraceError is a ValueError: the replay itself reports the bad line
        pass
    return max(64, min(16384, num_tokens // block_size // 2))


def trace_block_size(path: Path) -> int:
    # Mooncake hash ids each stand for one 512-token block.
    return MOONCAKE_BLOCK_SIZE if trace_format(path) == "mooncake" else 16


def replay_trace_job(path: str, bus: Any, block_size: int, capacity_blocks: int) -> dict:
    """Worker-thread job: replay a token/block trace through a fresh engine emitting on `bus`."""
    from engine.core.replay import ReplayConfig, replay
    from engine.core.trace import read_trace

    config = ReplayConfig(block_size=block_size, capacity_blocks=capacity_blocks, seed=0)
    # Streamed, as `cachescope replay` does: memory is bounded by the longest line, not the file.
    result = replay(read_trace(path, block_size), config, events=bus, source=str(path))
    result.config["trace"] = str(path)
    return result.to_dict()


def model_threads() -> int:
    """Intra-op threads for the model: every core but one, which the GUI thread keeps.

    Measured on a busy 2-core machine (`cachescope demo multi-turn-reuse`, warm runner):
    with torch's default of 2 threads each turn's TTFT was 3.1-4.5 s (84 s in all), with 1
    thread 0.16-0.30 s (14 s in all). When anything else wants a core (the GUI drawing a
    demo's events), a parallel matmul waits for its descheduled thread at every barrier.
    """
    return max(1, (os.cpu_count() or 2) - 1)


# A collection that a background thread sets off can also free a Qt object caught in a
# cycle there: its destructor then takes a Qt lock on that thread and waits for the GIL,
# while the GUI thread holds the GIL deleting a widget and waits for the same lock (a
# deadlock seen in tests/test_remote_app.py with the tokenizer loading on its thread).
# A job that allocates a lot runs inside `collector_paused`.
@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a background job runs (a bill, a
    tokenizer load), then every object made meanwhile frozen out of later collections (as
    the model's are once it is loaded).
    A bill of the 12,031-request Mooncake trace makes some 400,000 objects: each full
    collection the worker set off while making them walked every object in the process
    holding the GIL and stalled the window 0.2-0.5 s, seven times in one bill; collecting
    them at the end (even the young generations only) stalled it 0.26 s. Refcounting still
    frees a dropped bill (its rows hold no cycles); a cycle made during the job, or left
    uncollected before it, is never collected: the price of never walking the bill again
    (with the Mooncake trace open, a full collection took 0.35 s and found nothing)."""
    from app.runtime import collector

    collector.hold_automatic(job=True)  # a window opened or closed meanwhile, or another job, keeps its own hold
    try:
        yield
    finally:
        gc.freeze()
        collector.give_back_automatic(job=True)


def load_model_job(model: str | None, num_blocks: int, block_size: int, progress: Callable[[str, float], None]) -> Any:
    """Worker-thread job: load (converting on first run) the model and build a runner."""
    from app.runtime.imports import BACKGROUND_IMPORTS

    # Not importing at the same moment as the live log's warm-up: torch, transformers (the
    # load imports them) and numba (warm_up) are imported with the lock held.
    with BACKGROUND_IMPORTS:
        import torch

        torch.set_num_threads(model_threads())
        from engine.core.events import EventBus
        from engine.core.live_log import warm_up
        from engine.model.loader import load_model
        from engine.model.runner import ModelRunner

        loaded = load_model(model, progress=progress)
        progress("building the KV pool", 0.98)
        runner = ModelRunner(loaded, num_blocks=num_blocks, block_size=block_size, seed=0, events=EventBus())
        # the event log's compiled passes load here, not at the first chat message on the GUI thread
        progress("readying the event log", 0.99)
        warm_up()
    return runner


# Advice written for the command line, and what a window user can do instead.
_CLI_ADVICE = {" (use --format to choose one)": "; open a file in one of those formats"}


def error_sentence(exc: BaseException, what: str) -> str:
    """One sentence for a dialog: the user's mistake as said by the engine, else what failed.
    Command-line advice (a flag to pass) is replaced by what a window user can do."""
    if isinstance(exc, (InputError, TraceError)):
        text = str(exc)
        for cli, gui in _CLI_ADVICE.items():
            text = text.replace(cli, gui)
        return text
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return f"{what}: {exc.strerror or exc} ({exc.filename})."
    return f"{what}: {type(exc).__name__}: {exc}".rstrip(".") + "."


def resize_pool_job(runner: Any, num_blocks: int, block_size: int) -> Any:
    """Worker-thread job: a runner on the same loaded model with a fresh pool of another size."""
    from engine.core.events import EventBus
    from engine.model.runner import ModelRunner

    return ModelRunner(runner.loaded, num_blocks=num_blocks, block_size=block_size, seed=0, events=EventBus())
