"""Device memory for one run: which tensors own memory and where it lies.

Following ggml-alloc in a simple form (DESIGN.md decision 5): tensors computed by the split
get an offset in one arena; a buffer is free once the last step touching it (through any
view) has run, and a later buffer may take its place (first fit, 256-byte aligned). Views
never own memory; weights, caches and graph inputs live outside the arena; outputs and
tensors other splits read are kept to the end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from ggmlpy.codegen_cuda.steps import Step
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import block_size

ALIGN = 256


def root_of(t: Tensor) -> Tensor:
    return t.view_src if t.view_src is not None else t


def nbytes(t: Tensor, env: Mapping[str, int]) -> int:
    """Bytes a buffer-owning tensor spans (the largest dimension extent; ne[0] counts
    elements, nb[0] the bytes of a block of them)."""
    ne = [evaluate(n, env) for n in t.ne]
    ne[0] //= block_size(t.type)
    return max(n * evaluate(b, env) for n, b in zip(ne, t.nb))


def align(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


@dataclass
class ArenaPlan:
    offsets: dict[int, int]   # root tensor id -> byte offset in the arena
    sizes: dict[int, int]
    size: int                 # total bytes


def plan_arena(steps: list[Step], env: Mapping[str, int], owned: set[int], keep: Iterable[int] = ()) -> ArenaPlan:
    """Offsets for every root in `owned` (tensor ids) that the steps write or read.

    `keep`: roots that stay live after the last step (outputs)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    roots: dict[int, Tensor] = {}
    for i, step in enumerate(steps):
        for t in step.writes:
            r = root_of(t)
            if r.id in owned:
                first.setdefault(r.id, i)
                last[r.id] = i
                roots[r.id] = r
        for t in step.reads:
            r = root_of(t)
            if r.id in owned:
                first.setdefault(r.id, i)
                last[r.id] = max(last.get(r.id, i), i)
                roots[r.id] = r
    end = len(steps)
    for rid in keep:
        if rid in last:
            last[rid] = end
    sizes = {rid: align(max(1, nbytes(r, env))) for rid, r in roots.items()}
    offsets: dict[int, int] = {}
    placed: list[tuple[int, int, int]] = []  # (offset, size, last step)
    for rid in sorted(first, key=lambda r: (first[r], r)):
        start, size = first[rid], sizes[rid]
        live = sorted((p for p in placed if p[2] >= start), key=lambda p: p[0])
        off = 0
        for p_off, p_size, _ in live:
            if off + size <= p_off:
                break
            off = max(off, p_off + p_size)
        offsets[rid] = off
        placed.append((off, size, last[rid]))
    total = max((o + s for o, s, _ in placed), default=0)
    return ArenaPlan(offsets, sizes, total)
