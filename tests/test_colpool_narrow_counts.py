"""The columnar pool's slot counts (tokens, announced, removed, copies) in uint16 until one
would pass 2**16 - 1: a hash announced 70,000 times widens them once, on every path (a batch
at a time, many frames in one compiled call that stops at the frame and resumes), and the
pool still answers as the reference does."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from engine.remote import colpool, fastwire
from engine.remote.colpool import ColumnarPool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import _run, state

HOT = ((1 << 63) + 7).to_bytes(8, "big")
ROOT = ((1 << 63) + 1).to_bytes(8, "big")


def _frames(num_frames: int, per_frame: int) -> list[tuple[int, bytes]]:
    """A root block and a hot block under it on GPU, then frames that store the hot block
    again (a copy, its parent named), report it again with no parent (vLLM's reuse report
    once one was made) and now and then remove a copy, beside blocks stored and removed
    once each, as a busy server does."""
    frames = [(0, encode_batch(1.0, [VllmEvent("BlockStored", (ROOT,), None, tuple(range(16)), 16),
                                     VllmEvent("BlockStored", (HOT,), ROOT, tuple(range(16, 32)), 16)]))]
    for f in range(1, num_frames):
        events = []
        for j in range(per_frame):
            if j % 7 == 3:
                events.append(VllmEvent("BlockStored", (HOT,), None, tuple(range(16, 32)), 16))
            elif j % 11 == 5:
                events.append(VllmEvent("BlockRemoved", (HOT,)))
            else:
                events.append(VllmEvent("BlockStored", (HOT,), ROOT, tuple(range(16, 32)), 16))
        other = ((1 << 62) + f).to_bytes(8, "big")
        events.append(VllmEvent("BlockStored", (other,), ROOT, tuple(range(32, 48)), 16))
        if f > 2:
            events.append(VllmEvent("BlockRemoved", (((1 << 62) + f - 2).to_bytes(8, "big"),)))
        frames.append((f, encode_batch(1.0 + f, events)))
    return frames


@pytest.fixture(scope="module")
def hot_frames() -> list[tuple[int, bytes]]:
    return _frames(760, 100)


def test_counts_are_narrow_until_a_hash_is_announced_past_what_they_hold(hot_frames):
    pool = ColumnarPool("t")
    half = len(hot_frames) // 2
    for seq, payload in hot_frames[:half]:
        pool.apply(fastwire.decode_columns(seq, payload))
    assert pool.C.dtype == np.uint16  # 35,000 announcements: narrow still
    for seq, payload in hot_frames[half:]:
        pool.apply(fastwire.decode_columns(seq, payload))
    assert pool.C.dtype == np.uint32
    hot = pool.tiers["GPU"][HOT]
    assert hot.num_announced > 0xFFFF and hot.num_removed > 0
    assert state(pool) == _run(hot_frames, False)[0]


@pytest.mark.parametrize("journal", [False, True])
def test_many_frames_at_once_stop_at_the_frame_that_would_pass_and_resume_wide(journal, hot_frames, monkeypatch):
    """Runs of 64 frames in one call: the call stops before the frame whose hashes could take
    the most announcements past uint16, C is widened, the rest of the run applied after it."""
    stops: list[int] = []
    entry = colpool._run_frames_py
    SEQS = list(inspect.signature(entry.py_func).parameters).index("seqs")  # (by name: the arguments grow)

    def counted(*args):
        done = entry(*args)
        if done < len(args[SEQS]):
            stops.append(done)
        return done

    monkeypatch.setattr(colpool, "_run_frames_py", counted)
    pool = ColumnarPool("t", journal=journal)
    rows = []
    for a in range(0, len(hot_frames), 64):
        pool.apply_many([fastwire.decode_columns(seq, p) for seq, p in hot_frames[a:a + 64]])
        if journal:
            rows.append(pool.take_journal())
    assert pool.C.dtype == np.uint32 and len(stops) == 1
    one = ColumnarPool("t", journal=journal)
    for seq, payload in hot_frames:
        one.apply(fastwire.decode_columns(seq, payload))
    assert state(pool) == state(one) == _run(hot_frames, False)[0]
    if journal:  # the journal says what it says a frame at a time
        whole = one.take_journal()
        for column in ("op", "tier", "seq", "store", "key"):  # (slot numbers depend on room made)
            assert np.array_equal(np.concatenate([getattr(r, column) for r in rows]), getattr(whole, column))


def test_decoded_runs_stop_and_resume_as_well(hot_frames):
    """The route from `decode_columns_many`'s arrays (`_run_decoded`): the same widening."""
    pool = ColumnarPool("t", journal=True)
    for a in range(0, len(hot_frames), 64):
        pool.apply_many(fastwire.decode_columns_many(a, [p for _, p in hot_frames[a:a + 64]]))
    assert pool.C.dtype == np.uint32
    assert state(pool) == _run(hot_frames, False)[0]


def test_a_pool_of_many_tenants_widens_its_tenant_column():
    pool = ColumnarPool("t")
    for i in range(0xFFFF):
        pool._tenant_id(f"salt-{i}")
    assert pool.C.dtype == np.uint16
    pool._tenant_id("one more")
    assert pool.C.dtype == np.uint32


def test_the_warm_up_compiles_the_wide_counts_an_attach_may_reach(hot_frames):
    """An attach's pool (journalled, fed runs of `decode_columns_many`) whose counts widen
    finds its loops compiled by `warm_up` (the install step's): no compile on its thread."""
    colpool.warm_up()
    loops = (colpool._run_decoded_py, colpool._run_frames_py, colpool._run_py, colpool._store_py,
             colpool._remove_py, colpool._drop_unnamed_bids)
    before = [len(f.signatures) for f in loops]
    pool = ColumnarPool("t", journal=True)
    for a in range(0, len(hot_frames), 64):
        pool.apply_many(fastwire.decode_columns_many(a, [p for _, p in hot_frames[a:a + 64]]))
        pool.release_journal(pool.take_journal().stop)
    assert pool.C.dtype == np.uint32
    assert [len(f.signatures) for f in loops] == before
