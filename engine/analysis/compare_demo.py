"""Demo sides of a comparison: `demo:NAME` (every request a demo served) and
`demo:NAME:PART` (one part of it, such as the timestamp demo's front and end), read from
the demo's JSON result, each with the log of the engine that served it.

The demos themselves live in `engine.demos`, a layer above this one: the app hands
`DemoRuns` a function that runs one (`app.views.compare.demo_sides`).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Sequence

from engine.analysis.compare import PreparedSide, Run, SideOptions, end_seqs, new_log
from engine.core.errors import InputError
from engine.core.projection import EventLog
from engine.core.served import ServedRequest

_ROW_KEYS = ("request_id", "prompt_tokens", "cached_tokens")


def _is_row(x: Any) -> bool:
    return isinstance(x, dict) and all(k in x for k in _ROW_KEYS) and isinstance(x["prompt_tokens"], int)


def demo_parts(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The served requests of a demo result, whole ("" key) and by part: a findings entry
    that is a list of request rows, or holds one under "requests" (the timestamp demo's
    front and end, the A/B demo's one_value and ab_test), else the steps grouped by their
    request id without its trailing number (retrieved-1, retrieved-2: "retrieved")."""
    steps = [s for s in result.get("steps", []) if _is_row(s)]
    parts: dict[str, list[dict[str, Any]]] = {}
    for key, value in (result.get("findings") or {}).items():
        rows = value.get("requests") if isinstance(value, dict) else value
        if isinstance(rows, list) and rows and all(_is_row(r) for r in rows):
            parts[str(key)] = rows
    if not parts:
        for s in steps:
            stem = re.sub(r"-\d+$", "", str(s["request_id"]))
            parts.setdefault(stem, []).append(s)
    whole = steps if steps else [r for rows in parts.values() for r in rows]
    return {"": whole, **parts}


class DemoRuns:
    """Runs demos for compare sides, each demo once however many sides name it, and keeps
    a log of every engine a demo builds. `run_demo(name, on_engine)` is the app's way to run
    one (`engine.demos.run_demo` with a `DemoEnv(on_engine=...)`, which this layer below
    the demos cannot import); it raises InputError for an unknown name."""

    def __init__(self, run_demo: Callable[[str, Callable[[Any], None]], dict[str, Any]],
                 names: Sequence[str] | None = None) -> None:
        self._run_demo = run_demo
        self.names = tuple(names) if names is not None else None
        self._done: dict[str, tuple[dict[str, Any], list[tuple[Any, EventLog]]]] = {}
        self._prompts: dict[str, dict[str, tuple[int, ...]]] = {}  # per demo: request id -> prompt token ids

    def check(self, name: str) -> None:
        """Refuse an unknown demo before any demo runs (a demo can take a minute)."""
        if self.names is not None and name not in self.names:
            raise InputError(f"there is no demo called {name!r}; run 'cachescope demo --list' to see the "
                             f"{len(self.names)} demos")

    def result(self, name: str) -> tuple[dict[str, Any], list[tuple[Any, EventLog]]]:
        if name not in self._done:
            engines: list[tuple[Any, EventLog]] = []
            prompts = self._prompts.setdefault(name, {})

            def on_engine(engine: Any) -> None:
                if getattr(engine, "num_blocks", 0) > 0:  # a prefix cache, not the semantic cache's bus
                    log = new_log(engine.num_blocks, engine.block_size)
                    engine.bus.subscribe(log.append)
                    engines.append((engine, log))
                if getattr(engine, "runner", None) is not None:
                    _record_prompts(engine.runner, prompts)

            self._done[name] = (self._run_demo(name, on_engine), engines)
        return self._done[name]

    def side(self, name: str, part: str | None, opts: SideOptions) -> PreparedSide:
        result, engines = self.result(name)
        parts = demo_parts(result)
        label = f"demo:{name}" + (f":{part}" if part else "")
        if part is not None and part not in parts:
            known = ", ".join(p for p in parts if p) or "none"
            raise InputError(f"the demo {name!r} has no part {part!r} (its parts: {known})")
        rows = parts[part or ""][:opts.limit] if opts.limit else parts[part or ""]
        if not rows:
            raise InputError(f"{label}: the demo serves no request to compare")
        served = [ServedRequest(i, str(r["request_id"]), r.get("salt"), r["prompt_tokens"], r["cached_tokens"],
                                r.get("computed_tokens", r["prompt_tokens"] - r["cached_tokens"]), 0,
                                r.get("miss_reason"), r.get("first_miss_block"), r.get("divergence_token"))
                  for i, r in enumerate(rows)]
        engine, log, seqs = _engine_of(engines, [r.id for r in served], part)
        config = {"source": label, "kind": "demo", "demo": name, "part": part, "model": result.get("model"),
                  "block_size": engine.block_size if engine is not None else None,
                  "capacity_blocks": engine.num_blocks if engine is not None else None}
        stored = evicted = None
        if log is not None:
            stored, evicted = log.live.counters.num_stored_blocks, log.live.counters.num_evicted_blocks
        prompts = self._prompts.get(name, {})
        billing = None
        if all(r.id in prompts for r in served):
            billing = functools.partial(_billing_of_prompts, tuple((r.id, r.tenant, prompts[r.id]) for r in served))
        run = Run(label, "demo", config, served, stored, evicted, log=log, end_seqs=seqs,
                  no_log_reason=None if log is not None else "the demo's engine kept no pool", billing=billing)
        return PreparedSide(label, "demo", opts, recorded=run)


def _record_prompts(runner: Any, prompts: dict[str, tuple[int, ...]]) -> None:
    """Keep the prompt of every request `runner` serves through its cache, by request id:
    a demo's result reports counts, not prompts, and a hosted bill needs the prompts. The
    runner is the demo's own, fresh for this run; its `generate` is wrapped, not changed."""
    generate = runner.generate

    @functools.wraps(generate)
    def recording(prompt_token_ids: Sequence[int], *args: Any, **kwargs: Any) -> Any:
        rid = kwargs.get("request_id")
        if rid is not None and kwargs.get("use_cache", True):
            prompts[str(rid)] = tuple(int(t) for t in prompt_token_ids)
        return generate(prompt_token_ids, *args, **kwargs)

    runner.generate = recording


def _billing_of_prompts(requests: Sequence[tuple[str, str | None, tuple[int, ...]]]) -> list[Any]:
    """Hosted-API requests of prompts served in order, as `cachescope billing` makes them from
    a token-level trace of the same prompts."""
    from engine.analysis.billing import requests_from_trace
    from engine.core.trace import TraceRequest

    return requests_from_trace([TraceRequest(i, i + 1, rid, tenant, tokens, None, None, len(tokens), 0)
                                for i, (rid, tenant, tokens) in enumerate(requests)])


def _engine_of(engines: list[tuple[Any, EventLog]], ids: list[str],
               part: str | None) -> tuple[Any, EventLog | None, dict[str, int]]:
    """The engine whose log served most of `ids`, with the end seq of each id. A demo may
    name a request "PART/id" in its engine (the A/B demo runs each part on its own)."""
    best: tuple[Any, EventLog | None, dict[str, int]] = (None, None, {})
    best_score = (0, 0)
    for engine, log in engines:
        ends = end_seqs(log)
        seqs, exact = {}, 0
        for rid in ids:
            for key in ((rid, f"{part}/{rid}") if part else (rid,)):
                if key in ends:
                    seqs[rid], exact = ends[key], exact + 1
                    break
        if not seqs and part is None:  # "arm/id" under any one arm
            tails = {k.rsplit("/", 1)[-1]: v for k, v in ends.items()}
            if len(tails) == len(ends):
                seqs = {rid: tails[rid] for rid in ids if rid in tails}
        score = (exact, len(seqs))
        if score > best_score:
            best, best_score = (engine, log, seqs), score
    return best
