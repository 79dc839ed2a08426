"""`engine.core.live_log.warm_up` loads the live log's compiled pass off the GUI thread.

Without it the first batch a window appends (its first chat message) loads numba and the
compiled series pass on the GUI thread: 1.4-1.7 s measured on this machine, against
16-40 ms once warmed. The model's load job calls it on the worker.
"""

from __future__ import annotations

import pytest

from app.runtime import jobs
from engine.core import columnar_log
from engine.core.live_log import warm_up


def test_warm_up_compiles_the_series_pass_a_live_log_runs():
    loop = columnar_log._compiled_series_loop()
    if loop is None:
        pytest.skip("numba is not installed")
    warm_up()
    assert loop.signatures, "the compiled series pass was not run"


def test_the_model_load_job_warms_the_live_log_after_building_the_runner(monkeypatch):
    import engine.core.live_log as live_log
    import engine.model.loader as loader
    import engine.model.runner as runner

    calls: list[str] = []
    monkeypatch.setattr(loader, "load_model", lambda model, progress=None: calls.append("load") or "model")
    monkeypatch.setattr(runner, "ModelRunner", lambda *a, **k: calls.append("runner") or "runner")
    monkeypatch.setattr(live_log, "warm_up", lambda: calls.append("warm_up"))
    steps: list[str] = []
    assert jobs.load_model_job(None, 8, 4, lambda text, fraction: steps.append(text)) == "runner"
    assert calls == ["load", "runner", "warm_up"]
    assert steps[-1] == "readying the event log"
