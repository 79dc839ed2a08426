"""The metrics view's per-request hit-rate dots: made for the requests in view and a view's
width either side, not for every request of an opened trace; in view they are each
request's own hit rate, as the request columns give it, wherever the view is moved."""

from __future__ import annotations


import numpy as np

from app.runtime.context import make_test_context
from tests._traces import trace_head
from tests._views import metrics_view_on_replay

NUM_REQUESTS = 2000
NUM_BLOCKS = 2000


def _dots(view) -> dict[int, float]:
    x, y = view.s_rate.getData()
    assert np.all(x == np.round(x))
    return dict(zip(x.astype(int).tolist(), y.tolist()))


def _expected(state) -> np.ndarray:
    _, cached, computed = state.projection.request_columns()
    total = cached + computed
    return 100 * np.where(total > 0, cached / np.maximum(total, 1), 0.0)


def _in_view(view, n: int) -> range:
    (x0, x1), _ = view.p_rate.vb.viewRange()
    return range(max(1, int(np.ceil(x0))), min(n, int(np.floor(x1))) + 1)


def test_dots_cover_the_view_not_every_request(qtbot, tmp_path):
    from app.views.pool.metrics_view import MAX_BARS

    path = trace_head(tmp_path, NUM_REQUESTS)
    ctx = make_test_context(tmp_path / "ctx")
    try:
        view = metrics_view_on_replay(ctx, qtbot, path, NUM_BLOCKS)
        want = _expected(ctx.state)
        n = len(want)
        assert n > 3 * MAX_BARS
        dots = _dots(view)
        # the latest MAX_BARS in view, their dots and as many before: not all n
        assert set(_in_view(view, n)) <= set(dots) and len(dots) <= 3 * MAX_BARS + 2 < n
        assert all(abs(dots[i] - want[i - 1]) < 1e-9 for i in dots)
        # a pan inside what the dots cover sets nothing again; out of it, they are made again
        set_data = view.s_rate.setData
        calls: list = []
        view.s_rate.setData = lambda *a, **k: (calls.append(k), set_data(*a, **k))
        view.p_rate.setXRange(n - 500.5, n - 100.5, padding=0)
        assert not calls
        view.p_rate.setXRange(1.5, 60.5, padding=0)
        assert len(calls) == 1 and len(_dots(view)) < 200 and set(_in_view(view, n)) <= set(_dots(view))
        # panned to the start, zoomed out to all, and to a middle stretch: the dots in view follow
        for lo, hi in ((0.5, 120.5), (0.5, n + 0.5), (n / 2 - 30, n / 2 + 30)):
            view.p_rate.setXRange(lo, hi, padding=0)
            dots = _dots(view)
            shown = _in_view(view, n)
            assert len(shown) and set(shown) <= set(dots), (lo, hi)
            assert all(abs(dots[i] - want[i - 1]) < 1e-9 for i in dots)
    finally:
        ctx.shutdown()
