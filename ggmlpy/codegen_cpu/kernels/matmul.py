"""mul_mat kernels.

Float operands (attention over the f16 KV cache, f32/f16 weights): a dot-product form when
both operands are contiguous along K, an axpy form when `a` is contiguous along its rows
(the transposed V view), and a strided fallback.

Quantised weights (Q4_0, Q4_1, Q5_0, Q8_0): as ggml, the activations are first quantised to
8-bit blocks (phase 1, rows split over threads, then a barrier), and the dot products work
on the integer blocks directly (phase 2, weight rows split over threads, every token for each
weight row so the row stays in cache). The activation block is internal to this kernel:
{f32 d, i32 sum of q, 32 x i8 q} (40 bytes), more precise than ggml's f16 scales.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F16, F32, I8, I32, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size

FLOAT = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
QUANT = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q8_0)
QBLOCK = 40  # bytes of one activation block


def _supported(node: Tensor) -> bool:
    a, b = node.src
    if b.type != GGMLType.F32 or node.type != GGMLType.F32:
        return False
    if a.type in FLOAT:
        return True
    return (a.type in QUANT and a.ne[2] == 1 and a.ne[3] == 1 and b.is_contiguous
            and isinstance(a.ne[0], int) and a.ne[0] % 32 == 0)


def _scratch(node: Tensor, env: dict) -> int:
    a, b = node.src
    if a.type in FLOAT:
        return 0
    rows = evaluate(b.ne[1], env) * evaluate(b.ne[2], env) * evaluate(b.ne[3], env)
    return rows * (a.ne[0] // 32) * QBLOCK


@lowering("mul_mat", supports=_supported, scratch_bytes=_scratch)
def _mul_mat(kb: KernelBuilder, node: Tensor) -> None:
    a = node.src[0]
    if a.type in FLOAT:
        _float_mul_mat(kb, node)
    else:
        _quant_mul_mat(kb, node)


# float ----------------------------------------------------------------------------------------
def _float_mul_mat(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    a, x = node.src
    esize_a = type_size(a.type)
    start, end = kb.thread_range(n_rows(kb, node))
    K = kb.dim(a.ne[0])
    M = kb.dim(node.ne[0])
    r2 = kb.b.sdiv(kb.dim(x.ne[2]), kb.dim(a.ne[2]))
    r3 = kb.b.sdiv(kb.dim(x.ne[3]), kb.dim(a.ne[3]))
    axpy = a.nb[0] != esize_a and a.nb[1] == esize_a
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        xrow = row_ptr(kb, kb.arg("src1"), x, i1, i2, i3)
        drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        a2, a3 = b.sdiv(i2, r2), b.sdiv(i3, r3)
        if axpy:  # dst[:] = sum_k x[k] * a[k, :]; a's rows (fixed k) are contiguous
            with kb.loop(i64(0), M, "i0") as i0:
                kb.store(elem_ptr(kb, drow, node, i0), f32(0.0), node.type)
            abase = row_ptr(kb, kb.arg("src0"), a, i64(0), a2, a3)
            with kb.loop(i64(0), K, "k") as k:
                xk = kb.load(elem_ptr(kb, xrow, x, k), x.type)
                arow = kb.byte_ptr(abase, b.mul(k, kb.dim(a.nb[0])))
                with kb.loop(i64(0), M, "i0") as i0:
                    p = elem_ptr(kb, drow, node, i0)
                    av = kb.load(kb.byte_ptr(arow, b.mul(i0, kb.dim(a.nb[1]))), a.type)
                    kb.store(p, kb.fadd(kb.load(p, node.type), kb.fmul(xk, av)), node.type)
        else:
            with kb.loop(i64(0), M, "i0") as i0:
                arow = row_ptr(kb, kb.arg("src0"), a, i0, a2, a3)
                acc = kb.var(F32, f32(0.0), "acc")
                with kb.loop(i64(0), K, "k") as k:
                    av = kb.load(elem_ptr(kb, arow, a, k), a.type)
                    xv = kb.load(elem_ptr(kb, xrow, x, k), x.type)
                    b.store(kb.fadd(b.load(acc), kb.fmul(av, xv)), acc)
                kb.store(elem_ptr(kb, drow, node, i0), b.load(acc), node.type)


# quantised ------------------------------------------------------------------------------------
def _quantize_activations(kb: KernelBuilder, x: Tensor, n_blocks: int) -> None:
    """Phase 1: every row of x becomes n_blocks activation blocks in scratch."""
    b = kb.b
    start, end = kb.thread_range(n_rows(kb, x))
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, x, r)
        xrow = row_ptr(kb, kb.arg("src1"), x, i1, i2, i3)
        qrow = kb.byte_ptr(kb.arg("scratch"), b.mul(r, i64(n_blocks * QBLOCK)))
        with kb.loop(i64(0), i64(n_blocks), "blk") as blk:
            xs = kb.elem_ptr(xrow, b.mul(blk, i64(32)), F32)
            amax = kb.var(F32, f32(0.0), "amax")
            with kb.loop(i64(0), i64(32), "l") as l:
                v = b.load(kb.elem_ptr(xs, l, F32), typ=F32)
                b.store(kb.fmax(b.load(amax), kb.intrinsic("llvm.fabs", [v])), amax)
            d = kb.fdiv(b.load(amax), f32(127.0))
            inv = b.select(b.fcmp_ordered(">", d, f32(0.0)), kb.fdiv(f32(1.0), d), f32(0.0))
            out = kb.byte_ptr(qrow, b.mul(blk, i64(QBLOCK)))
            qsum = kb.var(I32, ir.Constant(I32, 0), "qsum")
            with kb.loop(i64(0), i64(32), "l") as l:
                v = b.load(kb.elem_ptr(xs, l, F32), typ=F32)
                q = b.fptosi(kb.intrinsic("llvm.round", [kb.fmul(v, inv)]), I32)
                b.store(b.trunc(q, I8), kb.byte_ptr(out, b.add(l, i64(8))), align=1)
                b.store(b.add(b.load(qsum), q), qsum)
            b.store(d, out, align=4)
            b.store(b.load(qsum), kb.byte_ptr(out, i64(4)), align=4)


def _weight_block_dot(kb: KernelBuilder, wt: GGMLType, wblk: ir.Value, qblk: ir.Value) -> ir.Value:
    """Integer dot of one weight block with one activation block, scaled to f32."""
    b = kb.b
    dq = b.load(qblk, typ=F32, align=4)
    qsum = b.sitofp(b.load(kb.byte_ptr(qblk, i64(4)), typ=I32, align=4), F32)
    q8 = kb.byte_ptr(qblk, i64(8))
    dw = b.fpext(b.load(wblk, typ=F16, align=1), F32)
    acc = kb.var(I32, ir.Constant(I32, 0), "isum")

    def q8_at(l):
        return b.sext(b.load(kb.byte_ptr(q8, l), typ=I8, align=1), I32)

    if wt == GGMLType.Q8_0:
        with kb.loop(i64(0), i64(32), "l") as l:
            w = b.sext(b.load(kb.byte_ptr(wblk, b.add(l, i64(2))), typ=I8, align=1), I32)
            b.store(b.add(b.load(acc), b.mul(w, q8_at(l))), acc)
        return kb.fmul(kb.fmul(dw, dq), b.sitofp(b.load(acc), F32))
    qs_off = {GGMLType.Q4_0: 2, GGMLType.Q4_1: 4, GGMLType.Q5_0: 6}[wt]
    qh = b.load(kb.byte_ptr(wblk, i64(2)), typ=I32, align=1) if wt == GGMLType.Q5_0 else None
    with kb.loop(i64(0), i64(16), "l") as l:
        byte = b.zext(b.load(kb.byte_ptr(wblk, b.add(l, i64(qs_off))), typ=I8, align=1), I32)
        lo = b.and_(byte, ir.Constant(I32, 15))
        hi = b.lshr(byte, ir.Constant(I32, 4))
        if qh is not None:  # the fifth bit of element l and of element l + 16
            l32 = b.trunc(l, I32)
            lo = b.or_(lo, b.shl(b.and_(b.lshr(qh, l32), ir.Constant(I32, 1)), ir.Constant(I32, 4)))
            hi = b.or_(hi, b.shl(b.and_(b.lshr(qh, b.add(l32, ir.Constant(I32, 16))), ir.Constant(I32, 1)),
                                 ir.Constant(I32, 4)))
        s = b.add(b.mul(lo, q8_at(l)), b.mul(hi, q8_at(b.add(l, i64(16)))))
        b.store(b.add(b.load(acc), s), acc)
    isum = b.sitofp(b.load(acc), F32)
    if wt == GGMLType.Q4_1:
        m = b.fpext(b.load(kb.byte_ptr(wblk, i64(2)), typ=F16, align=1), F32)
        return kb.fadd(kb.fmul(kb.fmul(dw, dq), isum), kb.fmul(kb.fmul(m, dq), qsum))
    offset = f32(8.0 if wt == GGMLType.Q4_0 else 16.0)
    return kb.fmul(kb.fmul(dw, dq), kb.fsub(isum, kb.fmul(offset, qsum)))


def _quant_mul_mat(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    a, x = node.src
    n_blocks = a.ne[0] // 32
    wblock = type_size(a.type)
    _quantize_activations(kb, x, n_blocks)
    kb.barrier()
    n_tok = n_rows(kb, x)
    start, end = kb.thread_range(kb.dim(a.ne[1]))
    with kb.loop(start, end, "row") as i:
        wrow = kb.byte_ptr(kb.arg("src0"), b.mul(i, kb.dim(a.nb[1])))
        with kb.loop(i64(0), n_tok, "tok") as j:
            i1, i2, i3 = unravel_row(kb, node, j)
            qrow = kb.byte_ptr(kb.arg("scratch"), b.mul(j, i64(n_blocks * QBLOCK)))
            acc = kb.var(F32, f32(0.0), "acc")
            with kb.loop(i64(0), i64(n_blocks), "blk") as blk:
                dot = _weight_block_dot(kb, a.type, kb.byte_ptr(wrow, b.mul(blk, i64(wblock))),
                                        kb.byte_ptr(qrow, b.mul(blk, i64(QBLOCK))))
                b.store(kb.fadd(b.load(acc), dot), acc)
            drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
            kb.store(elem_ptr(kb, drow, node, i), b.load(acc), node.type)


