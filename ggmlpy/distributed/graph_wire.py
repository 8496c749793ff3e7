"""A compiled graph's IR on the wire: what a remote actor needs to compile its splits.

The graph is pickled as (tensors in topological order, output ids, hints), tensors first:
pickle then meets every tensor after its sources, so it never recurses deeper than one
tensor's fields. Pickling the `Graph` itself would start from its outputs and recurse down
the whole model (a 30-layer model is thousands of frames deep, past Python's limit).
Tensor ids travel with the tensors, so the host and the actor name tensors alike: the
activations of a hop are keyed by the id of the tensor that owns their memory.
"""
from __future__ import annotations

import pickle

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.tensor import Tensor


def dump_graph(graph: Graph) -> bytes:
    """The graph's bytes (pickle protocol 5), for `load_graph` on the other side."""
    return pickle.dumps((graph.tensors, [o.id for o in graph.outputs], dict(graph.hints)), protocol=5)


def load_graph(blob: bytes) -> tuple[Graph, dict[int, Tensor]]:
    """The graph `dump_graph` wrote, and its tensors by id."""
    tensors, output_ids, hints = pickle.loads(blob)
    by_id = {t.id: t for t in tensors}
    return Graph([by_id[i] for i in output_ids], tensors, hints), by_id
