"""Quantised dot products, one emitter per weight type, on the 64-byte `dot_u8s8` step.

A matrix product walks K in *steps* (two 32-blocks, or one 256-value super-block) and each
step in *chunks* of 64 values. A kind tells the tiling loops (kernels/matmul.py) what to do:

    row(wblock)          per weight row and step: scales, and what the chunks decode from
                         (row_at(wrow, step) finds the step's bytes: `step_bytes` apart)
    tok(arow, step)      per token and step: pointers to the activation step (qact.py)
    chunk_w(row, j)      the chunk's 64 weights as unsigned bytes (+ per-lane scales)
    chunk_a(tok, j)      the chunk's 64 activation bytes
    init(row, tok)       the integer accumulator a step starts from
    chunk_dot(...)       integer accumulation of one chunk
    finish(...)          the step's integer sums into the f32 accumulators (<16 x float>)

vpdpbusd multiplies unsigned by signed bytes, so weights are decoded unsigned and their
offset taken back from the activations' sums: Q4_0 stores q + 8, Q5_0 q + 16, Q8_0 gets 128
added (xor 0x80), Q6_K stores q + 32, Q3_K q + 4, and the code-book types' codes to their value + CODE_OFFSET
(kernels/qcodes.py: MXFP4 12, IQ4_NL and IQ4_XS 128). For the 32-blocks that happens in integers (the
activation step carries -offset * sum(q) to start the accumulator); Q4_1's and Q5_1's minimums and the
K-quants' minimums and offsets are f32 terms, a second accumulator fed by one multiply-add of
a per-row vector and the activation step's precomputed sums. The same decoders serve the
repacked prefill path (qgemm.py) and get_rows (qdequant.py).

Here: the 32-block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL) and the K-quants with
IQ4_XS; the grid I-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the
ternary TQ1_0 and TQ2_0 are KQuants of kernels/qgrid.py (their values looked up in grids, the
signs applied before the offset) and qternary.py; the blocks of 64 and 128 against 32-blocks of
activations (Q2_0, Q1_0, NVFP4) are kernels/qwide.py's; all registered in KINDS below. The interface (QKind, KQuant)
lives in qkind.py so that both modules can build on it.

Only whole blocks are ever loaded (16 or 32 bytes at a time, align 1), so nothing is read
past the end of a weight row: the GGUF memory map has no tail padding.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, I8, I16, I32, I64, KernelBuilder, f32, i64, zero_vector
from ggmlpy.codegen_cpu.kernels.qact import Q8_256_16, Q8_256_32, q8_32
from ggmlpy.codegen_cpu.kernels.qcodes import CODE_BOOKS, CODE_OFFSET, e8m0_half, lookup
from ggmlpy.codegen_cpu.kernels.qgrid import GRID_KINDS
from ggmlpy.codegen_cpu.kernels.qternary import TERNARY_KINDS
from ggmlpy.codegen_cpu.kernels.qwide import WIDE_KINDS
from ggmlpy.codegen_cpu.kernels.qkind import KQuant, QKind, Vals
from ggmlpy.codegen_cpu.kernels.qvec import (
    CONTRACT, V16I32, WEIGHT_BYTE_MAX, concat, const, dot_u8s8, load_f16, load_vec, repeat_lanes, shuffle, sitofp,
    splat, splat_const, vec, zeros,
)
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import block_dtype


# 32-blocks --------------------------------------------------------------------------------------
class Block32(QKind):
    """Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL: a step is two blocks; lanes 0-7 belong to the
    first, 8-15 to the second. `offset` is what the unsigned weight exceeds the signed one by:
    the activation's aux vector (-offset * sum(q) in lanes 0 and 8) starts the integer
    accumulator, which undoes it exactly. Q4_1 and Q5_1 (offset None) add their minimums
    instead: the correction vector is <d0, m0, d1, m1, 0...>, met by d * sum(q) in lanes 1
    and 3. Where the quants, the fifth bits and the scale sit comes from the GGUF block's
    layout (ggmlpy/quants/layouts.py): a `qh` word gives each value its bit 4, an `e` byte is
    an E8M0 scale instead of the f16 `d`; a type with a code book (qcodes.CODE_BOOKS: MXFP4, IQ4_NL)
    looks its nibbles up in it."""
    step_elems = 64
    chunks = 1

    def __init__(self, wtype: GGMLType, offset: int | None):
        fields = block_dtype(wtype).fields
        self.wtype, self.offset, self.qs_at = wtype, offset, fields["qs"][1]
        self.qh_at = fields["qh"][1] if "qh" in fields else None
        self.e_at = fields["e"][1] if "e" in fields else None
        self.d_at = fields["d"][1] if "d" in fields else None
        self.codes = CODE_BOOKS.get(wtype)
        self.fmt = q8_32(offset)
        self.n_acc = 2 if offset is None else 1

    def init(self, kb: KernelBuilder, row: Vals, tok: Vals) -> ir.Value:
        return zeros(I32, 16) if self.offset is None else tok["aux"]

    def row(self, kb: KernelBuilder, wblock: ir.Value, tail: bool) -> Vals:
        b = kb.b
        p1 = None if tail else kb.byte_ptr(wblock, i64(self.block_bytes))
        if self.offset is None:  # d and m are adjacent halves: one 32-bit load per block
            dm = self._halves(kb, wblock, p1, 2)   # <d0, m0, d1, m1>
            return {"wd": shuffle(b, dm, None, [0] * 8 + [2] * 8),
                    "corr": shuffle(b, dm, zeros(F32, 4), [0, 1, 2, 3] + [4] * 12),
                    "q": self.decode(kb, wblock, p1)}
        d = self._scales(kb, wblock, p1)           # <d0, d1>
        return {"wd": repeat_lanes(b, d, 8), "q": self.decode(kb, wblock, p1)}

    def _scales(self, kb: KernelBuilder, p0: ir.Value, p1: ir.Value | None) -> ir.Value:
        """The two blocks' scales as <2 x float> (zero for a missing p1): f16 halves, or E8M0
        exponent bytes."""
        if self.e_at is None:
            return self._halves(kb, p0, p1, 1)
        b = kb.b
        e = zero_vector(vec(I8, 2))
        for i, p in enumerate([p0] if p1 is None else [p0, p1]):
            e = b.insert_element(e, b.load(kb.byte_ptr(p, i64(self.e_at)), typ=I8), ir.Constant(I32, i))
        d = e8m0_half(b, e)
        return d if p1 is not None else b.insert_element(d, f32(0.0), ir.Constant(I32, 1))

    def block_scale(self, kb: KernelBuilder, p: ir.Value) -> ir.Value:
        """The scale of the block at p as f32 (get_rows, qgemm's repacking)."""
        b = kb.b
        if self.e_at is None:
            return load_f16(b, kb.byte_ptr(p, i64(self.d_at)))
        return e8m0_half(b, b.load(kb.byte_ptr(p, i64(self.e_at)), typ=I8))

    @staticmethod
    def _halves(kb: KernelBuilder, p0: ir.Value, p1: ir.Value | None, n: int) -> ir.Value:
        """n f16 values from the start of each block, as 2n floats (zeros for a missing p1)."""
        b = kb.b
        it = ir.IntType(16 * n)
        w = b.insert_element(zero_vector(vec(it, 2)), b.load(p0, typ=it, align=1), ir.Constant(I32, 0))
        if p1 is not None:
            w = b.insert_element(w, b.load(p1, typ=it, align=1), ir.Constant(I32, 1))
        return b.fpext(b.bitcast(w, vec(ir.HalfType(), 2 * n)), vec(F32, 2 * n))

    def _nibbles(self, kb: KernelBuilder, p0: ir.Value, p1: ir.Value | None) -> ir.Value:
        """Two blocks' 16 packed bytes -> 64 values in element order: each block's bytes are
        broadcast to two 128-bit lanes, shifted by 0 and 4 bits (one vpsrlvw), masked."""
        b = kb.b
        v0 = load_vec(b, kb.byte_ptr(p0, i64(self.qs_at)), I8, 16)
        v1 = zeros(I8, 16) if p1 is None else load_vec(b, kb.byte_ptr(p1, i64(self.qs_at)), I8, 16)
        v = shuffle(b, v0, v1, [*range(16), *range(16), *range(16, 32), *range(16, 32)])
        shifts = const(I16, ([0] * 8 + [4] * 8) * 2)
        v = b.bitcast(b.lshr(b.bitcast(v, vec(I16, 32)), shifts), vec(I8, 64))
        return b.and_(v, splat_const(I8, 15, 64))

    def decode(self, kb: KernelBuilder, p0: ir.Value, p1: ir.Value | None) -> ir.Value:
        b = kb.b
        if self.wtype == GGMLType.Q8_0:
            v0 = load_vec(b, kb.byte_ptr(p0, i64(2)), I8, 32)
            v1 = zeros(I8, 32) if p1 is None else load_vec(b, kb.byte_ptr(p1, i64(2)), I8, 32)
            return b.xor(concat(b, v0, v1), splat_const(I8, 0x80, 64))  # a tail's 128s meet zeros
        q = self._nibbles(kb, p0, p1)
        if self.codes is not None:   # a tail's zero nibbles become code 0's byte: they meet zeros
            return lookup(kb, q, self.codes)
        if self.qh_at is None:
            return q
        # bit j of the block's qh word is bit 4 of element j
        bits = b.zext(b.load(kb.byte_ptr(p0, i64(self.qh_at)), typ=I32, align=1), I64)
        if p1 is not None:
            h1 = b.zext(b.load(kb.byte_ptr(p1, i64(self.qh_at)), typ=I32, align=1), I64)
            bits = b.or_(bits, b.shl(h1, i64(32)))
        mask = b.bitcast(bits, vec(ir.IntType(1), 64))
        return b.or_(q, b.select(mask, splat_const(I8, 16, 64), zeros(I8, 64)))

    def chunk_w(self, kb: KernelBuilder, row: Vals, j: int) -> Vals:
        return row



class Q4K(KQuant):
    """Q4_K (and Q5_K with `high_bits`): d, dmin, 12 bytes of 6-bit scales and mins, [qh],
    qs; chunk j holds sub-blocks 2j (low nibbles) and 2j + 1 (high nibbles)."""

    fmt = Q8_256_32
    groups = 8

    def __init__(self, wtype: GGMLType):
        self.wtype = wtype
        self.high_bits = wtype == GGMLType.Q5_K
        self.qs_at = 48 if self.high_bits else 16

    def row(self, kb: KernelBuilder, wblock: ir.Value, tail: bool) -> Vals:
        b = kb.b
        d = load_f16(b, wblock)
        dmin = load_f16(b, kb.byte_ptr(wblock, i64(2)))
        sc, mn = self._scales(kb, load_vec(b, kb.byte_ptr(wblock, i64(4)), I8, 12))
        mf = b.fmul(sitofp(b, mn), splat(b, b.fsub(f32(0.0), dmin), 8), flags=CONTRACT)
        vals = {"p": wblock, "scales": sc, "wd": splat(b, d, 16),
                "corr": shuffle(b, mf, zeros(F32, 8), [*range(8), *[8] * 8])}
        if self.high_bits:
            vals["qh"] = load_vec(b, kb.byte_ptr(wblock, i64(16)), I8, 32)
        return vals

    @staticmethod
    def _scales(kb: KernelBuilder, q: ir.Value) -> tuple[ir.Value, ir.Value]:
        """ggml's get_scale_min_k4 for the eight sub-blocks at once: (scales, mins) as i32."""
        b = kb.b
        first = [True] * 4 + [False] * 4
        sel = const(ir.IntType(1), first)

        def c(v):
            return splat_const(I8, v, 8)

        x = shuffle(b, q, None, [0, 1, 2, 3, 8, 9, 10, 11])    # q[j] (j<4) | q[j+4] (j>=4)
        y = shuffle(b, q, None, [0, 0, 0, 0, 0, 1, 2, 3])      # q[j-4] for j>=4
        sc = b.select(sel, b.and_(x, c(63)), b.or_(b.and_(x, c(15)), b.shl(b.lshr(y, c(6)), c(4))))
        xm = shuffle(b, q, None, [4, 5, 6, 7, 8, 9, 10, 11])   # q[j+4]
        ym = shuffle(b, q, None, [0, 0, 0, 0, 4, 5, 6, 7])     # q[j] for j>=4
        mn = b.select(sel, b.and_(xm, c(63)), b.or_(b.lshr(xm, c(4)), b.shl(b.lshr(ym, c(6)), c(4))))
        return b.zext(sc, vec(I32, 8)), b.zext(mn, vec(I32, 8))

    def chunk_w(self, kb: KernelBuilder, row: Vals, j: int) -> Vals:
        b = kb.b
        v = load_vec(b, kb.byte_ptr(row["p"], i64(self.qs_at + 32 * j)), I8, 32)
        q = concat(b, b.and_(v, splat_const(I8, 15, 32)), b.lshr(v, splat_const(I8, 4, 32)))
        if self.high_bits:
            h = row["qh"]
            one = splat_const(I8, 1, 32)
            lo = b.and_(b.lshr(h, splat_const(I8, 2 * j, 32)), one)
            hi = b.and_(b.lshr(h, splat_const(I8, 2 * j + 1, 32)), one)
            q = b.or_(q, b.shl(concat(b, lo, hi), splat_const(I8, 4, 64)))
        sc = shuffle(kb.b, row["scales"], None, [2 * j] * 8 + [2 * j + 1] * 8)
        return {"q": q, "sc": sc}


class Q6K(KQuant):
    """Q6_K: ql[128], qh[64], 16 signed 8-bit scales, d; q + 32 stored in 6 bits. Half h
    (128 values) comes from ql[64h..64h+63] and qh[32h..32h+31]: chunk 2h is values 0-63 of the
    half (low nibbles, qh bits 0-1 and 2-3), chunk 2h + 1 values 64-127 (high nibbles, bits 4-7)."""

    fmt = Q8_256_16
    groups = 16

    def __init__(self) -> None:
        self.wtype = GGMLType.Q6_K

    def row(self, kb: KernelBuilder, wblock: ir.Value, tail: bool) -> Vals:
        b = kb.b
        d = load_f16(b, kb.byte_ptr(wblock, i64(208)))
        sc = b.sext(load_vec(b, kb.byte_ptr(wblock, i64(192)), I8, 16), V16I32)
        mf = b.fmul(sitofp(b, sc), splat(b, b.fmul(d, f32(-32.0)), 16), flags=CONTRACT)
        return {"p": wblock, "scales": sc, "wd": splat(b, d, 16), "corr": mf}

    def chunk_w(self, kb: KernelBuilder, row: Vals, j: int) -> Vals:
        b = kb.b
        h, upper = divmod(j, 2)
        ql0 = load_vec(b, kb.byte_ptr(row["p"], i64(64 * h)), I8, 32)
        ql1 = load_vec(b, kb.byte_ptr(row["p"], i64(64 * h + 32)), I8, 32)
        qh = load_vec(b, kb.byte_ptr(row["p"], i64(128 + 32 * h)), I8, 32)

        def bits(shift):
            return b.shl(b.and_(b.lshr(qh, splat_const(I8, shift, 32)), splat_const(I8, 3, 32)),
                         splat_const(I8, 4, 32))

        def low(v):
            return b.lshr(v, splat_const(I8, 4, 32)) if upper else b.and_(v, splat_const(I8, 15, 32))

        s = 4 * upper
        q = concat(b, b.or_(low(ql0), bits(s)), b.or_(low(ql1), bits(s + 2)))
        sc = shuffle(b, row["scales"], None, [8 * h + 4 * upper + g for g in range(4) for _ in range(4)])
        return {"q": q, "sc": sc}


class Crumbs(KQuant):
    """Q2_K and Q3_K: two bits per value, value 128n + 32s + l in bits 2s..2s+1 of
    qs[32n + l], so chunk j is half n = j // 2 with s = 2 (j % 2) and 2 (j % 2) + 1; sub-blocks
    of 16 values, one integer scale each. Field offsets come from the GGUF block layout.

    - Q2_K: scale byte i holds sub-block i's scale (low nibble) and minimum (high nibble);
      d * scale * q - dmin * min, the minimum met by the activation sums.
    - Q3_K: hmask bit 4n + s of byte l is the value's third bit; stored q + 4 in 0..7 (a
      clear bit means q - 4), so the offset meets the activation sums as -4 * d * scale;
      sixteen 6-bit scales (stored + 32) packed in 12 bytes, as ggml's kmask1/kmask2 unpack
      them: the low nibble from byte i (i < 8) or the high one of byte i - 8, the top two
      bits at bits 2 (i // 4) of byte 8 + i % 4."""

    fmt = Q8_256_16
    groups = 16

    def __init__(self, wtype: GGMLType):
        fields = block_dtype(wtype).fields
        self.wtype = wtype
        self.at = {name: fields[name][1] for name in fields}
        self.third_bit = "hmask" in fields

    def row(self, kb: KernelBuilder, wblock: ir.Value, tail: bool) -> Vals:
        b = kb.b
        d = load_f16(b, kb.byte_ptr(wblock, i64(self.at["d"])))
        packed = load_vec(b, kb.byte_ptr(wblock, i64(self.at["scales"])), I8, 12 if self.third_bit else 16)
        vals = {"p": wblock, "wd": splat(b, d, 16)}
        if self.third_bit:
            sc = self._q3_scales(kb, packed)
            vals["corr"] = b.fmul(sitofp(b, sc), splat(b, b.fmul(d, f32(-4.0)), 16), flags=CONTRACT)
            vals["hm"] = load_vec(b, kb.byte_ptr(wblock, i64(self.at["hmask"])), I8, 32)
        else:
            sc = b.zext(b.and_(packed, splat_const(I8, 15, 16)), V16I32)
            mn = b.zext(b.lshr(packed, splat_const(I8, 4, 16)), V16I32)
            dmin = load_f16(b, kb.byte_ptr(wblock, i64(self.at["dmin"])))
            vals["corr"] = b.fmul(sitofp(b, mn), splat(b, b.fsub(f32(0.0), dmin), 16), flags=CONTRACT)
        vals["scales"] = sc
        return vals

    @staticmethod
    def _q3_scales(kb: KernelBuilder, q: ir.Value) -> ir.Value:
        """The 16 signed scales (i32) from Q3_K's 12 scale bytes."""
        b = kb.b
        low = b.lshr(shuffle(b, q, None, [*range(8), *range(8)]), const(I8, [0] * 8 + [4] * 8))
        top = b.lshr(shuffle(b, q, None, [8 + i % 4 for i in range(16)]), const(I8, [2 * (i // 4) for i in range(16)]))
        sc = b.or_(b.and_(low, splat_const(I8, 15, 16)), b.shl(b.and_(top, splat_const(I8, 3, 16)), splat_const(I8, 4, 16)))
        return b.sub(b.zext(sc, V16I32), splat_const(I32, 32, 16))

    def chunk_w(self, kb: KernelBuilder, row: Vals, j: int) -> Vals:
        b = kb.b
        n, s0 = j // 2, 2 * (j % 2)
        qs = load_vec(b, kb.byte_ptr(row["p"], i64(self.at["qs"] + 32 * n)), I8, 32)

        def part(s: int) -> ir.Value:
            q = b.and_(b.lshr(qs, splat_const(I8, 2 * s, 32)), splat_const(I8, 3, 32))
            if not self.third_bit:
                return q
            bit = b.and_(b.lshr(row["hm"], splat_const(I8, 4 * n + s, 32)), splat_const(I8, 1, 32))
            return b.or_(q, b.shl(bit, splat_const(I8, 2, 32)))

        sc = shuffle(b, row["scales"], None, [4 * j + g for g in range(4) for _ in range(4)])
        return {"q": concat(b, part(s0), part(s0 + 1)), "sc": sc}


class IQ4XS(KQuant):
    """IQ4_XS: d, scales_h (u16), scales_l[4], qs[128]; eight sub-blocks of 32 values with
    6-bit scales stored + 32 (low four bits in a nibble of scales_l[s / 2], top two at bits
    2s of scales_h). Sub-block s's 32 codes are the low then the high nibbles of qs[16s ..
    16s + 15], as IQ4_NL's block; chunk j holds sub-blocks 2j and 2j + 1. Codes decode to
    kvalues_iq4nl + 128 (qcodes.py), so the offset meets the activation sums as
    -128 * d * scale."""

    fmt = Q8_256_32
    groups = 8
    wtype = GGMLType.IQ4_XS
    n_acc = 1   # the products take the offset back in integers (chunk_dot); `corr` serves get_rows and qgemm

    def __init__(self) -> None:
        fields = block_dtype(self.wtype).fields
        self.at = {name: fields[name][1] for name in fields}
        self.codes = CODE_BOOKS[self.wtype]

    def row(self, kb: KernelBuilder, wblock: ir.Value, tail: bool) -> Vals:
        b = kb.b
        d = load_f16(b, kb.byte_ptr(wblock, i64(self.at["d"])))
        low = load_vec(b, kb.byte_ptr(wblock, i64(self.at["scales_l"])), I8, 4)
        low = b.and_(b.lshr(shuffle(b, low, None, [s // 2 for s in range(8)]), const(I8, [0, 4] * 4)),
                     splat_const(I8, 15, 8))
        high = b.load(kb.byte_ptr(wblock, i64(self.at["scales_h"])), typ=I16, align=1)
        high = b.lshr(splat(b, high, 8), const(I16, [2 * s for s in range(8)]))
        high = b.shl(b.trunc(b.and_(high, splat_const(I16, 3, 8)), vec(I8, 8)), splat_const(I8, 4, 8))
        sc = b.sub(b.zext(b.or_(low, high), vec(I32, 8)), splat_const(I32, 32, 8))
        corr = b.fmul(sitofp(b, sc), splat(b, b.fmul(d, f32(-float(CODE_OFFSET[self.wtype]))), 8), flags=CONTRACT)
        return {"p": wblock, "scales": sc, "wd": splat(b, d, 16),
                "corr": shuffle(b, corr, zeros(F32, 8), [*range(8), *[8] * 8])}

    def chunk_dot(self, kb: KernelBuilder, isum: ir.Value, wq: Vals, aq: ir.Value) -> ir.Value:
        """sum((u - 128) a) * scale per lane, exactly as ggml's integer sums: a second dot with
        128 in every weight byte takes the offset back before the scale, so no large offset term
        is cancelled in f32 (the sums stay below 2^24 and convert exactly)."""
        b = kb.b
        p = dot_u8s8(kb, zeros(I32, 16), wq["q"], aq, WEIGHT_BYTE_MAX[self.wtype])
        offset = CODE_OFFSET[self.wtype]
        off = dot_u8s8(kb, zeros(I32, 16), splat_const(I8, offset, 64), aq, offset)
        return b.add(isum, b.mul(b.sub(p, off), wq["sc"]))

    def chunk_w(self, kb: KernelBuilder, row: Vals, j: int) -> Vals:
        b = kb.b
        v = load_vec(b, kb.byte_ptr(row["p"], i64(self.at["qs"] + 32 * j)), I8, 32)
        q = concat(b, b.and_(v, splat_const(I8, 15, 32)), b.lshr(v, splat_const(I8, 4, 32)))
        q = shuffle(b, q, None, [*range(16), *range(32, 48), *range(16, 32), *range(48, 64)])
        sc = shuffle(b, row["scales"], None, [2 * j] * 8 + [2 * j + 1] * 8)
        return {"q": lookup(kb, q, self.codes), "sc": sc}


KINDS: dict[GGMLType, QKind] = {
    GGMLType.Q4_0: Block32(GGMLType.Q4_0, 8),
    GGMLType.Q4_1: Block32(GGMLType.Q4_1, None),
    GGMLType.Q5_0: Block32(GGMLType.Q5_0, 16),
    GGMLType.Q5_1: Block32(GGMLType.Q5_1, None),
    GGMLType.Q8_0: Block32(GGMLType.Q8_0, 128),
    GGMLType.MXFP4: Block32(GGMLType.MXFP4, CODE_OFFSET[GGMLType.MXFP4]),
    GGMLType.IQ4_NL: Block32(GGMLType.IQ4_NL, CODE_OFFSET[GGMLType.IQ4_NL]),
    GGMLType.Q2_K: Crumbs(GGMLType.Q2_K),
    GGMLType.Q3_K: Crumbs(GGMLType.Q3_K),
    GGMLType.Q4_K: Q4K(GGMLType.Q4_K),
    GGMLType.Q5_K: Q4K(GGMLType.Q5_K),
    GGMLType.Q6_K: Q6K(),
    GGMLType.IQ4_XS: IQ4XS(),
    **GRID_KINDS,      # IQ2_XXS ... IQ1_M (kernels/qgrid.py)
    **TERNARY_KINDS,   # TQ2_0, TQ1_0 (kernels/qternary.py)
    **WIDE_KINDS,      # Q2_0, Q1_0, NVFP4 (kernels/qwide.py)
}
