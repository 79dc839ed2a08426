"""fastwire.decode_columns_many reads runs into arrays it keeps (`_RunRooms`): a room is
taken again only when nothing refers to it, so a run a batch, a pool or a reader still
holds is never written over, and a run let go lends its room to the next."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.remote import colpool, fastwire
from engine.bench.attach import recorded_stream
from tests.test_colpool import state

FRAMES = recorded_stream(20_000, gpu_blocks=2_000, seed=4)[0]  # recorded vLLM 0.33 frames, bench attach's


def _runs(first: int, count: int, size: int = 64) -> list[list[bytes]]:
    return [FRAMES[s:s + size] for s in range(first, first + count * size, size)]


def _copy(batches: list[fastwire.ColumnarBatch]) -> list[tuple]:
    return [(b.rows.copy(), b.data.copy(), b.parents.copy(), b.keys.copy(), b.tokens.copy()) for b in batches]


def _same(batches: list[fastwire.ColumnarBatch], copies: list[tuple]) -> bool:
    return all(np.array_equal(got, kept) for b, c in zip(batches, copies)
               for got, kept in zip((b.rows, b.data, b.parents, b.keys, b.tokens), c))


def _held_runs_survive() -> bool:
    """Runs decoded and held, more of them than rooms are kept, while later runs are decoded:
    each keeps what it read (as decode_columns reads its frames)."""
    held, copies = [], []
    for i, run in enumerate(_runs(0, fastwire._RunRooms.num_kept + 3)):
        batches = fastwire.decode_columns_many(64 * i, run)
        held.append(batches)
        copies.append(_copy(batches))
    for i, run in enumerate(_runs(64 * len(held), 6)):  # later runs, decoded while those are held
        fastwire.decode_columns_many(0, run)
    one = [fastwire.decode_columns(64 * i + j, p)
           for i, run in enumerate(_runs(0, len(held))) for j, p in enumerate(run)]
    return all(_same(b, c) for b, c in zip(held, copies)) \
        and _same([b for run in held for b in run], _copy(one))


def test_a_held_run_is_never_written_over():
    assert _held_runs_survive()


def test_the_check_fails_when_a_held_room_is_taken(monkeypatch):
    """The seeded mutant: every kept room taken as if nothing held it."""
    monkeypatch.setattr(fastwire, "unheld", lambda array: True)
    assert not _held_runs_survive()


def test_a_run_let_go_lends_its_room_to_the_next():
    a = fastwire.decode_columns_many(0, FRAMES[:64])
    b = fastwire.decode_columns_many(64, FRAMES[64:128])
    assert not np.shares_memory(a[0].run.rows.base, b[0].run.rows.base)
    assert not np.shares_memory(a[0].run.data.base, b[0].run.data.base)
    rooms = [(id(r), id(d)) for r, d in fastwire._ROOMS.rooms]
    assert (id(a[0].run.rows.base), id(a[0].run.data.base)) in rooms
    del a, b
    c = fastwire.decode_columns_many(0, FRAMES[:64])  # the same frames: a kept room fits them
    assert (id(c[0].run.rows.base), id(c[0].run.data.base)) in rooms
    assert [(id(r), id(d)) for r, d in fastwire._ROOMS.rooms] == rooms


def test_one_view_alone_keeps_its_room():
    """Only a frame's token ids kept (the batches and the run let go): its room stays its own."""
    batches = fastwire.decode_columns_many(0, FRAMES[:64])
    tokens = batches[5].tokens
    kept = tokens.copy()
    del batches
    for run in _runs(64, fastwire._RunRooms.num_kept + 2):
        fastwire.decode_columns_many(64, run)
    assert np.array_equal(tokens, kept) and len(kept) > 0


def _journal(pool: colpool.ColumnarPool) -> list:
    j = pool.take_journal()
    return [a.tolist() for a in (j.op, j.tier, j.slot, j.seq, j.store, j.key, j.width)]


@pytest.mark.parametrize("journal", [False, True])
def test_a_pool_holding_runs_behind_the_decode(journal):
    """As an attachment: runs decoded while earlier ones wait to be applied (up to three
    behind), in pieces; the pool and its journal equal a pool's that applied each run as
    soon as it was read (the same pieces), and its blocks one's fed frame by frame."""
    behind, at_once, by_frame = (colpool.ColumnarPool("t", journal=journal) for _ in range(3))
    waiting = []
    for s in range(0, len(FRAMES), 64):
        for pool, run in ((at_once, fastwire.decode_columns_many(s, FRAMES[s:s + 64])),
                          (behind, None)):
            if run is None:
                waiting.append(fastwire.decode_columns_many(s, FRAMES[s:s + 64]))
                if len(waiting) <= 3:
                    continue
                run = waiting.pop(0)
            pool.apply_many(run[:20])
            pool.apply_many(run[20:])
    for run in waiting:
        behind.apply_many(run[:20])
        behind.apply_many(run[20:])
    for i, p in enumerate(FRAMES):
        by_frame.apply(fastwire.decode_columns(i, p))
    assert behind.num_cached > 0 and behind.num_removed > 0
    assert state(behind) == state(at_once) == state(by_frame)
    if journal:
        assert _journal(behind) == _journal(at_once)


def test_each_thread_decodes_into_rooms_of_its_own():
    mine = fastwire.decode_columns_many(0, FRAMES[:64])
    kept = _copy(mine)
    theirs: list = []
    t = threading.Thread(target=lambda: theirs.extend(fastwire.decode_columns_many(0, run) for run in _runs(64, 8)))
    t.start()
    t.join()
    assert _same(mine, kept)
    assert not any(np.shares_memory(mine[0].run.rows, r[0].run.rows) for r in theirs)
    assert not any(np.shares_memory(mine[0].run.data, r[0].run.data) for r in theirs)


def test_rooms_kept_are_bounded():
    runs = _runs(0, fastwire._RunRooms.num_kept + 3)
    held = [fastwire.decode_columns_many(64 * i, run) for i, run in enumerate(runs)]
    assert len(fastwire._ROOMS.rooms) <= fastwire._RunRooms.num_kept
    assert all(r.nbytes + d.nbytes <= fastwire._RunRooms.most_bytes for r, d in fastwire._ROOMS.rooms)
    assert len(held) == fastwire._RunRooms.num_kept + 3
