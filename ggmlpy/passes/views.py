"""View folding: layout-only nodes become as few strided views as possible.

Three rules (data, run by the rewrite engine bottom-up):
  - fold_chain: a view/reshape/permute/transpose of a view is one `view` op of the first
    node below the chain that is not a view. Every view already carries its final ne, nb
    and byte offset relative to its memory owner, so folding keeps those and only rewrites
    the op and its source: params ne, nb and offset (relative to the new source).
  - drop_identity: a view with its source's type, shape, strides and placement is the
    source itself (reshape to the same shape, permute(0, 1, 2, 3), a round trip).
  - cont_to_reshape: a `cont` of a tensor that is already contiguous, of the same type,
    copies nothing a reshape would not give: it becomes a reshape view. A cont that is a
    graph output stays a copy (an output keeps memory of its own).
The source of a folded view stays the node below the chain, not the memory owner, so a view
of the KV cache still depends on the set_rows that filled it.
"""
from __future__ import annotations

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import Kind
from ggmlpy.ir.symbolic import simplify
from ggmlpy.ir.tensor import Flag, Tensor, contiguous_strides, memory_root, offset_in_owner
from ggmlpy.passes.common import copy_tensor
from ggmlpy.passes.rewrite import Bindings, Pat, Rule, rewrite_graph


def _fold_chain(outer: Tensor, b: Bindings) -> Tensor:
    base = b["base"]
    offset = simplify(offset_in_owner(outer) - offset_in_owner(base))
    return copy_tensor(outer, op="view", src=(base,),
                       params={"ne": tuple(outer.ne), "nb": tuple(outer.nb), "offset": offset},
                       view_src=memory_root(base), view_offs=offset_in_owner(outer))


def _same_layout(t: Tensor, b: Bindings) -> Tensor | None:
    base = b["base"]
    same = (t.type == base.type and t.ne == base.ne and t.nb == base.nb
            and memory_root(t) is memory_root(base) and offset_in_owner(t) == offset_in_owner(base))
    return base if same else None


def _cont_to_reshape(t: Tensor, b: Bindings) -> Tensor | None:
    a = b["a"]
    if t.flags & Flag.OUTPUT or a.type != t.type or not a.is_contiguous:
        return None
    return copy_tensor(t, op="reshape", src=(a,), params={"ne": tuple(t.ne)},
                       nb=contiguous_strides(t.type, t.ne), view_src=memory_root(a),
                       view_offs=offset_in_owner(a))


VIEW_RULES: tuple[Rule, ...] = (
    Rule("drop_identity", Pat(kind=Kind.VIEW, src=(Pat(name="base"),)), _same_layout,
         "a view that changes nothing is its source"),
    Rule("fold_chain", Pat(kind=Kind.VIEW, src=(Pat(kind=Kind.VIEW, src=(Pat(name="base"),)),)),
         _fold_chain, "a view of a view is one view of the first non-view below"),
    Rule("cont_to_reshape", Pat("cont", src=(Pat(name="a"),)), _cont_to_reshape,
         "a contiguous copy of contiguous data is a reshape"),
)


def fold_views(graph: Graph) -> Graph:
    """graph with view chains folded, identity views dropped and needless conts removed."""
    return rewrite_graph(graph, VIEW_RULES)
