"""concat (ggml_concat): two tensors joined along one dimension, row by row.

Along dim 0 each destination row is a's row followed by b's; along dim 1, 2 or 3 each
destination row is a row of a (index below a's extent there) or of b (the index less it).
Any source strides; F32, F16 or BF16 sources, an F32 result.
"""
from __future__ import annotations

from ggmlpy.codegen_cpu.irgen import KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType

PLAIN = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


def _supported(node: Tensor) -> bool:
    return node.type == GGMLType.F32 and all(s.type in PLAIN for s in node.src)


def _copy(kb: KernelBuilder, src: Tensor, srow, node: Tensor, drow, start, stop, shift) -> None:
    """dst[i0] = src[i0 - shift] for i0 in [start, stop)."""
    with kb.loop(start, stop, "i0") as i0:
        v = kb.load(elem_ptr(kb, srow, src, kb.b.sub(i0, shift)), src.type)
        kb.store(elem_ptr(kb, drow, node, i0), v, node.type)


@lowering("concat", supports=_supported)
def _concat(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    a, c = node.src
    dim = node.params["dim"]
    start, end = kb.thread_range(n_rows(kb, node))
    with kb.loop(start, end, "r") as r:
        idx = list(unravel_row(kb, node, r))          # (i1, i2, i3) of the destination row
        drow = row_ptr(kb, kb.arg("dst"), node, *idx)
        if dim == 0:
            split = kb.dim(a.ne[0])
            _copy(kb, a, row_ptr(kb, kb.arg("src0"), a, *idx), node, drow, i64(0), split, i64(0))
            _copy(kb, c, row_ptr(kb, kb.arg("src1"), c, *idx), node, drow, split, kb.dim(node.ne[0]), split)
        else:
            split = kb.dim(a.ne[dim])
            shifted = list(idx)
            shifted[dim - 1] = b.sub(idx[dim - 1], split)
            with b.if_else(b.icmp_signed("<", idx[dim - 1], split)) as (from_a, from_c):
                with from_a:
                    _copy(kb, a, row_ptr(kb, kb.arg("src0"), a, *idx), node, drow, i64(0), kb.dim(node.ne[0]), i64(0))
                with from_c:
                    _copy(kb, c, row_ptr(kb, kb.arg("src1"), c, *shifted), node, drow, i64(0), kb.dim(node.ne[0]),
                          i64(0))
