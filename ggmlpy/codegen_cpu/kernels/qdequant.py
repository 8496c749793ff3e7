"""Quantised rows back to f32 in native code (get_rows on quantised embedding tables).

It reuses the weight decoders of the dot products (kernels/qdot.py), which give each 64
values as unsigned bytes plus their scales, and applies the scales in f32 instead of
feeding a dot product:

- 32-blocks: d * (u - offset), or d * u + m for Q4_1 and Q5_1 (MXFP4: u its code's value +
  12, d its E8M0 scale: kernels/qcodes.py);
- K-quants: d * scale(lane) * u + correction(lane), the correction being the minimum
  (Q2_K, Q4_K, Q5_K: -dmin * m) or the offset (Q3_K: -4 * d * scale, Q6_K: -32 * d * scale;
  the grid I-quants and ternary types, kernels/qgrid.py: -offset * d * scale, exact in f32);
- Q2_0, Q1_0, NVFP4 (kernels/qwide.py): d(lane) * (u - offset), 64 values at a time.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu import repack
from ggmlpy.codegen_cpu.irgen import F32, I8, I32, I64, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.qdot import KINDS, Block32, KQuant
from ggmlpy.codegen_cpu.kernels.qcodes import CODE_BOOKS, e8m0_half, lookup
from ggmlpy.codegen_cpu.kernels.qwide import WideBlock
from ggmlpy.codegen_cpu.kernels.qvec import (
    CONTRACT, concat, const, load_f16, load_vec, shuffle, sitofp, splat, store_vec, vec,
)
from ggmlpy.ir.types import GGMLType, block_size, type_size

DEQUANTIZABLE = tuple(KINDS)


def dequant_row(kb: KernelBuilder, t: GGMLType, src: ir.Value, dst: ir.Value, k: int) -> None:
    """k values of type t at src (a row of blocks) as f32 at dst."""
    kind = KINDS[t]
    b = kb.b
    if isinstance(kind, WideBlock):
        _wide(kb, kind, src, dst, k)
        return
    n_blocks = k // block_size(t)
    with kb.loop(i64(0), i64(n_blocks), "dq") as blk:
        bp = kb.byte_ptr(src, b.mul(blk, i64(type_size(t))))
        out = kb.elem_ptr(dst, b.mul(blk, i64(block_size(t))), F32)
        if isinstance(kind, Block32):
            _block32(kb, kind, bp, out)
        else:
            _kquant(kb, kind, bp, out)


def _u8_to_f32(b: ir.IRBuilder, q: ir.Value) -> ir.Value:
    return sitofp(b, b.zext(q, vec(I32, q.type.count)))


def _block32(kb: KernelBuilder, kind: Block32, bp: ir.Value, out: ir.Value) -> None:
    store_vec(kb.b, block32_values(kb, kind.wtype, bp), out)


def block32_values(kb: KernelBuilder, t: GGMLType, bp: ir.Value) -> ir.Value:
    """The block of 32 at bp (a 32-block type of KINDS) as <32 x float>: also what the
    attention over a quantised KV cache reads its K and V rows with (kernels/kv_quant.py)."""
    b, kind = kb.b, KINDS[t]
    u = _u8_to_f32(b, shuffle(b, kind.decode(kb, bp, None), None, range(32)))
    d = splat(b, kind.block_scale(kb, bp), 32)
    if kind.offset is None:
        m = splat(b, load_f16(b, kb.byte_ptr(bp, i64(2))), 32)
        return b.fadd(b.fmul(u, d, flags=CONTRACT), m, flags=CONTRACT)
    return b.fmul(b.fsub(u, splat(b, f32(float(kind.offset)), 32)), d)


def _wide(kb: KernelBuilder, kind: WideBlock, src: ir.Value, dst: ir.Value, k: int) -> None:
    """64 values at a time, d(lane) * (u - offset), each lane's scale on its four values."""
    b = kb.b
    with kb.loop(i64(0), i64(k // kind.step_elems), "dw") as step:
        row = kind.row_at(kb, src, step, False)
        u = b.fsub(_u8_to_f32(b, row["q"]), splat(b, f32(float(kind.offset)), 64))
        d = shuffle(b, row["wd"], None, [e // 4 for e in range(64)])
        store_vec(b, b.fmul(u, d), kb.elem_ptr(dst, b.mul(step, i64(64)), F32))


def _kquant(kb: KernelBuilder, kind: KQuant, bp: ir.Value, out: ir.Value) -> None:
    b = kb.b
    row = kind.row(kb, bp, False)
    for j in range(kind.chunks):
        w = kind.chunk_w(kb, row, j)
        scale = shuffle(b, w["sc"], None, [e // 4 for e in range(64)])
        u = sitofp(b, b.mul(b.zext(w["q"], vec(I32, 64)), scale))
        d = shuffle(b, row["wd"], None, [0] * 64)
        corr = shuffle(b, row["corr"], None, [kind.corr_lane(j, e) for e in range(64)])
        v = b.fadd(b.fmul(u, d, flags=CONTRACT), corr, flags=CONTRACT)
        store_vec(b, v, kb.elem_ptr(out, i64(64 * j), F32))




def dequant_repacked_row(kb: KernelBuilder, t: GGMLType, table: ir.Value, row: ir.Value, dst: ir.Value,
                         k: int) -> None:
    """Row `row` of a repacked table (repack.py) as k f32 values at dst: lane row % 16 of
    the vectors of group row // 16, a block at a time."""
    b = kb.b
    sb = repack.STEP_BYTES[t]
    group = kb.byte_ptr(table, b.mul(b.sdiv(row, i64(repack.GROUP)), i64(repack.n_steps(t, k) * sb)))
    lane = b.mul(b.srem(row, i64(repack.GROUP)), i64(4))
    with kb.loop(i64(0), i64(k // 32), "rq") as blk:
        h = b.srem(blk, i64(2))
        step = kb.byte_ptr(group, b.mul(b.sdiv(blk, i64(2)), i64(sb)))
        half = b.add(b.mul(h, i64(32)), b.sdiv(lane, i64(2)))   # byte of f16 number 16h + r

        def lane_bytes(first: int, per_block: int, c: int) -> ir.Value:
            """This row's 4 bytes in vector first + per_block * h + c of the step."""
            vector = b.add(b.mul(h, i64(per_block)), i64(first + c))
            return load_vec(b, kb.byte_ptr(step, b.add(b.mul(vector, i64(64)), lane)), I8, 4)

        def scale(at: int) -> ir.Value:
            return splat(b, load_f16(b, kb.byte_ptr(step, b.add(i64(at), half))), 32)

        if repack.exponents(t):   # MXFP4: the E8M0 byte of block h, row r at byte 16h + r
            e = b.load(kb.byte_ptr(step, b.add(i64(repack.d_offset(t)), b.sdiv(half, i64(2)))), typ=I8)
            d = splat(b, e8m0_half(b, e), 32)
        else:
            d = scale(repack.d_offset(t))
        if t == GGMLType.Q8_0:
            u = _u8_to_f32(b, _concat_all(b, [lane_bytes(0, 8, c) for c in range(8)]))
            v = b.fmul(b.fsub(u, splat(b, f32(128.0), 32)), d)
        elif t == GGMLType.Q1_0:   # bits 4r.. of the 8 words of vector h: +d where set, -d where clear
            words = load_vec(b, kb.byte_ptr(step, b.mul(h, i64(64))), I64, 8)
            nibbles = b.trunc(b.lshr(words, splat(b, lane, 8)), vec(ir.IntType(4), 8))
            bits = b.bitcast(b.bitcast(nibbles, I32), vec(ir.IntType(1), 32))
            v = b.fmul(b.select(bits, splat(b, f32(1.0), 32), splat(b, f32(-1.0), 32)), d)
        else:
            packed = _concat_all(b, [lane_bytes(0, 4, c) for c in range(4)])   # qs bytes 0..15
            q = concat(b, b.and_(packed, splat(b, ir.Constant(I8, 15), 16)),
                       b.lshr(packed, splat(b, ir.Constant(I8, 4), 16)))
            if repack.high_bits(t):
                q = b.or_(q, _fifth_bits(b, lane_bytes(repack.qh_offset(t) // 64, 1, 0)))
            if t in CODE_BOOKS:
                q = lookup(kb, q, CODE_BOOKS[t])
            u = _u8_to_f32(b, q)
            if repack.minimums(t):
                v = b.fadd(b.fmul(u, d, flags=CONTRACT), scale(repack.m_offset(t)), flags=CONTRACT)
            else:
                v = b.fmul(b.fsub(u, splat(b, f32(float(KINDS[t].offset)), 32)), d)
        store_vec(b, v, kb.elem_ptr(dst, b.mul(blk, i64(32)), F32))


def _concat_all(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    while len(parts) > 1:
        parts = [concat(b, parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return parts[0]


def _fifth_bits(b: ir.IRBuilder, plane: ir.Value) -> ir.Value:
    """Q5_0's and Q5_1's bit 4 of the block's 32 values (as 0 or 16) from its 4 plane bytes: value j
    has it in byte j % 4, bit c (j < 16) or 4 + c (j >= 16), c = (j % 16) // 4."""
    lanes = [j % 4 for j in range(32)]
    shifts = [(j % 16) // 4 + (4 if j >= 16 else 0) for j in range(32)]
    spread = shuffle(b, plane, None, lanes)
    bit = b.and_(b.lshr(spread, const(I8, shifts)), splat(b, ir.Constant(I8, 1), 32))
    return b.shl(bit, splat(b, ir.Constant(I8, 4), 32))
