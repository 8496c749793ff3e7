"""Shared pieces of kernels: walking the rows of a 4-D tensor with ggml broadcasting."""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import KernelBuilder, i64
from ggmlpy.ir.tensor import Tensor


def unravel_row(kb: KernelBuilder, t: Tensor, r: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Row r of t (rows are ne1*ne2*ne3, i1 fastest) as (i1, i2, i3)."""
    b = kb.b
    ne1, ne2 = kb.dim(t.ne[1]), kb.dim(t.ne[2])
    i1 = b.srem(r, ne1)
    q = b.sdiv(r, ne1)
    return i1, b.srem(q, ne2), b.sdiv(q, ne2)


def n_rows(kb: KernelBuilder, t: Tensor) -> ir.Value:
    b = kb.b
    return b.mul(b.mul(kb.dim(t.ne[1]), kb.dim(t.ne[2])), kb.dim(t.ne[3]))


def bcast_index(kb: KernelBuilder, i: ir.Value, n_dst, n_src) -> ir.Value:
    """ggml's repeat: the source index for destination index i along one dimension."""
    if n_src == n_dst:
        return i
    if n_src == 1:
        return i64(0)
    return kb.b.srem(i, kb.dim(n_src))


def row_ptr(kb: KernelBuilder, base: ir.Value, t: Tensor, i1, i2, i3) -> ir.Value:
    b = kb.b
    off = b.add(b.add(b.mul(i1, kb.dim(t.nb[1])), b.mul(i2, kb.dim(t.nb[2]))), b.mul(i3, kb.dim(t.nb[3])))
    return kb.byte_ptr(base, off)


def src_row_ptr(kb: KernelBuilder, base: ir.Value, src: Tensor, dst: Tensor, i1, i2, i3) -> ir.Value:
    """Row pointer of a source broadcast to dst's shape."""
    return row_ptr(kb, base, src, bcast_index(kb, i1, dst.ne[1], src.ne[1]),
                   bcast_index(kb, i2, dst.ne[2], src.ne[2]), bcast_index(kb, i3, dst.ne[3], src.ne[3]))


def elem_ptr(kb: KernelBuilder, row: ir.Value, t: Tensor, i0: ir.Value) -> ir.Value:
    return kb.byte_ptr(row, kb.b.mul(i0, kb.dim(t.nb[0])))


def src_ptr_args(kb: KernelBuilder, node: Tensor) -> list[ir.Value]:
    return [kb.arg(f"src{i}") for i in range(len(node.src))]


