"""From a split's nodes to the steps the CUDA backend launches, fusing what its rules group.

The CUDA backend marks its own splits after scheduling (docs/backends.md section 4): the
fusion engine (passes/fusion.py, `group_nodes`) groups a split's nodes with the CUDA rule
set (fusion_rules.py: the named patterns of passes/patterns.py with this backend's kernel
predicates, chosen by LowerOptions) and orders them so that each group is consecutive
(CudaBackend.split_groups gives the same). Each group then becomes one Step through STEPS, a
table keyed by the group's kind (passes/patterns.FUSED_KINDS; as codegen_cpu/fusion.py turns
the CPU's groups into fused nodes); every other node is lowered alone through the lowering
registry (lowering.py), views excepted (they launch nothing). Why per split rather than a graph pass: the rules depend on this backend's
options (fuse_oproj, fuse_rope, the matrix-vector kernel's column limit) and on the split's
boundary (a value another split reads must be materialised), both known only here; and the
CPU's groups over the same nodes, marked by the "fusion" pass, never conflict with these.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ggmlpy.codegen_cuda.fusion_rules import SINGLE_TOKEN_SYMBOLS, CudaFusionOptions, cuda_rules
from ggmlpy.codegen_cuda.lower_attention import FEW_BLOCKS_THREADS, AttentionStep, OutProjection
from ggmlpy.codegen_cuda.lower_elementwise import ElementwiseStep
from ggmlpy.codegen_cuda.lower_matmul import MatMulOptions, MatMulStep, PreNorm, RopeEpilogue, RowStore
from ggmlpy.codegen_cuda.lower_simple import NormStep, RopeStep
from ggmlpy.codegen_cuda.lowering import lower
from ggmlpy.codegen_cuda.steps import LoweringError, Step
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.tensor import Tensor
from ggmlpy.passes.common import consumers
from ggmlpy.passes.fusion import ResolvedGroup, group_nodes, resolve_groups
from ggmlpy.passes.patterns import GLUS, NORMS

__all__ = ["LowerOptions", "SINGLE_TOKEN_SYMBOLS", "STEPS", "lower_split", "split_groups"]


@dataclass
class LowerOptions:
    fuse: bool = True  # False: no rules, a step per node
    matmul: MatMulOptions = field(default_factory=MatMulOptions)
    fuse_oproj: bool = False  # a decode attention computes its output projection and residual add
    attn_threads: int = FEW_BLOCKS_THREADS  # threads per attention block on small grids (decode)

    def fusion(self) -> CudaFusionOptions | None:
        """The knobs that choose the fusion rules (None: fuse nothing)."""
        if not self.fuse:
            return None
        return CudaFusionOptions(self.matmul.max_cols, self.matmul.fuse_rope, self.fuse_oproj)


def split_groups(graph: Graph, nodes: list[Tensor], opts: LowerOptions) -> tuple[list[Tensor], list[ResolvedGroup]]:
    """The split's nodes in the order they run (each group consecutive) and its groups."""
    fusion = opts.fusion()
    if fusion is None:
        return list(nodes), []
    users = consumers(graph.tensors)
    order, groups = group_nodes(list(nodes), users, cuda_rules(fusion), graph.hints)
    at = {t.id: i for i, t in enumerate(order)}
    return order, sorted(resolve_groups(groups, users), key=lambda g: at[g.nodes[0].id])


def lower_split(graph: Graph, nodes: list[Tensor], opts: LowerOptions) -> list[Step]:
    """The steps of one split, in the order they launch."""
    order, groups = split_groups(graph, nodes, opts)
    starting = {g.nodes[0].id: g for g in groups}
    grouped = {t.id for g in groups for t in g.nodes}
    steps: list[Step] = []
    for node in order:
        group = starting.get(node.id)
        if group is not None:
            steps.append(STEPS[group.pattern](group, opts))
        elif node.id not in grouped and OPS[node.op].kind != Kind.VIEW:
            steps.append(lower(node, opts))
    return steps


# the table: a group's pattern -> its step ------------------------------------------------------
def _of(group: ResolvedGroup, *ops: str) -> list[Tensor]:
    return [t for t in group.nodes if t.op in ops]


def _one(group: ResolvedGroup, *ops: str) -> Tensor | None:
    found = _of(group, *ops)
    if len(found) > 1:
        raise LoweringError(f"{group.pattern} group with {len(found)} {'/'.join(ops)} nodes")
    return found[0] if found else None


def _stored(sr: Tensor) -> tuple[Tensor, list[Tensor]]:
    """What a set_rows stores (under its reshapes), and the reshapes (outermost last)."""
    views, t = [], sr.src[1]
    while t.op == "reshape":
        views.append(t)
        t = t.src[0]
    return t, views[::-1]


def _attention(group: ResolvedGroup, opts: LowerOptions) -> Step:
    sm = _one(group, "soft_max")
    # the V product reads the weights, or (out_prod, a quantised V cache) their transpose
    kqv = next(t for t in _of(group, "mul_mat") + _of(group, "out_prod")
               if t.src[1] is sm or (t.op == "out_prod" and t.src[1].src and t.src[1].src[0] is sm))
    perm = next((t for t in _of(group, "permute") if t.src[0] is kqv), None)
    cont, add = _one(group, "cont"), _one(group, "add")
    oproj = None
    if add is not None:
        mm = next(t for t in _of(group, "mul_mat") if t.src[1] is cont)
        oproj = OutProjection(mm, add)
    weights = kqv.src[1] if kqv.src[1] is not sm else None
    return AttentionStep(sm.src[0], sm, kqv, perm, cont, oproj=oproj, few_blocks_threads=opts.attn_threads,
                         weights_view=weights)


def _product(group: ResolvedGroup, opts: LowerOptions) -> Step:
    glu, add = _one(group, *GLUS), _one(group, "add")
    mats = list(glu.src) if glu is not None else _of(group, "mul_mat")
    norm, mul = _one(group, *NORMS), _one(group, "mul")
    pre = None
    if norm is not None:
        weight = (mul.src[1] if mul.src[0] is norm else mul.src[0]) if mul is not None else None
        pre = PreNorm(norm, mul, weight)
    store, ropes = None, {}
    for rope in _of(group, "rope"):
        ropes[mats.index(rope.src[0].src[0])] = RopeEpilogue(rope.src[0], rope, [], None)
    for sr in _of(group, "set_rows"):
        under, views = _stored(sr)
        if under.op == "rope":
            i = mats.index(under.src[0].src[0])
            ropes[i] = RopeEpilogue(ropes[i].view, under, views, sr)
        else:
            store = RowStore(mats.index(under), sr, views)
    return MatMulStep(mats, opts.matmul, glu=glu, add=add, prenorm=pre, store=store, ropes=dict(sorted(ropes.items())))


def _rope(group: ResolvedGroup, opts: LowerOptions) -> Step:
    stores = {}
    for sr in _of(group, "set_rows"):
        under, views = _stored(sr)
        stores[under.id] = (views, sr)
    return RopeStep([(rope, stores.get(rope.id)) for rope in _of(group, "rope")])


def _norm_mul(group: ResolvedGroup, opts: LowerOptions) -> Step:
    norm, mul = group.nodes
    return NormStep(norm, mul)


def _chain(group: ResolvedGroup, opts: LowerOptions) -> Step:
    return ElementwiseStep(list(group.nodes))


STEPS: dict[str, Callable[[ResolvedGroup, LowerOptions], Step]] = {
    "attention": _attention,
    "glu_product": _product,
    "residual_product": _product,
    "shared_x_product": _product,
    "rope": _rope,
    "norm_mul": _norm_mul,
    "map_chain": _chain,
}
