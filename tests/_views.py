"""A metrics view shown on a test context that has adopted a kernel replay of a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.runtime.jobs import trace_block_size
from app.runtime.replays import kernel_replay_job


def metrics_view_on_replay(ctx: Any, qtbot: Any, path: Path, num_blocks: int) -> Any:
    """A 900x600 `MetricsView` of `ctx`, shown, after `ctx.state` adopted the kernel's replay
    of `path` in a pool of `num_blocks` blocks (what an opened trace gives the view)."""
    from app.views.pool.metrics_view import MetricsView

    view = MetricsView(ctx)
    qtbot.addWidget(view)
    view.resize(900, 600)
    view.show()
    bs = trace_block_size(path)
    _, log = kernel_replay_job(str(path), bs, num_blocks)
    ctx.state.set_engine({"block_size": bs, "num_blocks": num_blocks})
    ctx.state.adopt_log(log)
    return view
