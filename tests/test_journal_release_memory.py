"""Rows a pool has released are freed: the app's log keeps where a pool's per-store arrays
are read (`live_journal.StoreArrays`: the pool and its counts) to read stores when a view
asks, not the `JournalRows` it was given, whose views would hold on to the journal's row
array the pool dropped at `release_journal` (about 56 B a block while a stream is held)."""

from __future__ import annotations

import gc
import sys
import weakref

import numpy as np

from engine.core import live_journal
from engine.remote import colpool


def test_the_log_does_not_keep_a_released_row_array():
    from app.commands._bench_gui import _held_frames
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    log = live_journal.journal_log(16)
    pool = journal_pool_class()("test")
    old_arrays = []
    for seq, payload in enumerate(_held_frames(40_000)):
        pool.apply(fastwire.decode_columns(seq, payload))
        rows = pool.take_journal()
        old_arrays.append(weakref.ref(pool.J))
        live_journal.append_journal(log, rows, pool, "test")
        pool.release_journal(rows.stop)
        del rows
    gc.collect()
    assert pool.journal_base > 0 and len(old_arrays) > 2
    # (the pool keeps at most JOURNAL_ROOMS of the arrays it dropped, to hold its rows in again)
    rooms = pool._journal_rooms
    assert len(rooms) <= colpool.JOURNAL_ROOMS
    alive = [r for r in old_arrays if r() is not None and r() is not pool.J and not any(r() is a for a in rooms)]
    assert not alive, f"{len(alive)} released row arrays are still held"
    assert all(sys.getrefcount(rooms[k]) == 2 for k in range(len(rooms)))  # the list's alone: none is read
    # and the stores still read back, through the arrays kept
    stores = log.columnar.store_attributes
    parent, tokens, _salt, _ext, _tenant = stores[len(stores) - 1]
    assert len(tokens) == 16


def test_the_log_and_the_rows_in_flight_hold_no_view_of_the_per_store_arrays():
    """The log reads a pool's per-store arrays through the pool when a view asks
    (`StoreArrays.arrays`), and rows taken but not yet written (the feed's placed ticks,
    alive across the next apply) read them through the pool too (`JournalRows.per_store`):
    with no view of them held, every growth of the token ids and the store keys is made in
    place, none copies them whole. The stores still read back as the pool has them."""
    from engine.bench.attach import recorded_stream
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    class Small(journal_pool_class()):  # small sizes: many growths, most by a sixteenth
        _tokens_small = 1 << 12
        _rows_small = 1 << 8

    log = live_journal.journal_log(16)
    pool = Small("test")
    growths = copies = 0
    in_flight = None
    frames, _, _ = recorded_stream(8_000, gpu_blocks=2_000, seed=7)
    for start in range(0, len(frames), 16):
        tok, num_tok, keys, num_keys = id(pool.tok), len(pool.tok), id(pool.K), len(pool.K)
        pool.apply_many([fastwire.decode_columns(s, frames[s]) for s in range(start, min(len(frames), start + 16))])
        growths += (len(pool.tok) != num_tok) + (len(pool.K) != num_keys)
        copies += (id(pool.tok) != tok) + (id(pool.K) != keys)
        if in_flight is not None:  # the tick before, written now, as the window's tick writes the feed's
            live_journal.commit_journal(log, *in_flight)
        rows = pool.take_journal()  # (with their batch times, as the feed takes them)
        in_flight = live_journal.prepare_journal(log, rows, pool, "test"), 0.0, pool.times_of(rows)
        pool.release_journal(rows.stop)
        del rows
    live_journal.commit_journal(log, *in_flight)
    assert growths >= 10 and copies == 0, (growths, copies)
    stores = log.columnar.store_attributes
    arrays = pool.per_store()
    some = np.array([0, 1, 15, 16, 4_095, len(stores) // 2, len(stores) - 1])
    assert stores.tokens(some) == [tuple(arrays.token_ids(int(s)).tolist()) for s in some]
    assert stores.parents(some)[1] == pool.hash_of(int(arrays.store_key[0]), int(arrays.parent_width[1]))
