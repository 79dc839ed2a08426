"""What the window keeps of an opened trace beside the log (issue 20, H6): the metrics view
keeps each plotted request's reused and computed tokens only (its own and the running hit
rate made from them when read); and the window draws the same with the log's `a` kept per
event as with the old layout (a byte a row)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from app.runtime.context import make_test_context
from engine.core import columnar
from tests._traces import trace_head
from tests._views import metrics_view_on_replay

NUM_REQUESTS = 2000
NUM_BLOCKS = 2000


def _arrays_of(view, n: int) -> dict[str, int]:
    """The view's own attributes that are an array of one value per plotted request."""
    return {name: value.nbytes for name, value in vars(view).items() if isinstance(value, np.ndarray) and len(value) == n}


def test_the_metrics_view_keeps_two_values_a_request(qtbot, tmp_path):
    from app.views.pool.metrics_view import _cumulative_rate

    path = trace_head(tmp_path, NUM_REQUESTS)
    ctx = make_test_context(tmp_path / "ctx")
    try:
        view = metrics_view_on_replay(ctx, qtbot, path, NUM_BLOCKS)
        _, cached, computed = ctx.state.projection.request_columns()
        n = len(cached)
        assert n > 1000
        # the old view kept four floats a request (the tokens, each one's rate, the running rate)
        assert _arrays_of(view, n) == {"cached_tokens": 8 * n, "computed_tokens": 8 * n}
        assert np.array_equal(view.cached_tokens, cached) and np.array_equal(view.computed_tokens, computed)
        rate = _cumulative_rate(cached, computed)
        assert np.array_equal(view.hit_rates, rate)
        x, y = view.c_rate.getOriginalDataset()
        assert np.array_equal(y, 100 * rate) and np.array_equal(x, np.arange(1, n + 1))
        dots_x, dots_y = view.s_rate.getData()
        at = dots_x.astype(int) - 1
        total = cached[at] + computed[at]
        assert len(at) and np.array_equal(dots_y, 100 * np.divide(cached[at], total, out=np.zeros(len(at)),
                                                                  where=total > 0))
        ctx.state.scrub_to(int(ctx.state.log.last_seq) // 2)  # fewer requests: the same two a request
        view.refresh()
        m = len(view.cached_tokens)
        assert 0 < m < n and _arrays_of(view, m) == {"cached_tokens": 8 * m, "computed_tokens": 8 * m}
    finally:
        ctx.shutdown()


def _drawn(w) -> list:
    """What the window's views draw, item by item in a fixed order: every pyqtgraph item's
    data (curves, bars, scatters, images) and every label's text; for the block table, the
    colour of each block and, apart, its image with the grid it was laid out in. (A grab of
    the whole window is no measure: a second window in one process lays its docks out a
    pixel apart, and the block table's grid follows its size.)"""
    import pyqtgraph as pg
    from PySide6.QtWidgets import QLabel

    from app.views.pool.block_table_view import BlockTableView

    out: list = []
    for label in w.findChildren(QLabel):
        if label.isVisible():
            out.append(("label", label.objectName(), label.text()))
    for view in w.findChildren(pg.GraphicsView):
        for item in view.scene().items():
            if isinstance(item, pg.PlotCurveItem):
                x, y = item.getData()
                out.append(("curve", None if x is None else np.asarray(x).tolist(), None if y is None else np.asarray(y).tolist()))
            elif isinstance(item, pg.ScatterPlotItem):
                x, y = item.getData()
                out.append(("dots", np.asarray(x).tolist(), np.asarray(y).tolist()))
            elif isinstance(item, pg.BarGraphItem):
                out.append(("bars", *(np.asarray(item.opts.get(k) if item.opts.get(k) is not None else []).tolist()
                                      for k in ("x", "height", "y0"))))
            elif isinstance(item, pg.ImageItem) and item.image is not None:
                table = view.parent()
                if isinstance(table, BlockTableView):
                    out.append(("cells", table.cell_colors.tobytes()))
                    out.append(("image", (table.cols, table.rows, table.cell_px), item.image.tobytes()))
                else:
                    out.append(("image", None, item.image.tobytes()))
    return out


def _alike(a: list, b: list) -> bool:
    """Two windows' `_drawn` the same, but an image laid out in another grid (the window's
    docks a pixel apart) is not compared: its blocks' colours are."""
    return len(a) == len(b) and all(x == y or (x[0] == y[0] == "image" and x[1] != y[1] and x[1] is not None)
                                    for x, y in zip(a, b))


def _waiting(w) -> bool:
    """True while a block table has a redraw ahead: the end of its live evictions' red flash
    (`FLASH_SECONDS`, longer than one quiet spell of `_settle`: a flash that began just
    before one could be drawn in two pictures alike) or the end of a frame."""
    from app.views.pool.block_table_view import BlockTableView

    return any(v._flash_timer.isActive() or v._frame_timer.isActive() for v in w.findChildren(BlockTableView))


def _settle(app, w) -> list:
    """Events handled until what the window draws holds still (the views' throttled redraws,
    the block table's flash and the status bar's timer run): what it then draws."""
    drawn, deadline = None, time.monotonic() + 30
    while time.monotonic() < deadline:
        end = time.monotonic() + 0.4
        while time.monotonic() < end or _waiting(w):
            app.processEvents()
            time.sleep(0.005)
        now = _drawn(w)
        if now == drawn:
            return now
        drawn = now
    raise AssertionError("the window kept drawing something new for 30 s")


def _open_and_draw(app, tmp_path, path, name: str):
    from app.window.main_window import MainWindow

    ctx = make_test_context(tmp_path / name)
    w = MainWindow(ctx, load_model=False)
    try:
        w.resize(1280, 800)
        w.show()
        app.processEvents()
        getattr(w, "finish_startup", lambda: None)()
        app.processEvents()
        done: list = []
        w.open_file(path, on_done=done.append)
        deadline = time.monotonic() + 120
        while not done and time.monotonic() < deadline:
            app.processEvents()
            time.sleep(0.002)
        assert done and done[0] is not None
        drawn = [_settle(app, w)]
        state = ctx.state
        for frac in (0.1, 0.55):  # scrubs: the pool, the block table and the cursors there
            state.scrub_to(int(state.log.last_seq * frac))
            drawn.append(_settle(app, w))
        return drawn, state.log.columnar
    finally:
        ctx.shutdown()
        w.close()
        w.deleteLater()
        app.processEvents()


@pytest.mark.timeout(300)
def test_the_window_draws_the_same_with_a_kept_per_event(qapp, tmp_path, monkeypatch):
    path = trace_head(tmp_path, 1500)
    new, log = _open_and_draw(qapp, tmp_path, path, "new")
    assert "a" in log._per_event
    monkeypatch.setattr(columnar, "PER_EVENT_WHEN_ALIKE", ())
    old, log = _open_and_draw(qapp, tmp_path, path, "old")
    assert "a" not in log._per_event and "a" in log._sparse_base
    for a, b in zip(new, old):
        assert len(a) > 20 and sum(kind == "cells" for kind, *_ in a) >= 1
        assert _alike(a, b), [(x[0], x[1] if x[0] != "cells" else "", y[1] if y[0] != "cells" else "")
                              for x, y in zip(a, b) if x != y][:3]
