"""A journalled `ColumnarPool` whose token ids and store rows a reader holds views of as it
grows (`PoolStores`, made when read: the app's log and feed keep none) copies them into a new
array at each growth:
past 8 times their small size such a copy grows them by half again, not a sixteenth, so
they are copied a few times, not ~16 times over (each copy faults in fresh pages); resized
in place (no reader), they grow by a sixty-fourth. Rows and token ids equal a pool's
applied one frame at a time."""

from __future__ import annotations

import numpy as np

from engine.bench.attach import recorded_stream
from engine.remote import fastwire
from engine.remote.colpool import S_JSTORES, S_TOKUSED, ColumnarPool

HOLD = 4  # frames a call: few, so that a growth is set by the array's size, not by one call's ids


class _SmallPool(ColumnarPool):
    _tokens_small = 1 << 12
    _rows_small = 1 << 8


def _columns(rows) -> np.ndarray:
    return np.column_stack([rows.op, rows.tier, rows.seq, rows.store, rows.key.view(np.int64), rows.width])


def _feed(pool: ColumnarPool, runs: list, hold_views: bool) -> tuple[int, int, list]:
    """Apply the runs, taking and releasing the rows after each; (token copies, store-row
    copies past 8 times the small sizes, the rows taken)."""
    tok_copies = store_copies = 0
    taken, held = [], None
    for run in runs:
        # (ids, not references: a reference would make any growth a copy)
        tok, js, num_tok, num_js = id(pool.tok), id(pool.JS), len(pool.tok), len(pool.JS)
        pool.apply_many(run)
        if id(pool.tok) != tok and num_tok >= 8 * pool._tokens_small:
            tok_copies += 1
        if id(pool.JS) != js and num_js >= 8 * pool._rows_small:
            store_copies += 1
        rows = pool.take_journal()
        taken.append(_columns(rows))
        held = rows.per_store() if hold_views else None  # a reader's views, alive across the next apply
        pool.release_journal(rows.stop)
        del rows
    del held
    return tok_copies, store_copies, taken


def test_a_held_journal_copies_its_token_ids_by_half_again_past_the_small_size():
    payloads, _, _ = recorded_stream(8_000, gpu_blocks=2_000, seed=7)
    runs = [fastwire.decode_columns_many(i, payloads[i:i + HOLD]) for i in range(0, len(payloads), HOLD)]
    pool = _SmallPool("t", journal=True)
    tok_copies, store_copies, taken = _feed(pool, runs, hold_views=True)
    # the stream goes past 4 times 8 times the small sizes: half again a copy makes 6 copies of
    # each past 8 times them, a sixteenth made 36 of the token ids and 17 of the store rows
    assert int(pool.S[S_TOKUSED]) > 32 * _SmallPool._tokens_small
    assert int(pool.S[S_JSTORES]) > 32 * _SmallPool._rows_small
    assert 1 <= tok_copies <= 8 and 1 <= store_copies <= 8
    # the same rows, token ids and store rows as a pool applied one frame at a time
    one = ColumnarPool("t", journal=True)
    for seq, p in enumerate(payloads):
        one.apply(fastwire.decode_columns(seq, p))
    assert np.array_equal(np.concatenate(taken), _columns(one.take_journal()))
    n = int(pool.S[S_TOKUSED])
    assert n == int(one.S[S_TOKUSED]) and np.array_equal(pool.tok[:n], one.tok[:n])
    o = int(pool.S[S_JSTORES])
    assert pool.JS.dtype == one.JS.dtype and pool.JS[:o].tobytes() == one.JS[:o].tobytes()
    # with no reader holding a view, the arrays are resized in place: by a sixty-fourth, no copy
    free = _SmallPool("t", journal=True)
    assert _feed(free, runs, hold_views=False)[:2] == (0, 0)


def test_a_journal_that_holds_a_backlog_grows_its_rows_by_half_again():
    """The journal's rows (J, 56 bytes a row) hold what the reader has not released yet: in
    an attached window, the stream's rows the GUI ticks have not committed, ~100K rows at
    fleet rates. Grown by an eighth or a sixteenth, like the arrays kept for good, J was
    grown 28-35 times per 100K vLLM events there (33-50 ms of the subscriber thread, 5-6
    of them copies past a reader's views); by half again a few times, however large the
    backlog. Released rows are dropped into an array of their own size (`release_journal`),
    so no room is kept for good."""
    payloads, _, _ = recorded_stream(8_000, gpu_blocks=2_000, seed=7)
    runs = [fastwire.decode_columns_many(i, payloads[i:i + HOLD]) for i in range(0, len(payloads), HOLD)]
    pool = _SmallPool("t", journal=True)
    growths, taken, held = [], [], []
    for k, run in enumerate(runs):
        before = len(pool.J)
        pool.apply_many(run)
        if len(pool.J) > before:
            growths.append((before, len(pool.J)))
        rows = pool.take_journal()
        taken.append(_columns(rows))
        held.append(rows)  # a reader's views, alive until it releases them
        if k % 64 == 63:  # a backlog of 64 calls' rows, then released
            pool.release_journal(rows.stop)
            held.clear()
        del rows
    assert len(growths) >= 3 and max(b for _, b in growths) > 8 * _SmallPool._rows_small
    assert all(after >= before + before // 2 for before, after in growths), growths
    one = ColumnarPool("t", journal=True)
    for seq, p in enumerate(payloads):
        one.apply(fastwire.decode_columns(seq, p))
    assert np.array_equal(np.concatenate(taken), _columns(one.take_journal()))


def test_a_journal_grown_in_place_keeps_a_sixty_fourth_of_its_token_ids_idle():
    """Resized in place, a growth's new room is zeroed, so resident at once (a copy's was
    untouched pages): past 8 times their small size the token ids and store keys grow by a
    sixty-fourth, so at most that (and one call's need) is idle and resident after a growth,
    where a sixteenth kept up to 2 B a block of a 10M-block pool's token ids."""
    payloads, _, _ = recorded_stream(8_000, gpu_blocks=2_000, seed=7)
    runs = [fastwire.decode_columns_many(i, payloads[i:i + HOLD]) for i in range(0, len(payloads), HOLD)]
    pool = _SmallPool("t", journal=True)
    growths = 0
    for run in runs:
        tok, keys = len(pool.tok), len(pool.K)
        pool.apply_many(run)
        used, stores = int(pool.S[S_TOKUSED]), int(pool.S[S_JSTORES])
        if len(pool.tok) != tok and tok >= 8 * pool._tokens_small:
            growths += 1
            # (the reserve asks for the call's ids and 1,024 more at least)
            assert len(pool.tok) - used <= max(tok // 64, sum(b.num_tokens for b in run) + 1024), (tok, used)
        if len(pool.K) != keys and keys >= 8 * pool._rows_small:
            assert len(pool.K) - stores <= max(keys // 64, sum(b.num_keys for b in run) + 1024), (keys, stores)
        pool.release_journal(pool.take_journal().stop)
    assert growths >= 10
