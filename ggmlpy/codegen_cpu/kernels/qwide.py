"""Dot decoders of the weight blocks wider than the activations' blocks of 32: Q2_0 and NVFP4 (64
values) and Q1_0 (128), which ggml multiplies against Q8_0 as these do against the q8_32
activations (qact.py).

A step is 64 values, one dot_u8s8 vector: lane L holds values 4L..4L+3, so the scales go per
lane. "wd" is the weights' scale of each lane, met by the activations' (lanes 0-7 the first
block of 32, 8-15 the second) as the 32-blocks' is; the weights are unsigned bytes, value +
`offset`, the offset taken back from the activation sums that start the integer accumulator.

- Q2_0: one f16 d, value 4i + c at bits 2c of qs[i] as code - 1 (-1, 0, 1, 2): lane i's four
  bytes are qs[i] shifted by 0, 2, 4 and 6 (one 32-bit spread per lane); offset 1.
- Q1_0: one f16 d per 128 values, value j bit j of the 16-byte field (set +d, clear -d): a
  step is the block's first or second 64 bits, a mask selecting 2 or 0; offset 1. Two steps
  read one block, so `row_at` finds the half.
- NVFP4: four sub-blocks of 16, each MXFP4's nibble layout over 8 bytes of qs (the low nibbles
  are values 0-7, the high ones 8-15) with its own UE4M3 scale; codes looked up as MXFP4's
  (value + 12, qcodes.py). The scale changes within a block of 32, so the offset's sums come
  per lane (qact.py's "_sum4" format).

Model weights of Q1_0 are repacked (repack.py: its bits as the 16 rows' dot masks, and
kernels/qrepacked.py), which streams 1.33x the file's bytes at several times the rate: the
direct tiles spend a conversion and two multiplies per 64 values and row, 9 bytes of them.
Q2_0 and NVFP4 are not, and have no qgemm path: their prompts take the direct tiles.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import I8, I32, I64, KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels.qact import q8_32
from ggmlpy.codegen_cpu.kernels.qcodes import CODE_BOOKS, CODE_OFFSET, lookup, ue4m3_half
from ggmlpy.codegen_cpu.kernels.qkind import QKind, Vals
from ggmlpy.codegen_cpu.kernels.qvec import (
    load_f16, load_vec, repeat_lanes, shuffle, splat, splat_const, vec, zeros,
)
from ggmlpy.ir.types import GGMLType, block_size
from ggmlpy.quants import block_dtype

G = GGMLType


class WideBlock(QKind):
    """Common parts: `row` gives {"wd": <16 x float> lane scales, "q": <64 x i8> unsigned
    weights}; the activation aux (-offset * sums) starts the accumulator."""
    step_elems = 64
    chunks = 1
    n_acc = 1
    offset: int
    sum_group = 32   # values per offset sum in the activations' aux

    def __init__(self) -> None:
        fields = block_dtype(self.wtype).fields
        self.at = {name: fields[name][1] for name in fields}
        self.fmt = q8_32(self.offset, self.sum_group)

    def init(self, kb: KernelBuilder, row: Vals, tok: Vals) -> ir.Value:
        return tok["aux"]

    def chunk_w(self, kb: KernelBuilder, row: Vals, j: int) -> Vals:
        return row


class Q2(WideBlock):
    wtype, offset = G.Q2_0, 1

    def row(self, kb: KernelBuilder, wblock: ir.Value, tail: bool) -> Vals:
        b = kb.b
        x = b.zext(load_vec(b, kb.byte_ptr(wblock, i64(self.at["qs"])), I8, 16), vec(I32, 16))
        w = x
        for c in (1, 2, 3):   # bits 0-1 of byte c of lane i: bits 2c, 2c + 1 of qs[i]
            w = b.or_(w, b.shl(x, splat_const(I32, 6 * c, 16)))
        q = b.and_(b.bitcast(w, vec(I8, 64)), splat_const(I8, 3, 64))
        return {"wd": splat(b, load_f16(b, kb.byte_ptr(wblock, i64(self.at["d"]))), 16), "q": q}


class Q1(WideBlock):
    wtype, offset = G.Q1_0, 1

    def row_at(self, kb: KernelBuilder, wrow: ir.Value, step: ir.Value, tail: bool) -> Vals:
        b = kb.b
        block = kb.byte_ptr(wrow, b.mul(b.lshr(step, i64(1)), i64(self.block_bytes)))
        half = b.mul(b.and_(step, i64(1)), i64(8))
        bits = b.load(kb.byte_ptr(block, b.add(half, i64(self.at["qs"]))), typ=I64, align=1)
        mask = b.bitcast(bits, vec(ir.IntType(1), 64))
        q = b.select(mask, splat_const(I8, 2, 64), zeros(I8, 64))
        return {"wd": splat(b, load_f16(b, kb.byte_ptr(block, i64(self.at["d"]))), 16), "q": q}


class NVFP4(WideBlock):
    wtype, offset, sum_group = G.NVFP4, CODE_OFFSET[G.MXFP4], 4

    def row(self, kb: KernelBuilder, wblock: ir.Value, tail: bool) -> Vals:
        b = kb.b
        d = ue4m3_half(b, load_vec(b, kb.byte_ptr(wblock, i64(self.at["d"])), I8, 4))
        v = load_vec(b, kb.byte_ptr(wblock, i64(self.at["qs"])), I8, 32)
        low, high = b.and_(v, splat_const(I8, 15, 32)), b.lshr(v, splat_const(I8, 4, 32))
        order = [i for s in range(4) for i in [*range(8 * s, 8 * s + 8), *range(32 + 8 * s, 40 + 8 * s)]]
        q = lookup(kb, shuffle(b, low, high, order), CODE_BOOKS[G.MXFP4])
        return {"wd": repeat_lanes(b, d, 4), "q": q}


WIDE_KINDS: dict[GGMLType, WideBlock] = {k.wtype: k for k in (Q2(), Q1(), NVFP4())}
assert all(block_size(t) % 64 == 0 for t in WIDE_KINDS)
