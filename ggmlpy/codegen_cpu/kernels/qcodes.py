"""Code-book types in the quantised kernels: MXFP4, IQ4_NL and IQ4_XS.

These types store 4-bit *codes*, not numbers: code c stands for entry c of a 16-value table
(ggml's kvalues_mxfp4, the E2M1 values doubled so they are integers; kvalues_iq4nl, a
non-linear grid from -127 to 113). dot_u8s8 multiplies unsigned weight bytes, so the decoders
map each code to its value plus the type's `CODE_OFFSET` (one byte-table lookup per vector,
`CODE_BOOKS`), and the offset is taken back from the activations' sums exactly as Q4_0's 8
is (qact.py's q8_32(offset) for the 32-blocks; a correction term for IQ4_XS's super-blocks).

MXFP4's scale is 2^(e - 128) (GGML_E8M0_TO_FP32_HALF: the doubled codes' half), which no f16
holds (2^-128 .. 2^127), so the kernels build the f32 from its bits (`e8m0_half`) where the
other 32-block types convert an f16.

The lookup is vpshufb (16 table bytes per 128-bit lane) on the x86 flavours of qvec.py; the
"generic" flavour, plain IR for any target, selects among the 16 constants by the code's
four bits.
"""
from __future__ import annotations

from typing import Sequence

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, I8, I32, KernelBuilder
from ggmlpy.codegen_cpu.kernels.qvec import concat, const, intrinsic, shuffle, splat_const, vec
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants.dequant_blocks import KVALUES_MXFP4
from ggmlpy.quants.iq_grids import KVALUES_IQ4NL

# per code-book type: its signed table, and what the unsigned bytes exceed it by (the least
# that makes every entry non-negative for MXFP4; IQ4's -127 needs 128, Q8_0's offset)
_TABLES = {GGMLType.MXFP4: (KVALUES_MXFP4, 12), GGMLType.IQ4_NL: (KVALUES_IQ4NL, 128),
           GGMLType.IQ4_XS: (KVALUES_IQ4NL, 128)}
CODE_OFFSET: dict[GGMLType, int] = {t: offset for t, (_, offset) in _TABLES.items()}
# per code-book type: the unsigned byte each of its 16 codes decodes to (ggml's table + offset)
CODE_BOOKS: dict[GGMLType, tuple[int, ...]] = {
    t: tuple(int(v) + offset for v in table) for t, (table, offset) in _TABLES.items()}

# vpshufb by width in bytes (each 16 bytes look up in their own copy of the table), and the
# widest each x86 flavour has
_PSHUFB = {64: "llvm.x86.avx512.pshuf.b.512", 32: "llvm.x86.avx2.pshuf.b", 16: "llvm.x86.ssse3.pshuf.b.128"}
_WIDEST = {"vnni512": 64, "vnni256": 32, "avx2": 32}


def lookup(kb: KernelBuilder, codes: ir.Value, table: Sequence[int]) -> ir.Value:
    """table[c] for every byte c (0..15) of `codes` (<n x i8>, n a multiple of 16)."""
    b = kb.b
    n = codes.type.count
    width = _WIDEST.get(kb.qdot)
    if width is None:
        return _select_tree(b, codes, table)
    while n % width:
        width //= 2
    lut = const(I8, list(table) * (width // 16))
    parts = [intrinsic(kb, _PSHUFB[width], vec(I8, width), [lut, shuffle(b, codes, None, range(i, i + width))])
             for i in range(0, n, width)]
    while len(parts) > 1:
        parts = [concat(b, parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return parts[0]


def _select_tree(b: ir.IRBuilder, codes: ir.Value, table: Sequence[int]) -> ir.Value:
    """The lookup as plain IR: 15 selects, pairs of entries by bit 0, then pairs of those by
    bit 1, and so on (LLVM lowers them to blends on any target)."""
    n = codes.type.count
    level = [splat_const(I8, v, n) for v in table]
    bit = 0
    while len(level) > 1:
        set_ = b.icmp_unsigned("!=", b.and_(codes, splat_const(I8, 1 << bit, n)), splat_const(I8, 0, n))
        level = [b.select(set_, level[i + 1], level[i]) for i in range(0, len(level), 2)]
        bit += 1
    return level[0]


def e8m0_half(b: ir.IRBuilder, e: ir.Value) -> ir.Value:
    """2^(e - 128) as f32 from exponent bytes e (i8 or <n x i8>), bit for bit ggml's
    GGML_E8M0_TO_FP32_HALF: e >= 2 is the normal number of exponent field e - 1; e = 0 and 1
    are the subnormals 2^-128 and 2^-127 (bits 0x00200000, 0x00400000)."""
    n = e.type.count if isinstance(e.type, ir.VectorType) else None

    def c(value: int, t=I32) -> ir.Value:
        return ir.Constant(t, value) if n is None else splat_const(t, value, n)

    w = b.zext(e, I32 if n is None else vec(I32, n))
    normal = b.shl(b.sub(w, c(1)), c(23))
    tiny = b.select(b.icmp_unsigned("==", w, c(0)), c(0x00200000), c(0x00400000))
    bits = b.select(b.icmp_unsigned("<", w, c(2)), tiny, normal)
    return b.bitcast(bits, F32 if n is None else vec(F32, n))


def ue4m3_half(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """NVFP4's scale bytes (<n x i8>) as f32, bit for bit ggml's ggml_ue4m3_to_fp32 (which halves
    it, as E8M0's: the doubled codes' half). Bit 7 is not read; exponent e (bits 3-6) and
    mantissa m give 2^(e - 8) (1 + m / 8), built from its bits, or m 2^-10 where e = 0, and 0x7F
    (E4M3's NaN) is 0."""
    n = x.type.count

    def c(value: int) -> ir.Value:
        return splat_const(I32, value, n)

    w = b.zext(x, vec(I32, n))
    em = b.and_(w, c(0x7F))
    normal = b.bitcast(b.add(b.shl(em, c(20)), c(119 << 23)), vec(F32, n))
    tiny = b.fmul(b.sitofp(em, vec(F32, n)), const(F32, [2.0 ** -10] * n))
    value = b.select(b.icmp_unsigned("<", em, c(8)), tiny, normal)
    return b.select(b.icmp_unsigned("==", w, c(0x7F)), const(F32, [0.0] * n), value)
