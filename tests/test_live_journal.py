"""A columnar pool's journal on the live columnar log (engine.core.live_journal) against the
reference: the same frames through `RemotePool`'s events into a `LiveColumnarLog` (itself
held equal to the Python `EventLog` by tests/test_live_log.py). The journal's slots are the
columnar pool's own, so what is compared does not depend on slot numbers: every event
(kind, hash, parent, token ids, tenant, blocks cleared), the counts and series after each
tick, and the held blocks (hash, parent, tokens) live and scrubbed back.
"""

from __future__ import annotations

from collections import Counter

import pytest

from engine.core.live_journal import append_journal, journal_log
from engine.remote import fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.wire import MalformedFrame
from tests.test_live_log import _check_projection, _feed, _remote_events

SERIES = ("in_use", "cached_free", "empty", "max_ref", "evicted", "cached_tokens", "prompt_tokens", "refusal_seqs",
          "reset_seqs")


def _journal_fed(frames, reset_every: int = 0, per_tick: int = 1, source: str = "tcp://10.0.0.5:5557",
                 compiled: bool = True):
    log = journal_log(16, compiled=compiled, checkpoint_rows=48)
    pool = ColumnarPool(source, rank=0, journal=True)
    for i, (seq, payload) in enumerate(frames):
        if reset_every and i and i % reset_every == 0:
            pool.reset(seq)
        try:
            pool.apply(fastwire.decode_columns(seq, payload))
        except MalformedFrame:
            pass
        if i % per_tick == per_tick - 1:
            append_journal(log, pool.take_journal(), pool, source)
    append_journal(log, pool.take_journal(), pool, source)
    return log


def feed_state(state, frames, reset_every: int = 0, per_tick: int = 16, source: str = "tcp://10.0.0.5:5557",
               after_tick=None) -> None:
    """`frames` into a journal-fed `PoolState` as an attach's window takes them: a journalling
    pool (`journal_pool_class`) applies `per_tick` frames a tick (a restart every `reset_every`),
    and the tick's rows are taken, placed and written (`take_journal_rows`, `prepare_journal`,
    `apply_prepared`); `after_tick()` after each tick."""
    from app.runtime.journal_feed import JournalPools, take_journal_rows
    from engine.core.live_journal import prepare_journal
    from engine.remote.overlay import journal_pool_class

    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    pool = journal_pool_class()(source)
    att, taken = JournalPools([pool]), {}
    for at in range(0, len(frames), per_tick):
        for i, (seq, payload) in enumerate(frames[at:at + per_tick]):
            if reset_every and (at + i) % reset_every == reset_every - 1:
                pool.reset(seq)
            pool.apply_many([fastwire.decode_columns(seq, payload)])
        got = take_journal_rows(att, taken, 1 << 30)
        state.apply_prepared([(prepare_journal(state.log, h, p, p.source, int(p.rank)), t) for h, p, t in got[0]])
        if after_tick is not None:
            after_tick()


def _said(e) -> tuple:
    if e.kind == "block_stored":
        return e.kind, e.block_hash, e.parent_hash, tuple(e.token_ids), e.salt, e.remote.batch_seq
    if e.kind == "block_evicted":
        return e.kind, e.block_hash, e.remote.batch_seq
    return e.kind, e.num_blocks_cleared


def _held(p) -> Counter:
    return Counter((p.hashes[b], p.parents[b], tuple(p.token_ids[b])) for b in range(p.num_blocks)
                   if p.hashes[b] is not None)


def _same(got, ref, where: str) -> None:
    assert len(got) == len(ref), where
    for name in SERIES:
        assert list(getattr(got.series, name)) == list(getattr(ref.series, name)), (where, name)
    assert got.live.counters == ref.live.counters, where
    assert _held(got.live) == _held(ref.live), where
    assert got.live.num_cached_free == ref.live.num_cached_free and got.live.num_in_use == 0, where


def _fixtures():
    from tests.test_fastwire import FIXTURES

    return FIXTURES


@pytest.mark.parametrize("name", sorted(_fixtures()))
@pytest.mark.parametrize("per_tick, compiled", [(1, True), (64, True), (64, False)])
def test_every_recorded_fixture_says_what_the_reference_says(name, per_tick, compiled):
    frames = _fixtures()[name]
    events = _remote_events(frames, 1, 0)
    if not events:
        pytest.skip("the fixture's frames carry no block event")
    ref, python = _feed(events, 0, 16, [len(events)], every_batch=False)  # python: the EventLog
    got = _journal_fed(frames, per_tick=per_tick, compiled=compiled)
    _same(got, ref, name)
    assert [_said(e) for e in got.events] == [_said(e) for e in ref.events]
    for i in sorted({0, 1, len(ref) // 3, len(ref) // 2, len(ref) - 1}):
        seq = int(ref.seqs[i])
        assert _held(got.state_at(seq)) == _held(ref.state_at(seq)), (name, seq)
        _check_projection(got.state_at(seq), python.state_at(seq), f"{name} at {seq}")
    _check_projection(got.live, python.live, f"{name} live")


@pytest.mark.parametrize("seed, compiled", [(0, True), (1, True), (2, True), (0, False), (1, False)])
def test_synthetic_streams_with_copies_clears_and_restarts(seed, compiled):
    from tests.test_colpool import _synthetic

    frames = _synthetic(220, seed)
    events = _remote_events(frames, 1, 37)
    ref, python = _feed(events, 0, 16, [len(events)], every_batch=False)
    got = _journal_fed(frames, reset_every=37, per_tick=7, compiled=compiled)
    assert {"block_stored", "block_evicted", "cache_reset"} <= {e.kind for e in ref.events}
    assert got.columnar.short_places is False  # a clear's batch: the live pool's places whole from it
    _same(got, ref, f"seed {seed}")
    assert [_said(e) for e in got.events] == [_said(e) for e in ref.events]
    for i in range(0, len(ref), max(1, len(ref) // 12)):
        seq = int(ref.seqs[i])
        a, b = got.state_at(seq), ref.state_at(seq)
        assert _held(a) == _held(b) and a.counters == b.counters, (seed, seq)
        _check_projection(a, python.state_at(seq), f"seed {seed} at {seq}")


def test_the_comparison_can_fail():
    from tests.test_colpool import _synthetic

    frames = _synthetic(60, 1)
    events = _remote_events(frames, 1, 0)
    ref, _ = _feed(events, 0, 16, [len(events)], every_batch=False)
    got = _journal_fed(frames[:-3])
    with pytest.raises(AssertionError):
        _same(got, ref, "three frames short")


@pytest.mark.parametrize("compiled", [True, False])
def test_a_servers_log_makes_its_block_counts_and_kinds_from_its_rows(compiled):
    """An attached server's log keeps no per-event `cached_free`, `empty` or `evicted` count
    and no event kinds (each follows from the rows: 13 B an event of a server that evicts;
    `cached_free` till its first clear): they read as the reference's, and a snapshot's stay
    as they were while rows keep coming."""
    from tests.test_colpool import _synthetic

    frames = _synthetic(220, 3)
    events = _remote_events(frames, 1, 0)
    ref, _ = _feed(events, 0, 16, [len(events)], every_batch=False)
    half = len(frames) // 2
    got = _journal_fed(frames[:half], per_tick=7, compiled=compiled)
    frozen = got.snapshot()
    first = (list(frozen.series.empty), list(frozen.series.evicted), list(frozen.series.cached_free))
    source = "tcp://10.0.0.5:5557"
    pool = ColumnarPool(source, rank=0, journal=True)
    got = journal_log(16, compiled=compiled, checkpoint_rows=48)
    for i, (seq, payload) in enumerate(frames):
        pool.apply(fastwire.decode_columns(seq, payload))
        if i == half - 1 or i % 7 == 6 or i == len(frames) - 1:
            append_journal(got, pool.take_journal(), pool, source)
        if i == half - 1:
            frozen = got.snapshot()
            n = len(frozen.series.seq)
    assert "block_evicted" in {e.kind for e in ref.events}
    for name in ("empty", "evicted", "cached_free"):
        assert list(getattr(got.series, name)) == list(getattr(ref.series, name)), name
    assert list(got.kinds) == list(ref.kinds)
    assert (list(frozen.series.empty), list(frozen.series.evicted), list(frozen.series.cached_free)) == (
        list(ref.series.empty)[:n], list(ref.series.evicted)[:n], list(ref.series.cached_free)[:n]) == first
    assert got._columns["empty"].n == got._columns["evicted"].n == 0
    # a clear is an event of a row a block: the series pass's from then on, its cached free kept
    assert not got._free_from_rows and got._columns["cached_free"].n == len(got)
    assert got._bounds is not None and got._kinds.n == len(got)  # a clear's event has a row a block


def _stored(seq: int, block: int, digest: bytes):
    from engine.core.events import BlockStored

    return BlockStored(seq=seq, time=float(seq), request_id="", block_id=block, block_hash=digest, parent_hash=None,
                       token_ids=(seq,) * 4, salt=None)


def _evicted(seq: int, block: int, digest: bytes):
    from engine.core.events import BlockEvicted

    return BlockEvicted(seq=seq, time=float(seq), block_id=block, block_hash=digest, by_request_id="")


@pytest.mark.parametrize("odd_at", [5, 6, None])
def test_rows_no_placer_writes_make_the_log_keep_its_cached_free_counts(odd_at):
    """A journal tick's rows that store into a block holding a hash, or take a hash from a
    block holding none, do not tell the cached free count (`_free_from_rows`): from that tick
    on the log keeps it, the counts before made from the rows, all equal to a log that kept
    them from the first (its ticks are the series pass's, not the journal's)."""
    from engine.core.live_log import LiveColumnarLog

    from engine.core.events import CacheReset

    events = [_stored(0, 0, b"a" * 8), _stored(1, 1, b"b" * 8), _evicted(2, 0, b"a" * 8),
              CacheReset(seq=3, time=3.0, num_blocks_cleared=1),  # block 1's hash: one row, one event
              _stored(4, 0, b"c" * 8), _stored(5, 2, b"d" * 8), _evicted(6, 2, b"d" * 8), _stored(7, 1, b"e" * 8)]
    if odd_at == 5:  # a second hash stored into block 0 (a store into a block holding one)
        events[5:7] = [_stored(5, 0, b"f" * 8), _evicted(6, 0, b"f" * 8)]
    elif odd_at == 6:  # a hash taken from block 1, which holds none
        events[6] = _evicted(6, 1, b"g" * 8)
    fused, kept = LiveColumnarLog(0, 4), LiveColumnarLog(0, 4)
    fused.columnar.journal_fed = True  # its ticks the journal's pass, as a journal log's
    for lo in range(0, len(events), 2):
        for log in (fused, kept):
            log.extend(events[lo:lo + 2])
    assert not kept._free_from_rows and kept._columns["cached_free"].n == len(events)
    assert fused._free_from_rows == (odd_at is None)
    assert fused._columns["cached_free"].n == (0 if odd_at is None else len(events))
    assert list(fused.series.cached_free) == list(kept.series.cached_free)
    assert list(fused.series.empty) == list(kept.series.empty)
    assert list(kept.series.cached_free)[:5] == [1, 2, 1, 0, 1]
    if odd_at == 5:  # the store over a hash: no new cached free block
        assert list(kept.series.cached_free)[5] == 1


def test_a_log_whose_events_are_a_row_each_keeps_no_event_kinds():
    """A server that evicts and never clears: each event a row, its kind its row's."""
    from engine.bench.attach import recorded_stream

    payloads, _, _ = recorded_stream(3_000, gpu_blocks=200)
    frames = list(enumerate(payloads))
    events = _remote_events(frames, 1, 0)
    ref, _ = _feed(events, 0, 16, [len(events)], every_batch=False)
    got = _journal_fed(frames, per_tick=16)
    assert {"block_evicted", "block_stored"} <= {e.kind for e in ref.events}
    assert list(got.kinds) == list(ref.kinds) and list(got.series.evicted) == list(ref.series.evicted)
    assert list(got.series.cached_free) == list(ref.series.cached_free)
    assert got._bounds is None and got._kinds.n == 0 and got._columns["evicted"].n == 0
    assert got._free_from_rows and got._columns["cached_free"].n == 0


@pytest.mark.parametrize("short_rows", [None, 1_500])
def test_a_servers_live_pool_keeps_its_places_short_and_makes_them_whole(monkeypatch, short_rows):
    """An attached server's live pool keeps its free-queue places as int32 offsets from
    TAIL_BASE (`_ShortPlaces`: 4 B a block, not 8) while every batch is a journal tick, and
    whole from the tick that would take them past the offsets' end (`SHORT_PLACE_ROWS`,
    lowered here): its free queue, live and scrubbed back, is the reference's either way."""
    import numpy as np

    import engine.core.live_log as live_log
    from engine.bench.attach import recorded_stream

    if short_rows is not None:
        monkeypatch.setattr(live_log, "SHORT_PLACE_ROWS", short_rows)
    payloads, _, _ = recorded_stream(3_000, gpu_blocks=200)
    frames = list(enumerate(payloads))
    events = _remote_events(frames, 1, 0)
    ref, python = _feed(events, 0, 16, [len(events)], every_batch=False)
    got = _journal_fed(frames, per_tick=16)
    assert len(got) > 3_000 and {"block_evicted", "block_stored"} <= {e.kind for e in ref.events}
    live = got._live_arrays
    if short_rows is None:
        assert isinstance(live, live_log._ShortPlaces) and live.short.dtype == np.int32 and got.columnar.short_places
    else:
        assert type(live) is live_log.PoolArrays and live.free_pos.dtype == np.int64
        assert got.columnar.short_places is False
    assert list(got.live.free) == list(python.live.free) and len(python.live.free) > 100
    col = got.columnar  # the places themselves, not their order alone: as a pass from the first row writes them
    assert np.array_equal(live.free_pos, col._advance(col.initial_state(), 0, col.num_rows).free_pos)
    _check_projection(got.live, python.live, "live")
    for i in (len(ref) // 3, len(ref) // 2, len(ref) - 2):
        seq = int(ref.seqs[i])
        _check_projection(got.state_at(seq), python.state_at(seq), f"at {seq}")


def test_evictions_between_sample_positions_are_the_cumulative_counts_differences():
    """What a timeline's bars read (`evicted_between`): the same from a server's log (counted
    from its rows), a columnar log's series and the reference EventLog's, at any positions."""
    import numpy as np

    from engine.core.columnar_log import EventSeries
    from tests.test_colpool import _synthetic

    frames = _synthetic(220, 4)
    events = _remote_events(frames, 1, 0)
    ref, python = _feed(events, 0, 16, [len(events)], every_batch=False)
    got = _journal_fed(frames, per_tick=5)
    n = len(ref)
    rng = np.random.default_rng(4)
    cum = np.concatenate(([0], np.asarray(list(python.series.evicted), np.int64)))
    assert cum[-1] > 0
    for at in (np.array([0, n]), np.array([0, 0, 1, 1, n // 2, n, n]), np.sort(rng.integers(0, n + 1, 40))):
        want = np.diff(cum[at]).tolist()
        for log in (got, ref, python):
            assert list(map(int, log.series.evicted_between(at))) == want, type(log.series).__name__
        whole = EventSeries(*([np.zeros(n, np.int64)] * 5), cum[1:], *([np.zeros(n, np.int64)] * 4))  # kept whole
        assert list(map(int, whole.evicted_between(at))) == want
