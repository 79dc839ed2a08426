"""A log's per-block born rows (`ColumnarLog.fit_born_rows`) grow by half again where they lie
(`engine.core.growth.regrow`, a mapping of their own past 256 KiB). The room past the blocks
held is left unset: every read stops at `num_blocks`, and a block's row is written before it
counts. Its pages are then no resident memory until a block is born into them; zeroed, they
were half again the array (0.8 B a block of bench held's 10M-block pool, 1.4 B at 1M)."""

from __future__ import annotations

import os
import struct
import sys

import numpy as np
import pytest

from engine.core.columnar import ColumnarLog

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")


def _resident_pages(a: np.ndarray, start: int, stop: int) -> tuple[int, int]:
    """(pages present, pages) of `a`'s bytes [start, stop), whole pages inside it only."""
    page = os.sysconf("SC_PAGE_SIZE")
    lo = -(-(a.ctypes.data + start) // page)
    hi = (a.ctypes.data + stop) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(lo * 8)
        entries = struct.unpack(f"<{hi - lo}Q", f.read((hi - lo) * 8))
    return sum(e >> 63 for e in entries), hi - lo


def test_the_born_rows_room_past_the_blocks_held_is_not_resident():
    col = ColumnarLog(0, 16)
    top = 0
    while len(col._born_row) < 2_000_000:  # grown by half again, each block's row written as it is born
        new = top + 50_000
        col.fit_born_rows(new, new)
        col._born_row[top:new + 1] = np.arange(top, new + 1)
        top = new + 1
    born = col._born_row
    assert born.nbytes >= 8 << 20 and len(born) - top > 200_000  # room of 800 KB and more
    present, pages = _resident_pages(born, top * born.itemsize, born.nbytes)
    assert pages >= 200 and present <= pages // 20, (present, pages)
    held, _ = _resident_pages(born, 0, top * born.itemsize)
    assert held > 0 and np.array_equal(born[:top], np.arange(top))
