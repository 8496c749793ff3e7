"""Row normalisations over ne[0]: rms_norm and norm (mean/variance), f32 accumulation."""
from __future__ import annotations

from ggmlpy.codegen_cpu.irgen import F32, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType


def _f32_rows(node: Tensor) -> bool:
    return node.src[0].type == GGMLType.F32 and node.type == GGMLType.F32


@lowering("rms_norm", "norm", supports=_f32_rows)
def _norm(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    src = node.src[0]
    ne0 = kb.dim(node.ne[0])
    n = b.sitofp(ne0, F32)
    start, end = kb.thread_range(n_rows(kb, node))
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        srow = row_ptr(kb, kb.arg("src0"), src, i1, i2, i3)
        drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        mean = f32(0.0)
        if node.op == "norm":
            acc = kb.var(F32, f32(0.0), "sum")
            with kb.loop(i64(0), ne0, "i0") as i0:
                b.store(kb.fadd(b.load(acc), kb.load(elem_ptr(kb, srow, src, i0), src.type)), acc)
            mean = kb.fdiv(b.load(acc), n)
        sq = kb.var(F32, f32(0.0), "sumsq")
        with kb.loop(i64(0), ne0, "i0") as i0:
            v = kb.fsub(kb.load(elem_ptr(kb, srow, src, i0), src.type), mean)
            b.store(kb.fadd(b.load(sq), kb.fmul(v, v)), sq)
        scale = kb.fdiv(f32(1.0), kb.sqrt(kb.fadd(kb.fdiv(b.load(sq), n), f32(node.params["eps"]))))
        with kb.loop(i64(0), ne0, "i0") as i0:
            v = kb.fsub(kb.load(elem_ptr(kb, srow, src, i0), src.type), mean)
            kb.store(elem_ptr(kb, drow, node, i0), kb.fmul(v, scale), node.type)
