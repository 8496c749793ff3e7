"""The CUDA backend's fusion rules: which nodes of a split one CUDA kernel computes.

These are rules of the fusion engine (passes/fusion.py: candidates, `group_nodes`), in
priority order (a node joins at most one group, earlier rules win), built on the named
patterns of passes/patterns.py (group kinds: FUSED_KINDS) with this backend's kernel
predicates:

  attention         mul_mat(K, Q) -> soft_max -> mul_mat(V, .) [-> permute -> cont]; with
                    `fuse_oproj`, also add(mul_mat(wo, cont), residual) for one token
  glu_product       mul_mat(gate, x), mul_mat(up, x) -> swiglu/geglu            (few columns)
  residual_product  mul_mat(W, x) -> add(., residual)                        (either kernel)
  shared_x_product  up to MAX_GROUP mul_mats sharing x and weight type (Q, K, V) (few columns)
  rope              two ropes with the same positions and parameters (Q and K), and a rope's
                    rows stored into a cache: rope -> reshape -> set_rows(cache, ., idx)
  norm_mul          rms_norm/norm -> mul(., weight)
  map_chain         map ops each read only by the next (scale -> tanh -> scale)

A product on the matrix-vector kernel (few columns guaranteed) takes extensions into its
group: `prenorm` (x = rms_norm/norm(y) [* w], computed inside), a KV `store` (one product's
result only stored as cache rows: the set_rows of V) and, with `fuse_rope`, `rope`
epilogues (a product only read through reshape -> rope, mode 0, rotated in the epilogue,
and stored as cache rows when that is the rope's only use: K). A rule yields the product
with its extensions first and the bare product after it, so the engine falls back to the
bare one when the whole would not run as one step.

The conditions that depend on the CUDA kernels (the matrix-vector kernel's eligibility,
dq8 weight types, head sizes) are the kernels' own predicates. The attention, product and
norm rules match their named patterns (ATTENTION, GLU_PRODUCT, RESIDUAL_PRODUCT, NORM_MUL);
what a tree of sources cannot say (products sharing x, a product's epilogues, a rope's cache
store and its partner) the rules find with the engine's MatchContext around them.

Attention is a rule here, not an op the model builds (llama.cpp chooses its fused flash
attention, GGML_OP_FLASH_ATTN_EXT, at graph-build time): the graph keeps the plain chain
every backend runs (the reference backend's oracle, the CPU's matmul_softmax group,
fuse=False), a chain the kernel cannot run (Gemma 2's soft-capping between the product and
the softmax) is simply not grouped, and no model builder or IR op has to change.

Placement: the engine runs each group as one consecutive step, reordering the split's nodes
(data flow and cache write order kept) and refusing a group that would need its own output;
so no rule checks what lies between its members (a cache access a store would move past:
the write-order edges and the cycle check decide that).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterator, Literal

from ggmlpy.codegen_cuda.lower_attention import MAX_DPL
from ggmlpy.codegen_cuda.lower_elementwise import MAP_OPS
from ggmlpy.codegen_cuda.lower_matmul import a_rows_contiguous, matvec_ok
from ggmlpy.codegen_cuda.steps import DQ8_TYPES, KV_QUANT_TYPES, same_shape, static_int
from ggmlpy.ir.ops.common import can_repeat
from ggmlpy.ir.symbolic import SymExpr
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size
from ggmlpy.passes.fusion import Candidate, MatchContext, Rule
from ggmlpy.passes.patterns import (
    ATTENTION, ATTENTION_QV, FUSED_KINDS, GLU_PRODUCT, MAP_CHAIN, NORM_MUL, NORMS, RESIDUAL_PRODUCT,
)
from ggmlpy.passes.rewrite import Bindings, match, matches

MAX_GROUP = 3  # products sharing x in one matrix-vector launch
SINGLE_TOKEN_SYMBOLS = {"n_tokens": 1, "n_outputs": 1}


@dataclass(frozen=True)
class CudaFusionOptions:
    """The knobs of LowerOptions that choose rules: the matrix-vector kernel's column limit
    (0: never, so no product extensions), rope epilogues, the attention's output projection."""

    max_cols: int = 8
    fuse_rope: bool = True
    fuse_oproj: bool = False


def by_position(ts: list[Tensor], ctx: MatchContext) -> list[Tensor]:
    return sorted(ts, key=lambda t: ctx.position[t.id])


def cols_bound(b: Tensor, ctx: MatchContext) -> int | None:
    """A static upper bound on b's column count (ne[1]), when one is known: one-token graphs
    (hints["tokens"] == "single") have n_tokens = n_outputs = 1."""
    n = b.ne[1]
    if isinstance(n, int):
        return n
    if ctx.hints.get("tokens") == "single" and isinstance(n, SymExpr) and n.symbols <= set(SINGLE_TOKEN_SYMBOLS):
        return n.eval(SINGLE_TOKEN_SYMBOLS)
    return None


def vector_only(mm: Tensor, ctx: MatchContext, opts: CudaFusionOptions) -> bool:
    """Whether mm = mul_mat(a, b) always runs on the matrix-vector kernel (few columns)."""
    a, b = mm.src
    bound = cols_bound(b, ctx)
    return bound is not None and 0 < opts.max_cols and bound <= opts.max_cols and matvec_ok(a, b)


# attention ------------------------------------------------------------------------------------
def match_attention(kqv: Tensor, ctx: MatchContext) -> list[Tensor] | None:
    """[kq, sm, kqv] (+ [perm, cont]) when `kqv` ends an attention chain (the ATTENTION
    pattern) the kernel handles (attention_supported); over a quantised V cache (ATTENTION_QV)
    [kq, sm, transposed sm, kqv = out_prod] (+ ...)."""
    b = match((ATTENTION if kqv.op == "mul_mat" else ATTENTION_QV).roots[0], kqv)
    if b is None or not attention_supported(b, ctx):
        return None
    kq, sm = b["kq"], b["sm"]
    out = [kq, sm, *([b["smt"]] if "smt" in b else []), kqv]
    perm = ctx.only_consumer(kqv)
    if perm is not None and perm.op == "permute":
        cont = ctx.only_consumer(perm)
        if cont is not None and cont.op == "cont" and cont.type == GGMLType.F32:
            out += [perm, cont]
    return out


def attention_supported(b: Bindings, ctx: MatchContext) -> bool:
    """lower_attention.py's conditions: the softmax and the scores read only by the next
    step, f16/f32 K and V views, heads sharing K/V heads, head sizes."""
    kq, sm, kqv, k, q, v = (b[n] for n in ("kq", "sm", "kqv", "k", "q", "v"))
    weights = b.get("smt", sm)   # what the V product reads: sm, or its transpose (out_prod)
    if ctx.only_consumer(kq) is not sm or ctx.only_consumer(weights) is not kqv:
        return False
    if weights is not sm and (ctx.only_consumer(sm) is not weights or not _transposed(weights, sm)):
        return False
    float_kv = (GGMLType.F32, GGMLType.F16)
    if not (k.type in float_kv or _quant_rows(k)) or q.type != GGMLType.F32:
        return False
    if not (v.type in float_kv or (weights is not sm and _quant_rows(v))):
        return False
    if any(t.ne[3] != 1 for t in (k, q, v, kq)):
        return False
    hk, hv = static_int(q.ne[0]), static_int(v.ne[1] if weights is sm else v.ne[0])
    n_head, k_heads, v_heads = static_int(q.ne[2]), static_int(k.ne[2]), static_int(v.ne[2])
    if hk is None or hv is None or n_head is None or k_heads is None or v_heads is None:
        return False
    if hv > 32 * MAX_DPL or hk > 1024 or n_head % k_heads or n_head % v_heads or sm.ne[2] != q.ne[2]:
        return False
    return not (len(sm.src) > 1 and (sm.src[1].type not in float_kv or sm.src[1].ne[3] != 1))


def _quant_rows(t: Tensor) -> bool:
    """A quantised KV cache view read along its rows' blocks (the kernel decodes them)."""
    return t.type in KV_QUANT_TYPES and t.nb[0] == type_size(t.type) and static_int(t.ne[0]) is not None \
        and t.ne[0] % 32 == 0


def _transposed(t: Tensor, of: Tensor) -> bool:
    """t is `of` with dims 0 and 1 swapped, over the same memory."""
    return (tuple(t.ne) == (of.ne[1], of.ne[0], *of.ne[2:]) and tuple(t.nb) == (of.nb[1], of.nb[0], *of.nb[2:])
            and t.view_offs == of.view_offs)


def residual_of(add: Tensor, ctx: MatchContext) -> tuple[Tensor, Tensor] | None:
    """(mm, residual) when add = mm + residual (RESIDUAL_PRODUCT, either order, the first
    that fits) can be the product's epilogue (residual_supported)."""
    for b in matches(RESIDUAL_PRODUCT.roots[0], add):
        if residual_supported(b, ctx):
            return b["mm"], b["residual"]
    return None


def residual_supported(b: Bindings, ctx: MatchContext) -> bool:
    """mm read by nothing but the add, the residual f32 of mm's shape."""
    mm, other, add = b["mm"], b["residual"], b["add"]
    return other is not mm and ctx.free(mm) and ctx.only_consumer(mm) is add \
        and same_shape(mm, other) and other.type == GGMLType.F32


def out_projection(attention: list[Tensor], ctx: MatchContext) -> list[Tensor] | None:
    """[mm, add] for add(mul_mat(wo, out), residual) alone reading a one-token attention's
    output `out` (the cont of its heads), when the attention kernel can compute it
    (attention.cu.j2, `oproj`): wo a plain matrix of a dq8 type with a row per output,
    heads of a multiple of 8 dims that divides 256."""
    kq, cont = attention[0], attention[-1]
    if cont.op != "cont":
        return None
    kqv = attention[-3]
    if cols_bound(cont, ctx) != 1:
        return None
    hv, n_head = kqv.ne[0], kq.src[1].ne[2]
    if not isinstance(hv, int) or hv % 8 or 32 % (hv // 8) or not isinstance(n_head, int):
        return None
    mm = ctx.only_consumer(cont)
    add = ctx.only_consumer(mm) if mm is not None else None
    epilogue = residual_of(add, ctx) if add is not None and ctx.free(add) else None
    if epilogue is None or epilogue[0] is not mm:
        return None
    wo = mm.src[0]
    if mm.src[1] is not cont or wo.type not in DQ8_TYPES or not a_rows_contiguous(wo):
        return None
    if wo.ne[0] != n_head * hv or not isinstance(wo.ne[1], int) or wo.ne[2] != 1 or wo.ne[3] != 1:
        return None
    if cont.nb[0] != 4 or add.type != GGMLType.F32 or add.nb[0] != 4:
        return None
    return [mm, add]


@dataclass(frozen=True)
class AttentionRule:
    """The attention chain as one kernel (lower_attention.py), with the output projection
    and residual add when `oproj` (and the kernel can: out_projection)."""

    name: str = ATTENTION.name
    oproj: bool = False
    views_and_writes: bool = True
    doc: str = ATTENTION.doc

    def candidates(self, ctx: MatchContext) -> Iterator[Candidate]:
        for node in ctx.tensors:
            if node.op not in ("mul_mat", "out_prod") or not ctx.free(node):
                continue
            members = match_attention(node, ctx)
            if members is None:
                continue
            proj = out_projection(members, ctx) if self.oproj else None
            if proj is not None:
                yield members + proj, [proj[1]]
            if not ctx.free(node):
                continue
            yield members, [members[-1]]
            core = members.index(node) + 1
            if not ctx.free(node) or len(members) == core:
                continue
            yield members[:core], [node]  # without the permute and cont


# products -------------------------------------------------------------------------------------
def prenorm(mats: list[Tensor], ctx: MatchContext) -> list[Tensor]:
    """[norm] or [norm, mul] when b = norm(x) [* w] is read by nothing but these products
    (the kernel normalises x itself); [] otherwise."""
    b = mats[0].src[1]
    if any(m.src[1] is not b for m in mats) or ctx.is_output(b):
        return []
    if sorted(u.id for u in ctx.users.get(b.id, [])) != sorted(m.id for m in mats):
        return []
    mul, norm = None, b
    if b.op == "mul":
        mul = b
        norm, w = b.src
        if norm.op not in NORMS:
            norm, w = w, norm
        if ctx.only_consumer(norm) is not mul or norm is w:
            return []
        if w.type != GGMLType.F32 or tuple(w.ne) != (norm.ne[0], 1, 1, 1):
            return []
    if norm.op not in NORMS or not ctx.free(*(t for t in (norm, mul) if t is not None)):
        return []
    x = norm.src[0]
    if x.type != GGMLType.F32 or x.nb[0] != 4 or not isinstance(x.ne[0], int):
        return []
    return [norm] + ([mul] if mul is not None else [])


def store_target(base: Tensor, ctx: MatchContext) -> list[Tensor] | None:
    """[reshapes..., set_rows] when `base` is only ever stored as cache rows through reshapes:
    set_rows(cache, reshape(...(base)), idx) with base's element order = the rows', into a
    float cache (a quantised one's rows are quantised a block at a time by set_rows itself)."""
    chain, t = [], base
    while True:
        user = ctx.only_consumer(t)
        if user is None or not ctx.free(user):
            return None
        chain.append(user)
        if user.op != "reshape":
            break
        t = user
    sr = chain[-1]
    if sr.op != "set_rows" or sr.src[1] is not t:
        return None
    cache, src, idx = sr.src
    if cache.type in KV_QUANT_TYPES:
        return None
    if not base.is_contiguous or any(d != 1 for d in (idx.ne[1], idx.ne[2], idx.ne[3])):
        return None
    if cache.ne[2] != 1 or cache.ne[3] != 1 or src.ne[2] != 1 or src.ne[3] != 1:
        return None
    return chain


def row_store(mats: list[Tensor], ctx: MatchContext) -> tuple[int, list[Tensor]] | None:
    """(i, [views..., set_rows]): the first product stored as cache rows of its shape."""
    for i, mm in enumerate(mats):
        chain = store_target(mm, ctx)
        if chain is not None and chain[-1].src[1].ne[0] == mm.ne[0] and chain[-1].src[1].ne[1] == mm.ne[1]:
            return i, chain
    return None


def rope_store(rope: Tensor, ctx: MatchContext) -> list[Tensor] | None:
    """[views..., set_rows] storing this rope's rows in a cache, when that is its only use."""
    if rope.ne[3] != 1:
        return None
    chain = store_target(rope, ctx)
    if chain is None:
        return None
    src = chain[-1].src[1]
    if src.ne[0] != rope.ne[0] * rope.ne[1] or src.ne[1] != rope.ne[2]:
        return None
    return chain


def rope_epilogues(mats: list[Tensor], skip: int, ctx: MatchContext) -> list[list[Tensor]]:
    """For each product (but mats[skip], stored) only read as reshape -> rope (mode 0,
    adjacent pairs of rows): [view, rope] + the rope's cache store when that is its only use.
    Every rope of one launch shares positions, frequency factors and parameters."""
    found: list[list[Tensor]] = []
    key = None
    for i, mm in enumerate(mats):
        if i == skip:
            continue
        view = ctx.only_consumer(mm)
        if view is None or view.op != "reshape" or not ctx.free(view) or not mm.is_contiguous:
            continue
        rope = ctx.only_consumer(view)
        if rope is None or rope.op != "rope" or rope.src[0] is not view or not ctx.free(rope):
            continue
        hd, n_dims = view.ne[0], rope.params["n_dims"]
        if rope.params["mode"] != 0 or not isinstance(hd, int) or hd % 2 or n_dims % 2 or n_dims > hd:
            continue
        if view.ne[3] != 1 or rope.src[1].type != GGMLType.I32 or not rope.is_contiguous:
            continue
        # the kernel takes a position per column of a 2-D product (a token's heads in its rows);
        # a K-shift's Hadamard product [n, rows, heads, cells] has its positions elsewhere
        if mm.ne[2] != 1 or mm.ne[3] != 1 or view.ne[2] != mm.ne[1]:
            continue
        ff = rope.src[2] if len(rope.src) > 2 else None
        rkey = (rope.src[1].id, ff.id if ff is not None else None, tuple(sorted(rope.params.items())))
        if key is not None and rkey != key:
            continue
        key = rkey
        found.append([view, rope] + (rope_store(rope, ctx) or []))
    return found


def glu_supported(b: Bindings, ctx: MatchContext) -> bool:
    """Two distinct products read by nothing but the glu, with weights of one type and
    layout (the kernel walks both with one plan)."""
    gate, up, glu = b["gate"], b["up"], b["glu"]
    if gate is up or not ctx.free(gate, up) or any(ctx.only_consumer(t) is not glu for t in (gate, up)):
        return False
    ga, ua = gate.src[0], up.src[0]
    return ga.type == ua.type and tuple(ga.ne) == tuple(ua.ne) and tuple(ga.nb) == tuple(ua.nb)


@dataclass(frozen=True)
class ProductRule:
    """Products in one launch (lower_matmul.MatMulStep): `form` says which (glu, residual,
    shared_x); on the matrix-vector kernel with the extensions of the module docstring."""

    name: str
    form: Literal["glu", "residual", "shared_x"]
    opts: CudaFusionOptions
    views_and_writes: bool = True
    doc: str = ""

    def candidates(self, ctx: MatchContext) -> Iterator[Candidate]:
        """Each product with every extension; failing that with its prenorm only; failing
        that alone (the engine refuses a form that is no longer free or would be a cycle)."""
        for mats, tail, vector in self._cores(ctx):
            core = mats + tail
            outs = list(tail) if tail else list(mats)
            pre = prenorm(mats, ctx) if vector else []
            if vector and not tail:
                extra, roots = self._epilogues(mats, ctx)
                if extra:
                    yield by_position(pre + core + extra, ctx), roots
            if pre:
                yield by_position(pre + core, ctx), outs
            if len(core) > 1:
                yield by_position(core, ctx), outs

    def _cores(self, ctx: MatchContext) -> Iterator[tuple[list[Tensor], list[Tensor], bool]]:
        """(products, [glu or add], on the matrix-vector kernel) in graph order."""
        if self.form == "glu":
            for node in ctx.tensors:
                b = match(GLU_PRODUCT.roots[0], node) if ctx.free(node) else None
                if b is not None and glu_supported(b, ctx) and vector_only(b["gate"], ctx, self.opts):
                    yield [b["gate"], b["up"]], [node], True
        elif self.form == "residual":
            for node in ctx.tensors:
                found = residual_of(node, ctx) if ctx.free(node) else None
                if found is not None:
                    yield [found[0]], [node], vector_only(found[0], ctx, self.opts)
        else:
            by_b: dict[int, list[Tensor]] = {}
            for node in ctx.tensors:
                if node.op == "mul_mat" and ctx.free(node):
                    by_b.setdefault(node.src[1].id, []).append(node)
            for members in by_b.values():
                while members and vector_only(members[0], ctx, self.opts):
                    atype = members[0].src[0].type
                    group = [m for m in members if m.src[0].type == atype and vector_only(m, ctx, self.opts)]
                    group = group[:MAX_GROUP]
                    members = [m for m in members if m not in group]
                    yield group, [], True

    def _epilogues(self, mats: list[Tensor], ctx: MatchContext) -> tuple[list[Tensor], list[Tensor]]:
        """The members a KV store and rope epilogues add to products sharing x, and the
        group's roots then (a stored or rotated product's value is its store or rope)."""
        members: list[Tensor] = []
        outs = list(mats)
        store = row_store(mats, ctx)
        skip = -1
        if store is not None:
            skip, chain = store
            members += chain
            outs[skip] = chain[-1]
        if self.opts.fuse_rope:
            for epi in rope_epilogues(mats, skip, ctx):
                members += epi
                outs[mats.index(epi[0].src[0])] = epi[-1]
        return members, outs


# ropes, norms, chains -------------------------------------------------------------------------
@dataclass(frozen=True)
class RopeRule:
    """Ropes as one launch (lower_simple.RopeStep): each with its cache store fused in when
    that is its only use, and pairs sharing positions, frequency factors, parameters, shape
    and type (Q and K) together."""

    name: str = "rope"
    views_and_writes: bool = True
    doc: str = FUSED_KINDS["rope"].computes

    def candidates(self, ctx: MatchContext) -> Iterator[Candidate]:
        parts = [[node] + (rope_store(node, ctx) or []) for node in ctx.tensors
                 if node.op == "rope" and ctx.free(node)]
        pending: dict[tuple, list[Tensor]] = {}
        pairs: list[tuple[list[Tensor], ...]] = []
        for part in parts:
            node = part[0]
            ff = node.src[2].id if len(node.src) > 2 else None
            key = (node.src[1].id, ff, tuple(sorted(node.params.items())),
                   tuple(map(str, node.ne[:1] + node.ne[2:])), node.src[0].type)
            other = pending.pop(key, None)
            if other is None:
                pending[key] = part
            else:
                pairs.append((other, part))
        pairs += [(part,) for part in pending.values()]
        for pair in sorted(pairs, key=lambda p: ctx.position[p[0][0].id]):
            if len(pair) == 2:
                yield by_position(pair[0] + pair[1], ctx), [p[-1] for p in pair]
            for part in pair:
                if len(part) > 1 and ctx.free(*part):
                    yield part, [part[-1]]


def _norm_weight(b: Bindings, ctx: MatchContext) -> bool:
    norm, w = b["norm"], b["weight"]
    return norm is not w and can_repeat(w.ne, norm.ne) and w.type == GGMLType.F32


def _f32_link(cur: Tensor, nxt: Tensor) -> bool:
    return cur.type == GGMLType.F32 and any(s is cur for s in nxt.src)


@lru_cache(maxsize=None)
def cuda_rules(opts: CudaFusionOptions = CudaFusionOptions()) -> tuple[Rule, ...]:
    """The rule set the CUDA backend marks its splits with, for these knobs."""
    return (
        AttentionRule(oproj=opts.fuse_oproj),
        ProductRule("glu_product", "glu", opts, doc=GLU_PRODUCT.doc),
        ProductRule("residual_product", "residual", opts, doc=RESIDUAL_PRODUCT.doc),
        ProductRule("shared_x_product", "shared_x", opts, doc=FUSED_KINDS["shared_x_product"].computes),
        RopeRule(),
        NORM_MUL.where(_norm_weight),
        replace(MAP_CHAIN, ops=MAP_OPS, exclude=(), link=_f32_link),
    )
