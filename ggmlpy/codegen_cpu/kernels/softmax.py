"""soft_max_ext per row: max, exp and sum, normalise; the mask broadcasts over heads.

Rows contiguous along ne[0] (the usual case) run on <64 x float> chunks (four AVX-512
registers: four independent max and sum chains): a vector max and a vector sum per row,
reduced horizontally once, and a masked last chunk whose unset lanes read as -inf (so they
add nothing to the max or the sum). Strided rows keep a scalar loop.
Masked (-inf) entries come out exactly 0 either way. Values that may be -inf never go
through fast-math instructions, which assume finite operands. A softmax with attention sinks
(a third source, one logit per head) folds the head's sink into the row's max and sum.

As ggml's soft_max, the sum of the exponentials is kept in f64 and 1 / sum taken in f64:
an f32 sum is accurate enough on its own, but its last bits reach the 8-bit activation
quantisation of the next products: Gemma 3 270M's perplexity (golden test, llama.cpp 9.970)
measured 9.854 with f32 sums and 9.901 with f64 ones.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, F64, I64, PTR, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import bcast_index, elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.kernels.elementwise import contiguous_rows
from ggmlpy.codegen_cpu.kernels.extent import Visible, any_live, rows_share_chunks, tile_range
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size

NEG_INF = float("-inf")
WIDTH = 64  # lanes per chunk (see above)
SKIP_HIDDEN_KEYS = True  # the attention kernel's live ranges; off, it computes every key (tests compare)


def _supported(node: Tensor) -> bool:
    return (node.src[0].type == GGMLType.F32 and node.params.get("max_bias", 0.0) == 0.0
            and all(s.type in (GGMLType.F32, GGMLType.F16) for s in node.src))


@lowering("soft_max", supports=_supported)
def _soft_max(kb: KernelBuilder, node: Tensor) -> None:
    start, end = kb.thread_range(n_rows(kb, node))
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        soft_max_row_at(kb, node, row_ptr(kb, kb.arg("src0"), node.src[0], i1, i2, i3), drow,
                        mask_row(kb, node, i1, i2, i3, "src1"), sink=sink_value(kb, node, i2, "src2"))


def sink_value(kb: KernelBuilder, node: Tensor, i2: ir.Value, sinks_arg: str) -> ir.Value | None:
    """The attention sink of the rows of head i2 (None without sinks)."""
    if len(node.src) < 3:
        return None
    sinks = node.src[2]
    return kb.load(elem_ptr(kb, kb.arg(sinks_arg), sinks, i2), sinks.type)


def soft_max_row_at(kb: KernelBuilder, node: Tensor, srow: ir.Value, drow: ir.Value, mrow: ir.Value | None,
                    live: tuple[ir.Value, ir.Value] | None = None, sink: ir.Value | None = None) -> None:
    """The softmax of the row at srow into drow (in place when they are the same), with
    the mask row at mrow (None: no mask) and the head's attention sink (None: none).
    With `live` = (lo, hi) (contiguous rows only; lo a multiple of WIDTH), the mask hides
    every entry outside [lo, hi): only those are read, and the rest of the row is written as
    the 0 it would come out as. The chunks keep their lanes (lo is whole chunks from the
    row's start), so the sums add the same values in the same order."""
    ne0 = kb.dim(node.ne[0])
    vector = all(contiguous_rows(t) for t in (node, *node.src))
    if vector and live is not None:
        b = kb.b
        lo, hi = live
        at = (lambda row, t: elem_ptr(kb, row, t, lo))
        _vector_row(kb, node, at(srow, node.src[0]), None if mrow is None else at(mrow, node.src[1]),
                    at(drow, node), b.sub(hi, lo), sink, holes=mrow is not None)
        _zeros(kb, node, drow, i64(0), lo)
        _zeros(kb, node, drow, hi, ne0)
    elif vector:
        _vector_row(kb, node, srow, mrow, drow, ne0, sink)
    else:
        assert live is None, "a live range needs contiguous rows"
        _scalar_row(kb, node, srow, mrow, drow, ne0, sink)


def mask_row(kb: KernelBuilder, node: Tensor, i1: ir.Value, i2: ir.Value, i3: ir.Value,
             mask_arg: str) -> ir.Value | None:
    """The mask row of softmax row (i1, i2, i3), None without a mask: mask rows follow the
    token index; heads broadcast."""
    if len(node.src) < 2:
        return None
    mask = node.src[1]
    return row_ptr(kb, kb.arg(mask_arg), mask, i1, bcast_index(kb, i2, node.ne[2], mask.ne[2]),
                   bcast_index(kb, i3, node.ne[3], mask.ne[3]))


def _zeros(kb: KernelBuilder, node: Tensor, drow: ir.Value, start: ir.Value, stop: ir.Value) -> None:
    """dst[start:stop] = 0: the probabilities of keys the mask hides."""
    b = kb.b
    zero = kb.splat(f32(0.0), WIDTH)

    def store(i0: ir.Value, lanes: ir.Value | None) -> None:
        kb.store_vector(elem_ptr(kb, drow, node, b.add(start, i0)), zero, node.type, lanes)

    kb.vector_chunks(b.sub(stop, start), store, WIDTH)


def _attention_parts(node: Tensor) -> tuple[Tensor, Tensor]:
    """The mul_mat and soft_max nodes a mul_mat_soft_max node stands for (same shapes)."""
    k, q = node.src[:2]
    kq = dataclasses.replace(node, op="mul_mat", src=(k, q), params={})
    sm = dataclasses.replace(node, op="soft_max", src=(kq, *node.src[2:]))
    return kq, sm


def _attention_supported(node: Tensor) -> bool:
    from ggmlpy.codegen_cpu.kernels.matmul import is_dot_form

    kq, sm = _attention_parts(node)
    return (node.type == GGMLType.F32 and is_dot_form(kq) and _supported(sm)
            and all(contiguous_rows(t) for t in (sm, *sm.src)))


@lowering("mul_mat_soft_max", supports=_attention_supported)
def _attention_scores(kb: KernelBuilder, node: Tensor) -> None:
    """The matmul_softmax fusion group (codegen_cpu/fusion.py): per row, the scores k . q
    are written to dst and normalised there while still in cache; the same operations as
    the two nodes, so the same results.

    With a mask, each tile of queries computes only the keys in its live range
    (kernels/extent.py): outside it every score is masked, its probability exactly 0 either
    way, so the results are the same while a causal prefill does about half the work (and a
    sliding-window layer's long prompt little more than its window's)."""
    from ggmlpy.codegen_cpu.kernels.matmul import float_dot_tiles

    kq, sm = _attention_parts(node)
    start, end = kb.thread_range(n_rows(kb, node))
    mask = sm.src[1] if len(sm.src) > 1 and SKIP_HIDDEN_KEYS else None

    def mask_rows(rows: list[ir.Value]) -> list[ir.Value]:
        return [mask_row(kb, sm, *unravel_row(kb, sm, r), "src2") for r in rows]

    args = (mask.type, type_size(mask.type), kb.dim(sm.ne[0])) if mask is not None else ()

    def visible(rows: list[ir.Value]) -> Visible:
        masks = mask_rows(rows)
        lo, hi = tile_range(kb, masks, *args, NEG_INF, align=WIDTH)
        return Visible(lo, hi, lambda c: any_live(kb, masks, *args, c, NEG_INF))

    def together(rows: list[ir.Value]) -> ir.Value:  # queries of different sequences: apart
        return rows_share_chunks(kb, mask_rows(rows), *args, NEG_INF)

    # one softmax row is a function of its own, called with the row's pointers (computed
    # here, where a tile's rows share their index arithmetic): inlined, its nine copies (one
    # per row of every tile shape) were three quarters of the kernel's IR
    row_args = [("scores", PTR), ("mask_row", PTR), ("lo", I64), ("hi", I64), ("sink", F32)]
    has_mask, has_sinks = len(sm.src) > 1, len(sm.src) > 2

    def build_row(helper: KernelBuilder) -> None:
        live = (helper.arg("lo"), helper.arg("hi")) if mask is not None else None
        mrow = helper.arg("mask_row") if has_mask else None
        sink = helper.arg("sink") if has_sinks else None
        soft_max_row_at(helper, sm, helper.arg("scores"), helper.arg("scores"), mrow, live, sink)

    def normalise(rows, live):
        for r, scores in rows:   # the scores were written to dst: normalised in place
            i1, i2, i3 = unravel_row(kb, sm, r)
            mrow = mask_row(kb, sm, i1, i2, i3, "src2") if has_mask else ir.Constant(PTR, None)
            sink = sink_value(kb, sm, i2, "src3") if has_sinks else f32(0.0)
            kb.call_helper("softmax_row", row_args, build_row, [scores, mrow, *live, sink])

    float_dot_tiles(kb, kq, start, end, normalise, visible=visible if mask is not None else None,
                    together=together if mask is not None else None)


def _vector_row(kb: KernelBuilder, node: Tensor, srow: ir.Value, mrow: ir.Value | None, drow: ir.Value,
                ne0: ir.Value, sink: ir.Value | None = None, holes: bool = False) -> None:
    """With `holes` (the attention kernel, which computes no scores where a chunk of the
    tile's keys is masked), a chunk whose mask is all -inf is not read: it is stored as the
    -inf it would come out as, and its exponentials as 0 without computing them (adding 0
    to the lane sums changes nothing); in the other chunks a masked lane is -inf whatever
    its score holds (for a finite score, the value x * scale - inf gives anyway)."""
    b = kb.b
    src, scale = node.src[0], f32(node.params["scale"])
    neg_inf = kb.splat(f32(NEG_INF), WIDTH)

    def load(t: Tensor, row: ir.Value, i0: ir.Value, lanes: ir.Value | None) -> ir.Value:
        return kb.load_vector(elem_ptr(kb, row, t, i0), t.type, WIDTH, lanes, fill=NEG_INF)

    def store(value: ir.Value, i0: ir.Value, lanes: ir.Value | None) -> None:
        kb.store_vector(elem_ptr(kb, drow, node, i0), value, node.type, lanes)

    # 1: dst = x * scale + mask, and the running max (unset tail lanes: -inf)
    mx = kb.var(neg_inf.type, neg_inf, "max")

    def scaled(i0: ir.Value, lanes: ir.Value | None) -> None:
        mv = load(node.src[1], mrow, i0, lanes) if mrow is not None else None

        def compute() -> None:
            v = b.fmul(load(src, srow, i0, lanes), kb.like(scale, neg_inf))  # no fast-math: -inf
            if mv is not None:
                v = b.fadd(v, mv)
            if holes:  # a masked key's score may be unwritten (its 16-key chunk was skipped)
                v = kb.select(b.fcmp_ordered("==", mv, neg_inf), neg_inf, v)
            if lanes is not None:  # whatever the scale's sign
                v = kb.select(lanes, v, neg_inf)
            store(v, i0, lanes)
            b.store(_max(kb, b.load(mx), v), mx)

        _unless_all_neg_inf(kb, mv if holes else None, compute, lambda: store(neg_inf, i0, lanes))

    kb.vector_chunks(ne0, scaled, WIDTH)
    m = kb.reduce(b.load(mx), lambda x, y: _max(kb, x, y))
    if sink is not None:
        m = _max(kb, m, sink)
    # 2: dst = exp(dst - max), and the running sum in f64 (unset lanes read -inf: exp gives 0)
    zero64 = kb.splat(ir.Constant(F64, 0.0), WIDTH)
    total = kb.var(zero64.type, zero64, "sum")

    def exponent(i0: ir.Value, lanes: ir.Value | None) -> None:
        d = load(node, drow, i0, lanes)

        def compute() -> None:
            e = _exp_or_zero(kb, b.fsub(d, kb.like(m, neg_inf)))
            store(e, i0, lanes)
            b.store(kb.fadd(b.load(total), b.fpext(e, zero64.type)), total)

        _unless_all_neg_inf(kb, d if holes else None, compute, lambda: store(kb.splat(f32(0.0), WIDTH), i0, lanes))

    kb.vector_chunks(ne0, exponent, WIDTH)
    inv = _inverse(kb, _with_sink(kb, kb.reduce(b.load(total), kb.fadd), sink, m))
    # 3: normalise
    kb.vector_chunks(ne0, lambda i0, lanes: store(kb.fmul(load(node, drow, i0, lanes), inv), i0, lanes), WIDTH)


def _scalar_row(kb: KernelBuilder, node: Tensor, srow: ir.Value, mrow: ir.Value | None, drow: ir.Value,
                ne0: ir.Value, sink: ir.Value | None = None) -> None:
    b = kb.b
    src, mask = node.src[0], (node.src[1] if mrow is not None else None)
    scale = f32(node.params["scale"])
    mx = kb.var(F32, f32(NEG_INF), "max")
    with kb.loop(i64(0), ne0, "i0") as i0:
        v = kb.fmul(kb.load(elem_ptr(kb, srow, src, i0), src.type), scale)
        if mrow is not None:
            v = b.fadd(v, kb.load(elem_ptr(kb, mrow, mask, i0), mask.type))
        kb.store(elem_ptr(kb, drow, node, i0), v, node.type)
        b.store(kb.fmax(b.load(mx), v), mx)
    m = b.load(mx) if sink is None else _max(kb, b.load(mx), sink)
    total = kb.var(F64, ir.Constant(F64, 0.0), "sum")
    with kb.loop(i64(0), ne0, "i0") as i0:
        p = elem_ptr(kb, drow, node, i0)
        e = _exp_or_zero(kb, b.fsub(kb.load(p, node.type), m))
        kb.store(p, e, node.type)
        b.store(kb.fadd(b.load(total), b.fpext(e, F64)), total)
    inv = _inverse(kb, _with_sink(kb, b.load(total), sink, m))
    with kb.loop(i64(0), ne0, "i0") as i0:
        p = elem_ptr(kb, drow, node, i0)
        kb.store(p, kb.fmul(kb.load(p, node.type), inv), node.type)


def _unless_all_neg_inf(kb: KernelBuilder, v: ir.Value | None, compute: Callable[[], None],
                        otherwise: Callable[[], None]) -> None:
    """compute() unless every lane of v is -inf (then otherwise()); v None: compute()."""
    if v is None:
        compute()
        return
    b = kb.b
    n = v.type.count
    dead = b.fcmp_ordered("==", v, kb.splat(f32(NEG_INF), n))
    all_dead = b.icmp_unsigned("==", b.bitcast(dead, ir.IntType(n)), ir.Constant(ir.IntType(n), (1 << n) - 1))
    with b.if_else(all_dead) as (skip, work):
        with skip:
            otherwise()
        with work:
            compute()


def _with_sink(kb: KernelBuilder, total: ir.Value, sink: ir.Value | None, m: ir.Value) -> ir.Value:
    """The f64 sum of a row's exponentials plus its sink's, exp(sink - max) (ggml adds it
    after the row's sum)."""
    if sink is None:
        return total
    return kb.fadd(total, kb.b.fpext(_exp_or_zero(kb, kb.b.fsub(sink, m)), F64))


def _inverse(kb: KernelBuilder, total: ir.Value) -> ir.Value:
    """1 / sum, computed in f64 and used as an f32 scale, as ggml's soft_max does."""
    return kb.b.fptrunc(kb.fdiv(ir.Constant(F64, 1.0), total), F32)


def _exp_or_zero(kb: KernelBuilder, x: ir.Value) -> ir.Value:
    """exp(x) for x <= 0, exactly 0 for masked (-inf) entries (and NaN lanes)."""
    return kb.select(kb.fcmp(">", x, f32(-80.0)), kb.exp(x), f32(0.0))


def _max(kb: KernelBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """max(x, y) lane-wise as a compare and select (one vmaxps; llvm.maxnum's NaN rules would
    add a compare and a blend to the loop's dependency chain, and no NaN reaches here)."""
    return kb.select(kb.fcmp(">", x, y), x, y)
