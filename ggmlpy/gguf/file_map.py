"""A read-only memory map that remembers its file, so a reader can also fetch bytes of it with
pread: one row of an embedding table read through the map brings in the 64 KiB around it
(the kernel's fault-around), read with pread only the row (codegen_cpu/mapped_rows.py)."""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np


class FileMap(mmap.mmap):
    """mmap.mmap(fd, 0, access=ACCESS_READ) of the file at `path`."""

    path: Path

    @classmethod
    def of(cls, fd: int, path: Path) -> "FileMap":
        m = cls(fd, 0, access=mmap.ACCESS_READ)
        m.path = path
        return m


def file_map_of(data: np.ndarray) -> FileMap | None:
    """The FileMap data's memory belongs to (through ndarray bases and memoryviews), if any."""
    base = data
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return base if isinstance(base, FileMap) else None


def file_offset(data: np.ndarray, fmap: FileMap) -> int:
    """Where data's first byte is in fmap's file (the map starts at offset 0)."""
    return data.ctypes.data - np.frombuffer(fmap, np.uint8, count=0).ctypes.data


def open_for_reads(fmap: FileMap) -> int:
    """A descriptor of fmap's file for os.preadv (the caller closes it)."""
    return os.open(fmap.path, os.O_RDONLY)
