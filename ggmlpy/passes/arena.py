"""The block allocator behind every buffer plan (docs/architecture.md, decision 5).

Both planners, the graph-level one (passes/buffers.py) and the CUDA backend's
(codegen_cuda/planner.py), walk a schedule, take a block when a tensor is first needed and
give it back after its last use. They share this one allocator so that the two plans follow
the same rules and a fix to one is a fix to both.

It is ggml-alloc's dynamic allocator in a simple form: blocks live in one arena [0, top);
a request takes the smallest free block that fits (best fit, the lowest offset on ties) and
leaves the rest free; a freed block merges with free neighbours, so holes do not splinter;
with no block that fits, a free block at the top grows, else the arena grows from its top.
Every block is a multiple of `alignment`, so every offset is aligned.
"""
from __future__ import annotations

import bisect


def align(n: int, alignment: int) -> int:
    """n rounded up to a multiple of alignment."""
    return -(-n // alignment) * alignment


class Arena:
    """Best-fit allocator over [0, top), keyed by an id per block (a tensor id)."""

    def __init__(self, alignment: int):
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"arena alignment must be a power of two, got {alignment}")
        self.alignment = alignment
        self.free_blocks: list[tuple[int, int]] = []  # (offset, size), sorted, never adjacent
        self.blocks: dict[int, tuple[int, int]] = {}  # id -> (offset, aligned size)
        self.top = 0    # bytes the arena needs so far
        self.live = 0   # bytes in blocks now
        self.peak = 0   # most bytes live at a note_peak call

    def alloc(self, tid: int, size: int) -> int:
        """A block of at least `size` bytes (at least one alignment unit) for tid; its offset."""
        if tid in self.blocks:
            raise ValueError(f"arena: id {tid} already has a block at offset {self.blocks[tid][0]}")
        if size < 0:
            raise ValueError(f"arena: negative size {size} for id {tid}")
        size = align(max(size, 1), self.alignment)
        best = None  # index of the smallest free block that fits, the lowest offset on ties
        for i, (o, s) in enumerate(self.free_blocks):
            if s >= size and (best is None or s < self.free_blocks[best][1]):
                best = i
        if best is not None:
            o, s = self.free_blocks.pop(best)
            if s > size:
                self.free_blocks.insert(best, (o + size, s - size))
        elif self.free_blocks and sum(self.free_blocks[-1]) == self.top:
            o, _ = self.free_blocks.pop()  # the free block at the top grows to fit
            self.top = o + size
        else:
            o = self.top
            self.top += size
        self.blocks[tid] = (o, size)
        self.live += size
        return o

    def free(self, tid: int) -> None:
        """Give tid's block back; an id without a block (already freed, or handed on by
        transfer) is ignored, so callers can free by last use without bookkeeping."""
        if tid not in self.blocks:
            return
        o, s = self.blocks.pop(tid)
        self.live -= s
        self._insert(o, s)

    def transfer(self, old: int, new: int) -> None:
        """new takes over old's block (an in-place result); old no longer has one."""
        if old not in self.blocks:
            raise ValueError(f"arena: id {old} has no block to hand to {new}")
        if new in self.blocks:
            raise ValueError(f"arena: id {new} already has a block")
        self.blocks[new] = self.blocks.pop(old)

    def note_peak(self) -> None:
        """Record the bytes live now (call it where everything a step needs is allocated)."""
        self.peak = max(self.peak, self.live)

    def _insert(self, offset: int, size: int) -> None:
        """Return [offset, offset+size) to the free list, merged with free neighbours."""
        blocks = self.free_blocks
        i = bisect.bisect_left(blocks, (offset, size))
        if i < len(blocks) and offset + size == blocks[i][0]:  # the next block is free
            size += blocks.pop(i)[1]
        if i > 0 and sum(blocks[i - 1]) == offset:            # so is the previous one
            i -= 1
            offset, size = blocks[i][0], blocks[i][1] + size
            blocks[i] = (offset, size)
        else:
            blocks.insert(i, (offset, size))
