"""Quantised activations: the f32 rows of a matrix product's right operand, as 8-bit blocks in
the kernel's scratch, so that the dot products work on integers (as ggml's Q8_0/Q8_1/Q8_K).

Two internal formats (they never leave the kernel, so they are laid out for the dot loops
rather than as ggml's structs): every row starts with its K quantised bytes in order, so one
64-byte load covers two 32-blocks (or a quarter of a 256-block); the scales and sums follow.

- "q8_32" (weights in 32-blocks: Q4_0, Q4_1, Q5_0, Q8_0): per 32 values an f32 scale and the
  i32 sum of the quantised values (the weight offsets and Q4_1's minimum need it).
- "q8_256" (K-quants): per 256 values one f32 scale, and the i16 sums of every 16 values.

Scales are f32 (ggml stores f16): a little more precise, and no conversion in the dot loop.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, FAST, I8, I16, I32, I64, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.kernels.qvec import (
    intrinsic, reduce_add_i32, reduce_max_f32, shuffle, store_vec, vabs, vec, vrint,
)
from ggmlpy.ir.tensor import Tensor

ROW_ALIGN = 64


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class ActFormat:
    name: str
    block: int  # values per scale

    def n_blocks(self, k: int) -> int:
        return k // self.block

    def d_offset(self, k: int) -> int:
        return k

    def sums_offset(self, k: int) -> int:
        return k + 4 * self.n_blocks(k)

    def row_bytes(self, k: int) -> int:
        sums = 4 * self.n_blocks(k) if self.block == 32 else 2 * (k // 16)
        return _round_up(self.sums_offset(k) + sums, ROW_ALIGN)

    def scratch_bytes(self, k: int, rows: int) -> int:
        return rows * self.row_bytes(k) + ROW_ALIGN  # + room to align the base


Q8_32 = ActFormat("q8_32", 32)
Q8_256 = ActFormat("q8_256", 256)


def aligned_scratch(kb: KernelBuilder) -> ir.Value:
    """The scratch pointer rounded up to 64 bytes (numpy gives 16-byte aligned buffers)."""
    b = kb.b
    p = b.ptrtoint(kb.arg("scratch"), I64)
    p = b.and_(b.add(p, i64(ROW_ALIGN - 1)), i64(-ROW_ALIGN))
    return b.inttoptr(p, ir.PointerType())


def quantize_rows(kb: KernelBuilder, x: Tensor, fmt: ActFormat, k: int, base: ir.Value) -> None:
    """Every row of x (split over the threads) quantised into `base` rows of fmt.row_bytes(k)."""
    b = kb.b
    start, end = kb.thread_range(n_rows(kb, x))
    with kb.loop(start, end, "qr") as r:
        i1, i2, i3 = unravel_row(kb, x, r)
        xrow = row_ptr(kb, kb.arg("src1"), x, i1, i2, i3)
        qrow = kb.byte_ptr(base, b.mul(r, i64(fmt.row_bytes(k))))
        if fmt.block == 32:
            _quantize_q8_32(kb, xrow, qrow, fmt, k)
        else:
            _quantize_q8_256(kb, xrow, qrow, fmt, k)


def _load32(kb: KernelBuilder, xrow: ir.Value, first: ir.Value) -> ir.Value:
    return kb.b.load(kb.elem_ptr(xrow, first, F32), typ=vec(F32, 32), align=4)


def _inverse_scale(kb: KernelBuilder, amax: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(d, 1/d) for values up to amax mapped onto [-127, 127]; 1/d = 0 for an all-zero block."""
    b = kb.b
    d = kb.fdiv(amax, f32(127.0))
    inv = b.select(b.fcmp_ordered(">", amax, f32(0.0)), kb.fdiv(f32(127.0), amax), f32(0.0))
    return d, inv


def _quantize32(kb: KernelBuilder, x: ir.Value, inv: ir.Value) -> ir.Value:
    """<32 x float> -> <32 x i32> of round-to-nearest(x * inv)."""
    b = kb.b
    inv_v = b.insert_element(ir.Constant(vec(F32, 1), None), inv, ir.Constant(I32, 0))
    scaled = b.fmul(x, shuffle(b, inv_v, None, [0] * 32), flags=FAST)
    return b.fptosi(vrint(kb, scaled), vec(I32, 32))


def _quantize_q8_32(kb: KernelBuilder, xrow: ir.Value, qrow: ir.Value, fmt: ActFormat, k: int) -> None:
    b = kb.b
    n = fmt.n_blocks(k)
    dbase = kb.byte_ptr(qrow, i64(fmt.d_offset(k)))
    sbase = kb.byte_ptr(qrow, i64(fmt.sums_offset(k)))
    with kb.loop(i64(0), i64(n), "qb") as blk:
        x = _load32(kb, xrow, b.mul(blk, i64(32)))
        d, inv = _inverse_scale(kb, reduce_max_f32(kb, vabs(kb, x)))
        q = _quantize32(kb, x, inv)
        store_vec(b, b.trunc(q, vec(I8, 32)), kb.byte_ptr(qrow, b.mul(blk, i64(32))))
        b.store(d, kb.elem_ptr(dbase, blk, F32), align=4)
        b.store(reduce_add_i32(kb, q), kb.elem_ptr(sbase, blk, I32), align=4)


def _quantize_q8_256(kb: KernelBuilder, xrow: ir.Value, qrow: ir.Value, fmt: ActFormat, k: int) -> None:
    b = kb.b
    n = fmt.n_blocks(k)
    dbase = kb.byte_ptr(qrow, i64(fmt.d_offset(k)))
    sbase = kb.byte_ptr(qrow, i64(fmt.sums_offset(k)))
    with kb.loop(i64(0), i64(n), "qs") as sb:
        first = b.mul(sb, i64(256))
        xs = [_load32(kb, xrow, b.add(first, i64(32 * c))) for c in range(8)]
        amax = vabs(kb, xs[0])
        for x in xs[1:]:
            amax = intrinsic(kb, "llvm.maxnum.v32f32", amax.type, [amax, vabs(kb, x)])
        d, inv = _inverse_scale(kb, reduce_max_f32(kb, amax))
        sums = []
        for c, x in enumerate(xs):
            q = _quantize32(kb, x, inv)
            store_vec(b, b.trunc(q, vec(I8, 32)), kb.byte_ptr(qrow, b.add(first, i64(32 * c))))
            for h in range(2):
                sums.append(reduce_add_i32(kb, shuffle(b, q, None, range(16 * h, 16 * h + 16))))
        b.store(d, kb.elem_ptr(dbase, sb, F32), align=4)
        packed = ir.Constant(vec(I16, 16), None)
        for i, s in enumerate(sums):
            packed = b.insert_element(packed, b.trunc(s, I16), ir.Constant(I32, i))
        store_vec(b, packed, kb.elem_ptr(sbase, b.mul(sb, i64(16)), I16))

