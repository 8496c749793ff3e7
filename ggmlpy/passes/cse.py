"""Common-subexpression elimination: nodes with the same op, params, sources, type, shape,
strides and view placement are one node.

Never merged: leaves (each is bound by name to its own data), writes (each is a side
effect), graph outputs (each keeps its own node and memory), and computing nodes that read
memory some write of this graph changes (what they see depends on when they run; views of
such memory are only addresses and do merge).
"""
from __future__ import annotations

from typing import Any, Hashable

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import Kind
from ggmlpy.ir.symbolic import SymExpr
from ggmlpy.ir.tensor import Flag, Tensor, memory_root
from ggmlpy.passes.common import op_kind, rebuild


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """graph with every node that repeats an earlier one replaced by that earlier node."""
    written = {memory_root(t).id for t in graph.tensors if op_kind(t) == Kind.WRITE}
    first: dict[Hashable, Tensor] = {}

    def replace(t: Tensor) -> Tensor | None:
        if not _mergeable(t, written):
            return None
        key = node_key(t)
        if key in first:
            return first[key]
        first[key] = t
        return None

    return rebuild(graph, replace)


def _mergeable(t: Tensor, written: set[int]) -> bool:
    kind = op_kind(t)
    if t.is_leaf or kind == Kind.WRITE or t.flags & Flag.OUTPUT:
        return False
    if kind == Kind.VIEW:
        return True
    return all(memory_root(s).id not in written for s in t.src)


def node_key(t: Tensor) -> Hashable:
    """Everything that decides a node's value and layout; sources by identity."""
    return (t.op, t.type, t.ne, t.nb, canonical(t.params), tuple(s.id for s in t.src),
            t.view_src.id if t.view_src is not None else None, t.view_offs)


def canonical(value: Any) -> Hashable:
    """Params as a hashable value; floats by repr so -0.0 and 0.0 differ and NaN equals NaN."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(canonical(v) for v in value)
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, (int, str, bool, SymExpr)) or value is None:
        return value
    return ("repr", repr(value))
