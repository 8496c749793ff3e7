"""soft_max_ext per row: max, exp and sum, normalise; the mask broadcasts over heads."""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import bcast_index, elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType


def _supported(node: Tensor) -> bool:
    return (node.src[0].type == GGMLType.F32 and node.params.get("max_bias", 0.0) == 0.0
            and all(s.type in (GGMLType.F32, GGMLType.F16) for s in node.src))


@lowering("soft_max", supports=_supported)
def _soft_max(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    src = node.src[0]
    mask = node.src[1] if len(node.src) > 1 else None
    ne0 = kb.dim(node.ne[0])
    scale = f32(node.params["scale"])
    start, end = kb.thread_range(n_rows(kb, node))
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        srow = row_ptr(kb, kb.arg("src0"), src, i1, i2, i3)
        drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        mrow = None
        if mask is not None:  # mask rows follow the token index; heads broadcast
            mrow = row_ptr(kb, kb.arg("src1"), mask, i1, bcast_index(kb, i2, node.ne[2], mask.ne[2]),
                           bcast_index(kb, i3, node.ne[3], mask.ne[3]))
        mx = kb.var(F32, f32(float("-inf")), "max")
        with kb.loop(i64(0), ne0, "i0") as i0:
            v = kb.fmul(kb.load(elem_ptr(kb, srow, src, i0), src.type), scale)
            if mrow is not None:
                v = b.fadd(v, kb.load(elem_ptr(kb, mrow, mask, i0), mask.type))
            kb.store(elem_ptr(kb, drow, node, i0), v, node.type)
            b.store(kb.fmax(b.load(mx), v), mx)
        m = b.load(mx)
        total = kb.var(F32, f32(0.0), "sum")
        with kb.loop(i64(0), ne0, "i0") as i0:
            p = elem_ptr(kb, drow, node, i0)
            e = _exp_or_zero(kb, b.fsub(kb.load(p, node.type), m))
            kb.store(p, e, node.type)
            b.store(kb.fadd(b.load(total), e), total)
        inv = kb.fdiv(f32(1.0), b.load(total))
        with kb.loop(i64(0), ne0, "i0") as i0:
            p = elem_ptr(kb, drow, node, i0)
            kb.store(p, kb.fmul(kb.load(p, node.type), inv), node.type)


def _exp_or_zero(kb: KernelBuilder, x: ir.Value) -> ir.Value:
    """exp(x) for x <= 0, exactly 0 for masked (-inf) entries."""
    e = kb.exp(x)
    return kb.b.select(kb.b.fcmp_ordered(">", x, f32(-80.0)), e, f32(0.0))
