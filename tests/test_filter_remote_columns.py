"""The shared filter over an attached server's log from its columns (`columnar_mask`), held
equal to the filter over its events (`match_events`, what the worker ran for every filter
of an attach: a Python event per row): every recorded vLLM 0.33 and SGLang 0.5.23 fixture and
synthetic streams with copies, clears and restarts through the journal route, with filters
on every field the columns answer (tier, server, rank, tenant, request, kind, block, model,
session, reason) and their combinations."""

from __future__ import annotations

import numpy as np
import pytest

from app.runtime.selection import columnar_mask, match_events
from engine.analysis.filter_language import parse
from tests.test_live_journal import _fixtures, _journal_fed

SOURCE = "tcp://10.0.0.5:5557"  # `_journal_fed`'s server
TEXTS = ["tier:gpu", "tier:cpu", "tier:storage or tier:remote", "not tier:gpu", "tier!=gpu",
         "kind:stored and tier:cpu", "kind:evicted", "kind:cache_reset", "kind:reset or kind:evicted and tier:gpu",
         f'server:"{SOURCE}"', 'server:"tcp://10.0.0.5"', "server:other", "rank:0", "rank>=1", "rank<0", "rank!=0",
         "block:0", "block>=0", "block<0", "not block:1", "model:x", "session:s", "reason:evicted",
         'request:"tcp"', 'not request:"tcp://10"', "tenant:a", "not tenant:a"]


def _texts(log, events: list) -> list[str]:
    """TEXTS, and a request, a batch's request and the tenants the log's events name."""
    salts = sorted({str(e.salt).lower() for e in events if getattr(e, "salt", None)})
    rids = [e.request_id for e in events if e.kind == "block_stored"]
    extra = [f"tenant:{t}" for t in salts[:3]] + [f"tenant={salts[0]}"] if salts else []
    if rids:
        extra += [f'request:"{rids[len(rids) // 2].lower()}"', f'request="{rids[0].lower()}" or tier:cpu']
    return TEXTS + extra


def _same(log) -> int:
    """Every text's mask from the columns equal to the events', whole and from a few events
    on (what a live log's ticks ask for: the new events only)."""
    hits = 0
    n = len(log)
    events = list(log.events)  # built once for every text
    for text in _texts(log, events):
        flt = parse(text)
        got = columnar_mask(log, flt)
        assert got is not None, text
        want, _ = match_events(events, flt)
        assert got.tolist() == want.tolist(), text
        for start in (1, n // 3, n - 1, n):
            assert columnar_mask(log, flt, start=start).tolist() == want[start:].tolist(), (text, start)
        hits += int(want.any())
    return hits


@pytest.mark.parametrize("name", sorted(_fixtures()))
def test_a_recorded_servers_log_filters_from_its_columns_as_from_its_events(name):
    log = _journal_fed(_fixtures()[name][:240], per_tick=8, source=SOURCE)  # (the late join's 470: 60 s)
    if not len(log):
        pytest.skip("the fixture's frames carry no block event")
    assert not log.columns_answer_filters  # (before: every filter of an attach read the events)
    assert _same(log) >= 6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streams_with_copies_clears_and_restarts_filter_from_their_columns(seed):
    from tests.test_colpool import _synthetic

    log = _journal_fed(_synthetic(220, seed), reset_every=37, per_tick=7, source=SOURCE)
    kinds = {e.kind for e in log.events}
    assert {"block_stored", "block_evicted", "cache_reset"} <= kinds
    assert _same(log) >= 8


def test_the_comparison_can_fail():
    """A server's rows read as a local engine's (tier gpu, block ids) disagree with the events."""
    from tests.test_colpool import _synthetic

    log = _journal_fed(_synthetic(120, 1), per_tick=7, source=SOURCE)
    flt = parse("tier:cpu or block>=0")
    want, _ = match_events(log.events, flt)
    col = log.columnar
    kind, block = col.col("kind"), col.col("block")
    from engine.core.columnar import EVICTED, STORED

    as_local = np.logical_or.reduceat(np.isin(kind, (STORED, EVICTED)) & (block >= 0), np.asarray(log.starts))
    assert as_local.tolist() != want.tolist()
    assert columnar_mask(log, flt).tolist() == want.tolist()


def test_the_shared_filter_follows_an_attach_tick_by_tick_from_the_columns(monkeypatch):
    """The app's shared filter on a journal-fed `PoolState`, set before the rows come: each
    tick's new events matched from the columns (no event matched one by one), the mask
    equal to the events' at every step."""
    pytest.importorskip("pytestqt")
    from app.runtime import selection
    from app.runtime.state import PoolState
    from engine.analysis.filter_language import EventContext
    from tests.test_colpool import _synthetic
    from tests.test_live_journal import feed_state

    match = selection._match  # the reference, over the events

    def one_by_one(*_args):
        raise AssertionError("an attach's events were matched one by one")

    monkeypatch.setattr(selection, "_match", one_by_one)
    state = PoolState()
    shared = selection.EventFilter(state)  # set before the attach: feed_state makes the journal-fed log
    shared.set_filter("tier:cpu or kind:cache_reset")

    def same_after_tick():
        want = match(state.log.events, shared.filter, EventContext({}, {}))
        assert shared.filter_mask().tolist() == want.tolist()

    feed_state(state, _synthetic(160, 2), reset_every=41, source=SOURCE, after_tick=same_after_tick)
    assert shared.filter_mask().any() and len(state.log) > 500


def test_a_tenant_filter_reads_each_tick_once_and_keeps_to_the_whole_logs_answer(monkeypatch):
    """Tenants are learnt for the log once per row and request (`selection._Tenants`): each
    tick's `columnar_mask` from its first new event equals the events' mask over the whole log
    so far, and the stores whose salts are read over all the ticks are each stored row once
    (it read every stored row of the log at every tick: 58 ms a tick at 931K events)."""
    from app.runtime import selection
    from engine.core.columnar import ColumnarLog, STORED
    from tests.test_colpool import _synthetic
    from tests.test_live_journal import feed_state

    pytest.importorskip("pytestqt")
    from app.runtime.state import PoolState

    asked: list[int] = []
    real = ColumnarLog.store_salt_codes

    def counted(self, stores):
        asked.append(len(stores))
        return real(self, stores)

    monkeypatch.setattr(ColumnarLog, "store_salt_codes", counted)
    state = PoolState()
    seen = {"n": 0, "ticks": 0, "hits": 0, "texts": 0}

    def after_tick():
        log = state.log
        n = len(log)
        events = list(log.events)
        salts = sorted({str(e.salt).lower() for e in events if getattr(e, "salt", None)})
        texts = [f"tenant:{t}" for t in salts[:2]] + ["not tenant:a"]
        seen["texts"] = max(seen["texts"], len(texts))
        assert len(texts) == seen["texts"]
        for text in texts:
            flt = parse(text)
            want, _ = match_events(events, flt)
            got = columnar_mask(log, flt, start=seen["n"])
            assert got.tolist() == want[seen["n"]:].tolist(), text
            seen["hits"] += int(got.any())
        seen["n"], seen["ticks"] = n, seen["ticks"] + 1

    feed_state(state, _synthetic(160, 2), reset_every=41, source=SOURCE, after_tick=after_tick)
    col = state.log.columnar
    stored_rows = int(((col.col("kind") == STORED) & (col.info_numbers(slice(0, col.num_rows)) > 0)).sum())
    learnt = selection._learnt(col)
    assert seen["ticks"] > 5 and seen["hits"] > 5 and learnt.rows == col.num_rows
    # each stored row's salt read once to learn its request's tenant, and once per text as its
    # own tick's row (its own salt first): not the whole log's again at every tick
    assert stored_rows > 500 and sum(asked) == (1 + seen["texts"]) * stored_rows
