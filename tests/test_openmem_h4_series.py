"""A finished log keeps its per-event counts as their `Changes` or `Steps` where smaller.

The Mooncake trace's blocks in use change at 32,349 of its 481,145 events and its top ref
count at 24,062: kept whole they were 1.44 MB of the open's memory (8.4 B per distinct
block), kept as their changes 0.31 MB; its cached free blocks change at 43% of the events,
by more than 127 at 0.06%: 0.96 MB whole, 0.48 MB as one-byte steps. They are made whole
when read, equal to the reference series, and the timeline draws and zooms the same
curves from them.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.runtime.replays import kernel_replay_job
from engine.core.columnar_log import Changes, EventSeries, Steps, kept_form
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
    assert isinstance(kept["cached_free"], Steps)  # it changes at 43% of the events, by little
    whole = sum(getattr(s, name).nbytes for name in COUNTS)
    assert sum(k.nbytes for k in kept.values()) < 0.35 * whole
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


_RNG = np.random.default_rng(0)
_WALK = np.cumsum(_RNG.integers(-3, 4, 5000)).astype(np.int16)
_JUMPS = _WALK.copy()
_JUMPS[[10, 11, 2000, 4999]] = [30000, -30000, 500, -129]  # steps past a byte, either way


@pytest.mark.parametrize("series,kind", [
    (_WALK, Steps), (_JUMPS, Steps), (_WALK.astype(np.int32) * 1000 + 2**30, np.ndarray),
    (np.cumsum(_RNG.integers(-100, 101, 4000)).astype(np.int32) - 2**30, Steps),
    (_WALK.astype(np.int8), np.ndarray),  # a byte a value already
    (np.repeat(np.array([4, 9], np.int16), 3000), Changes), (np.zeros(1, np.int16), np.ndarray)])
def test_a_series_kept_in_its_smallest_form_reads_back_the_same(series, kind):
    kept = kept_form(series)
    assert type(kept) is kind
    for got in ((kept, kept.copy()) if kind is not np.ndarray else (kept,)):
        whole = got if kind is np.ndarray else got.whole()
        assert whole.dtype == series.dtype and np.array_equal(whole, series)


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
