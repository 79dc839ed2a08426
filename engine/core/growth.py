"""Arrays that grow where they lie: `regrow` makes a 1-D array longer, keeping its values.

Growing by a fraction (an eighth, so that little room is left unused) makes many growths,
and a growth that copies costs the whole array each time: a heap block is resized by realloc,
which copies it unless the block can grow where it lies; from MAPPED_BYTES on (Linux), the
array lies in an anonymous mapping of its own that mremap grows without a copy. A reader's
view of the old array (numpy's reference check, the mapping's exports) keeps it alive: the
array is then copied, never changed under that reader. Not here: the columnar pool's
n-d tables (`engine.remote.colpool._grow_rows`), which zero their new rows.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import tracemalloc
import weakref
from typing import Any

import numpy as np

# An array `regrow` makes at least this large gets a mapping of its own (anonymous, private),
# which grows by mremap: the kernel moves its pages, nothing is copied, and the room past its
# values is no resident memory until written. A heap block of this size mostly could not grow
# where it lay (below the app's 4 MiB mmap threshold, `app.runtime.allocator`, and in a process
# without it below glibc's, which rises to the largest block freed), and realloc copied it: a
# journal log's columns were copied ~8 times their final size, ~35 ms of the commit's CPU time
# per 100K vLLM events (2026-12-05).
MAPPED_BYTES = 1 << 18
# mremap is Linux's: elsewhere an anonymous mapping cannot grow where it lies, so arrays stay on the heap
CAN_MAP = sys.platform.startswith("linux") and hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS")


def unheld(array: Any) -> bool:
    """True if nothing refers to `array` but the one list, tuple or attribute it is read from
    (CPython's reference count): no reader's view, payload or rows of it, so it may be
    written over or grown where it lies. The journal's arrays (`engine.remote.colpool`), the
    decoder's rooms (`engine.remote.fastwire`) and the receive's buffers
    (`engine.remote.receive`) are taken again only when this says so."""
    return sys.getrefcount(array) == 3  # its holder, this call's argument and getrefcount's


def regrow(owner: Any, name: str, size: int, keep: int) -> None:
    """The 1-D array `owner.<name>` (`owner[name]` of a dict) made `size` long, its first
    `keep` values kept, past them unset. From MAPPED_BYTES on it lies in a mapping of its own
    (`_mapped`), grown where it lies when nothing else refers to it (the mapping checks: a view
    a reader kept holds it), else copied into a new one, as the reader keeps the old; a
    smaller one is resized by realloc (numpy checks the references), else copied. A copy held
    the old array and the grown one at once at the peak."""
    at_key = isinstance(owner, dict)
    old = owner[name] if at_key else getattr(owner, name)
    grown = None
    if CAN_MAP and size * old.itemsize >= MAPPED_BYTES:
        mapping = _mapping_of(old)
        if mapping is not None:
            dtype = old.dtype
            del old  # the owner's the one reference left to the mapping's buffer, unless a reader holds one
            if at_key:
                owner[name] = None
            else:
                setattr(owner, name, None)
            try:
                mapping.resize(max(1, size * dtype.itemsize))
                grown = np.frombuffer(mapping, dtype, count=size)
                _trace(mapping, grown)
            except (BufferError, OSError):  # a view a reader holds: copied, as that one keeps the old
                grown = _mapped(size, dtype)
                grown[:keep] = np.frombuffer(mapping, dtype, count=keep)
        else:
            grown = _mapped(size, old.dtype)
            grown[:keep] = old[:keep]
    else:
        del old  # numpy counts the references: only the owner's may be left
        try:
            (owner[name] if at_key else getattr(owner, name)).resize(size)
        except ValueError:  # another reference to it, or not its own memory: copied, as that one keeps the old
            old = owner[name] if at_key else getattr(owner, name)
            grown = np.empty(size, old.dtype)
            grown[:keep] = old[:keep]
    if grown is not None:
        if at_key:
            owner[name] = grown
        else:
            setattr(owner, name, grown)


def _mapped(size: int, dtype: Any) -> np.ndarray:
    """An array of `size` values of `dtype`, unset, in an anonymous private mapping of its own."""
    dtype = np.dtype(dtype)
    mapping = _Mapping(-1, max(1, size * dtype.itemsize), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.traced_at_cell = [0]
    weakref.finalize(mapping, _untrace, mapping.traced_at_cell)
    arr = np.frombuffer(mapping, dtype, count=size)
    _trace(mapping, arr)
    return arr


class _Mapping(mmap.mmap):
    """A `_mapped` array's mapping, which tracemalloc counts as numpy counts its own arrays
    (numpy's domain), so memory figures read from tracemalloc (`bench held`'s traced bytes)
    still see the arrays: `traced_at_cell` holds the address counted (0: none), moved on at
    each resize and dropped when the mapping is unmapped (a cell, not the mapping, so that
    the finalizer does not keep the mapping alive)."""

    __slots__ = ("traced_at_cell",)


NUMPY_TRACE_DOMAIN = 389047  # numpy's tracemalloc domain (its arrays' data)


def _trace(mapping: _Mapping, arr: np.ndarray) -> None:
    """Count `mapping`'s bytes (`arr`, its whole first part) in tracemalloc, in place of those
    counted at its old address."""
    _untrace(mapping.traced_at_cell)
    if tracemalloc.is_tracing():
        at = arr.__array_interface__["data"][0]
        ctypes.pythonapi.PyTraceMalloc_Track(ctypes.c_uint(NUMPY_TRACE_DOMAIN), ctypes.c_size_t(at),
                                             ctypes.c_size_t(len(mapping)))
        mapping.traced_at_cell[0] = at


def _untrace(cell: list[int]) -> None:
    if cell[0]:
        ctypes.pythonapi.PyTraceMalloc_Untrack(ctypes.c_uint(NUMPY_TRACE_DOMAIN), ctypes.c_size_t(cell[0]))
        cell[0] = 0


def _mapping_of(arr: np.ndarray) -> _Mapping | None:
    """The mapping `arr` is the whole first part of, if `_mapped` made it (another mapping, a
    file's say, is never resized here: such an array is copied), else None."""
    base = arr.base
    if isinstance(base, memoryview) and isinstance(base.obj, _Mapping) and arr.ndim == 1 and \
            arr.__array_interface__["data"][0] == np.frombuffer(base, np.uint8, count=0).__array_interface__["data"][0]:
        return base.obj
    return None
