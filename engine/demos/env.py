"""What every demo runs in: the shared models, engines wired to the caller, recorded steps.

A `DemoEnv` loads the default model and embedder once, however many demos run, and builds
a fresh engine per scenario whose events it records (and hands to `on_engine`, which the
app uses to point its views at that engine). The scenarios live in the sibling modules.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from engine.core.events import Event, EventBus
from engine.core.manager import PrefixCacheManager
from engine.core.served import ServedRequest
from engine.resources import resource_path

RESOURCES = resource_path("demos")
DEFAULT_MAX_NEW_TOKENS = 8
SEED = 0

# A short untimed request on every fresh runner before its first timed one: the first
# forward pass of a process (or on a freshly allocated pool) pays one-off costs - torch
# picking kernels, the allocator and the OS mapping pages - that the app's chat has paid
# long before its user reads a TTFT. Timing demos on a warm runner measures them the same way.
WARMUP_TOKENS = 64

Script = Callable[["DemoEnv"], dict]


@dataclass(slots=True, frozen=True)
class DemoEngine:
    """What `on_engine` receives for every engine a demo builds: the bus its events go to,
    its pool shape, and the runner when it is one (the app reads its model's KV shape)."""

    bus: EventBus
    block_size: int
    num_blocks: int
    runner: Any = None


@dataclass(slots=True, frozen=True)
class Demo:
    """One scenario. `script(env)` records steps on `env` and returns the findings."""

    name: str
    title: str
    summary: str  # one line, for --list and the menu
    explanation: str  # 2-4 sentences a teacher can read aloud
    needs: frozenset[str]  # "model", "tokenizer", "embedder"
    script: Script


def load_resource(name: str) -> Any:
    """A bundled demo input from resources/demos (JSON parsed, anything else as text)."""
    path = RESOURCES / name
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else text


class DemoEnv:
    """Shared state for running demos in one process.

    `model` (an `engine.model.loader.LoadedModel`) and `embedder` may be given; otherwise the
    bundled ones are loaded on first use and kept. `on_engine(engine)` is called with every
    runner or manager a demo builds, before it serves a request: the app attaches its
    views there. Not thread-safe: run one demo at a time.
    """

    def __init__(self, model: Any = None, embedder: Any = None,
                 on_engine: Callable[[DemoEngine], None] | None = None) -> None:
        self._model = model
        self._tokenizer = model.tokenizer if model is not None else None
        self._embedder = embedder
        self.on_engine = on_engine
        self._load_lock = threading.Lock()
        self.steps: list[dict[str, Any]] = []
        self.events: list[Event] = []
        self.timings: list[dict[str, Any]] = []
        self.engines: list[dict[str, Any]] = []
        self.outputs: dict[str, list[int]] = {}  # generated token ids by request id
        # Live objects a viewer can show beside the JSON result (the semantic cache).
        self.shown: dict[str, Any] = {}

    # ------------------------------------------------------------------ models
    @property
    def model(self) -> Any:
        with self._load_lock:
            if self._model is None:
                from engine.model.loader import load_model

                self._model = load_model()
                self._tokenizer = self._model.tokenizer
            return self._model

    @property
    def tokenizer(self) -> Any:
        with self._load_lock:
            if self._tokenizer is None:
                from engine.model.loader import load_tokenizer

                self._tokenizer = load_tokenizer()
            return self._tokenizer

    @property
    def embedder(self) -> Any:
        with self._load_lock:
            if self._embedder is None:
                from engine.semantic.cache import Embedder

                self._embedder = Embedder()
            return self._embedder

    @property
    def loaded_model(self) -> Any:
        """The model if one is loaded already (None otherwise); never loads."""
        return self._model

    @property
    def loaded_embedder(self) -> Any:
        return self._embedder

    # ------------------------------------------------------------------ engines
    def _bus(self) -> EventBus:
        bus = EventBus()
        # Subscribing also makes the bus active, so eviction events get the seq a later
        # `evicted` miss names, even headless.
        bus.subscribe(lambda event: self.events.append(event))
        return bus

    def bus(self) -> EventBus:
        """A recorded bus for an engine that is not a prefix cache (the semantic cache), announced."""
        bus = self._bus()
        if self.on_engine is not None:
            self.on_engine(DemoEngine(bus, 16, 0))
        return bus

    def runner(self, num_blocks: int = 256, block_size: int = 16) -> Any:
        """A fresh `ModelRunner` on the shared model, its events recorded and announced."""
        from engine.model.runner import ModelRunner

        bus = self._bus()
        runner = ModelRunner(self.model, num_blocks=num_blocks, block_size=block_size, seed=SEED, events=bus)
        warm_up(runner)
        self.engines.append({"kind": "runner", "num_blocks": num_blocks, "block_size": block_size,
                             "model": self.model.name})
        if self.on_engine is not None:
            self.on_engine(DemoEngine(bus, block_size, num_blocks, runner))
        return runner

    def manager(self, num_blocks: int = 256, block_size: int = 16) -> PrefixCacheManager:
        """A fresh model-less prefix-cache manager (token ids only), recorded and announced."""
        from engine.core.hashing import BlockHasher

        bus = self._bus()
        manager = PrefixCacheManager(num_blocks, block_size, BlockHasher(seed=SEED), bus)
        self.engines.append({"kind": "manager", "num_blocks": num_blocks, "block_size": block_size, "model": None})
        if self.on_engine is not None:
            self.on_engine(DemoEngine(bus, block_size, num_blocks))
        return manager

    # ------------------------------------------------------------------ recording
    def step(self, action: str, **data: Any) -> dict[str, Any]:
        row = {"step": len(self.steps) + 1, "action": action, **data}
        self.steps.append(row)
        return row

    def generate(self, runner: Any, request_id: str, prompt: list[int], action: str, *,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, salt: str | None = None,
                 **extra: Any) -> dict[str, Any]:
        """Serve one request greedily on `runner` and record it as a step (its row is returned)."""
        res = runner.generate(prompt, max_new_tokens=max_new_tokens, salt=salt, request_id=request_id)
        row = request_row(res, runner.block_size, salt)
        self.outputs[request_id] = list(res.output_token_ids)
        self.timings.append({"request_id": request_id, "ttft_ms": row["ttft_ms"], "cold_ttft_ms": None})
        return self.step(action, **row, **extra)

    def run(self, demo: Demo) -> dict[str, Any]:
        """Run `demo` from a clean record and assemble its JSON-ready result."""
        self.steps, self.events, self.timings, self.engines, self.outputs, self.shown = [], [], [], [], {}, {}
        started = time.perf_counter()
        findings = demo.script(self)
        return {
            "name": demo.name, "title": demo.title, "summary": demo.summary, "explanation": demo.explanation,
            "model": self._model.name if ("model" in demo.needs and self._model is not None) else None,
            "steps": self.steps, "findings": findings, "engines": self.engines,
            "events": dict(Counter(e.kind for e in self.events)), "timings": self.timings,
            "elapsed_s": round(time.perf_counter() - started, 3),
        }


def warm_up(runner: Any) -> None:
    """One untimed request that leaves the pool and the event log untouched (no cache)."""
    vocab = max(2, int(getattr(runner.tokenizer, "vocab_size", 0) or 1000))
    prompt = [(7 * i + 11) % vocab for i in range(WARMUP_TOKENS)]
    runner.generate(prompt, max_new_tokens=2, use_cache=False)


def request_row(res: Any, block_size: int, salt: str | None = None) -> dict[str, Any]:
    """The numbers of one `GenerationResult` that the demos report: the served request's
    row under the demos' names, plus who evicted a missed block and the other salt."""
    served = ServedRequest.from_result(0, res, salt)
    miss = res.miss
    return {
        "request_id": served.id, "salt": salt, "prompt_tokens": served.prompt_tokens,
        "cached_tokens": served.cached_tokens, "computed_tokens": served.computed_tokens,
        "hit_blocks": served.cached_tokens // block_size, "miss_reason": served.miss_reason,
        "first_miss_block": served.first_miss_block, "divergence_token": served.divergence_token,
        "evicted_by_seq": miss.evicted_by_seq if miss is not None else None,
        "other_salt": miss.other_salt if miss is not None else None,
        "ttft_ms": round(res.ttft_ms, 2), "output_text": served.output_text,
    }


def token_diff(tokenizer: Any, a: list[int], b: list[int], salt_a: str | None = None, salt_b: str | None = None,
               block_size: int = 16) -> dict[str, Any]:
    """`engine.analysis.diff` of two token sequences, reduced to what the demos report."""
    from engine.analysis.diff import DiffRequest, diff_requests

    d = diff_requests(tokenizer, DiffRequest(tuple(a), salt_a), DiffRequest(tuple(b), salt_b), block_size)
    return {"first_divergent_token": d.first_divergent_token, "matching_blocks": d.matching_blocks,
            "cause": d.cause, "explanation": d.explanation, "a_text": d.a["text"], "b_text": d.b["text"]}


