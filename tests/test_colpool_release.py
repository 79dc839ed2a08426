"""engine.remote.colpool's journal releases (`ColumnarPool.release_journal`): a reader that
copied what it reads of the rows before a row lets the pool drop them. Row numbers stay
global, rows given out before stay readable, and the rows still held and every per-store
array say what they said before the release. And the journal's narrow per-store rows
(17 bytes), widened once before a value would not fit, still say what the reference emits."""

from __future__ import annotations

import numpy as np
import pytest

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.colpool import S_JROWS, S_JSTORES, S_NPX, S_NRX, ColumnarPool
from engine.remote.wire import VllmEvent, encode_batch
from tests.test_colpool import FIXTURES, _journal_events, _reference_events, _run, _synthetic, state

ROW_FIELDS = ("op", "tier", "slot", "seq", "store", "key", "width")


def _rows(j) -> dict[str, list]:
    return {name: np.asarray(getattr(j, name)).tolist() for name in ROW_FIELDS}


def _batches(num_events: int, seed: int = 1, gpu_blocks: int = 2_000) -> list:
    payloads, _, _ = recorded_stream(num_events, gpu_blocks=gpu_blocks, seed=seed)
    return [fastwire.decode_columns(seq, p) for seq, p in enumerate(payloads)]


def test_released_rows_are_dropped_and_row_numbers_stay_global():
    """A pool released after every take holds a few rows, not all; what it gives from any
    row it still holds, and every per-store array, equals a pool never released."""
    batches = _batches(6_000)
    kept, released = ColumnarPool("t", journal=True), ColumnarPool("t", journal=True)
    taken = []
    for i in range(0, len(batches), 32):
        for pool in (kept, released):
            pool.apply_many(batches[i:i + 32])
        j = released.take_journal()
        taken.append((j, _rows(j)))
        base = released.journal_base  # the first row held: the same from there as the other
        assert _rows(kept.journal_since(base)) == _rows(released.journal_since(base))
        released.release_journal(j.stop)
    assert released.num_journal_rows == kept.num_journal_rows == int(kept.S[S_JROWS]) > 20_000
    assert released.journal_base > 0 and int(released.S[S_JROWS]) < 4 * released._release_min_rows
    assert len(released.J) < len(kept.J) // 4
    # rows given out before a release still read what they read when taken (views of the old array)
    assert all(_rows(j) == rows for j, rows in taken)
    assert sum(len(j) for j, _ in taken) == kept.num_journal_rows
    last = kept.journal_since(0)
    whole = released.journal_since(released.num_journal_rows)
    for name in ("parent", "parent_width", "token_start", "token_count", "tenant"):
        assert np.array_equal(getattr(last, name), getattr(whole, name))
    assert np.array_equal(last.tokens, whole.tokens)
    assert state(kept) == state(released)


def test_a_released_row_cannot_be_read_and_a_row_past_the_end_cannot_be_released():
    pool = ColumnarPool("t", journal=True)
    pool._release_min_rows = 1
    pool.apply_many(_batches(400))
    n = pool.num_journal_rows
    assert n > 10 and pool.journal_base == 0
    with pytest.raises(ValueError, match="past the journal's end"):
        pool.release_journal(n + 1)
    pool.release_journal(n - 5)
    assert pool.journal_base == n - 5 and int(pool.S[S_JROWS]) == 5
    with pytest.raises(ValueError, match="was released"):
        pool.journal_since(n - 6)
    assert len(pool.journal_since(n - 5)) == 5 and pool.journal_since(n - 5).start == n - 5
    pool.release_journal(3)  # already released: nothing happens
    assert pool.journal_base == n - 5
    with pytest.raises(ValueError, match="was released"):
        pool.take_journal()  # it took nothing yet: its rows from 0 are gone
    with pytest.raises(ValueError, match="no journal"):
        ColumnarPool("t").release_journal(0)


def test_rows_are_dropped_only_when_it_pays():
    """While fewer rows are released than the pool keeps (or than the minimum), a release
    copies nothing: a release per tick is cheap."""
    pool = ColumnarPool("t", journal=True)
    pool.apply_many(_batches(3_000))
    n = pool.num_journal_rows
    J = pool.J
    pool.release_journal(n // 2 - 1)
    pool.release_journal(100)
    assert pool.J is J and pool.journal_base == 0
    pool.release_journal(n // 2)
    assert pool.J is not J and pool.journal_base == n // 2
    assert int(pool.S[S_JROWS]) == n - n // 2
    small = ColumnarPool("t", journal=True)
    small.apply_many(_batches(40))
    J = small.J
    small.release_journal(small.num_journal_rows)  # all of them, but fewer than the minimum
    assert small.J is J and small.num_journal_rows < small._release_min_rows


def test_a_subclass_hears_how_many_rows_were_dropped():
    """`_journal_released` is told after each drop, so arrays indexed like J follow."""

    class Dated(ColumnarPool):
        def __init__(self) -> None:
            super().__init__("t", journal=True)
            self.drops: list[tuple[int, int]] = []

        def _journal_released(self, dropped: int) -> None:
            self.drops.append((dropped, self.journal_base))

    pool = Dated()
    pool._release_min_rows = 1
    pool.apply_many(_batches(200))
    n = pool.num_journal_rows
    pool.release_journal(n)
    pool.apply_many(_batches(200, seed=2))
    pool.release_journal(pool.num_journal_rows - 2)
    assert pool.drops == [(n, n), (pool.num_journal_rows - 2 - n, pool.num_journal_rows - 2)]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_a_released_journal_says_what_the_reference_emits(name):
    """Every fixture, each take released at once (rows dropped as soon as any are): the rows
    read afterwards are the reference's events, and the pool is the reference's pool."""
    frames = FIXTURES[name]
    ref_events, _ = _reference_events(frames, 5, 4)
    for many in (1, 64):
        got, pool = _journal_events(frames, 5, 4, many, take_every=2, release_min=1)
        assert got == ref_events
        assert state(pool) == _run(frames, False, 5, 4)[0]


def test_a_released_journal_of_a_synthetic_stream_says_what_the_reference_emits():
    frames = _synthetic(600, 7)
    ref_events, _ = _reference_events(frames, 30, 61)
    got, pool = _journal_events(frames, 30, 61, 16, take_every=5, release_min=1)
    assert got == ref_events and pool.journal_base > 0
    assert state(pool) == _run(frames, False, 30, 61)[0]


# ---- narrow per-store rows ------------------------------------------------------------

def _is_wide(pool: ColumnarPool) -> bool:
    return (pool.L.dtype, pool.SO.dtype, pool.C.dtype) == (np.int64, np.int64, np.uint32)


def test_a_journalled_pool_keeps_9_bytes_a_store_and_narrow_slot_columns():
    pool = ColumnarPool("t", journal=True)
    pool.apply_many(_batches(2_000))
    # its hash in K (8 B) and its parent's width in JS (1 B); its parent the store before's
    # hash, or a row of PX for its event's first; its token count and tenant its run's (RX)
    assert pool.JS.dtype == np.uint8 and pool.K.shape[1] == 1
    stores = int(pool.S[S_JSTORES])
    assert len(pool.K) >= stores and 0 < int(pool.S[S_NPX]) < stores // 4 and 0 < int(pool.S[S_NRX]) < stores // 4
    assert pool.L.dtype == np.uint32 and pool.SO.dtype == np.uint32
    # a slot: its batch row alone in L (4 B) and its five counts in uint16 (10 B)
    assert pool.L.shape[1] == 1 and pool.C.dtype == np.uint16 and pool.C.shape[1] == 4
    j = pool.journal_since(0)
    assert j.tokens.base is not None and np.all(np.asarray(j.token_count) == 16)


def test_past_the_narrow_limit_a_journal_widens_once_and_says_what_the_reference_emits(monkeypatch):
    """Store rows past what uint32 holds (the limit made small: 1,579 stores, 1,024 slots): L,
    JS and SO widen together, and the rows taken before (narrow) and after (wide) read the
    reference's events. (A journalled pool's token starts are in no narrow column.)"""
    frames = _synthetic(300, 3)
    ref_events, _ = _reference_events(frames, 30, 61)
    monkeypatch.setattr(ColumnarPool, "_narrow_limit", 1_200)
    got, pool = _journal_events(frames, 30, 61, 16, take_every=5)
    assert got == ref_events and _is_wide(pool)
    assert state(pool) == _run(frames, False, 30, 61)[0]


def _frames_of(events_per_frame: list[list[VllmEvent]]) -> list[tuple[int, bytes]]:
    return [(seq, encode_batch(1.0 + seq, events, 0)) for seq, events in enumerate(events_per_frame)]


def test_a_block_of_more_than_65535_token_ids_reads_back_and_widens_nothing():
    h = [bytes(7) + bytes([i]) for i in range(4)]
    big = tuple(range(70_000))
    frames = _frames_of([[VllmEvent("BlockStored", (h[0],), None, tuple(range(16)), 16)],
                         [VllmEvent("BlockStored", (h[1],), h[0], big, 70_000)],
                         [VllmEvent("BlockStored", (h[2], h[3]), h[1], tuple(range(32)), 16)]])
    ref_events, _ = _reference_events(frames, 100, 0)
    for many in (1, 3):
        got, pool = _journal_events(frames, 100, 0, many, take_every=1)
        assert got == ref_events and not _is_wide(pool) and pool.C.dtype == np.uint16  # (its count in its run)
        assert int(pool.journal_since(0).token_count[1]) == 70_000


def test_a_tenant_numbered_past_65535_reads_back_and_widens_nothing():
    pool = ColumnarPool("t", journal=True)
    names = [f"salt-{i}" for i in range(0xFFFF - 1)]
    pool.tenant_names.extend(names)  # as if that many salts came before
    pool._tenant_ids.update((n, i) for i, n in enumerate(names))
    h = [bytes(7) + bytes([i]) for i in range(3)]
    for seq, p in _frames_of([[VllmEvent("BlockStored", (h[0],), None, tuple(range(16)), 16, extra_keys=(("a",),))],
                              [VllmEvent("BlockStored", (h[1],), h[0], tuple(range(16)), 16, extra_keys=(("b",),))],
                              [VllmEvent("BlockStored", (h[2],), h[1], tuple(range(16)), 16)]]):
        pool.apply(fastwire.decode_columns(seq, p))
    j = pool.journal_since(0)
    assert not _is_wide(pool) and pool.C.dtype == np.uint16  # (a tenant's number in its run, int64)
    assert [pool.tenant_names[int(t) - 1] for t in j.tenant] == ["a", "b", "b"]
