"""Statistics of a live columnar log from its columns (`compute_columnar` on a
`LiveColumnarLog.snapshot()`), held equal to `compute`, the reference, over the same events'
dicts: an attached server's journal-fed log (recorded vLLM 0.33 and SGLang 0.5.23 frames,
synthetic streams with copies, clears and restarts), a snapshot read while the log goes on
growing, a local engine's live log, and the Statistics pane on an attach, which no longer
builds an event per row to count them (93,079 events: 9.3 s, 0.17 s from the columns)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.analysis.statistics import compute
from engine.analysis.statistics_columnar import compute_columnar
from tests.test_live_journal import _fixtures, _journal_fed
from tests.test_statistics import same


def _both(log, keep=None):
    """(columnar over a snapshot, reference over the kept events' dicts)."""
    snap = log.snapshot()
    dicts = [e.to_dict() for e in log.events]
    kept = dicts if keep is None else [d for d, k in zip(dicts, keep) if k]
    return compute_columnar(snap, keep, block_size=16), compute(kept, block_size=16)


@pytest.mark.parametrize("name", sorted(_fixtures()))
def test_an_attached_servers_statistics_from_its_columns_are_the_references(name):
    log = _journal_fed(_fixtures()[name], per_tick=8)
    if not len(log):
        pytest.skip("the fixture's frames carry no block event")
    got, want = _both(log)
    same(got, want)
    keep = np.random.default_rng(3).random(len(log)) < 0.5
    same(*_both(log, keep))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streams_with_copies_clears_and_restarts_count_as_the_reference_does(seed):
    from tests.test_colpool import _synthetic

    log = _journal_fed(_synthetic(220, seed), reset_every=37, per_tick=7)
    got, want = _both(log)
    same(got, want)
    # what the comparison covers: blocks stored again (reuse) and blocks that lived and left
    assert len(want.reuse_distance.values) and len(want.lifetime.values)
    assert want.lifetime.unit == "seconds" and got.num_events == len(log)
    keep = np.zeros(len(log), bool)
    keep[len(log) // 4:3 * len(log) // 4] = True  # a range of the middle half
    same(*_both(log, keep))


def test_a_journals_hash_ids_are_counted_as_the_hashes_they_stand_for():
    """A journal-fed log numbers a hash again each time it is stored anew: counted by id,
    a block stored again would be a first access and its removal would end no store; the
    statistics read the ids as their hashes (`JournalKeys.identities`)."""
    from tests.test_colpool import _synthetic

    log = _journal_fed(_synthetic(220, 0), per_tick=7)
    col = log.columnar
    ids = np.asarray(col.values_at("hash", np.arange(col.num_rows)), np.int64)
    ids = ids[ids >= 0]
    assert len(np.unique(ids)) > len(np.unique(col.keys.identities(ids)))  # a hash under several ids
    got, want = _both(log)
    same(got, want)
    assert len(want.reuse_distance.values) and len(want.lifetime.values)


def test_a_snapshot_counts_the_events_it_was_taken_with_while_the_log_grows():
    from engine.core.live_journal import append_journal
    from engine.remote import fastwire
    from engine.remote.colpool import ColumnarPool
    from tests.test_colpool import _synthetic

    frames = _synthetic(200, 1)
    log = _journal_fed(frames[:120], per_tick=5)
    snap = log.snapshot()
    before = [e.to_dict() for e in log.events]
    pool = ColumnarPool("later", journal=True)  # another server's rows appended after it
    for seq, payload in frames[120:]:
        pool.apply(fastwire.decode_columns(seq, payload))
        append_journal(log, pool.take_journal(), pool, "later")
    assert len(log) > len(before)
    same(compute_columnar(snap, block_size=16), compute(before, block_size=16))


def test_a_local_engines_live_log_counts_as_its_events():
    from engine.core.live_log import LiveColumnarLog
    from tests.test_statistics import replayed_events

    events, bs, capacity = replayed_events("twin_tenants")
    log = LiveColumnarLog(capacity, bs)
    for at in range(0, len(events), 97):  # a batch at a time, as the app's ticks append
        log.extend(events[at:at + 97])
    dicts = [e.to_dict() for e in events]
    same(compute_columnar(log.snapshot(), block_size=bs), compute(dicts, block_size=bs))


def test_the_statistics_pane_counts_an_attach_from_its_columns(qtbot, tmp_path, monkeypatch):
    """The pane on an attach's journal-fed log (synthetic vLLM frames with copies, placed and
    written as the window's ticks do) gives the reference's statistics without one event built per
    row for it (the reference's job, which takes the events, is not run)."""
    pytest.importorskip("pytestqt")
    from app.runtime.context import make_test_context
    from app.views.tools import statistics_view
    from tests.test_colpool import _synthetic
    from tests.test_live_journal import feed_state

    def no_events(*_args):
        raise AssertionError("a columnar log's statistics were counted from its events")

    monkeypatch.setattr(statistics_view, "_statistics_job", no_events)
    ctx = make_test_context(tmp_path)
    try:
        state = ctx.state
        feed_state(state, _synthetic(220, 2))
        assert state.journal_fed and len(state.log) > 1000
        view = statistics_view.StatisticsView(ctx)
        qtbot.addWidget(view)
        with qtbot.waitSignal(view.sigComputed, timeout=30_000):
            view.refresh()
        want = compute([e.to_dict() for e in state.log.events], block_size=16)
        same(view.stats, want)
        assert view.summary.text().startswith(f"{len(state.log):,} of {len(state.log):,} events")
    finally:
        ctx.shutdown()
