"""What every pass shares: copying tensors, rebuilding a graph around replacements, and the
dependency facts (consumers, memory roots, write ordering) passes must respect.

Passes never mutate their input graph (docs/architecture.md, decision 4). A tensor that changes, or
whose sources changed, is copied with a fresh id; an unchanged tensor is shared between
the input and the output graph, so a pass over a graph it does not touch costs no copies.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

from ggmlpy.ir.graph import Graph, append_post_order, tensor_deps
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.symbolic import simplify
from ggmlpy.ir.tensor import Flag, Tensor, memory_root

# graph.hints key of the fusion annotations (fusion.py): positions into graph.tensors, so any
# pass that changes the tensor list drops them (they would point at the wrong tensors)
FUSION_HINT = "fusion_groups"


class PassError(RuntimeError):
    """A pass produced, or was given, a graph that breaks an IR invariant."""


def op_kind(t: Tensor) -> Kind | None:
    """The registry kind of t's op (None for leaves and unknown ops)."""
    op = OPS.get(t.op)
    return op.kind if op is not None else None


deps = tensor_deps  # what t needs before it exists: its sources and, for views, its memory owner


def copy_tensor(t: Tensor, **changes) -> Tensor:
    """A new tensor (fresh id) with t's fields, some replaced; t is untouched."""
    fields = dict(type=t.type, ne=t.ne, nb=t.nb, op=t.op, src=t.src, params=dict(t.params),
                  name=t.name, flags=t.flags, view_src=t.view_src, view_offs=t.view_offs)
    fields.update(changes)
    return Tensor(**fields)


def consumers(tensors: Iterable[Tensor]) -> dict[int, list[Tensor]]:
    """Tensor id -> the tensors that list it as a source (each consumer once, in order)."""
    tensors = list(tensors)
    users: dict[int, list[Tensor]] = {t.id: [] for t in tensors}
    for t in tensors:
        for s in dict.fromkeys(t.src):
            users.setdefault(s.id, []).append(t)
    return users


def closure(roots: Iterable[Tensor]) -> set[int]:
    """Ids of the roots and of everything they depend on."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        t = stack.pop()
        if t.id in seen:
            continue
        seen.add(t.id)
        stack.extend(deps(t))
    return seen


def memory_order_edges(tensors: Sequence[Tensor]) -> list[tuple[Tensor, Tensor]]:
    """(before, after) pairs that data flow alone does not imply: a WRITE op and every other
    node touching the same memory keep their relative order, so a pass that reorders nodes
    never moves a read of the KV cache across the write that fills it."""
    touching: dict[int, list[Tensor]] = {}
    writers: set[int] = set()
    for t in tensors:
        kind = op_kind(t)
        if kind == Kind.WRITE:
            root = memory_root(t)
            writers.add(root.id)
            touching.setdefault(root.id, []).append(t)
        elif kind is not None and kind != Kind.VIEW:
            for root_id in {memory_root(s).id for s in t.src}:
                touching.setdefault(root_id, []).append(t)
    edges = []
    for root_id in writers:
        group = touching[root_id]
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if op_kind(a) == Kind.WRITE or op_kind(b) == Kind.WRITE:
                    edges.append((a, b))
    return edges


def new_graph(old: Graph, outputs: list[Tensor], tensors: list[Tensor]) -> Graph:
    """A graph with old's hints; fusion annotations survive only an unchanged tensor list."""
    hints = dict(old.hints)
    if [t.id for t in tensors] != [t.id for t in old.tensors]:
        hints.pop(FUSION_HINT, None)
    return Graph(list(outputs), list(tensors), hints)


# rebuilding -----------------------------------------------------------------------------------
Replace = Callable[[Tensor], "Tensor | None"]


def rebuild(graph: Graph, replace: Replace) -> Graph:
    """Walk graph in order, offering every node (with its sources already rebuilt) to
    `replace`, which returns None to keep it, an earlier tensor of the new graph, or a fresh
    tensor (whose sources may be tensors of either graph: they are mapped).

    Views of a replaced tensor are re-rooted (when the replacement is itself a view, their
    offset is composed with it). A fresh replacement inherits the replaced node's name when
    it has none, and its OUTPUT flag; a graph output is never replaced by an existing tensor
    (it keeps its own node). Tensors only the replaced ones needed are dropped; dead code
    that was already dead is left for dce. Leaves are never offered."""
    old_ids = {t.id for t in graph.tensors}
    mapped: dict[int, Tensor] = {}
    placed: set[int] = set()  # ids of the new graph's tensors so far
    for t in graph.tensors:
        cur = remap(t, mapped)
        new = None if t.is_leaf else replace(cur)
        if new is not None and new is not cur and new.id in old_ids:
            if new.id not in mapped:
                raise PassError(f"{t!r} was replaced by {new!r}, which comes after it")
            new = mapped[new.id]     # a tensor of the input graph: use its rebuilt version
        if new is None or new is cur or (new.id in placed and t.flags & Flag.OUTPUT):
            new = cur
        elif new.id not in placed:   # fresh: it takes t's place in the graph
            new = remap(new, mapped)
            if not new.name:
                new.name = t.name
            new.flags |= t.flags & Flag.OUTPUT
        mapped[t.id] = new
        placed.add(new.id)
    return _finish(graph, mapped)


def remap(t: Tensor, mapped: dict[int, Tensor]) -> Tensor:
    """t with its sources and memory owner replaced by their rebuilt versions (t itself when
    none changed). A view whose owner became a view re-roots at that view's owner."""
    src = tuple(mapped.get(s.id, s) for s in t.src)
    view_src, view_offs = t.view_src, t.view_offs
    if view_src is not None:
        owner = mapped.get(view_src.id, view_src)
        if owner is not view_src:
            if owner.view_src is not None:
                view_src, view_offs = owner.view_src, simplify(owner.view_offs + t.view_offs)
            else:
                view_src = owner
    if all(a is b for a, b in zip(src, t.src)) and view_src is t.view_src:
        return t
    return copy_tensor(t, src=src, view_src=view_src, view_offs=view_offs)


def _finish(graph: Graph, mapped: dict[int, Tensor]) -> Graph:
    """The rebuilt graph: outputs mapped, tensors in the old order (fresh tensors' new
    dependencies just before them), keeping what the old graph's sinks still need."""
    has_user = {s.id for t in graph.tensors for s in deps(t)}
    sinks = [mapped[t.id] for t in graph.tensors if t.id not in has_user]
    outputs = [mapped[o.id] for o in graph.outputs]
    alive = closure(outputs + sinks)
    order: list[Tensor] = []
    emitted: set[int] = set()
    for t in graph.tensors:
        _emit(mapped[t.id], alive, emitted, order)
    return new_graph(graph, outputs, order)


def _emit(t: Tensor, alive: set[int], emitted: set[int], order: list[Tensor]) -> None:
    """Append t after whatever it needs that is not placed yet (depth first)."""
    if t.id not in emitted and t.id in alive:
        append_post_order(t, emitted, order)


def check_graph(graph: Graph) -> None:
    """Raise PassError unless every dependency precedes its user, every tensor appears once
    and the outputs are in the graph: what every pass promises about what it returns."""
    position: dict[int, int] = {}
    for i, t in enumerate(graph.tensors):
        if t.id in position:
            raise PassError(f"{t!r} appears twice in the graph")
        for d in deps(t):
            if d.id not in position:
                raise PassError(f"{t!r} needs {d!r}, which is not before it in the graph")
        position[t.id] = i
    for o in graph.outputs:
        if o.id not in position:
            raise PassError(f"output {o!r} is not in the graph")
