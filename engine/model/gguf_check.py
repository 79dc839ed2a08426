"""A GGUF file's header and tensor table read without keeping them, to tell a damaged file
from a good one in one sentence before transformers reads it. The format is llama.cpp's
`docs/gguf.md` (versions 2 and 3, either byte order).

`gguf.GGUFReader` gives the same answer, but it builds a numpy view per metadata item: on
SmolLM2's 49,152-token vocabulary that is 10 s of a first start, spent again by transformers
for the config, the tokenizer and the weights.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# Value types of GGUF metadata (gguf.constants.GGUFValueType), as struct codes; STRING (8)
# and ARRAY (9) are read by hand.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_SUPPORTED_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32


class GGUFDamaged(ValueError):
    """The file is not a whole GGUF file; the message says where it stops making sense."""


@dataclass(slots=True, frozen=True)
class GGUFTable:
    """What the header says about the tensor data: enough to check the file holds it."""

    version: int
    num_tensors: int
    data_start: int  # file offset of the first tensor's data
    data_end: int  # file offset one past the last byte any tensor needs


def read_table(path: Path) -> GGUFTable:
    """Walk `path`'s header and tensor table; raise GGUFDamaged where they do not hold."""
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        if size < 24:
            raise GGUFDamaged("the header ends early")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _Walker(buf, size).table()


class _Walker:
    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self.buf, self.size, self.pos = buf, size, 4  # after the b"GGUF" signature
        (version,) = struct.unpack_from("<I", buf, 4)
        # A big-endian file reads as a version with its low 16 bits zero (as GGUFReader tells them).
        self.order = ">" if version & 0xFFFF == 0 else "<"

    def _take(self, code: str) -> int | float:
        fmt = self.order + code
        need = struct.calcsize(fmt)
        if self.pos + need > self.size:
            raise GGUFDamaged("the header ends early")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += need
        return value

    def _count(self, what: str, min_bytes: int) -> int:
        n = int(self._take("Q"))
        if n * min_bytes > self.size - self.pos:
            raise GGUFDamaged(f"{n:,} {what} cannot fit in the rest of the file")
        return n

    def _skip_string(self) -> None:
        n = self._count("string bytes", 1)
        self.pos += n

    def _string(self) -> str:
        start = self.pos + 8
        self._skip_string()
        return bytes(self.buf[start:self.pos]).decode("utf-8", "replace")

    def _skip_value(self, kind: int, depth: int = 0) -> int | None:
        """Step over one metadata value; a uint32 is returned (for general.alignment)."""
        if kind in _SCALARS:
            value = self._take(_SCALARS[kind])
            return int(value) if kind == 4 else None
        if kind == _STRING:
            self._skip_string()
            return None
        if kind == _ARRAY and depth < 4:
            item = int(self._take("I"))
            if item in _SCALARS:
                n = self._count("array items", struct.calcsize(_SCALARS[item]))
                self.pos += n * struct.calcsize(_SCALARS[item])
                return None
            n = self._count("array items", 8)
            if item == _STRING:  # a vocabulary: tens of thousands of them, so one tight loop
                length, buf, pos = struct.Struct(self.order + "Q").unpack_from, self.buf, self.pos
                try:
                    for _ in range(n):
                        pos += 8 + length(buf, pos)[0]
                except struct.error:
                    raise GGUFDamaged("the header ends early") from None
                if pos > self.size:
                    raise GGUFDamaged("the header ends early")
                self.pos = pos
                return None
            for _ in range(n):
                self._skip_value(item, depth + 1)
            return None
        raise GGUFDamaged(f"a metadata value has the unknown type {kind}")

    def table(self) -> GGUFTable:
        version = int(self._take("I"))
        if version not in _SUPPORTED_VERSIONS:
            raise GGUFDamaged(f"GGUF version {version} is not one this reader knows (2 or 3)")
        num_tensors = self._count("tensors", 24)
        num_items = self._count("metadata items", 12)
        alignment = _DEFAULT_ALIGNMENT
        for _ in range(num_items):
            key = self._string()
            value = self._skip_value(int(self._take("I")))
            if key == "general.alignment":
                if value is None or value <= 0 or value & (value - 1):
                    raise GGUFDamaged("general.alignment is not a power of two")
                alignment = value
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        extents = []
        for _ in range(num_tensors):
            name = self._string()
            num_dims = int(self._take("I"))
            if num_dims > 8:
                raise GGUFDamaged(f"tensor {name!r} has {num_dims} dimensions")
            elements = 1
            for _ in range(num_dims):
                elements *= int(self._take("Q"))
            kind = int(self._take("I"))
            try:
                block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            except (ValueError, KeyError):
                raise GGUFDamaged(f"tensor {name!r} has the unknown type {kind}") from None
            if elements % block:
                raise GGUFDamaged(f"tensor {name!r} does not fill whole {block}-element blocks")
            extents.append((int(self._take("Q")), elements // block * type_size))
        data_start = -(-self.pos // alignment) * alignment
        data_end = max((data_start + offset + num_bytes for offset, num_bytes in extents), default=data_start)
        return GGUFTable(version, num_tensors, data_start, data_end)
