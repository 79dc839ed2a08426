"""Guided demos: one scripted, bundled scenario per cache behaviour, headless and offline.

The registry and `run_demo` live here; the shared environment (one loaded model, engines
wired to the caller's views) in `engine.demos.env`; the scenarios in the sibling modules.
The app runs the same demos on its worker thread (`app.demos.runner`).
"""

from __future__ import annotations

from typing import Any

from engine.demos import answers, cacheblend, memory, perf, prefix, prompts, quantized
from engine.demos.env import Demo, DemoEnv
from engine.core.errors import InputError

DEMOS: tuple[Demo, ...] = (
    memory.KV_GROWS_PER_STEP,
    prefix.MULTI_TURN_REUSE,
    prefix.EDIT_INVALIDATES,
    prefix.TIMESTAMP_AT_FRONT,
    prefix.PARTIAL_BLOCK,
    prefix.TENANT_SALT,
    prefix.EVICTION_UNDER_PRESSURE,
    prefix.REORDERED_RAG_CHUNKS,
    memory.KV_MEMORY_70B_128K,
    answers.SEMANTIC_FALSE_POSITIVE,
    answers.PROMPT_CACHING_BILL,
    answers.DEFAULT_SYSTEM_PROMPT_DIFF,
    quantized.QUANTIZED_KV_CACHE,
    perf.PREFIX_SAVES_PREFILL_ONLY,
    perf.HASHING_COSTS_SOMETHING,
    perf.DEEPCOPY_VS_SHARED,
    prompts.TOOL_ORDER,
    prompts.AB_SETTING,
    prompts.COMPACTION,
    prompts.BREAKPOINT_ON_USER_MESSAGE,
    cacheblend.CACHEBLEND_RAG,
)
DEMO_NAMES: tuple[str, ...] = tuple(d.name for d in DEMOS)

__all__ = ["DEMOS", "DEMO_NAMES", "Demo", "DemoEnv", "get_demo", "list_demos", "run_demo"]


def get_demo(name: str) -> Demo:
    """The demo called `name`; an unknown name raises InputError listing the known ones."""
    for demo in DEMOS:
        if demo.name == name:
            return demo
    raise InputError(f"there is no demo called {name!r}; run 'cachescope demo --list' to see the "
                     f"{len(DEMOS)} demos")


def list_demos() -> list[dict[str, Any]]:
    """Name, title, one-line summary and the models each demo needs, in menu order."""
    return [{"name": d.name, "title": d.title, "summary": d.summary, "needs": sorted(d.needs)} for d in DEMOS]


def run_demo(name: str, env: DemoEnv | None = None) -> dict[str, Any]:
    """Run one demo and return its JSON-ready result.

    The result holds `name`, `title`, `explanation`, `steps`, `findings`, plus `events`
    (how many of each kind the demo's engines emitted) and `timings` (time to first
    token of model requests). Pass one `env` to several calls to load the models once.
    """
    demo = get_demo(name)
    env = env if env is not None else DemoEnv()
    return env.run(demo)
