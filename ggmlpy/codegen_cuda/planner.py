"""Device memory for one run: which tensors own memory and where it lies.

Following ggml-alloc in a simple form (docs/architecture.md, decision 5): tensors computed by the split
get an offset in one arena; a buffer is free once the last step touching it (through any
view) has run, and a later buffer may take its place (best fit, 256-byte aligned, by the
allocator passes/arena.py that the graph-level planner uses too). Views
never own memory; weights, caches and graph inputs live outside the arena; outputs and
tensors other splits read are kept to the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from ggmlpy.codegen_cuda.steps import Step
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Tensor, memory_root
from ggmlpy.ir.types import block_size
from ggmlpy.passes.arena import Arena
from ggmlpy.passes.arena import align as align_to

ALIGN = 256


def nbytes(t: Tensor, env: Mapping[str, int]) -> int:
    """Bytes a buffer-owning tensor spans (the largest dimension extent; ne[0] counts
    elements, nb[0] the bytes of a block of them)."""
    ne = [evaluate(n, env) for n in t.ne]
    ne[0] //= block_size(t.type)
    return max(n * evaluate(b, env) for n, b in zip(ne, t.nb))


def align(n: int, a: int = ALIGN) -> int:
    return align_to(n, a)


@dataclass
class ArenaPlan:
    offsets: dict[int, int]   # root tensor id -> byte offset in the arena
    sizes: dict[int, int]
    size: int                 # total bytes


def plan_arena(steps: list[Step], env: Mapping[str, int], owned: set[int], keep: Iterable[int] = ()) -> ArenaPlan:
    """Offsets for every root in `owned` (tensor ids) that the steps write or read.

    `keep`: roots that stay live after the last step (outputs). The steps run in order:
    before step i every root it touches first gets a block, after it every root it touches
    last gives its block back. All of a step's new blocks are taken before any of its dying
    ones are freed, so what a step writes never lies on what the same step reads."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    roots: dict[int, Tensor] = {}
    for i, step in enumerate(steps):
        for t in (*step.writes, *step.reads):
            r = memory_root(t)
            if r.id in owned:
                first.setdefault(r.id, i)
                last[r.id] = i
                roots[r.id] = r
    kept = set(keep)
    sizes = {rid: align(max(1, nbytes(r, env))) for rid, r in roots.items()}
    born: dict[int, list[int]] = {}
    dying: dict[int, list[int]] = {}
    for rid in first:  # in order of first touch
        born.setdefault(first[rid], []).append(rid)
        if rid not in kept:
            dying.setdefault(last[rid], []).append(rid)
    arena = Arena(ALIGN)
    offsets: dict[int, int] = {}
    for i in range(len(steps)):
        for rid in born.get(i, ()):
            offsets[rid] = arena.alloc(rid, sizes[rid])
        for rid in dying.get(i, ()):
            arena.free(rid)
    return ArenaPlan(offsets, sizes, arena.top)
