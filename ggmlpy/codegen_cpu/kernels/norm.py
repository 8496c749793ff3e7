"""Row normalisations over ne[0]: rms_norm and norm (mean/variance).

As ggml's CPU kernels: squares (and centred values) in f32, their sums in f64, the mean and
the scale back in f32. The f64 sums matter beyond their accuracy: the scale's last bits
decide how activations round in the 8-bit quantisation of the next matrix product, and
models with large activations (Gemma 3) follow llama.cpp's logits more closely with them.

Rows contiguous along ne[0] (the usual case) run on <64 x float> chunks with vector
accumulators summed horizontally at the end of each pass, and a masked last chunk; strided
rows (views) keep a scalar loop. 64 lanes are four AVX-512 registers of floats (eight of
doubles), so a sum runs as independent chains instead of waiting on one add's latency.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, F64, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.kernels.elementwise import contiguous_rows
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType

WIDTH = 64  # lanes per chunk (see above)


def _f32_rows(node: Tensor) -> bool:
    return node.src[0].type == GGMLType.F32 and node.type == GGMLType.F32


def _centred(node: Tensor) -> bool:
    return node.op in ("norm", "norm_mul")


def weighted_supported(node: Tensor) -> bool:
    """The fused forms (codegen_cpu/fusion.py): a contiguous f32 weight row of ne[0]."""
    w = node.src[1]
    return (_f32_rows(node) and w.type == GGMLType.F32 and contiguous_rows(w) and w.ne[0] == node.ne[0]
            and all(n == 1 for n in w.ne[1:]))


# rms_norm_mul / norm_mul: the normalised row times a weight row, the norm_mul fusion
# group of the passes run as one kernel (same values as the two nodes: (x * scale) * w)
@lowering("rms_norm", "norm", supports=_f32_rows)
@lowering("rms_norm_mul", "norm_mul", supports=weighted_supported)
def _norm(kb: KernelBuilder, node: Tensor) -> None:
    src = node.src[0]
    ne0 = kb.dim(node.ne[0])
    vector = contiguous_rows(src) and contiguous_rows(node)
    start, end = kb.thread_range(n_rows(kb, node))
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        srow = row_ptr(kb, kb.arg("src0"), src, i1, i2, i3)
        drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        (_vector_row if vector else _scalar_row)(kb, node, srow, drow, ne0)


def _mean(kb: KernelBuilder, total: ir.Value, ne0: ir.Value) -> ir.Value:
    """An f64 sum over ne0 elements as an f32 mean (ggml: `const float mean = sum/ne00`)."""
    return kb.b.fptrunc(kb.fdiv(total, kb.b.sitofp(ne0, F64)), F32)


def _scale(kb: KernelBuilder, node: Tensor, mean_square: ir.Value) -> ir.Value:
    """1 / sqrt(mean of squares + eps), in f32."""
    return kb.fdiv(f32(1.0), kb.sqrt(kb.fadd(mean_square, f32(node.params["eps"]))))


def _vector_row(kb: KernelBuilder, node: Tensor, srow: ir.Value, drow: ir.Value, ne0: ir.Value) -> None:
    b = kb.b
    src = node.src[0]
    zero = kb.splat(f32(0.0), WIDTH)
    zero64 = kb.splat(ir.Constant(F64, 0.0), WIDTH)

    def load(i0: ir.Value, mask: ir.Value | None) -> ir.Value:
        return kb.load_vector(elem_ptr(kb, srow, src, i0), src.type, WIDTH, mask)  # unset lanes 0

    def centred(i0: ir.Value, mask: ir.Value | None, mean: ir.Value) -> ir.Value:
        v = kb.fsub(load(i0, mask), mean)
        return v if mask is None or not _centred(node) else kb.select(mask, v, zero)  # keep unset lanes 0

    def accumulate(acc: ir.AllocaInstr, value: ir.Value) -> None:
        b.store(kb.fadd(b.load(acc), b.fpext(value, zero64.type)), acc)

    mean = f32(0.0)
    if _centred(node):
        total = kb.var(zero64.type, zero64, "sum")
        kb.vector_chunks(ne0, lambda i0, mask: accumulate(total, load(i0, mask)), WIDTH)
        mean = _mean(kb, kb.reduce(b.load(total), kb.fadd), ne0)
    sq = kb.var(zero64.type, zero64, "sumsq")

    def square(i0: ir.Value, mask: ir.Value | None) -> None:
        v = centred(i0, mask, mean)
        accumulate(sq, kb.fmul(v, v))

    kb.vector_chunks(ne0, square, WIDTH)
    scale = _scale(kb, node, _mean(kb, kb.reduce(b.load(sq), kb.fadd), ne0))

    def write(i0: ir.Value, mask: ir.Value | None) -> None:
        v = kb.fmul(centred(i0, mask, mean), scale)
        if len(node.src) > 1:  # times the weight row
            w = node.src[1]
            v = kb.fmul(v, kb.load_vector(elem_ptr(kb, kb.arg("src1"), w, i0), w.type, WIDTH, mask))
        kb.store_vector(elem_ptr(kb, drow, node, i0), v, node.type, mask)

    kb.vector_chunks(ne0, write, WIDTH)


def _scalar_row(kb: KernelBuilder, node: Tensor, srow: ir.Value, drow: ir.Value, ne0: ir.Value) -> None:
    b = kb.b
    src = node.src[0]
    zero64 = ir.Constant(F64, 0.0)
    mean = f32(0.0)
    if _centred(node):
        acc = kb.var(F64, zero64, "sum")
        with kb.loop(i64(0), ne0, "i0") as i0:
            x = kb.load(elem_ptr(kb, srow, src, i0), src.type)
            b.store(kb.fadd(b.load(acc), b.fpext(x, F64)), acc)
        mean = _mean(kb, b.load(acc), ne0)
    sq = kb.var(F64, zero64, "sumsq")
    with kb.loop(i64(0), ne0, "i0") as i0:
        v = kb.fsub(kb.load(elem_ptr(kb, srow, src, i0), src.type), mean)
        b.store(kb.fadd(b.load(sq), b.fpext(kb.fmul(v, v), F64)), sq)
    scale = _scale(kb, node, _mean(kb, b.load(sq), ne0))
    with kb.loop(i64(0), ne0, "i0") as i0:
        v = kb.fmul(kb.fsub(kb.load(elem_ptr(kb, srow, src, i0), src.type), mean), scale)
        if len(node.src) > 1:
            w = node.src[1]
            v = kb.fmul(v, kb.load(elem_ptr(kb, kb.arg("src1"), w, i0), w.type))
        kb.store(elem_ptr(kb, drow, node, i0), v, node.type)
