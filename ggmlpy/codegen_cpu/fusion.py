"""The CPU backend's fusion: its rule set, and the groups it runs as one kernel.

Its rules (CPU_RULES) are the named patterns of passes/patterns.py with this backend's kernel
predicates, in priority order; the pass pipeline marks them over the whole graph (the
"fusion" pass, which takes them from CpuBackend.fusion_rules). A backend then decides which
marked groups it runs fused (`split_groups`, the Backend hook): here a supported group
becomes one node of a fused op of FUSED_KINDS that a lowering implements (its result is the
group's output tensor, same id and memory), and the buffer plan treats exactly those groups
as one step (their interior tensors get no memory):

    norm_mul          rms_norm(x) * w, norm(x) * w        -> rms_norm_mul / norm_mul (x, w)
    residual_product  W x + r (repacked weights)          -> mul_mat_add (W, x, r)
    glu_product       act(W_gate x) * (W_up x) (repacked) -> mul_mat_glu (W_gate, W_up, x)
    expert_glu_product  the same over each token's experts    -> mul_mat_id_glu (W_gate, W_up, x, ids)
    matmul_softmax    softmax(k . q * scale + mask)       -> mul_mat_soft_max (k, q, mask)
    rope_qk           rope(q, pos), rope(k, pos)          -> rope_pair (q, pos, k, out_k): the
                      second result is written through the fourth operand

Some nodes are marked rather than fused (MARKS): a product whose right operand is a
softmax (the attention weights times V, out_prod's through a transposing view over a
quantised V cache) gets the parameter zero_tail, which lets its kernel skip the keys whose
weights are all 0 (the masked ones; kernels/matmul_float.py, float_axpy).

Each fused kernel computes the same f32 operations in the same order as the nodes it
replaces, so results are bit-identical (tests/ggmlpy/codegen_cpu/test_cpu_fusion.py). The other groups
(scale_softmax, map_chain: of the supported models only Gemma 2's soft-capping has them)
still run node by node.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ggmlpy.codegen_cpu import kernels as _kernels  # noqa: F401  (fills the lowering table)
from ggmlpy.codegen_cpu.lowering import LOWERINGS
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.tensor import Tensor
from ggmlpy.passes.fusion import MatchContext, ResolvedGroup, Rule, fusion_groups
from ggmlpy.passes.patterns import (
    EXPERT_GLU_PRODUCT, FUSED_KINDS, GLU_PRODUCT, MAP_CHAIN, MATMUL_SOFTMAX, NORM_MUL, RESIDUAL_PRODUCT, ROPE_QK, SCALE_SOFTMAX,
)
from ggmlpy.passes.rewrite import Bindings


# kernel predicates ----------------------------------------------------------------------------
def _weight_row(b: Bindings, ctx: MatchContext) -> bool:
    """The norm kernels scale by one weight row."""
    return all(d == 1 for d in b["weight"].ne[1:])


def _product_shape(b: Bindings, ctx: MatchContext) -> bool:
    """The add's result has the product's shape (the residual is read, not the product)."""
    return b["mm"].ne == b["add"].ne


CPU_RULES: tuple[Rule, ...] = (
    GLU_PRODUCT,
    EXPERT_GLU_PRODUCT,
    NORM_MUL.where(_weight_row),
    ROPE_QK,
    SCALE_SOFTMAX,
    MATMUL_SOFTMAX,
    RESIDUAL_PRODUCT.where(_product_shape),
    MAP_CHAIN,
)


# groups -> fused nodes ------------------------------------------------------------------------
def _fused(kind: str, node: Tensor, op: str, **changes) -> Tensor:
    """node as the fused op `op`, which FUSED_KINDS[kind] must list."""
    if op not in dict(FUSED_KINDS[kind].fused_ops):
        raise KeyError(f"fused op {op!r} is not listed for {kind!r} in passes/patterns.FUSED_KINDS")
    return dataclasses.replace(node, op=op, **changes)


def _norm_mul(group: ResolvedGroup) -> Tensor | None:
    norm, mul = group.nodes
    if mul.src[0] is not norm:
        return None
    return _fused("norm_mul", mul, f"{norm.op}_mul", src=(norm.src[0], mul.src[1]), params=dict(norm.params))


def _epilogue(group: ResolvedGroup) -> Tensor | None:
    mm, add = group.nodes
    residual = add.src[1] if add.src[0] is mm else add.src[0]
    if residual is mm:
        return None
    return _fused("residual_product", add, "mul_mat_add", src=(mm.src[0], mm.src[1], residual), params={})


def _gated_ffn(group: ResolvedGroup) -> Tensor | None:
    gate, up, glu = group.nodes
    if glu.src[0] is not gate or glu.src[1] is not up or gate.src[1] is not up.src[1]:
        return None
    return _fused("glu_product", glu, "mul_mat_glu", src=(gate.src[0], up.src[0], gate.src[1]),
                  params={**glu.params, "act": glu.op})


def _gated_experts(group: ResolvedGroup) -> Tensor | None:
    gate, up, glu = group.nodes
    if (glu.src[0] is not gate or glu.src[1] is not up or gate.src[1] is not up.src[1]
            or gate.src[2] is not up.src[2]):
        return None
    return _fused("expert_glu_product", glu, "mul_mat_id_glu", src=(gate.src[0], up.src[0], gate.src[1], gate.src[2]),
                  params={**glu.params, "act": glu.op})


def _attention_scores(group: ResolvedGroup) -> Tensor | None:
    kq, softmax = group.nodes
    if softmax.src[0] is not kq or tuple(kq.ne) != tuple(softmax.ne):
        return None
    return _fused("matmul_softmax", softmax, "mul_mat_soft_max", src=(*kq.src, *softmax.src[1:]))


def _rope_pair(group: ResolvedGroup) -> Tensor | None:
    rope_a, rope_b = group.nodes
    if len(rope_a.src) != 2 or rope_a.src[1] is not rope_b.src[1]:
        return None   # (frequency factors would need a fifth operand)
    return _fused("rope_qk", rope_a, "rope_pair", src=(rope_a.src[0], rope_a.src[1], rope_b.src[0], rope_b))


FUSED: dict[str, Callable[[ResolvedGroup], Tensor | None]] = {
    "rope_qk": _rope_pair,
    "matmul_softmax": _attention_scores,
    "glu_product": _gated_ffn,
    "expert_glu_product": _gated_experts,
    "norm_mul": _norm_mul,
    "residual_product": _epilogue,
}


def fused_nodes(graph: Graph, nodes: list[Tensor]) -> list[tuple[ResolvedGroup, Tensor]]:
    """The marked groups of `graph` lying within `nodes` (one split) that a CPU kernel runs
    as one, each with the fused node that computes it."""
    own = {n.id for n in nodes}
    out = []
    for group in fusion_groups(graph):
        make = FUSED.get(group.pattern)
        if make is None or not all(t.id in own for t in group.nodes):
            continue
        fused = make(group)
        lowering = LOWERINGS.get(fused.op) if fused is not None else None
        if lowering is not None and lowering.supports(fused):
            out.append((group, fused))
    return out


def split_groups(graph: Graph, nodes: list[Tensor]) -> tuple[list[Tensor], list[ResolvedGroup]]:
    """CpuBackend.split_groups: the split's nodes in their order (the fusion pass ordered
    the graph already) and the groups run as one kernel each."""
    return list(nodes), [group for group, _ in fused_nodes(graph, nodes)]


def _weights_times_values(node: Tensor) -> Tensor | None:
    """mul_mat(v, softmax(...)), or out_prod(v, transpose(softmax(...))) over a quantised V
    cache: marked zero_tail (parameters are part of the kernel key)."""
    weights = node.src[1] if node.op in ("mul_mat", "out_prod") else None
    if weights is not None and node.op == "out_prod" and weights.op in ("view", "permute"):
        weights = weights.src[0]
    if weights is None or weights.op != "soft_max":
        return None
    return dataclasses.replace(node, params={**node.params, "zero_tail": True})


MARKS: list[Callable[[Tensor], Tensor | None]] = [_weights_times_values]


class CpuFusion:
    """The groups of `graph` within `nodes` (one split) that run as one kernel here, and
    the nodes MARKS annotates."""

    def __init__(self, graph: Graph, nodes: list[Tensor]):
        self.replacement: dict[int, Tensor] = {}   # group output id -> its fused node
        self.interior: set[int] = set()
        self.group_keys: set[tuple[int, ...]] = set()
        for group, fused in fused_nodes(graph, nodes):
            self.replacement[fused.id] = fused
            # every other member is computed by the fused kernel (interior ones get no memory)
            self.interior.update(t.id for t in group.nodes if t.id != fused.id)
            self.group_keys.add(tuple(t.id for t in group.nodes))
        for node in nodes:
            for mark in MARKS:
                marked = mark(self.replacement.get(node.id, node))
                if marked is not None:
                    self.replacement[node.id] = marked

    def runs_fused(self, group: ResolvedGroup) -> bool:
        """For the buffer plan (passes/buffers.py): whether this group is one step."""
        return tuple(t.id for t in group.nodes) in self.group_keys

    def apply(self, nodes: list[Tensor]) -> list[Tensor]:
        """nodes with each fused group's other members dropped and its node replaced."""
        return [self.replacement.get(n.id, n) for n in nodes if n.id not in self.interior]
