"""A graph as bytes: what a remote actor compiles (distributed/), and what the disk cache of
optimised graphs stores (passes/stored.py).

The graph is pickled as (tensors in topological order, output ids, hints), tensors first:
pickle then meets every tensor after its sources, so it never recurses deeper than one
tensor's fields. Pickling the `Graph` itself would start from its outputs and recurse down
the whole model (a 30-layer model is thousands of frames deep, past Python's limit).
Tensor ids travel with the tensors, so a host and its actor name tensors alike (the
activations of a hop are keyed by the id of the tensor that owns their memory); a graph read
back from disk instead takes fresh ids (`fresh_ids`), so it can never share one with a
tensor this process made. Symbolic dimensions rebuild their hashes when loaded
(SymExpr.__reduce__): a string's hash differs from process to process.
"""
from __future__ import annotations

import pickle

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.tensor import Tensor, new_id


def dump_graph(graph: Graph) -> bytes:
    """The graph's bytes (pickle protocol 5), for `load_graph`."""
    return pickle.dumps((graph.tensors, [o.id for o in graph.outputs], dict(graph.hints)), protocol=5)


def load_graph(blob: bytes, fresh_ids: bool = False) -> tuple[Graph, dict[int, Tensor]]:
    """The graph `dump_graph` wrote, and its tensors by id (this process's ids if
    `fresh_ids`, else the writer's)."""
    tensors, output_ids, hints = pickle.loads(blob)
    by_old_id = {t.id: t for t in tensors}
    outputs = [by_old_id[i] for i in output_ids]
    if fresh_ids:
        for t in tensors:
            t.id = new_id()
    return Graph(outputs, tensors, hints), {t.id: t for t in tensors}
