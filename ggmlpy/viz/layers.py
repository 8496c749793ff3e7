"""Which transformer layer a tensor belongs to, from the layer-indexed names model files give
(`attn_norm-3`, `blk.3.attn_q.weight`, `cache_k_l3`), so the page can fold a layer into one box.

Unnamed tensors (norms before their multiply, views, permutes) take the layer of the first
consumer that has one (none when their readers belong to no layer: the output norm), and
unnamed tensors nothing reads that of their first source: they sit between named nodes of
one layer. Named tensors without an index (inp_pos, result_output) belong to no layer.
"""
from __future__ import annotations

import re

from ggmlpy.ir.graph import Graph
from ggmlpy.passes.common import consumers

LAYER_PATTERNS = (re.compile(r"^blk\.(\d+)\."), re.compile(r"-(\d+)$"), re.compile(r"_l(\d+)$"))


def layer_of_name(name: str) -> int | None:
    """The layer index a tensor name carries, or None."""
    for pattern in LAYER_PATTERNS:
        m = pattern.search(name)
        if m:
            return int(m.group(1))
    return None


def tensor_layers(graph: Graph) -> dict[int, int | None]:
    """Tensor id -> layer (None: outside every layer), for every tensor of graph."""
    layer = {t.id: layer_of_name(t.name) for t in graph.tensors}
    users = consumers(graph.tensors)
    for t in reversed(graph.tensors):   # consumers come later: walk back so chains resolve
        if not t.name and layer[t.id] is None:
            layer[t.id] = next((layer[u.id] for u in users.get(t.id, []) if layer[u.id] is not None), None)
    for t in graph.tensors:   # unnamed tensors nothing reads: from their sources
        if not t.name and layer[t.id] is None and not users.get(t.id):
            deps = list(t.src) + ([t.view_src] if t.view_src is not None else [])
            layer[t.id] = next((layer[s.id] for s in deps if layer.get(s.id) is not None), None)
    return layer
