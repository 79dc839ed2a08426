"""The room a `ColumnarPool`'s journal keeps after `release_journal` drops its rows: what a
steady stream brings between two drops, not a one-off burst's peak (which stayed allocated
for good: 30 B a block in bench gui's 1M-block held pool, every row taken and released)."""

from __future__ import annotations

import numpy as np

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.colpool import NUM_J, S_JROWS, ColumnarPool
from engine.remote.pool import RemotePool
from engine.remote.wire import decode_batch

HOLD = 64  # frames applied at once, as an attachment applies them


def _frames(num_events: int, gpu_blocks: int, seed: int) -> list:
    payloads, _, _ = recorded_stream(num_events, gpu_blocks=gpu_blocks, seed=seed)
    return [fastwire.decode_columns(seq, p) for seq, p in enumerate(payloads)]


def _columns(rows) -> np.ndarray:
    return np.column_stack([rows.op, rows.tier, rows.slot, rows.seq, rows.store, rows.key.view(np.int64), rows.width])


def test_a_burst_taken_and_released_leaves_no_room_for_another():
    """A server's whole cache stored at once (no evictions) and taken in two bites: once every
    row is released the journal keeps a little room, not as many rows again as the bites."""
    frames = _frames(12_000, 1 << 22, seed=7)
    pool = ColumnarPool("t", journal=True)
    half = len(frames) // 2
    taken = []
    for part in (frames[:half], frames[half:]):
        pool.apply_many(part)
        rows = pool.take_journal()
        taken.append(_columns(rows))
        pool.release_journal(rows.stop)
    assert pool.num_journal_rows > 40_000 and int(pool.S[S_JROWS]) == 0
    assert len(pool.J) <= 1024 + pool._release_min_rows
    # the rows taken in bites are the rows of a pool that never released any
    whole = ColumnarPool("t", journal=True)
    whole.apply_many(frames)
    assert np.array_equal(np.concatenate(taken), _columns(whole.take_journal()))
    ref = RemotePool("t")
    for seq, f in enumerate(frames):
        ref.apply(decode_batch(seq, f.payload))
    assert pool.num_cached == ref.num_cached and pool.cached_hashes() == ref.cached_hashes()


def test_a_steady_stream_keeps_the_room_it_needs_between_drops():
    """Evicting frames taken and released after every 64: after the first drops the journal
    holds each bite's rows without growing (a growth copies every row held), and its room
    is about one bite's rows, not more."""
    frames = _frames(60_000, 30_000, seed=8)
    pool = ColumnarPool("t", journal=True)
    grew = cycles = 0
    bites = []
    for n, i in enumerate(range(0, len(frames), HOLD)):
        J = pool.J
        pool.apply_many(frames[i:i + HOLD])
        rows = pool.take_journal()
        bites.append(len(rows))
        if n >= pool._journal_drops_seen and i + HOLD < len(frames):
            cycles += 1
            grew += pool.J is not J
        pool.release_journal(rows.stop)
    assert cycles > 50 and grew <= cycles // 10, (grew, cycles)
    assert len(pool.J) <= 1.5 * max(bites[-pool._journal_drops_seen:]) + 1024
    assert pool.J.shape[1] == NUM_J and int(pool.S[S_JROWS]) == 0


def test_a_burst_in_a_steady_stream_is_room_for_a_few_drops_only():
    """One bite ten times the others: the room after the next drops follows the usual bites
    again once the burst is older than the drops that size it."""
    frames = _frames(40_000, 30_000, seed=9)
    pool = ColumnarPool("t", journal=True)
    sizes = []
    i = 0
    for n in range(30):
        step = HOLD * (10 if n == 12 else 1)
        pool.apply_many(frames[i:i + step])
        i += step
        rows = pool.take_journal()
        pool.release_journal(rows.stop)
        sizes.append((len(rows), len(pool.J)))
    usual = max(b for b, _ in sizes[-5:])
    assert sizes[12][0] > 5 * usual
    assert all(room <= 1.5 * usual + 1024 for _, room in sizes[12:])


def test_the_arrays_rows_were_held_in_are_held_in_again_but_never_under_a_reader():
    """A reader that keeps each tick's rows until after the next apply (as the window's
    feed does, placed but not yet written): the journal holds its rows in the arrays it
    dropped once no reader's rows refer to them, so a steady stream makes no new array
    after its first drops, and rows a reader still holds are never written over."""
    frames = _frames(60_000, 30_000, seed=8)
    pool = ColumnarPool("t", journal=True)
    held = kept = None
    arrays = set()
    num = 0
    for n, i in enumerate(range(0, len(frames), HOLD)):
        pool.apply_many(frames[i:i + HOLD])
        if held is not None:  # the tick before, read after this apply
            assert np.array_equal(_columns(held), kept)
        rows = pool.take_journal()
        held, kept = rows, _columns(rows)
        pool.release_journal(rows.stop)
        if n >= 2 * pool._journal_drops_seen:
            arrays.add(id(pool.J))
            num += 1
    assert num > 50 and len(arrays) <= 3, (len(arrays), num)  # (the ids of arrays alive: none freed and made again)


def test_rows_a_reader_copies_let_the_journal_grow_and_drop_where_it_lies():
    """The window's feed copies the rows it takes (`take_journal_rows`, `JournalRows.copy`) and
    holds them until they are written, past the next applies: no view keeps the pool's J, so
    J grows (realloc) and drops (its kept rows moved to its front) in the one array, whatever
    the backlog, and the copies read as a pool that never released any."""
    from app.runtime.journal_feed import JournalPools, take_journal_rows
    from engine.remote.overlay import journal_pool_class

    frames = _frames(60_000, 30_000, seed=8)
    pool = journal_pool_class()("t")  # (an attachment's: it keeps each row's batch time)
    att, taken = JournalPools([pool]), {}
    held, copies, arrays = [], [], set()
    for n, i in enumerate(range(0, len(frames), HOLD)):
        pool.apply_many(frames[i:i + HOLD])
        if n % (1 + n % 5):  # a backlog of one to five applies between takes
            continue
        got, _ = take_journal_rows(att, taken, 1 << 30)
        for head, p, _ in got:
            assert p is pool and not np.shares_memory(head.op, pool.J)
            held.append((head, _columns(head)))
        for rows, cols in held[:-2]:  # written two takes later: unchanged meanwhile
            assert np.array_equal(_columns(rows), cols)
            copies.append(cols)
        del held[:-2]
        arrays.add(id(pool.J))
    copies += [cols for _, cols in held]
    assert pool.journal_base > 100_000 and len(arrays) == 1, (pool.journal_base, len(arrays))
    whole = ColumnarPool("t", journal=True)  # the same applies (slot numbers follow the growths)
    for i in range(0, len(frames), HOLD):
        whole.apply_many(frames[i:i + HOLD])
    assert np.array_equal(np.concatenate(copies), _columns(whole.take_journal()))


def test_a_copy_of_rows_is_the_rows_in_an_array_of_their_own():
    """`JournalRows.copy` of a tick's rows, of their first rows cut (`journal_head`) and of rows
    whose columns are not views of one block: the same columns and numbers, no memory shared."""
    from engine.core.live_journal import JOURNAL_ROW_FIELDS, journal_head

    pool = ColumnarPool("t", journal=True)
    frames = _frames(3_000, 2_000, seed=5)
    pool.apply_many(frames[:100])
    pool.take_journal()
    pool.apply_many(frames[100:200])
    rows = pool.take_journal()
    head = journal_head(rows, len(rows) // 3)
    loose = object.__new__(type(rows))
    for name in type(rows).__slots__:
        setattr(loose, name, getattr(rows, name))
    for name in JOURNAL_ROW_FIELDS:
        setattr(loose, name, np.array(getattr(rows, name)))  # each column an array of its own
    for got in (rows, head, loose):
        copy = got.copy()
        assert (copy.start, copy.stop, copy.pool, copy.store_counts) == (got.start, got.stop, pool, got.store_counts)
        assert len(copy) == len(got) > 100 and np.array_equal(_columns(copy), _columns(got))
        assert copy.key.dtype == np.uint64 and not np.shares_memory(copy.op, pool.J)
    assert np.array_equal(_columns(head.copy()), _columns(rows)[:len(head)])
