"""What the journal route's commit appends a tick at a time, kept as cheaply as it is
appended: no hash key the pool keeps (each id its store's number, `JournalKeys`), a tick's
one time as one run (`_Runs.extend_same`), a count that did not move as one value
(`_Growing.append_same`); each must read back what was appended, on a recorded vLLM stream."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.live_log import _Growing, _Runs


def test_one_value_appended_many_times_reads_back_as_given():
    runs, parts = _Runs(), []
    for value, n in ((1.5, 3), (1.5, 4), (-0.0, 2), (0.0, 1), (np.nan, 2), (np.nan, 0), (7.25, 5)):
        runs.extend_same(value, n)
        parts.append(np.full(n, value))
    runs.extend(np.array([7.25, 8.0]))
    parts.append(np.array([7.25, 8.0]))
    want = np.concatenate(parts)
    assert np.array_equal(runs[0:runs.n].view(np.int64), want.view(np.int64))  # -0.0 and NaN bit for bit
    assert runs._values.view.tolist()[-2:] == [7.25, 8.0] and len(runs._values.view) == 6  # a run a value
    col = _Growing(np.int64, narrow=np.int32, uniform=True)
    col.append_same(0, 5_000)
    assert col.nbytes == 0 and len(col.view) == 5_000
    col.append_same(3, 2)
    col.append(np.array([4, 0], np.int64))
    assert col.view.tolist() == [0] * 5_000 + [3, 3, 4, 0]


@pytest.fixture(scope="module")
def journalled():
    """A recorded stream placed tick by tick into a journal-fed log (past one chunk of hash
    keys), and every tick's journal keys and widths as taken."""
    from app.runtime.journal_feed import JournalPools, take_journal_rows
    from app.runtime.live_path import FRAMES_PER_TICK
    from app.runtime.state import PoolState
    from engine.bench.attach import recorded_stream
    from engine.core.live_journal import prepare_journal
    from engine.remote import fastwire
    from engine.remote.overlay import journal_pool_class

    payloads, _, _ = recorded_stream(9_000, gpu_blocks=2_000)
    pool = journal_pool_class()("test")
    att = JournalPools([pool])
    state = PoolState()
    state.set_engine({"block_size": 16, "num_blocks": 0, "remote": True, "journal": True, "model": "vLLM"})
    taken: dict[int, int] = {}
    keys, widths = [], []
    for start in range(0, len(payloads), FRAMES_PER_TICK):
        with att.lock:
            pool.apply_many([fastwire.decode_columns(s, payloads[s])
                             for s in range(start, min(len(payloads), start + FRAMES_PER_TICK))])
        got = take_journal_rows(att, taken, 1 << 30)
        for head, _, _ in got[0]:
            keys.append(np.asarray(head.key, np.uint64).copy())
            widths.append(np.asarray(head.width, np.int64).copy())
        state.apply_prepared([(prepare_journal(state.log, h, p, p.source, int(p.rank)), t) for h, p, t in got[0]],
                             notify=False)
    return state.log, pool, np.concatenate(keys), np.concatenate(widths)


def test_a_journal_logs_hash_keys_are_the_journals_read_from_the_pools_stores(journalled):
    """Every id's key, read from its pool's per-store keys, is the journal row's; only the
    rows whose key the pool does not keep (a clear, a removal of a hash not held) keep one."""
    log, pool, keys, widths = journalled
    table = log.columnar.keys
    assert len(table) == len(keys) > 40_000
    assert np.array_equal(table.keys_of(np.arange(len(table))), keys)
    own = table._own_id.view
    assert len(own) == len(table._own_key.view) < len(keys) // 100  # not a key an id
    assert table._store.nbytes <= 4.5 * len(keys) + 4096  # a store number (int32) an id, an eighth room at most
    ids = np.array([0, len(keys) // 3, len(keys) // 2, len(keys) - 1, *own[:3].tolist()], np.int64)
    ids = ids[widths[ids] > 0]
    assert table.digests(ids) == [pool.hash_of(int(keys[i]), int(widths[i])) for i in ids]
    assert [table.digest(int(i)) for i in ids] == [pool.hash_of(int(keys[i]), int(widths[i])) for i in ids]


def test_counts_that_never_move_keep_no_array(journalled):
    log, _, _, _ = journalled
    s = log.series
    for name in ("in_use", "max_ref", "cached_tokens", "prompt_tokens"):  # no request holds a remote block
        assert log._columns[name].nbytes == 0 and not np.asarray(getattr(s, name)).any(), name
    assert len(s.cached_free) == len(log) and int(np.asarray(s.evicted)[-1]) > 0
    size = log.columnar.blocks_at(np.asarray(log.ends, np.int64))
    assert np.array_equal(np.asarray(s.empty), size - np.asarray(s.in_use) - np.asarray(s.cached_free))
