"""From a split's nodes to the steps the CUDA backend launches, fusing what it can.

Patterns (each node joins at most one step):
  attention   mul_mat(K, Q) -> soft_max -> mul_mat(V, .) [-> permute -> cont]
  products    glu:      mul_mat(gate, x), mul_mat(up, x) -> swiglu/geglu      (few columns)
              epilogue: mul_mat(W, x) -> add(., residual)
              group:    mul_mats sharing x and weight type (Q, K, V)           (few columns)
              and, on the matrix-vector kernel (few columns):
              prenorm:  x = rms_norm/norm(y) [* w] computed inside the product
              store:    one product's result only stored as KV cache rows (set_rows of V)
              rope:     products only read through reshape -> rope (mode 0), rotated in
                        the epilogue (Q), and stored as cache rows if that is the rope's
                        only use (K): two rows per warp, the pair a rotation mixes
  rope        two ropes with the same positions and parameters (Q and K) in one launch;
              rope -> reshape -> set_rows(cache, ., idx): rotated keys straight into the cache
  norm        rms_norm/norm -> mul(., weight)
  chains      map ops each read only by the next (scale -> tanh -> scale): one kernel
A fusion never hides a result someone else needs (a graph output, a node of another split,
a second consumer). A step runs where its last node ran, except product groups, which run
where their first product ran (every input exists by then; a store moved earlier is checked
against other accesses to the cache in between).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ggmlpy.codegen_cuda.lower_attention import FEW_BLOCKS_THREADS, AttentionStep, OutProjection, match_attention
from ggmlpy.codegen_cuda.lower_matmul import (
    MatMulOptions, MatMulStep, PreNorm, RopeEpilogue, RowStore, a_rows_contiguous, matvec_ok,
)
from ggmlpy.codegen_cuda.lower_elementwise import MAP_OPS, ElementwiseStep
from ggmlpy.codegen_cuda.lower_simple import NormStep, RopeStep
from ggmlpy.codegen_cuda.lowering import lower
from ggmlpy.codegen_cuda.steps import DQ8_TYPES, Step, same_shape
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.ops.common import can_repeat
from ggmlpy.ir.symbolic import SymExpr
from ggmlpy.ir.tensor import Flag, Tensor, memory_root
from ggmlpy.ir.types import GGMLType

MAX_GROUP = 3
SINGLE_TOKEN_SYMBOLS = {"n_tokens": 1, "n_outputs": 1}


@dataclass
class LowerOptions:
    fuse: bool = True
    matmul: MatMulOptions = field(default_factory=MatMulOptions)
    fuse_oproj: bool = False  # a decode attention computes its output projection and residual add
    attn_threads: int = FEW_BLOCKS_THREADS  # threads per attention block on small grids (decode)


class _Graph:
    """Consumer, output and position queries over one split."""

    def __init__(self, graph: Graph, nodes: list[Tensor]):
        self.graph = graph
        self.nodes = nodes
        self.users = graph.consumers()
        self.in_split = {n.id for n in nodes}
        self.position = {n.id: i for i, n in enumerate(nodes)}

    def consumers(self, t: Tensor) -> list[Tensor]:
        return self.users.get(t.id, [])

    def is_output(self, t: Tensor) -> bool:
        """Needed outside a fused step: a graph output or a consumer in another split."""
        return bool(t.flags & Flag.OUTPUT) or any(u.id not in self.in_split for u in self.consumers(t))

    def only_consumer(self, t: Tensor) -> Tensor | None:
        users = self.consumers(t)
        return users[0] if len(users) == 1 and not self.is_output(t) else None

    def cols_bound(self, b: Tensor) -> int | None:
        """A static upper bound on b's column count (ne[1]), when one is known."""
        n = b.ne[1]
        if isinstance(n, int):
            return n
        if self.graph.hints.get("tokens") == "single" and isinstance(n, SymExpr) \
                and n.symbols <= set(SINGLE_TOKEN_SYMBOLS):
            return n.eval(SINGLE_TOKEN_SYMBOLS)
        return None


@dataclass
class _Product:
    mats: list[Tensor]
    at: Tensor                       # the node whose position the step takes
    glu: Tensor | None = None
    add: Tensor | None = None
    prenorm: PreNorm | None = None
    store: RowStore | None = None
    ropes: dict[int, RopeEpilogue] = field(default_factory=dict)
    vector_only: bool = False        # few columns guaranteed: the matrix-vector kernel runs


def lower_split(graph: Graph, nodes: list[Tensor], opts: LowerOptions) -> list[Step]:
    g = _Graph(graph, nodes)
    taken: set[int] = set()
    placed: dict[int, list[Step]] = {}

    def place(step: Step, at: Tensor) -> None:
        taken.update(n.id for n in step.nodes)
        placed.setdefault(g.position[at.id], []).append(step)

    def free(*ts: Tensor) -> bool:
        return all(t.id in g.in_split and t.id not in taken for t in ts)

    if opts.fuse:
        attentions = []
        for node in nodes:
            if node.id not in taken and node.op == "mul_mat":
                m = match_attention(node, g.consumers, g.is_output)
                members = [t for t in m if t is not None] if m is not None else []
                if m is not None and free(*members):
                    taken.update(t.id for t in members)  # kept from the products below
                    attentions.append((m, members))
        products = _products(nodes, g, opts, free)
        for m, members in attentions:
            prod = _out_projection(m, products, g) if opts.fuse_oproj else None
            if prod is None:
                place(AttentionStep(*m, few_blocks_threads=opts.attn_threads), members[-1])
            else:
                products.remove(prod)
                place(AttentionStep(*m, oproj=OutProjection(prod.mats[0], prod.add),
                                    few_blocks_threads=opts.attn_threads), prod.add)
        for prod in products:
            step = MatMulStep(prod.mats, opts.matmul, glu=prod.glu, add=prod.add, prenorm=prod.prenorm,
                              store=prod.store, ropes=prod.ropes)
            place(step, prod.at)
        for step, at in _ropes(nodes, g, free):
            place(step, at)
        for node in nodes:
            if node.id not in taken and node.op == "mul":
                found = _norm_mul(node, g, free)
                if found is not None:
                    place(*found)
        for chain in _elementwise_chains(nodes, g, free):
            place(ElementwiseStep(chain), chain[-1])

    for i, node in enumerate(nodes):
        if node.id in taken or OPS[node.op].kind == Kind.VIEW:
            continue
        step = lower(node, opts)
        placed.setdefault(i, []).append(step)
        taken.add(node.id)
    return [s for i in sorted(placed) for s in placed[i]]


Free = Callable[..., bool]


# products -----------------------------------------------------------------------------------------
def _products(nodes: list[Tensor], g: _Graph, opts: LowerOptions, free: Free) -> list[_Product]:
    used: set[int] = set()

    def avail(*ts: Tensor) -> bool:
        return free(*ts) and not any(t.id in used for t in ts)

    def vector_only(a: Tensor, b: Tensor) -> bool:
        bound = g.cols_bound(b)
        return bound is not None and bound <= opts.matmul.max_cols and opts.matmul.max_cols > 0 and matvec_ok(a, b)

    out: list[_Product] = []
    for node in nodes:  # glu: gate and up in one launch, the activation in the epilogue
        if node.op not in ("swiglu", "geglu") or not avail(node):
            continue
        gate, up = node.src
        if gate.op != "mul_mat" or up.op != "mul_mat" or gate is up or not avail(gate, up):
            continue
        if gate.src[1] is not up.src[1] or any(g.only_consumer(t) is not node for t in (gate, up)):
            continue
        ga, ua = gate.src[0], up.src[0]
        if ga.type != ua.type or tuple(ga.ne) != tuple(ua.ne) or tuple(ga.nb) != tuple(ua.nb):
            continue
        if vector_only(ga, gate.src[1]):
            out.append(_Product([gate, up], node, glu=node, vector_only=True))
            used.update((gate.id, up.id, node.id))
    for node in nodes:  # epilogue: + residual
        if node.op != "add" or not avail(node):
            continue
        for mm, other in ((node.src[0], node.src[1]), (node.src[1], node.src[0])):
            if mm.op == "mul_mat" and other is not mm and avail(mm) and g.only_consumer(mm) is node \
                    and same_shape(mm, other) and other.type == GGMLType.F32:
                out.append(_Product([mm], node, add=node, vector_only=vector_only(*mm.src)))
                used.update((mm.id, node.id))
                break
    by_b: dict[int, list[Tensor]] = {}
    for node in nodes:  # groups sharing x (and singles)
        if node.op == "mul_mat" and avail(node):
            by_b.setdefault(node.src[1].id, []).append(node)
    for members in by_b.values():
        while members:
            first = members[0]
            if not vector_only(*first.src):
                out += [_Product([m], m) for m in members]
                break
            group = [m for m in members if m.src[0].type == first.src[0].type and vector_only(*m.src)][:MAX_GROUP]
            members = [m for m in members if m not in group]
            out.append(_Product(group, group[0], vector_only=True))
    for prod in out:
        if prod.vector_only:
            prod.prenorm = _prenorm(prod, g, free)
            prod.store = _row_store(prod, g, free)
            if opts.matmul.fuse_rope:
                prod.ropes = _rope_epilogues(prod, g, free)
    return out


def _out_projection(m: tuple, products: list[_Product], g: _Graph) -> _Product | None:
    """The product `add(mul_mat(wo, out), residual)` that alone reads a one-token attention's
    output `out` (the cont of its heads, head after head), when the attention kernel can
    compute it (attention.cu.j2, `oproj`): wo a plain matrix of a dq8 type with a row per
    output, heads of a multiple of 8 dims that divides 256, nothing in between to move past."""
    kq, sm, kqv, perm, cont = m
    if cont is None or g.cols_bound(cont) != 1:
        return None
    q, hv = kq.src[1], kqv.ne[0]
    n_head = q.ne[2]
    if not isinstance(hv, int) or hv % 8 or 32 % (hv // 8) or not isinstance(n_head, int):
        return None
    mm = g.only_consumer(cont)
    prod = next((p for p in products if len(p.mats) == 1 and p.mats[0] is mm and p.add is not None), None)
    if prod is None or prod.glu is not None or prod.prenorm is not None:
        return None
    wo, add = mm.src[0], prod.add
    if mm.src[1] is not cont or wo.type not in DQ8_TYPES or not a_rows_contiguous(wo):
        return None
    if wo.ne[0] != n_head * hv or not isinstance(wo.ne[1], int) or wo.ne[2] != 1 or wo.ne[3] != 1:
        return None
    if cont.nb[0] != 4 or add.type != GGMLType.F32 or add.nb[0] != 4:
        return None
    between = g.nodes[g.position[cont.id] + 1:g.position[add.id]]
    if any(n is not mm and OPS[n.op].kind != Kind.VIEW for n in between):
        return None
    return prod


def _rope_epilogues(prod: _Product, g: _Graph, free: Free) -> dict[int, RopeEpilogue]:
    """Products of the group whose result is only read as reshape -> rope (mode 0, adjacent
    pairs of rows), with the rope's cache store when that is its only use. Every rope fused
    into one launch shares positions, frequency factors and parameters."""
    if prod.glu is not None or prod.add is not None:
        return {}
    found: dict[int, RopeEpilogue] = {}
    key = None
    for i, mm in enumerate(prod.mats):
        if prod.store is not None and prod.store.index == i:
            continue
        view = g.only_consumer(mm)
        if view is None or view.op != "reshape" or not free(view) or not mm.is_contiguous:
            continue
        rope = g.only_consumer(view)
        if rope is None or rope.op != "rope" or rope.src[0] is not view or not free(rope):
            continue
        hd, n_dims = view.ne[0], rope.params["n_dims"]
        if rope.params["mode"] != 0 or not isinstance(hd, int) or hd % 2 or n_dims % 2 or n_dims > hd:
            continue
        if view.ne[3] != 1 or rope.src[1].type != GGMLType.I32 or not rope.is_contiguous:
            continue
        ff = rope.src[2] if len(rope.src) > 2 else None
        rkey = (rope.src[1].id, ff.id if ff is not None else None, tuple(sorted(rope.params.items())))
        if key is not None and rkey != key:
            continue
        store = _rope_part(rope, g, free)
        if store is not None and not _moves_safely(store[1], prod.at, g):
            store = None
        key = rkey
        found[i] = RopeEpilogue(view, rope, store[0] if store else [], store[1] if store else None)
    return found


def _prenorm(prod: _Product, g: _Graph, free: Free) -> PreNorm | None:
    """b = norm(x) [* w], read by nothing but this product: compute it inside."""
    b = prod.mats[0].src[1]
    if any(m.src[1] is not b for m in prod.mats) or g.is_output(b):
        return None
    if sorted(u.id for u in g.consumers(b)) != sorted(m.id for m in prod.mats):
        return None
    mul, w, norm = None, None, b
    if b.op == "mul":
        mul = b
        norm, w = b.src
        if norm.op not in ("rms_norm", "norm"):
            norm, w = w, norm
        if g.only_consumer(norm) is not mul:
            return None
        k = norm.ne[0]
        if w.type != GGMLType.F32 or tuple(w.ne) != (k, 1, 1, 1) or norm is w:
            return None
    if norm.op not in ("rms_norm", "norm") or not free(*(t for t in (norm, mul) if t is not None)):
        return None
    x = norm.src[0]
    if x.type != GGMLType.F32 or x.nb[0] != 4 or not isinstance(x.ne[0], int):
        return None
    return PreNorm(norm, mul, w)


def _view_chain(t: Tensor) -> tuple[Tensor, list[Tensor]]:
    """The non-view tensor under a chain of views, and the views (outermost last)."""
    views = []
    while not t.is_leaf and OPS[t.op].kind == Kind.VIEW:
        views.append(t)
        t = t.src[0]
    return t, list(reversed(views))


def _store_target(base: Tensor, g: _Graph, free: Free) -> tuple[list[Tensor], Tensor] | None:
    """(views, set_rows) when `base` is only ever stored as cache rows through reshapes:
    set_rows(cache, reshape(...(base)), idx) with base's element order = the rows'."""
    views, t = [], base
    while True:
        user = g.only_consumer(t)
        if user is None or not free(user):
            return None
        if user.op == "reshape":
            views.append(user)
            t = user
            continue
        break
    if user.op != "set_rows" or user.src[1] is not t:
        return None
    cache, src, idx = user.src
    if not base.is_contiguous or any(d != 1 for d in (idx.ne[1], idx.ne[2], idx.ne[3])):
        return None
    if cache.ne[2] != 1 or cache.ne[3] != 1 or src.ne[2] != 1 or src.ne[3] != 1:
        return None
    return views, user


def _moves_safely(store: Tensor, to: Tensor, g: _Graph) -> bool:
    """Running `store` (a set_rows) at `to`'s earlier position changes nothing: no node in
    between touches the cache it writes."""
    cache = memory_root(store)
    lo, hi = g.position[to.id], g.position[store.id]
    for node in g.nodes[lo:hi]:
        if memory_root(node) is cache or any(memory_root(s) is cache for s in node.src):
            return False
    return True


def _row_store(prod: _Product, g: _Graph, free: Free) -> RowStore | None:
    if prod.glu is not None or prod.add is not None:
        return None
    for i, mm in enumerate(prod.mats):
        found = _store_target(mm, g, free)
        if found is None:
            continue
        views, sr = found
        if sr.src[1].ne[0] == mm.ne[0] and sr.src[1].ne[1] == mm.ne[1] and _moves_safely(sr, prod.at, g):
            return RowStore(i, sr, views)
    return None


# single-node fusions ------------------------------------------------------------------------------
def _rope_part(node: Tensor, g: _Graph, free: Free) -> tuple[list[Tensor], Tensor] | None:
    """The (views, set_rows) storing this rope's rows in a cache, when that is its only use."""
    if node.ne[3] != 1:
        return None
    found = _store_target(node, g, free)
    if found is None:
        return None
    sr = found[1]
    if sr.src[1].ne[0] != node.ne[0] * node.ne[1] or sr.src[1].ne[1] != node.ne[2]:
        return None
    return found


def _first_use(t: Tensor, g: _Graph) -> int:
    """The position of the first computing node reading t (through views too)."""
    best = len(g.nodes)
    todo = [t]
    while todo:
        for u in g.consumers(todo.pop()):
            if u.id not in g.position:
                continue
            if OPS[u.op].kind == Kind.VIEW:
                todo.append(u)
            else:
                best = min(best, g.position[u.id])
    return best


def _ropes(nodes: list[Tensor], g: _Graph, free: Free) -> list[tuple[Step, Tensor]]:
    """Every free rope as a step: stores fused in, pairs sharing positions and parameters in
    one launch (when running the first one later is harmless)."""
    parts = []
    for node in nodes:
        if node.op == "rope" and free(node):
            store = _rope_part(node, g, free)
            parts.append((node, store, store[1] if store is not None else node))
    out: list[tuple[Step, Tensor]] = []
    pending: dict[tuple, tuple] = {}
    for part in parts:
        node = part[0]
        ff = node.src[2].id if len(node.src) > 2 else None
        key = (node.src[1].id, ff, tuple(sorted(node.params.items())), tuple(map(str, node.ne[:1] + node.ne[2:])),
               node.src[0].type)
        other = pending.pop(key, None)
        if other is None:
            pending[key] = part
            continue
        at = max((other, part), key=lambda p: g.position[p[2].id])[2]
        if all(_first_use(p[2], g) > g.position[at.id] for p in (other, part)):
            out.append((RopeStep([(other[0], other[1]), (part[0], part[1])]), at))
        else:
            out += [(RopeStep([(p[0], p[1])]), p[2]) for p in (other, part)]
    out += [(RopeStep([(p[0], p[1])]), p[2]) for p in pending.values()]
    return out


def _elementwise_chains(nodes: list[Tensor], g: _Graph, free: Free) -> list[list[Tensor]]:
    """Runs of two or more map ops where each result is read only by the next, all of one
    shape, float32 in between (lower_elementwise.py). The chain runs where its last node
    ran, so nothing in between may write memory (a later stage's operand could change)."""
    chains: list[list[Tensor]] = []
    used: set[int] = set()
    for node in nodes:
        if node.id in used or node.op not in MAP_OPS or not free(node):
            continue
        chain = [node]
        while True:
            cur = chain[-1]
            nxt = g.only_consumer(cur)
            if nxt is None or nxt.op not in MAP_OPS or not free(nxt) or cur.type != GGMLType.F32 \
                    or tuple(nxt.ne) != tuple(cur.ne) or all(s is not cur for s in nxt.src):
                break
            chain.append(nxt)
        if len(chain) < 2:
            continue
        span = g.nodes[g.position[chain[0].id]:g.position[chain[-1].id]]
        if any(OPS[n.op].kind == Kind.WRITE for n in span):
            continue
        chains.append(chain)
        used.update(n.id for n in chain)
    return chains


def _norm_mul(node: Tensor, g: _Graph, free: Free):
    norm, w = node.src
    if norm.op not in ("rms_norm", "norm") or not free(norm, node) or g.only_consumer(norm) is not node \
            or norm is w:
        return None
    if not can_repeat(w.ne, norm.ne) or w.type != GGMLType.F32:
        return None
    return NormStep(norm, node), node
