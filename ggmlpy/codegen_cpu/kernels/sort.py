"""Row kernels of a mixture-of-experts router: argsort (its top-k is a view of the first
columns) and sum_rows.

argsort ranks each value by counting the values that go before it (larger ones for a
descending sort, smaller for ascending, an equal one when its index is lower): n² compares
per row, with no data-dependent branches, for the rows routers sort (8 to 256 experts).
Ties keep index order, as the numpy reference; NaNs go last. sum_rows adds in double
precision, as ggml.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import I32, KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType

F64 = ir.DoubleType()


def _supported(node: Tensor) -> bool:
    return node.src[0].type == GGMLType.F32


@lowering("argsort", supports=_supported)
def _argsort(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    (a,) = node.src
    descending = node.params.get("order", 0) == 1
    start, end = kb.thread_range(n_rows(kb, node))
    n = kb.dim(a.ne[0])
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        src, dst = row_ptr(kb, kb.arg("src0"), a, i1, i2, i3), row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        with kb.loop(i64(0), n, "i") as i:
            xi = kb.load(elem_ptr(kb, src, a, i), a.type)
            rank = kb.var(ir.IntType(64), i64(0), "rank")
            with kb.loop(i64(0), n, "j") as j:
                xj = kb.load(elem_ptr(kb, src, a, j), a.type)
                # a NaN goes last either way, so the ranks stay a permutation
                nan_i, nan_j = b.fcmp_unordered("uno", xi, xi), b.fcmp_unordered("uno", xj, xj)
                ahead = b.or_(b.fcmp_ordered(">" if descending else "<", xj, xi), b.and_(nan_i, b.not_(nan_j)))
                same = b.or_(b.fcmp_ordered("==", xj, xi), b.and_(nan_i, nan_j))
                tie_before = b.and_(same, b.icmp_signed("<", j, i))
                b.store(b.add(b.load(rank), b.zext(b.or_(ahead, tie_before), ir.IntType(64))), rank)
            b.store(b.trunc(i, I32), elem_ptr(kb, dst, node, b.load(rank)), align=4)


@lowering("sum_rows", supports=_supported)
def _sum_rows(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    (a,) = node.src
    start, end = kb.thread_range(n_rows(kb, node))
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        src = row_ptr(kb, kb.arg("src0"), a, i1, i2, i3)
        acc = kb.var(F64, ir.Constant(F64, 0.0), "sum")
        with kb.loop(i64(0), kb.dim(a.ne[0]), "i") as i:
            b.store(b.fadd(b.load(acc), b.fpext(kb.load(elem_ptr(kb, src, a, i), a.type), F64)), acc)
        kb.store(row_ptr(kb, kb.arg("dst"), node, i1, i2, i3), b.fptrunc(b.load(acc), ir.FloatType()), node.type)
