"""Row lookups in a weight that stays in the model file's memory map (a K-quant token
embedding, which get_rows reads in the file's own layout): the rows a run needs are read
from the file with pread into private memory, and the kernel reads them there.

Read through the map, one row faults in the whole 64 KiB window around it whenever the file
is in the page cache (the kernel's fault-around; MADV_RANDOM stops readahead from disk, not
that): 512 random tokens mapped 28 MiB of a 125 MiB Q4_K table, and a context's resident
memory grew with every new token it saw. Here a row costs the page or two it lands on,
handed back (MADV_DONTNEED) after the run; the copy is kept out of transparent huge pages,
which would make a row cost 2 MiB and survive the hand-back. pread copies the row from the
page cache: a few microseconds a row, once per run.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ggmlpy.codegen_cpu.repack import operand_repacked
from ggmlpy.gguf.file_map import file_map_of, file_offset, open_for_reads
from ggmlpy.ir.tensor import Flag, Tensor, memory_root
from ggmlpy.sched.store import TensorStore

MADV_DONTNEED = 4
MAP_NORESERVE = 0x4000   # Linux's value (the mmap module names it from Python 3.12): a copy
                         # the table's size, of which a run touches a few pages, is not
                         # charged in full against a strict overcommit limit
PAGE = mmap.PAGESIZE


@dataclass
class _Table:
    """One file-mapped table and the id tensors of the get_rows nodes that read it."""
    fd: int
    file_offset: int
    row_bytes: int
    n_rows: int
    shadow: mmap.mmap                       # private anonymous memory, the table's size
    ids: list[Tensor] = field(default_factory=list)
    filled: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def address(self) -> int:
        return np.frombuffer(self.shadow, np.uint8, count=0).ctypes.data


class MappedRowLookups:
    """The file-mapped tables of a split read by get_rows alone, by root tensor id."""

    def __init__(self, tables: dict[int, _Table]):
        self.tables = tables
        self._madvise = ctypes.CDLL(None, use_errno=True).madvise if tables else None

    @classmethod
    def of(cls, nodes: list[Tensor], weights: Mapping[int, np.ndarray]) -> "MappedRowLookups":
        """From a split's nodes and the arrays bound to its unpacked weights (by root id):
        the weights in a FileMap that every node reading them as they are in the file
        reads as get_rows' table, with input ids (bound before the run, so they are there
        to read). A tied embedding's product reads the repacked copy: not a reader here."""
        readers: dict[int, list[Tensor]] = {}
        for node in nodes:
            for j, src in enumerate(node.src):
                if src is not None and memory_root(src).id in weights and not operand_repacked(node, j):
                    lookup = (node.op == "get_rows" and j == 0 and src.view_src is None
                              and node.src[1].view_src is None and node.src[1].flags & Flag.INPUT)
                    readers.setdefault(memory_root(src).id, []).append(node if lookup else None)
        tables = {}
        for root_id, uses in readers.items():
            data = weights[root_id]
            fmap = file_map_of(data)
            if fmap is None or None in uses:
                continue
            row_bytes = int(uses[0].src[0].nb[1])
            fd = open_for_reads(fmap)
            shadow = mmap.mmap(-1, max(data.nbytes, 1),
                               flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
            shadow.madvise(mmap.MADV_NOHUGEPAGE)   # where THP is always on, a row would fault in 2 MiB
            table = tables[root_id] = _Table(fd, file_offset(data, fmap), row_bytes, data.nbytes // row_bytes,
                                             shadow, [node.src[1] for node in uses])
            weakref.finalize(table, os.close, fd)
        return cls(tables)

    def fill(self, store: TensorStore, env: Mapping[str, int]) -> None:
        """Read the rows this run looks up into each table's private copy."""
        for table in self.tables.values():
            ids = np.unique(np.concatenate([store.array(t, env).ravel() for t in table.ids]).astype(np.int64))
            ids = ids[(ids >= 0) & (ids < table.n_rows)]
            view = memoryview(table.shadow)
            rb = table.row_bytes
            try:
                for i in ids.tolist():
                    if os.preadv(table.fd, [view[i * rb:(i + 1) * rb]], table.file_offset + i * rb) != rb:
                        raise OSError(f"row {i} of a {table.n_rows}-row table: the model file is shorter "
                                      f"than it was when it was mapped")
            finally:
                view.release()
            table.filled = ids

    def release(self) -> None:
        """Hand back the pages the last run's rows were read into."""
        for table in self.tables.values():
            base, rb = table.address, table.row_bytes
            for i in table.filled.tolist():
                start = (base + i * rb) // PAGE * PAGE
                end = -(-(base + (i + 1) * rb) // PAGE) * PAGE
                self._madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_DONTNEED)
            table.filled = table.filled[:0]
