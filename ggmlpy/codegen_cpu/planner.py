"""Arena planning for a compiled split: liveness over the node order, best-fit reuse of freed
blocks, sizes at the worst case. (ggmlpy.passes.buffers is the general pass; this is the
minimal planner the CPU backend needs for its own nodes.)"""
from __future__ import annotations

from typing import Mapping

from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.ir.types import row_size

ALIGN = 64


def tensor_bytes(t: Tensor, env: Mapping[str, int]) -> int:
    ne = [evaluate(d, env) for d in t.ne]
    n = row_size(t.type, ne[0]) if ne[0] else 0
    for d in ne[1:]:
        n *= d
    return -(-n // ALIGN) * ALIGN


def plan_arena(nodes: list[Tensor], roots: list[Tensor], env: Mapping[str, int]) -> tuple[dict[int, int], int]:
    """Offsets for `roots` (tensors computed here); a block is freed after its last reader."""
    root_ids = {r.id for r in roots}
    last_use: dict[int, int] = {}
    for i, n in enumerate(nodes):
        for t in (n, *n.src):
            r = t.view_src if t.view_src is not None else t
            if r.id in root_ids:
                last_use[r.id] = i
    pinned = {r.id for r in roots if r.flags & Flag.OUTPUT}
    by_id = {r.id: r for r in roots}
    free: list[tuple[int, int]] = []  # (offset, size)
    offsets: dict[int, int] = {}
    top = 0
    for i, n in enumerate(nodes):
        for t in (n, *n.src):
            r = t.view_src if t.view_src is not None else t
            if r.id in root_ids and r.id not in offsets:
                size = tensor_bytes(by_id[r.id], env)
                fits = [(s, o) for o, s in free if s >= size]
                if fits:
                    s, o = min(fits)
                    free.remove((o, s))
                    if s > size:
                        free.append((o + size, s - size))
                    offsets[r.id] = o
                else:
                    offsets[r.id] = top
                    top += size
        for rid, last in last_use.items():
            if last == i and rid not in pinned and rid in offsets:
                free.append((offsets[rid], tensor_bytes(by_id[rid], env)))
    return offsets, max(top, ALIGN)
