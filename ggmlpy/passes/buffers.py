"""Buffer planning as ggml-alloc does it (docs/architecture.md, decision 5): one arena per graph, every
computed tensor at an offset in it, blocks reused once their last reader has run.

  - Liveness comes from the graph order. A tensor lives from the step that computes it to
    the last step that reads it, directly or through any view of its memory.
  - Views (and write results, which are views of their destination) never own memory.
    Leaves (inputs, weights, KV cache) are bound by name outside the arena. Graph outputs,
    and tensors an output is a view of, are never freed.
  - A node whose op allows it (OpDef.inplace) takes over its first source's block when that
    source is a computed tensor (not a leaf, view or output) of the same size, read by no
    other node and no view.
  - A freed block is reused best-fit (the smallest free block that fits, the lowest offset
    on ties); with none, the arena grows from its top. Neighbouring free blocks merge.
    The allocator is passes/arena.py, shared with the CUDA backend's planner.
  - Fusion groups (fusion.py) are one step each: their interior members get no memory,
    their outputs are allocated when the group runs, and what they read lives until then.
Sizes are symbolic; the plan is made for the worst case given as `env` (n_tokens = n_ubatch,
n_kv = the cache size, ...), so one arena serves every smaller ubatch at the same offsets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Union

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Flag, Tensor, memory_root
from ggmlpy.ir.types import block_size, type_size
from ggmlpy.passes.arena import Arena, align
from ggmlpy.passes.fusion import ResolvedGroup, fusion_groups

ALIGNMENT = 64
WORST_CASE = {"n_tokens": 512, "n_kv": 4096, "n_outputs": 512, "n_kv_swa": 4096}


@dataclass
class BufferPlan:
    """Where every computed tensor lives in one arena, sized for `env`."""

    offsets: dict[int, int]   # tensor id -> byte offset in the arena (multiple of alignment)
    sizes: dict[int, int]     # tensor id -> bytes it uses at `env`
    inplace: dict[int, int]   # tensor id -> id of the source whose block it took over
    arena_size: int           # bytes the arena needs
    peak_bytes: int           # most bytes live at once (aligned blocks)
    no_reuse_bytes: int       # bytes if every tensor had a block of its own
    alignment: int = ALIGNMENT
    env: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        mib = 1 << 20
        env = ", ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return (f"buffer plan ({env}): {len(self.offsets)} tensors, {len(self.inplace)} in place; "
                f"arena {self.arena_size / mib:.2f} MiB, peak {self.peak_bytes / mib:.2f} MiB, "
                f"without reuse {self.no_reuse_bytes / mib:.2f} MiB\n")


class PlanError(ValueError):
    """The graph cannot be planned as given (a symbol without a value, a bad alignment)."""


def tensor_nbytes(t: Tensor, env: Mapping[str, int]) -> int:
    """ggml_nbytes at `env`: the bytes from t's first element to its last (0 when empty)."""
    try:
        ne = [evaluate(d, env) for d in t.ne]
        nb = [evaluate(d, env) for d in t.nb]
    except KeyError as e:
        raise PlanError(f"sizing {t!r} needs a value for symbol {e.args[0]!r}; the env has "
                        f"{sorted(env)}") from None
    if min(ne) <= 0:
        return 0
    if block_size(t.type) > 1:  # nb[0] is the size of a block
        first = ne[0] // block_size(t.type) * nb[0]
    else:
        first = type_size(t.type) + (ne[0] - 1) * nb[0]
    return first + sum((n - 1) * s for n, s in zip(ne[1:], nb[1:]))


Fused = Union[bool, Callable[[ResolvedGroup], bool]]


def _runs_fused(fused: Fused) -> Callable[[ResolvedGroup], bool]:
    """`fused`: True (every fusion group is one kernel), False (none is), or a predicate
    naming the groups a backend runs as one kernel (the CPU backend fuses some)."""
    if callable(fused):
        return fused
    return lambda group: bool(fused)


def arena_tensors(graph: Graph, fused: Fused = True) -> list[Tensor]:
    """The tensors that need arena memory: computed, owning their memory, materialised."""
    interior = _interior_ids(graph, fused)
    return [t for t in graph.nodes if t.view_src is None and t.id not in interior]


def _interior_ids(graph: Graph, fused: Fused = True) -> set[int]:
    select = _runs_fused(fused)
    return {t.id for g in fusion_groups(graph) if select(g) for t in g.interior}


def _steps(graph: Graph, fused: Fused) -> list[list[Tensor]]:
    """The graph's nodes in execution steps: a fused group is one step, any other node one."""
    group_of: dict[int, int] = {}
    select = _runs_fused(fused)
    for i, g in enumerate(fusion_groups(graph)):
        if select(g):
            group_of.update({t.id: i for t in g.nodes})
    steps: list[list[Tensor]] = []
    current = None
    for t in graph.nodes:
        g = group_of.get(t.id)
        if g is None or g != current:
            steps.append([])
        steps[-1].append(t)
        current = g
    return steps


def plan_buffers(graph: Graph, env: Mapping[str, int] | None = None, alignment: int = ALIGNMENT,
                 fused: Fused = True) -> BufferPlan:
    """Offsets for every arena tensor of graph at the worst case `env` (default WORST_CASE).

    `fused=False` plans as if every node ran on its own (a backend without fused kernels)."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise PlanError(f"alignment must be a power of two, got {alignment}")
    env = dict(WORST_CASE if env is None else env)
    owned = arena_tensors(graph, fused)
    sizes = {t.id: tensor_nbytes(t, env) for t in owned}
    steps = _steps(graph, fused)
    dying: dict[int, list[int]] = {}
    for tid, last in _last_uses(steps, sizes).items():
        dying.setdefault(last, []).append(tid)
    pinned = {memory_root(o).id for o in graph.outputs}
    n_readers = _readers(graph)
    arena = Arena(alignment)
    offsets: dict[int, int] = {}
    inplace: dict[int, int] = {}
    for i, step in enumerate(steps):
        for t in step:
            if t.id not in sizes:
                continue
            parent = _inplace_parent(t, step, sizes, n_readers, pinned)
            if parent is not None:
                offsets[t.id] = offsets[parent.id]
                inplace[t.id] = parent.id
                arena.transfer(parent.id, t.id)
            else:
                offsets[t.id] = arena.alloc(t.id, sizes[t.id])
        arena.note_peak()
        for tid in dying.get(i, ()):
            if tid not in pinned:
                arena.free(tid)  # a block handed to an in-place child is freed with the child
    no_reuse = sum(align(s, alignment) for s in sizes.values())
    return BufferPlan(offsets, sizes, inplace, arena.top, arena.peak, no_reuse, alignment, env)


def _last_uses(steps: list[list[Tensor]], sizes: dict[int, int]) -> dict[int, int]:
    """Arena tensor id -> the last step that reads it (through views too), or computes it."""
    last: dict[int, int] = {}
    for i, step in enumerate(steps):
        for t in step:
            for x in (t, *t.src):
                root = memory_root(x)
                if root.id in sizes:
                    last[root.id] = i
    return last


def _readers(graph: Graph) -> dict[int, int]:
    """Tensor id -> how many nodes read it or view its memory."""
    count: dict[int, int] = {}
    for t in graph.tensors:
        for s in dict.fromkeys(t.src):
            count[s.id] = count.get(s.id, 0) + 1
        if t.view_src is not None and all(s is not t.view_src for s in t.src):
            count[t.view_src.id] = count.get(t.view_src.id, 0) + 1
    return count


def _inplace_parent(t: Tensor, step: list[Tensor], sizes, n_readers, pinned) -> Tensor | None:
    if len(step) != 1 or not OPS[t.op].inplace or not t.src:
        return None
    p = t.src[0]
    ok = (p.id in sizes and p.id not in pinned and not p.flags & Flag.OUTPUT
          and n_readers.get(p.id, 0) == 1 and (p.type, p.ne, p.nb) == (t.type, t.ne, t.nb))
    return p if ok else None
