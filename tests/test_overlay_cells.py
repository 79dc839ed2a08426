"""The block table's aggregated grid of a large remote pool (`RemoteOverlay.cell_codes`),
kept between redraws, against `aggregate` of the codes computed afresh from the overlay's
arrays: while vLLM frames (engine.remote.wire) grow the pool through the journal route,
and as the stream's clock ages blocks across every age edge."""

from __future__ import annotations

import numpy as np
import pytest

import engine.remote.overlay as overlay
from engine.remote.overlay import AGE_EDGES, aggregate

MAX_CELLS = 1000


def _fresh(remote, n: int, now: float) -> np.ndarray:
    base, stored = remote.base[:n], remote.stored_at[:n]
    older = sum((stored < now - edge).astype(np.int64) for edge in AGE_EDGES)
    return np.where(base == 0, 0, base.astype(np.int64) - older).astype(np.uint8)


@pytest.fixture
def held(qtbot):
    from app.commands._bench_gui import _held_frames
    from app.runtime.context import make_test_context
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    ctx = make_test_context()
    ctx.bridge.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    pool = journal_pool_class()("test")
    frames = list(_held_frames(40_000))

    def apply(first: int, last: int) -> None:
        for seq in range(first, last):
            pool.apply(fastwire.decode_columns(seq, frames[seq]))
        rows = pool.take_journal()
        ctx.state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])

    yield ctx, apply, len(frames), pool
    ctx.shutdown()


def _hash(i: int) -> bytes:  # the held frames' hash of block i (app.commands._bench_gui._held_frames)
    return (((i * 0x9E3779B97F4A7C15) & (2**64 - 1)) | (1 << 63)).to_bytes(8, "big")


@pytest.mark.parametrize("max_touched", [overlay.MAX_TOUCHED, 300])
def test_cells_kept_between_redraws_equal_a_fresh_aggregate(held, monkeypatch, max_touched):
    """With 300, every tick below changes more slots than are remembered: the grid is taken
    whole again instead of the list (the pool of 40,000 stores keeps none of it)."""
    from engine.remote import fastwire
    from engine.remote.wire import VllmEvent, encode_batch

    monkeypatch.setattr(overlay, "SWEEP_SLOTS", 3_000)  # several calls to a whole pass
    monkeypatch.setattr(overlay, "MAX_TOUCHED", max_touched)
    ctx, apply, num_frames, pool = held
    state = ctx.state
    apply(0, num_frames)
    remote = state.remote
    assert len(remote._touched) <= max_touched  # a pool filled with no redraw lists no slots
    n = state.projection.num_blocks
    now = float(remote.stored_at[:n].max())
    cells, k = remote.cell_codes(state.projection, now=now, max_cells=MAX_CELLS)
    assert k > 1
    rng = np.random.default_rng(7)
    seq = num_frames
    fresh_ids = iter(range(10**6, 2 * 10**6))
    for step in range(8):
        # removals free slots, new stores take them: the touched slots' cells only
        gone = rng.choice(40_000, 400, replace=False)
        events = [VllmEvent("BlockRemoved", tuple(_hash(int(i)) for i in gone[j:j + 50]), medium="GPU")
                  for j in range(0, len(gone), 50)]
        if step % 2:
            new = [_hash(next(fresh_ids)) for _ in range(256)]
            events += [VllmEvent("BlockStored", tuple(new[j:j + 64]), None, tuple(range(16 * 64)), 16,
                                 medium="CPU" if step % 4 == 1 else "GPU") for j in range(0, 256, 64)]
        pool.apply(fastwire.decode_columns(seq, encode_batch(now + step, events)))
        seq += 1
        rows = pool.take_journal()
        state.apply_journal([(rows, pool, 0, 1, pool.times_of(rows))])
        p = state.projection
        cells, k2 = remote.cell_codes(p, now=now, max_cells=MAX_CELLS)
        want, k_want = aggregate(_fresh(remote, p.num_blocks, now), MAX_CELLS)
        assert k2 == k_want and np.array_equal(cells, want), step
    # the stream's clock moves past every age edge: the sweep re-ages the pool in slices
    n = state.projection.num_blocks
    before = cells.copy()
    for later in (now + 11, now + 70, now + 700):
        for _ in range(n // 3_000 + 2):
            cells, k = remote.cell_codes(state.projection, now=later, max_cells=MAX_CELLS)
        want, _ = aggregate(_fresh(remote, n, later), MAX_CELLS)
        assert np.array_equal(cells, want), later
        assert not np.array_equal(cells, before), later  # the ages moved (so the check can fail)
        before = cells.copy()


def test_the_whole_pool_at_once_when_the_sweep_is_not_cut(held):
    ctx, apply, num_frames, _ = held
    apply(0, num_frames)
    p = ctx.state.projection
    remote = ctx.state.remote
    now = float(remote.stored_at[:p.num_blocks].max()) + 30
    cells, k = remote.cell_codes(p, now=now, max_cells=MAX_CELLS)
    want, k_want = aggregate(_fresh(remote, p.num_blocks, now), MAX_CELLS)
    assert k == k_want > 1 and np.array_equal(cells, want)
    # what the block table draws is the same grid
    assert np.array_equal(remote.codes(p, now=now), _fresh(remote, p.num_blocks, now))
