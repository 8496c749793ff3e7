"""ssm_conv (ir/ops/ssm.py): per (sequence, token) row of the result, each channel's dot of
its d_conv inputs ending at that token with its kernel row, summed in float32 in k order as
ggml's CPU loop (no fast-math reassociation: the same bits). The channels of a row are split
over the threads."""
from __future__ import annotations

from ggmlpy.codegen_cpu.irgen import KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, row_ptr
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType


def _supported(node: Tensor) -> bool:
    sx, c = node.src
    return sx.type == c.type == node.type == GGMLType.F32 and isinstance(c.ne[0], int)


@lowering("ssm_conv", supports=_supported)
def _ssm_conv(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    sx, c = node.src
    d_conv = c.ne[0]
    start, end = kb.thread_range(kb.dim(node.ne[0]))
    with kb.loop(i64(0), kb.dim(node.ne[2]), "s") as s:
        with kb.loop(i64(0), kb.dim(node.ne[1]), "t") as t:
            drow = row_ptr(kb, kb.arg("dst"), node, t, s, i64(0))
            with kb.loop(start, end, "i") as i:
                srow = row_ptr(kb, kb.arg("src0"), sx, i, s, i64(0))
                crow = row_ptr(kb, kb.arg("src1"), c, i, i64(0), i64(0))
                acc = f32(0.0)
                for k in range(d_conv):   # unrolled: d_conv is 4 in the models that use it
                    xv = kb.load(elem_ptr(kb, srow, sx, b.add(t, i64(k))), sx.type)
                    cv = kb.load(elem_ptr(kb, crow, c, i64(k)), c.type)
                    acc = b.fadd(acc, b.fmul(xv, cv))
                kb.store(elem_ptr(kb, drow, node, i), acc, node.type)
