"""Length-prefixed string arrays, walked once at open and decoded lazily.

A GGUF string array is a run of (u64 length, bytes) records; finding where the array ends
means visiting every record (Gemma's vocabulary has 262,144 of them). Opening a file only
finds the end, with the tightest loop Python allows (about 25 ms for Gemma) and one bounds
check after the loop; only a failing file pays for a second, careful walk that names the
broken element. Nothing is allocated per string at open: the strings are decoded when read,
and the offsets that random access needs are built on the first such access.
"""
from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator, Sequence
from itertools import repeat

import numpy as np

from ggmlpy.gguf.errors import GGUFError

_U64 = struct.Struct("<Q")
# what a record length beyond the buffer raises: struct.error for an offset past the end,
# OverflowError for an offset that no longer fits a C integer (a length near 2**64)
_OUT_OF_RANGE = (struct.error, OverflowError)


def _careful_walk(mem: memoryview, start: int, n: int, limit: int) -> int:
    """Index of the first record that does not fit below `limit` (there is one)."""
    o = start
    for i in range(n):
        if o + 8 > limit:
            return i
        o += 8 + _U64.unpack_from(mem, o)[0]
        if o > limit:
            return i
    return n


def string_array_end(buf: np.ndarray, start: int, n: int) -> int:
    """End offset of `n` strings starting at `start`, or -(index + 1) of the first record
    that runs past the end of `buf`."""
    mem = memoryview(buf)
    limit = len(buf)
    unpack = _U64.unpack_from
    o = start
    try:
        for _ in repeat(None, n):
            o += 8 + unpack(mem, o)[0]
    except _OUT_OF_RANGE:
        o = limit + 1
    if o > limit:
        return -(_careful_walk(mem, start, n, limit) + 1)
    return o


class StringArray(Sequence):
    """A GGUF array of strings, decoded on access (UTF-8 with surrogateescape, lossless)."""

    def __init__(self, buf: np.ndarray, start: int, count: int, end: int):
        self._buf = buf
        self._start = start  # offset of the first length prefix
        self._count = count
        self._end = end  # offset just past the last string
        self._offsets: np.ndarray | None = None  # count + 1 record offsets, built on demand

    def _changed(self) -> GGUFError:
        return GGUFError("string array no longer matches the file (was it modified while open?)",
                         offset=self._start)

    def offsets(self) -> np.ndarray:
        """Offsets of every length prefix, then the end offset (count + 1 int64 values)."""
        if self._offsets is None:
            mem = memoryview(self._buf)
            unpack = _U64.unpack_from
            offs = array("q")
            append = offs.append
            o = self._start
            try:
                for _ in repeat(None, self._count):
                    append(o)
                    o += 8 + unpack(mem, o)[0]
            except _OUT_OF_RANGE:
                raise self._changed() from None
            if o != self._end:
                raise self._changed()
            append(o)
            self._offsets = np.frombuffer(offs, dtype=np.int64)
        return self._offsets

    def __len__(self) -> int:
        return self._count

    def raw(self, i: int) -> bytes:
        offs = self.offsets()
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(f"string index {i} out of range for {self._count} strings")
        return self._buf[offs[i] + 8:offs[i + 1]].tobytes()

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.raw(i).decode("utf-8", "surrogateescape")

    def lengths(self) -> np.ndarray:
        """Byte length of every string."""
        offs = self.offsets()
        return offs[1:] - offs[:-1] - 8

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        """Every string, decoded. A vocabulary is read whole at every model load (Gemma's
        262,144 tokens), so the strings are made by one decode and one split, at C speed:
        each length field is overwritten with 8 NUL bytes and the run decoded at once.
        That gives exactly the strings decoded one by one (a NUL is never part of a UTF-8
        sequence, so an incomplete or stray sequence next to one is escaped byte by byte as
        it would be alone); strings that hold a NUL themselves take the loop."""
        offs = self.offsets()
        heads = offs[:-1] - self._start
        data = np.array(self._buf[self._start:self._end])    # a copy to overwrite
        lengths = offs[1:] - offs[:-1] - 8
        if self._count and lengths.max() < 1 << 16:   # then the fields' 6 high bytes are 0
            data[heads] = 0
            data[heads + 1] = 0
        else:
            data[(heads[:, None] + np.arange(8)).ravel()] = 0
        if np.count_nonzero(data) != len(data) - 8 * self._count:   # a NUL inside a string
            return self._tolist_one_by_one(offs)
        return data.tobytes().decode("utf-8", "surrogateescape").split("\0" * 8)[1:]

    def _tolist_one_by_one(self, offs: np.ndarray) -> list[str]:
        """tolist for strings that may hold NUL bytes: one decode per string."""
        data = self._buf[self._start:self._end].tobytes()  # slicing bytes is the fastest
        at = (offs - self._start).tolist()    # each record's start, then the end
        return [data[a + 8:b].decode("utf-8", "surrogateescape") for a, b in zip(at, at[1:])]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (StringArray, list, tuple)):
            return len(self) == len(other) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def head(self, k: int) -> list[str]:
        """The first `k` strings, without building the offsets of all of them."""
        mem = memoryview(self._buf)
        out = []
        o = self._start
        for _ in range(min(k, self._count)):
            n = _U64.unpack_from(mem, o)[0]
            out.append(str(mem[o + 8:o + 8 + n], "utf-8", "surrogateescape"))
            o += 8 + n
        return out

    def __repr__(self) -> str:
        head = ", ".join(repr(s) for s in self.head(3))
        return f"StringArray(n={len(self)}, [{head}{', ...' if len(self) > 3 else ''}])"
