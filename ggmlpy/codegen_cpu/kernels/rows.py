"""Row gathers and scatters: get_rows (embedding lookup, output selection) and set_rows
(writing K and V rows into their cache cells).

get_rows reads F32/F16/BF16 tables element by element and quantised tables (Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: every type kernels/qdot.py decodes) a block
at a time with the vector dequantisers of kernels/qdequant.py; tables the CPU backend keeps
repacked (repack.py: a model's weights, such as an embedding tied to the output) from
that layout."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ggmlpy.codegen_cpu import repack
from ggmlpy.codegen_cpu.irgen import KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.kernels.kv_store import STORABLE, quantize_row
from ggmlpy.codegen_cpu.kernels.qdequant import DEQUANTIZABLE, dequant_row, dequant_repacked_row
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size

PLAIN = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


@contextmanager
def _indexed_rows(kb: KernelBuilder, rows: Tensor, idx: Tensor, idx_arg: str) -> Iterator[tuple]:
    """The loop over this thread's share of the rows of `rows` that get_rows and set_rows
    share: yields the row length, the row's (i1, i2, i3) and the row number that the index
    tensor `idx` (kernel argument idx_arg) holds for it (the length emitted before the loop)."""
    start, end = kb.thread_range(n_rows(kb, rows))
    ne0 = kb.dim(rows.ne[0])
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, rows, r)
        ip = row_ptr(kb, kb.arg(idx_arg), idx, i2, i3, i64(0))
        row = kb.load_i64(elem_ptr(kb, ip, idx, i1), idx.type)
        yield ne0, i1, i2, i3, row


def _get_rows_supported(node: Tensor) -> bool:
    table = node.src[0]
    if node.type != GGMLType.F32:
        return False
    if table.type in DEQUANTIZABLE:  # whole rows of blocks into a contiguous f32 row
        return isinstance(table.ne[0], int) and node.nb[0] == 4
    return table.type in PLAIN


@lowering("get_rows", supports=_get_rows_supported)
def _get_rows(kb: KernelBuilder, node: Tensor) -> None:
    table, idx = node.src
    with _indexed_rows(kb, node, idx, "src1") as (ne0, i1, i2, i3, row):
        srow = row_ptr(kb, kb.arg("src0"), table, row, i2, i3)
        drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        if repack.operand_repacked(node, 0):  # row `row` of the CPU backend's own layout
            dequant_repacked_row(kb, table.type, kb.arg("src0"), row, drow, table.ne[0])
        elif table.type in DEQUANTIZABLE:
            dequant_row(kb, table.type, srow, drow, table.ne[0])
        else:
            with kb.loop(i64(0), ne0, "i0") as i0:
                v = kb.load(elem_ptr(kb, srow, table, i0), table.type)
                kb.store(elem_ptr(kb, drow, node, i0), v, node.type)


def _set_rows_supported(node: Tensor) -> bool:
    dst, src, idx = node.src
    if dst.type in STORABLE:   # a quantised KV cache: contiguous f32 rows of whole blocks
        return (src.type == GGMLType.F32 and src.nb[0] == 4 and node.nb[0] == type_size(dst.type)
                and isinstance(src.ne[0], int) and src.ne[0] % 32 == 0)
    return dst.type in PLAIN and src.type == GGMLType.F32


@lowering("set_rows", supports=_set_rows_supported)
def _set_rows(kb: KernelBuilder, node: Tensor) -> None:
    """Rows converted element by element, or quantised a block at a time into a quantised
    KV cache (kernels/kv_store.py: the bytes ggml's CPU set_rows writes)."""
    _, src, idx = node.src  # the kernel's dst is the destination's memory
    with _indexed_rows(kb, src, idx, "src2") as (ne0, i1, i2, i3, row):
        srow = row_ptr(kb, kb.arg("src1"), src, i1, i2, i3)
        drow = row_ptr(kb, kb.arg("dst"), node, row, i2, i3)
        if node.type in STORABLE:
            quantize_row(kb, node.type, srow, drow, src.ne[0])
        else:
            with kb.loop(i64(0), ne0, "i0") as i0:
                kb.store(elem_ptr(kb, drow, node, i0), kb.load(elem_ptr(kb, srow, src, i0), src.type), node.type)
