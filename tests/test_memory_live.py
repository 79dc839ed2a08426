"""What the app holds per tracked block of a remote vLLM pool, beside the engine's pool: the
live log's per-event arrays, its checkpoints and live pool, the series pass's state and the
tier overlay, counted in bytes (`nbytes_by_part`) for fixed streams, so the budget reached
cannot grow back unseen (RSS would make the test depend on the allocator); and the compact
columns those arrays are made of (`engine.core.live_log`) against plain numpy arrays."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core import live_log
from engine.core.live_log import _Growing, _Runs
from engine.remote.overlay import MAX_TOUCHED

NUM_BLOCKS = 100_000  # more than the overlay lists between redraws (MAX_TOUCHED)
CHECKPOINT_EVENTS = 16_384  # the app's 131,072 scaled to the pool: several, thinned to four

# Bytes per block reached on 2026-12-03 at this scale (the growth room of 100,000 blocks
# included), with a little room. Before that day, at 1M blocks: events 69 (every column
# int64 or float64, one per event), checkpoints and live pool 41, the series pass's state 9,
# the overlay's listed slots 40 (a Python int per stored block while no view drew); and here
# the event route's copies by hash 152 (a 1-tuple and three list entries a block).
BUDGET = {"events": 17.0, "series_state": 7.5, "live": 16.5, "checkpoints": 12.0, "holders": 95.0, "slots": 18.0,
          "times": 8.5, "ring": 1.0}


def _parts(state) -> dict[str, float]:
    parts = {**state.log.nbytes_by_part(), **state.remote.nbytes_by_part()}
    return {k: v / NUM_BLOCKS for k, v in parts.items()}


@pytest.fixture(autouse=True)
def _checkpoints_at_this_scale(monkeypatch):
    import app.runtime.state as state_mod

    monkeypatch.setattr(state_mod, "REMOTE_CHECKPOINT_EVENTS", CHECKPOINT_EVENTS)


@pytest.fixture
def journal_state(qtbot):
    from app.commands._bench_gui import _held_frames
    from app.runtime.context import make_test_context
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    ctx = make_test_context()
    ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    pool = journal_pool_class()("test")
    for seq, payload in enumerate(_held_frames(NUM_BLOCKS)):
        pool.apply(fastwire.decode_columns(seq, payload))
        if seq % 4 == 3:  # a tick every four frames, as the bench's every 64 at its scale
            rows = pool.take_journal()
            ctx.state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
    rows = pool.take_journal()
    ctx.state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
    yield ctx.state
    ctx.shutdown()


@pytest.fixture
def event_state(qtbot):
    from app.commands._bench_gui import _remote_events
    from app.runtime.context import make_test_context

    ctx = make_test_context()
    ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "model": "vLLM"})
    events = _remote_events(NUM_BLOCKS)
    for i in range(0, NUM_BLOCKS, 5_000):
        ctx.state.apply_events(events[i:i + 5_000])
    yield ctx.state
    ctx.shutdown()


@pytest.mark.parametrize("route", ["journal", "event"])
def test_bytes_per_block_stay_within_the_budget(route, request):
    state = request.getfixturevalue(f"{route}_state")
    assert state.projection.num_blocks == NUM_BLOCKS == len(state.log)
    parts = _parts(state)
    over = {k: round(v, 2) for k, v in parts.items() if k in BUDGET and v > BUDGET[k]}
    assert not over, f"over the budget: {over}; all: { {k: round(v, 2) for k, v in parts.items()} }"
    assert len(state.remote._touched) <= MAX_TOUCHED  # bounded whatever the pool's size


def test_growing_column_narrow_until_a_value_does_not_fit():
    col = _Growing(np.int64, narrow=np.int32)
    rng = np.random.default_rng(3)
    want = [rng.integers(0, 1 << 20, 700), rng.integers(-(1 << 20), 1 << 20, 2_000)]
    for part in want:
        col.extend(part)
    assert col.view.dtype == np.int32 and col.nbytes <= 4 * 4_096
    want.append(np.array([(1 << 31) - 5, 1 << 40, -(1 << 35)], np.int64))  # past int32: widened once
    col.extend(want[-1])
    want.append(rng.integers(0, 1 << 20, 3_000))
    col.extend(want[-1])
    assert col.view.dtype == np.int64
    assert np.array_equal(col.view, np.concatenate(want))


def test_growing_column_near_the_narrow_limit_widens_before_it(monkeypatch):
    col = _Growing(np.int64, narrow=np.int32)
    top = np.iinfo(np.int32).max - live_log._NARROW_MARGIN
    col.extend(np.array([top], np.int64))
    assert col.view.dtype == np.int32
    col.extend(np.array([top + 1], np.int64))  # within the margin: wide from here on
    assert col.view.dtype == np.int64 and col.view.tolist() == [top, top + 1]


def test_uniform_column_holds_nothing_until_a_second_value():
    col = _Growing(np.int32, uniform=True)
    for _ in range(5):
        col.extend(np.zeros(10_000, np.int32))
    assert col.nbytes == 0 and len(col.view) == 50_000 and not col.view.any()
    assert col.view.dtype == np.int32
    col.extend(np.array([0, 0, 7, 0], np.int32))
    col.extend(np.arange(5, dtype=np.int32))
    want = np.concatenate([np.zeros(50_002, np.int32), [7, 0], np.arange(5)])
    assert np.array_equal(col.view, want) and col.view.dtype == np.int32
    # a uniform narrow column whose one value does not fit the narrow type
    wide = _Growing(np.int64, narrow=np.int32, uniform=True)
    wide.extend(np.full(3, 1 << 40, np.int64))
    wide.extend(np.array([1], np.int64))
    assert wide.view.tolist() == [1 << 40] * 3 + [1]


def test_runs_give_back_every_value_exactly():
    rng = np.random.default_rng(11)
    runs, parts = _Runs(), []
    for _ in range(60):
        n = int(rng.integers(0, 300))
        values = np.repeat(rng.choice([0.0, -0.0, 1.5, np.nan, 1.8e9 + 0.125, 1e-300], int(rng.integers(1, 6))),
                           int(rng.integers(1, 80)))[:n]
        runs.extend(values)
        parts.append(values)
    want = np.concatenate(parts)
    assert runs.n == len(want)
    for start, stop in [(0, len(want)), (0, 1), (len(want) - 1, len(want)), (5, 5), (7, 4)] + \
            [tuple(sorted(rng.integers(0, len(want) + 1, 2))) for _ in range(200)]:
        got = runs[start:stop]
        # bit for bit: -0.0 stays -0.0 and a NaN a NaN
        assert np.array_equal(got.view(np.int64), want[start:stop].view(np.int64)), (start, stop)


def _growing_frames(num_frames: int, seed: int) -> list[tuple[int, bytes]]:
    """vLLM frames of a pool that mostly grows: 8 new blocks a frame, and now and then a
    removal of a held block or a block stored again (its slots change between checkpoints)."""
    import random

    from engine.remote.wire import VllmEvent, encode_batch

    rng = random.Random(seed)
    held: list[bytes] = []
    gone: list[bytes] = []
    frames = []
    for seq in range(num_frames):
        new = [rng.randrange(1, 1 << 64).to_bytes(8, "big") for _ in range(8)]
        if gone and rng.random() < 0.3:
            new[0] = gone.pop(rng.randrange(len(gone)))
        events = [VllmEvent("BlockStored", tuple(new), None, tuple(range(16 * len(new))), 16,
                            medium=rng.choice(["GPU", "CPU"]))]
        held.extend(new)
        if rng.random() < 0.5:
            victims = [held.pop(rng.randrange(len(held))) for _ in range(rng.randint(1, 3))]
            gone.extend(victims)
            events.append(VllmEvent("BlockRemoved", tuple(victims), medium="GPU"))
        frames.append((seq, encode_batch(1_800_000_000.0 + seq, events)))
    return frames


@pytest.mark.parametrize("stream", ["growing", "churn"])
def test_checkpoints_kept_as_differences_scrub_as_the_reference(stream):
    """Checkpoints after the first and before the newest keep only what differs from the
    next one (`_DeltaState`), taken again when every other one goes: scrubbing to any
    event still shows what the reference shows, on a pool that grows (few differences,
    patches on patches) and on one that churns (whole arrays)."""
    from engine.core.live_log import LiveColumnarLog, _DeltaState
    from engine.core.projection import EventLog
    from tests.test_colpool import _synthetic
    from tests.test_live_log import _check_projection, _remote_events

    if stream == "growing":
        events, every, batch = _remote_events(_growing_frames(300, 5)), 64, 37
    else:
        events, every, batch = _remote_events(_synthetic(160, 1), 1, 7), 16, 9
    col = LiveColumnarLog(0, 16, checkpoint_rows=every, max_checkpoints=6)
    ref = EventLog(0, 16)
    patched = 0
    for i in range(0, len(events), batch):
        col.extend(events[i:i + batch])
        ref.extend(events[i:i + batch])
        patched = max(patched, sum(isinstance(s, _DeltaState) and isinstance(s.parts["hash_keys"], tuple)
                                   for s in col.columnar._cp_states))
    assert col.columnar.checkpoint_rows > every  # thinned at least once
    if stream == "growing":
        assert patched >= 3  # patches on patches
    assert ref.live.num_blocks > 50
    for seq in [*ref.seqs[::max(1, len(ref.seqs) // 80)], ref.seqs[-1]]:
        _check_projection(col.state_at(seq), ref.state_at(seq), f"scrubbed to {seq}")
    if stream == "growing":
        whole = 16 * (len(col.columnar._cp_states) - 1) * col.live.num_blocks
        assert col.nbytes_by_part()["checkpoints"] < whole / 2


def test_an_opened_trace_keeps_its_per_event_arrays_compact(tmp_path):
    """The kernel's log of a real trace (Mooncake's first 2,000 requests) as the app opens
    it: each event's rows as one int32 array read as two views, seqs in int32 and the
    series in the narrowest type that holds each (int16 for a pool of 4,096 blocks): 29
    bytes an event beside the rows, where int64 arrays and the pass's int32 and int64
    series were 61; the values are the ones the pass computed."""
    from app.runtime.replays import kernel_replay_job
    from tests.test_app_columnar import ROOT

    src = ROOT / "resources" / "traces" / "mooncake_conversation_trace.jsonl"
    path = tmp_path / "mooncake_2000.jsonl"
    with src.open("rb") as f:
        path.write_bytes(b"".join(line for _, line in zip(range(2000), f)))
    _, log = kernel_replay_job(str(path), 512, 4096)
    n = len(log)
    assert n > 50_000
    assert log.starts.base is log.ends.base and log.starts.dtype == np.int32 and log.seqs.dtype == np.int32
    s = log.series
    columns = (s.in_use, s.cached_free, s.empty, s.max_ref, s.evicted, s.cached_tokens, s.prompt_tokens)
    assert s.in_use.dtype == np.int16
    per_event = (log.starts.base.nbytes + log.seqs.nbytes + log.kinds.nbytes + sum(a.nbytes for a in columns)) / n
    assert per_event <= 29.5, per_event
    loop = live_log._compiled_series_loop()  # the pass `series` narrows, run again
    wide = log._compute_series() if loop is None else log._compiled_series(loop)
    for got, want in zip(columns, (wide.in_use, wide.cached_free, wide.empty, wide.max_ref, wide.evicted,
                                   wide.cached_tokens, wide.prompt_tokens)):
        assert np.array_equal(got, want)
