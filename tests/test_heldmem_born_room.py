"""A log's per-block born rows (`engine.core.columnar.BornRows`): runs while they pay, as a
pool fills (an attached server's journal makes a block at each store until its pool is full),
else an array grown by half again where it lies, whose room past the blocks held is left
unset (every read stops at the blocks held): its pages are no resident memory until a block
is born into them (zeroed, they were half again the array: 0.8 B a block of bench held's
10M-block pool). Both read back every block's row and search as numpy does."""

from __future__ import annotations

import os
import struct
import sys

import numpy as np
import pytest

from engine.core.columnar import BornRows, ColumnarLog


def _resident_pages(a: np.ndarray, start: int, stop: int) -> tuple[int, int]:
    """(pages present, pages) of `a`'s bytes [start, stop), whole pages inside it only."""
    page = os.sysconf("SC_PAGE_SIZE")
    lo = -(-(a.ctypes.data + start) // page)
    hi = (a.ctypes.data + stop) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(lo * 8)
        entries = struct.unpack(f"<{hi - lo}Q", f.read((hi - lo) * 8))
    return sum(e >> 63 for e in entries), hi - lo


def _check_reads(born: BornRows, whole: np.ndarray) -> None:
    assert len(born) == len(whole) and born.last == whole[-1]
    for start, stop in ((0, len(whole)), (3, 17), (len(whole) - 5, len(whole)), (len(whole) // 2, len(whole) // 2 + 1)):
        assert np.array_equal(born.span(start, stop), whole[start:stop])
    probes = np.sort(np.concatenate([whole, whole + 1, whole - 1, [-5, whole[-1] + 100]]))
    probes = probes[np.r_[True, probes[1:] != probes[:-1]]]  # np.unique's hashing took 3 s of 6M
    assert np.array_equal(np.asarray(born.searchsorted(probes)), np.searchsorted(whole, probes))
    assert np.array_equal(np.asarray(born.searchsorted(probes, side="right")),
                          np.searchsorted(whole, probes, side="right"))
    # one row at a time (the scalar path) at about 3,000 rows spread over all of them: each
    # probe costs a Python call, and every 7th of 6M probes was most of this file's 40 s
    for row in probes[::max(1, len(probes) // 3000)].tolist():
        assert int(born.searchsorted(row)) == int(np.searchsorted(whole, row))


def test_a_pool_that_fills_a_block_a_row_keeps_a_few_runs():
    """Blocks there from the start, then 2M born one a row in ticks (a server filling its
    pool), then now and then a few at scattered rows: a few hundred bytes, not 8 MB."""
    born = BornRows(1000)
    whole = [np.full(1000, -1)]
    row = 0
    for _ in range(400):  # ticks of 5,000 stores, each a new block
        rows = np.arange(row, row + 5000)
        n = len(born)
        born.extend(rows)
        whole.append(rows)
        # what a journal tick reads of the blocks it made: their rows, and the blocks before its first row
        assert np.array_equal(born.span(n, n + 5000), rows) and born.searchsorted(row) == n
        assert born.searchsorted(row + 10) == n + 10 and born.searchsorted(row + 10, side="right") == n + 11
        row += 5000 + 3  # (a removal or two between ticks)
    for _ in range(50):
        row += 997
        rows = np.full(2, row) + np.arange(2)
        born.extend(rows)
        whole.append(rows)
    whole = np.concatenate(whole)
    assert born.nbytes < 10_000 and born.dtype == np.int32
    _check_reads(born, whole)
    frozen = born.view(len(whole))
    born.extend(np.array([row + 10]))
    _check_reads(frozen, whole)  # a snapshot reads its blocks while more are born


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")
def test_born_rows_that_stop_running_are_an_array_whose_room_is_not_resident():
    born = BornRows(0)
    rng = np.random.default_rng(5)
    rows = np.cumsum(rng.integers(2, 9, 2_100_000))  # one block every few rows: runs of one
    for a in range(0, len(rows), 50_000):
        born.extend(rows[a:a + 50_000])
    arr = born._arr
    assert arr is not None and born._runs is None and len(arr) - len(born) > 200_000
    present, pages = _resident_pages(arr, len(born) * arr.itemsize, arr.nbytes)
    assert pages >= 200 and present <= pages // 20, (present, pages)
    _check_reads(born, rows)


def test_a_log_grown_by_its_events_and_by_a_journal_reads_its_blocks():
    col = ColumnarLog(4, 16)
    col.num_rows = 10
    col._grow(6)  # an event past the pool's end: born at the row it makes next
    col._grow(9, np.array([12, 12, 15]))  # a journal's: each at the row that first stored it
    assert col.num_blocks == 10 and col._born_row.span(0, 10).tolist() == [-1] * 4 + [10] * 3 + [12, 12, 15]
    assert col.blocks_at(0) == 4 and col.blocks_at(11) == 7 and col.blocks_at(13) == 9 and col.blocks_at(16) == 10
    assert col.blocks_at(np.array([0, 11, 16])).tolist() == [4, 7, 10]
