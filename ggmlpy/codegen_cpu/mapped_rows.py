"""Row lookups straight from a memory-mapped weight: the pages they map are let go after each
run.

A table get_rows reads in the GGUF file's own layout (a K-quant token embedding) stays in
the file mapping. Reading one row faults in more than its page: when the file is in the page
cache, Linux maps the whole 64 KiB window around the fault (fault-around; MADV_RANDOM turns
off readahead from disk, not that). So the table's resident share grows with every new token
a context sees: 512 random tokens map 28 MiB of a 125 MiB Q4_K table, none of it needed
again. After each run the windows its rows touched are unmapped (MADV_DONTNEED, a few
microseconds each): the page cache keeps them, so the next lookup of a row is a minor fault,
and the process's resident memory stays what it keeps (the repacked weights) plus what it
computes.
"""
from __future__ import annotations

import ctypes
from typing import Mapping

import numpy as np

from ggmlpy.codegen_cpu.repack import from_mmap, pages_inside
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.sched.store import TensorStore

WINDOW = 64 * 1024       # the kernel's fault-around window (fault_around_bytes' default)
MADV_DONTNEED = 4


class MappedRowLookups:
    """The get_rows nodes of a split that read a file-mapped weight, by table."""

    def __init__(self, lookups: list[tuple[np.ndarray, int, Tensor]]):
        """lookups: (the table's bytes in the mapping, bytes per row, the ids tensor)."""
        self.lookups = lookups
        self._madvise = ctypes.CDLL(None, use_errno=True).madvise if lookups else None

    @classmethod
    def of(cls, nodes: list[Tensor], tables: Mapping[int, np.ndarray]) -> "MappedRowLookups":
        """From a split's nodes and the arrays bound to its unpacked weights (by tensor id),
        those that are file-mapped; the ids must be an input (bound by the caller before the
        run, so they are still there after it)."""
        lookups = []
        for node in nodes:
            if node.op != "get_rows":
                continue
            table, ids = node.src[0], node.src[1]
            data = tables.get(table.id)
            if (data is not None and table.view_src is None and ids.view_src is None
                    and ids.flags & Flag.INPUT and from_mmap(data)):
                lookups.append((data, int(table.nb[1]), ids))
        return cls(lookups)

    def release(self, store: TensorStore, env: Mapping[str, int]) -> None:
        """Unmap the fault-around windows of every row the last run read."""
        for data, row_bytes, ids in self.lookups:
            rows = store.array(ids, env).ravel().astype(np.int64)
            base = data.ctypes.data
            first = (base + rows * row_bytes) // WINDOW
            last = (base + (rows + 1) * row_bytes - 1) // WINDOW
            windows = np.unique(np.concatenate([first, last]))
            lo, hi = pages_inside(data)
            for w in windows.tolist():
                start, end = max(w * WINDOW, lo), min((w + 1) * WINDOW, hi)
                if end > start:
                    self._madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED)

