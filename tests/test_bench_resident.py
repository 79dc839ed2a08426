"""`engine.bench.resident`: the arrays an object graph holds, each counted once by its
resident pages, as `bench held` reports where a held pool's bytes per block go."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from engine.bench import resident
from engine.bench.resident import arrays_of, breakdown, resident_bytes

MB = 1 << 20


class _Slots:
    __slots__ = ("a", "b")

    def __init__(self, a, b) -> None:
        self.a, self.b = a, b


class _Holder:
    def __init__(self, **kw) -> None:
        self.__dict__.update(kw)


def _pagemap_readable() -> bool:
    try:
        with open(resident.PAGEMAP, "rb") as fh:
            fh.read(8)
        return True
    except OSError:
        return False


def test_each_array_is_found_once_by_the_first_path_to_it():
    big = np.ones(MB, np.uint8)
    other = np.ones(MB // 8, np.int64)
    root = _Holder(x=_Slots(big[10:], [other, {"k": big}]), tiny=np.ones(16), name="not an array")
    found = arrays_of({"root": root})
    assert set(found) == {"root.x.a", "root.x.b[0]"}  # a view's base counted once; the tiny one left out
    assert found["root.x.a"] is big and found["root.x.b[0]"] is other


@pytest.mark.skipif(not _pagemap_readable(), reason="no /proc/self/pagemap here")
def test_an_arrays_unwritten_room_is_no_resident_memory():
    # an anonymous mapping's pages are mapped at their first write (np.zeros may reuse heap
    # memory that calloc zeroes, when earlier frees raised glibc's mmap threshold)
    arr = np.frombuffer(mmap.mmap(-1, 64 * MB), np.uint8)
    assert resident_bytes(arr) < MB
    arr[:16 * MB] = 1
    got = resident_bytes(arr)
    assert 16 * MB <= got <= 16 * MB + 2 * mmap.PAGESIZE
    holder = _Holder(room=arr, whole=np.ones(8 * MB, np.uint8))
    out = breakdown({"h": holder}, per=1_000)
    assert out["source"] == "pagemap"
    assert out["arrays"]["h.room uint8 (67108864,)"] == pytest.approx(16 * MB / 1_000, rel=0.01)
    assert out["all_arrays"] == pytest.approx((16 + 8) * MB / 1_000, rel=0.01)


def test_without_pagemap_an_array_counts_its_bytes(monkeypatch):
    monkeypatch.setattr(resident, "PAGEMAP", "/nonexistent/pagemap")
    arr = np.zeros(4 * MB, np.uint8)
    assert resident_bytes(arr) == arr.nbytes
    assert breakdown({"a": arr}, per=4)["source"] == "array sizes"


def test_a_tables_chunks_are_one_entry():
    chunks = [np.ones(MB // 8, np.uint64) for _ in range(10)]  # 1 MB each
    pair = [np.ones(MB, np.uint8), np.ones(2 * MB, np.uint8)]
    out = breakdown({"keys": _Holder(chunks=chunks, pair=pair)}, per=MB)
    assert set(out["arrays"]) == {"keys.chunks[*] uint64 (10 arrays)", f"keys.pair[0] uint8 ({MB},)",
                                  f"keys.pair[1] uint8 ({2 * MB},)"}
    assert out["arrays"]["keys.chunks[*] uint64 (10 arrays)"] == pytest.approx(10, rel=0.01)
    assert out["all_arrays"] == pytest.approx(13, rel=0.01)
