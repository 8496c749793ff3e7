"""MXFP4 in the quantised kernels: its code book lookup and its E8M0 scale.

MXFP4 (ggml's block_mxfp4: one exponent byte `e`, then Q4_0's 16 bytes of nibbles) differs
from Q4_0 in two facts, each kept here as one table or one formula:

- A nibble is a *code*, not a number: code c stands for ggml's kvalues_mxfp4[c], the E2M1
  (FP4) values doubled so they are integers (0, 1, 2, 3, 4, 6, 8, 12 and their negatives).
  dot_u8s8 multiplies unsigned weight bytes, so the decoders map each code to kvalues + 12
  (0..24, `CODE_BOOKS`), one byte-table lookup per vector, and the 12 is taken back from
  the activations' sums exactly as Q4_0's 8 is (qact.py's q8_32(12): the accumulator starts
  at -12 * sum(q)).
- The scale is 2^(e - 128) (GGML_E8M0_TO_FP32_HALF: the doubled codes' half), which no f16
  holds (2^-128 .. 2^127), so the kernels build the f32 from its bits (`e8m0_half`) where
  the other 32-block types convert an f16.

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

CODE_OFFSET = 12   # what the unsigned code values exceed ggml's signed ones by

# per code-book type: the unsigned byte each of its 16 codes decodes to (ggml's table + offset)
CODE_BOOKS: dict[GGMLType, tuple[int, ...]] = {
    GGMLType.MXFP4: tuple(int(v) + CODE_OFFSET for v in KVALUES_MXFP4),
}

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
