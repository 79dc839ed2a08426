"""Where a benchmark's memory lies: the numpy arrays an object graph holds, each by its resident bytes.

`bench held` reports the RSS growth of a held remote pool per block; `breakdown` says which
arrays make it up. An array counts the pages of it that are resident, read from
/proc/self/pagemap (Linux: bit 63 of a page's entry, readable without privileges), not its
length: the room an array keeps past its values (a pool's growth, a log's next rows) is
no memory until it is written. Where pagemap cannot be read, an array counts its bytes.
"""

from __future__ import annotations

import mmap
import re
from typing import Any

import numpy as np

PAGEMAP = "/proc/self/pagemap"
MIN_BYTES = 1 << 16  # smaller arrays are left out of a breakdown: their sum is noise beside the pool's
MAX_ITEMS = 200  # of a dict, list or tuple, the items looked into (a log's tables of strings are long)
MAX_DEPTH = 8
GROUP = 8  # a list's items of one type, from this many on, are one entry of a breakdown
_ITEM = re.compile(r"\[\d+\]")


def arrays_of(roots: dict[str, Any], min_bytes: int = MIN_BYTES) -> dict[str, np.ndarray]:
    """Each distinct array reachable from `roots` (name -> object) through attributes, slots,
    dicts, lists and tuples, at most MAX_DEPTH steps: the array that owns the memory (the base
    of every view of it, counted once), named by the first path that reached it
    (`state.log.columnar._cols['kind']`). Arrays under `min_bytes` are left out."""
    found: dict[int, tuple[str, np.ndarray]] = {}
    seen: set[int] = set()

    def walk(obj: Any, path: str, depth: int) -> None:
        if id(obj) in seen or depth > MAX_DEPTH or isinstance(obj, (str, bytes, bytearray, int, float, bool, type)):
            return
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            found.setdefault(id(base), (path, base))
            return
        if isinstance(obj, dict):
            for key, value in list(obj.items())[:MAX_ITEMS]:
                walk(value, f"{path}[{key!r}]", depth + 1)
            return
        if isinstance(obj, (list, tuple)):
            for i, value in enumerate(obj[:MAX_ITEMS]):
                walk(value, f"{path}[{i}]", depth + 1)
            return
        names = list(getattr(obj, "__dict__", None) or ())
        for cls in type(obj).__mro__:
            slots = getattr(cls, "__slots__", ())
            names += [slots] if isinstance(slots, str) else list(slots)
        for name in names:
            try:
                value = getattr(obj, name)
            except (AttributeError, RuntimeError):  # an empty slot, a Qt object already deleted
                continue
            walk(value, f"{path}.{name}", depth + 1)

    for name, root in roots.items():
        walk(root, name, 0)
    return {path: arr for path, arr in found.values() if arr.nbytes >= min_bytes}


def resident_bytes(arr: np.ndarray, pagemap: Any = None) -> int:
    """The bytes of the pages `arr`'s memory spans that are resident (whole pages: an array
    sharing its first or last page with others counts that page), or its bytes when
    pagemap cannot be read (`pagemap`: the open file, to read many arrays at one open)."""
    if arr.nbytes == 0:
        return 0
    if pagemap is None:
        try:
            with open(PAGEMAP, "rb") as fh:
                return resident_bytes(arr, fh)
        except OSError:
            return int(arr.nbytes)
    page = mmap.PAGESIZE
    start = arr.__array_interface__["data"][0]
    first, last = start // page, (start + arr.nbytes - 1) // page
    try:
        pagemap.seek(first * 8)
        entries = np.frombuffer(pagemap.read((last - first + 1) * 8), np.uint64)
    except OSError:
        return int(arr.nbytes)
    return int(np.count_nonzero(entries >> np.uint64(63))) * page


def breakdown(roots: dict[str, Any], per: int, top: int = 24, min_bytes: int = MIN_BYTES) -> dict[str, Any]:
    """Resident bytes of the arrays of `roots` (`arrays_of`) divided by `per` (a benchmark's
    blocks): the `top` largest by name (`path dtype shape`; arrays that are the items of one
    list, at least GROUP of them, as one `path[*] dtype (n arrays)`: a table kept in chunks),
    and the sum of all."""
    arrays = arrays_of(roots, min_bytes)
    try:
        fh = open(PAGEMAP, "rb")
    except OSError:
        fh = None
    try:
        sized = [(path, arr, resident_bytes(arr, fh)) for path, arr in arrays.items()]
    finally:
        if fh is not None:
            fh.close()
    groups: dict[tuple[str, str], list[int]] = {}
    for path, arr, size in sized:
        groups.setdefault((_ITEM.sub("[*]", path), str(arr.dtype)), []).append(size)
    sizes = {}
    for path, arr, size in sized:
        key = (_ITEM.sub("[*]", path), str(arr.dtype))
        if len(groups[key]) >= GROUP:
            sizes[f"{key[0]} {key[1]} ({len(groups[key])} arrays)"] = sum(groups[key])
        else:
            sizes[f"{path} {arr.dtype} {arr.shape}"] = size
    ranked = sorted(sizes.items(), key=lambda item: -item[1])
    return {"per": per, "source": "pagemap" if fh is not None else "array sizes",
            "all_arrays": round(sum(sizes.values()) / per, 1),
            "arrays": {name: round(size / per, 2) for name, size in ranked[:top]}}
