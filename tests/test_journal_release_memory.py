"""Rows a pool has released are freed: the app's log keeps a pool's per-store arrays
(`live_journal.StoreArrays`) to read stores when a view asks, not the `JournalRows` it was
given, whose views would hold on to the journal's row array the pool dropped at
`release_journal` (about 56 B a block while a stream is held)."""

from __future__ import annotations

import gc
import weakref

from engine.core import live_journal


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
    alive = [r for r in old_arrays if r() is not None and r() is not pool.J]
    assert not alive, f"{len(alive)} released row arrays are still held"
    # and the stores still read back, through the arrays kept
    stores = log.columnar.store_attributes
    parent, tokens, _salt, _ext, _tenant = stores[len(stores) - 1]
    assert len(tokens) == 16
