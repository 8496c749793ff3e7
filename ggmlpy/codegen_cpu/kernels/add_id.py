"""add_id: each selected expert's bias added to its rows of a mixture-of-experts product
(gpt-oss's expert biases), out[:, e, t] = a[:, e, t] + b[:, ids[e, t]].

One row of `a` per (expert slot, token); the bias row is looked up through the I32 id, so
the [N, n_expert] bias table is read only where a token selected the expert.
"""
from __future__ import annotations

from ggmlpy.codegen_cpu.irgen import KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType


def _supported(node: Tensor) -> bool:
    a, bias, ids = node.src
    return a.type == bias.type == node.type == GGMLType.F32 and ids.type == GGMLType.I32


@lowering("add_id", supports=_supported)
def _add_id(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    a, bias, ids = node.src
    start, end = kb.thread_range(n_rows(kb, node))
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)       # i1: the expert slot, i2: the token
        expert = kb.load_i64(elem_ptr(kb, row_ptr(kb, kb.arg("src2"), ids, i2, i64(0), i64(0)), ids, i1), ids.type)
        arow = row_ptr(kb, kb.arg("src0"), a, i1, i2, i3)
        brow = row_ptr(kb, kb.arg("src1"), bias, expert, i64(0), i64(0))
        drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        with kb.loop(i64(0), kb.dim(node.ne[0]), "i0") as i0:
            s = b.fadd(kb.load(elem_ptr(kb, arow, a, i0), a.type), kb.load(elem_ptr(kb, brow, bias, i0), bias.type))
            kb.store(elem_ptr(kb, drow, node, i0), s, node.type)
