"""Demo sides of a comparison (`demo:NAME[:PART]`): the demos run exactly as `cachescope
demo NAME` runs them, through `engine.demos`, which `engine.analysis.compare` (a layer
below the demos) cannot import. No Qt here: the command uses it too."""

from __future__ import annotations

from typing import Any, Callable

from engine.analysis.compare_demo import DemoRuns


def demo_runs(model: Any = None) -> DemoRuns:
    """A `DemoRuns` over the bundled demos; `model` (a loaded model) spares a second load."""
    from engine.demos import DEMO_NAMES

    def run(name: str, on_engine: Callable[[Any], None]) -> dict[str, Any]:
        from engine.demos import run_demo
        from engine.demos.env import DemoEnv

        return run_demo(name, DemoEnv(model=model, on_engine=on_engine))

    return DemoRuns(run, DEMO_NAMES)
