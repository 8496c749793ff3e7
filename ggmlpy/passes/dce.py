"""Dead-code elimination: keep what the outputs need, and every write.

A WRITE op (set_rows, cpy) changes memory that outlives the graph (the KV cache), so it is a
root like an output even when nothing in the graph reads its result. In the llama graphs it
is reachable anyway (the K/V views that attention reads are views of the set_rows result,
which orders the read after the write); the K-shift graph lists its cpy nodes as outputs.
"""
from __future__ import annotations

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import Kind
from ggmlpy.passes.common import closure, new_graph, op_kind


def eliminate_dead_code(graph: Graph) -> Graph:
    """graph without the tensors that neither an output nor a write depends on. Nothing is
    copied: kept tensors are the input's own, in the input's order."""
    roots = list(graph.outputs) + [t for t in graph.tensors if op_kind(t) == Kind.WRITE]
    alive = closure(roots)
    return new_graph(graph, graph.outputs, [t for t in graph.tensors if t.id in alive])
