"""A finished log keeps the counts most events leave unchanged as their changes (`Changes`).

The Mooncake trace's blocks in use change at 32,349 of its 481,145 events and its top ref
count at 24,062: kept whole they were 1.44 MB of the open's memory (8.4 B per distinct
block), kept as their changes 0.31 MB. They are made whole when read, equal to the
reference series, and the timeline draws and zooms the same curves from them.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.runtime.replays import kernel_replay_job
from engine.core.columnar_log import Changes, EventSeries
from engine.resources import RESOURCES

MOONCAKE = RESOURCES / "traces" / "mooncake_conversation_trace.jsonl"
COUNTS = ("in_use", "cached_free", "max_ref")


def _slice(tmp_path, lines: int):
    out = tmp_path / "mooncake.jsonl"
    with MOONCAKE.open("rb") as src:
        out.write_bytes(b"".join(line for _, line in zip(range(lines), src)))
    return out


def _kept(series, name: str):
    return getattr(EventSeries, name).__get__(series)  # the slot, as the log keeps it


def test_the_counts_are_kept_as_their_changes_and_read_as_the_reference_series():
    _, log = kernel_replay_job(str(MOONCAKE), 512, None)
    s = log.series
    ref = log._compute_series()  # the numpy pass over the rows, the reference
    for name in COUNTS:
        got = getattr(s, name)
        assert isinstance(got, np.ndarray) and len(got) == len(log)
        assert np.array_equal(got, getattr(ref, name)), name
    kept = {name: _kept(s, name) for name in COUNTS}
    assert isinstance(kept["in_use"], Changes) and isinstance(kept["max_ref"], Changes)
    whole = sum(getattr(s, name).nbytes for name in COUNTS)
    # in use and the top ref count as their changes; cached free changes at 43% of the
    # events, so it stays whole (its changes would take more)
    assert sum(k.nbytes for k in kept.values()) < 0.6 * whole
    assert isinstance(kept["cached_free"], np.ndarray)
    assert np.array_equal(s.empty, log.columnar.num_blocks - ref.in_use - ref.cached_free)
    # settled (the worker's last step) they are still equal
    log.settle()
    for name in COUNTS:
        assert np.array_equal(getattr(log.series, name), getattr(ref, name)), name


@pytest.mark.parametrize("series", [np.zeros(0, np.int16), np.arange(50, dtype=np.int16),
                                    np.array([3, 3, 3, 1, 1, 7, 7, 7, 7, 7, 7, 7, 7], np.int8),
                                    np.repeat(np.array([0, 5, 2, 9], np.int16), [1000, 3, 500, 2000])])
def test_changes_give_back_the_series_they_were_made_of(series):
    kept = Changes.of(series)
    whole = kept.whole() if isinstance(kept, Changes) else kept
    assert whole.dtype == series.dtype and np.array_equal(whole, series)
    assert isinstance(kept, Changes) == (len(series) == 3503)  # only the long runs are worth it
    if isinstance(kept, Changes):
        again = kept.copy()
        assert again.at is not kept.at and np.array_equal(again.whole(), series)


pytest.importorskip("pytestqt")

from app.ui.plots import peak_reduce  # noqa: E402
from app.views.pool.timeline_view import TimelineView  # noqa: E402
from tests.test_engine_views import ctx  # noqa: E402,F401


def test_the_timeline_draws_and_zooms_a_finished_logs_curves_from_them(ctx, qtbot, tmp_path):  # noqa: F811
    _, log = kernel_replay_job(str(_slice(tmp_path, 3000)), 512, 400)
    ctx.state.adopt_log(log)
    view = TimelineView(ctx)
    qtbot.addWidget(view)
    view.resize(900, 500)
    view.show()
    view.refresh(force=True)
    qtbot.wait(50)
    ref = log._compute_series()
    x = np.asarray(log.seqs)
    assert isinstance(_kept(log.series, "in_use"), Changes)
    mid = int(x[len(x) // 2])
    for lo, hi in ((float(x[0]), float(x[-1])), (mid - 300.0, mid + 300.0)):
        view._set_curves(lo, hi)  # what a zoom to [lo, hi] draws
        for curve, values in ((view.c_used, ref.in_use), (view.c_cached, ref.in_use + ref.cached_free),
                              (view.c_ref, ref.max_ref)):
            xs, ys = (a.astype(float) for a in peak_reduce(x, values, lo, hi))
            got_x, got_y = curve.getData()
            assert np.array_equal(got_x, xs) and np.array_equal(got_y, ys)
