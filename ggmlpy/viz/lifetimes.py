"""Buffer lifetimes for the lifetime chart: when each arena block is born and dies.

BufferPlan keeps offsets and sizes, not time. The times are recomputed here with the
planner's own rules (passes/buffers.py): execution steps are single nodes or fusion groups
(the pipeline plans every group as one step); a tensor lives from the step that computes it
to the last step that reads it, directly or through a view of its memory; graph outputs (and
what they view) live to the end. A block taken over in place passes from parent to child at
the child's step, so the parent's life ends the step before and one block never counts twice.
"""
from __future__ import annotations

from dataclasses import dataclass

from ggmlpy.ir.graph import Graph
from ggmlpy.passes.arena import align
from ggmlpy.passes.buffers import BufferPlan
from ggmlpy.ir.tensor import memory_root
from ggmlpy.passes.fusion import fusion_groups


@dataclass(frozen=True)
class Block:
    tensor: int        # tensor id
    offset: int
    size: int          # bytes at the plan's env (unaligned)
    start: int         # first step it is live
    end: int           # last step it is live (inclusive)
    inplace_of: int | None = None   # the tensor id whose block it took over


@dataclass
class Lifetimes:
    blocks: list[Block]
    step_of: dict[int, int]    # node id -> step index
    n_steps: int
    live: list[int]            # aligned bytes live per step
    peak_step: int

    @property
    def peak_bytes(self) -> int:
        return self.live[self.peak_step] if self.live else 0


def execution_steps(graph: Graph) -> dict[int, int]:
    """Node id -> step index: a fusion group is one step, any other node one."""
    group_of = {t.id: i for i, g in enumerate(fusion_groups(graph)) for t in g.nodes}
    step_of: dict[int, int] = {}
    step, current = -1, None
    for t in graph.nodes:
        g = group_of.get(t.id)
        if g is None or g != current:
            step += 1
        step_of[t.id] = step
        current = g
    return step_of


def lifetimes(graph: Graph, plan: BufferPlan) -> Lifetimes:
    step_of = execution_steps(graph)
    n_steps = max(step_of.values(), default=-1) + 1
    last: dict[int, int] = {}
    for t in graph.nodes:
        for x in (t, *t.src):
            root = memory_root(x)
            if root.id in plan.offsets:
                last[root.id] = step_of[t.id]
    pinned = {memory_root(o).id for o in graph.outputs}
    handed = {parent: child for child, parent in plan.inplace.items()}
    blocks = []
    for tid, offset in plan.offsets.items():
        start = step_of[tid]
        end = n_steps - 1 if tid in pinned else last.get(tid, start)
        if tid in handed:
            end = step_of[handed[tid]] - 1
        blocks.append(Block(tid, offset, plan.sizes[tid], start, max(start, end), plan.inplace.get(tid)))
    live = [0] * n_steps
    for b in blocks:
        for s in range(b.start, b.end + 1):
            live[s] += align(b.size, plan.alignment)
    peak = max(range(n_steps), key=live.__getitem__) if n_steps else 0
    return Lifetimes(blocks, step_of, n_steps, live, peak)
