"""The fusion vocabulary: every kind of fusion group, and the named patterns that find them.

A fusion group's `pattern` (passes/fusion.py) is always a key of FUSED_KINDS, whichever
backend formed it, and so is every fused node op a backend replaces a group with (the CPU's
`mul_mat_add`, ...: FusedKind.fused_ops). The patterns below are data (`Pat` trees, as
tinygrad's PatternMatcher), defined once here; a backend composes its rule set from them
plus its own kernel predicates (whether it has a kernel for this instance: types, shapes,
`FusionRule.where`), in its own package (codegen_cpu/fusion.py, codegen_cuda/fusion_rules.py),
and hands that rule set to the fusion engine. A pattern's own conditions (a scale without
bias folds into a softmax; two ropes are one layer's q and k) are part of the pattern.

A group a pattern cannot describe as one tree of sources (products sharing x, a rope and its
cache store, a product's epilogues) has its kind here all the same; the backend that forms
it finds its members with the engine's context (MatchContext) around these patterns.
"""
from __future__ import annotations

from dataclasses import dataclass

from ggmlpy.ir.ops import Kind
from ggmlpy.ir.tensor import Tensor
from ggmlpy.passes.common import op_kind
from ggmlpy.passes.fusion import ChainRule, FusionRule, MatchContext
from ggmlpy.passes.rewrite import Bindings, Pat

NORMS = ("rms_norm", "norm")
GLUS = ("swiglu", "geglu")


@dataclass(frozen=True)
class FusedKind:
    """One kind of fusion group: what its kernel computes, which nodes are its members, and
    the fused node ops (op -> operands) a backend may replace such a group with."""

    computes: str
    members: str
    fused_ops: tuple[tuple[str, str], ...] = ()


FUSED_KINDS: dict[str, FusedKind] = {
    "attention": FusedKind(
        "softmax(K.Q) V per (token, head), written in the final cont's layout; with the output "
        "projection, W_o . out + residual for one token",
        "mul_mat(K, Q), soft_max, mul_mat(V, .) (over a quantised V cache: transpose, out_prod(V, .)) "
        "[, permute, cont] [, mul_mat(W_o, .), add]"),
    "glu_product": FusedKind(
        "act(x @ W_gate) * (x @ W_up): both products read x once",
        "mul_mat(W_gate, x), mul_mat(W_up, x), swiglu/geglu [+ product extensions]",
        (("mul_mat_glu", "(W_gate, W_up, x), param act: the glu op"),)),
    "expert_glu_product": FusedKind(
        "act(x @ W_gate[e]) * (x @ W_up[e]) for each token's selected experts e: both expert "
        "products from one quantisation of x and one grouping of the tokens by expert",
        "mul_mat_id(W_gate, x, ids), mul_mat_id(W_up, x, ids), swiglu/geglu",
        (("mul_mat_id_glu", "(W_gate, W_up, x, ids), param act: the glu op"),)),
    "residual_product": FusedKind(
        "W x + residual: the add in the product's epilogue",
        "mul_mat(W, x), add(., residual) [+ product extensions]",
        (("mul_mat_add", "(W, x, residual)"),)),
    "shared_x_product": FusedKind(
        "up to three products of one x (Q, K, V) in one launch",
        "mul_mat(W_i, x) ... [+ product extensions]"),
    "norm_mul": FusedKind(
        "normalise rows and scale them by a weight",
        "rms_norm/norm, mul(., weight)",
        (("rms_norm_mul", "(x, weight), rms_norm's params"), ("norm_mul", "(x, weight), norm's params"))),
    "rope_qk": FusedKind(
        "rotate q and k of one attention layer with one cos/sin table",
        "rope(q, pos), rope(k, pos)",
        (("rope_pair", "(q, pos, k, out_k): the second result is written through the fourth operand"),)),
    "rope": FusedKind(
        "ropes sharing positions, frequency factors and parameters (q and k) in one launch, each "
        "with its rows stored into a cache when that is its only use",
        "rope [, reshape..., set_rows] [, a second rope [, reshape..., set_rows]]"),
    "scale_softmax": FusedKind(
        "a plain scale folded into the softmax's scale",
        "scale (no bias), soft_max"),
    "matmul_softmax": FusedKind(
        "attention scores k.q, masked, scaled and normalised",
        "mul_mat(k, q), soft_max",
        (("mul_mat_soft_max", "(k, q, mask...), soft_max's params"),)),
    "map_chain": FusedKind(
        "elementwise ops, each the only reader of the previous, in one kernel",
        "the ops of the chain, in order"),
}
"""Product extensions (CUDA's matrix-vector kernel, codegen_cuda/fusion_rules.py): `prenorm`
(x = rms_norm/norm(y) [* w] computed inside), a KV `store` (reshape..., set_rows of one
product) and `rope` epilogues (reshape, rope [, reshape..., set_rows])."""


def fused_op_kinds() -> dict[str, str]:
    """Every fused node op of FUSED_KINDS -> the kind it stands for."""
    return {op: kind for kind, k in FUSED_KINDS.items() for op, _ in k.fused_ops}


# pattern conditions ----------------------------------------------------------------------------
def _no_bias(t: Tensor) -> bool:
    return t.params.get("b", 0.0) == 0.0


def projection_input(t: Tensor, max_steps: int = 8) -> Tensor | None:
    """The activation x of the projection mul_mat(w, x) that t derives from through views
    and row/elementwise ops on its first source (q and k norms included), if any."""
    for _ in range(max_steps):
        if t.op == "mul_mat":
            return t.src[1]
        if op_kind(t) not in (Kind.VIEW, Kind.ROW, Kind.ELEMENTWISE) or not t.src:
            return None
        t = t.src[0]
    return None


def _qk_pair(b: Bindings, ctx: MatchContext) -> bool:
    """Two ropes with the same parameters, positions and frequency factors, applied to
    projections of the same activation: the q and the k of one attention layer."""
    a, c = b["rope_a"], b["rope_b"]
    if a.params != c.params or len(a.src) != len(c.src):
        return False
    if any(x is not y for x, y in zip(a.src[2:], c.src[2:])):
        return False
    xa = projection_input(a.src[0])
    return xa is not None and xa is projection_input(c.src[0])


# the named patterns ----------------------------------------------------------------------------
def _pattern(kind: str, roots: tuple[Pat, ...], members: tuple[str, ...], **kw) -> FusionRule:
    return FusionRule(kind, roots, members, doc=FUSED_KINDS[kind].computes, **kw)


_ROPE_SRC = (Pat(), Pat(name="pos"))

GLU_PRODUCT = _pattern("glu_product", (Pat(GLUS, name="glu", src=(
    Pat("mul_mat", name="gate", src=(Pat(name="w_gate"), Pat(name="x"))),
    Pat("mul_mat", name="up", src=(Pat(name="w_up"), Pat(name="x"))))),), ("gate", "up", "glu"))
EXPERT_GLU_PRODUCT = _pattern("expert_glu_product", (Pat(GLUS, name="glu", src=(
    Pat("mul_mat_id", name="gate", src=(Pat(name="w_gate"), Pat(name="x"), Pat(name="ids"))),
    Pat("mul_mat_id", name="up", src=(Pat(name="w_up"), Pat(name="x"), Pat(name="ids"))))),), ("gate", "up", "glu"))
NORM_MUL = _pattern("norm_mul", (Pat("mul", name="mul", src=(Pat(NORMS, name="norm"), Pat(name="weight"))),),
                    ("norm", "mul"))
ROPE_QK = _pattern("rope_qk", (Pat("rope", name="rope_a", extra_src=True, src=_ROPE_SRC),
                               Pat("rope", name="rope_b", extra_src=True, src=_ROPE_SRC)),
                   ("rope_a", "rope_b"), check=_qk_pair)
SCALE_SOFTMAX = _pattern("scale_softmax", (Pat("soft_max", name="softmax", extra_src=True, src=(
    Pat("scale", name="scale", where=_no_bias),)),), ("scale", "softmax"))
MATMUL_SOFTMAX = _pattern("matmul_softmax", (Pat("soft_max", name="softmax", extra_src=True, src=(
    Pat("mul_mat", name="kq"),)),), ("kq", "softmax"))
RESIDUAL_PRODUCT = _pattern("residual_product", (Pat("add", name="add", commutative=True, src=(
    Pat("mul_mat", name="mm"), Pat(name="residual"))),), ("mm", "add"))
ATTENTION = _pattern("attention", (Pat("mul_mat", name="kqv", src=(
    Pat(name="v"), Pat("soft_max", name="sm", extra_src=True, src=(
        Pat("mul_mat", name="kq", src=(Pat(name="k"), Pat(name="q"))),)))),), ("kq", "sm", "kqv"),
    views_and_writes=True)
# the same over a quantised V cache (llama/kv_attention.py): V read by rows, out_prod(V, weights^T)
ATTENTION_QV = _pattern("attention", (Pat("out_prod", name="kqv", src=(
    Pat(name="v"), Pat(kind=Kind.VIEW, name="smt", src=(Pat("soft_max", name="sm", extra_src=True, src=(
        Pat("mul_mat", name="kq", src=(Pat(name="k"), Pat(name="q"))),)),)))),), ("kq", "sm", "smt", "kqv"),
    views_and_writes=True)
MAP_CHAIN = ChainRule("map_chain", doc=FUSED_KINDS["map_chain"].computes)
