"""Dot decoders of ggml's ternary types, TQ2_0 and TQ1_0: q - 1 for unsigned codes q (0..2;
TQ2_0's two bits can also hold 3, which ggml decodes to 2), one f16 d per 256 values and no
sub-block scales. The codes are the unsigned bytes dot_u8s8 takes, the offset 1 comes back
through the activation sums (qgrid.GridKind's `corr`), and the products are summed without
a scale multiply (`unit_scales`).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import I8, I16, I32, KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels.qact import Q8_256_32
from ggmlpy.codegen_cpu.kernels.qgrid import GridKind
from ggmlpy.codegen_cpu.kernels.qkind import KQuant, Vals
from ggmlpy.codegen_cpu.kernels.qvec import concat, const, load_vec, shuffle, splat_const, vec
from ggmlpy.ir.types import GGMLType

G = GGMLType


class TQ2(GridKind):
    """TQ2_0: q - 1 for two-bit q in Q2_K's order (value 128n + 32s + l at bits 2s of
    qs[32n + l]); one d per super-block."""
    wtype, fmt, groups, offset, unit_scales = G.TQ2_0, Q8_256_32, 8, 1, True

    def scales(self, kb: KernelBuilder, row: Vals) -> ir.Value:
        return splat_const(I32, 1, 8)

    def values(self, kb: KernelBuilder, row: Vals, j: int) -> ir.Value:
        b = kb.b
        n, half = divmod(j, 2)
        qs = self.load(kb, row, "qs", 32 * n, I8, 32)
        return concat(b, *[b.and_(b.lshr(qs, splat_const(I8, 2 * s, 32)), splat_const(I8, 3, 32))
                           for s in (2 * half, 2 * half + 1)])


def _tq1_digits() -> tuple[list[int], list[int]]:
    """For each of the 256 values of a TQ1_0 block: (its byte of qs + qh, 3^digit)."""
    at, power = [], []
    for v in range(256):
        if v < 160:
            byte, n = v % 32, v // 32
        elif v < 240:
            byte, n = 32 + (v - 160) % 16, (v - 160) // 16
        else:
            byte, n = 48 + (v - 240) % 4, (v - 240) // 4
        at.append(byte)
        power.append(3 ** n)
    return at, power


class TQ1(TQ2):
    """TQ1_0: five base-3 digits per qs byte and four per qh byte, read as a fixed-point
    fraction: digit n of q is ((q * 3^n mod 256) * 3) >> 8 (ggml's dequantize_row_tq1_0).
    Values 0-159 are digits 0-4 of qs[0..31], 160-239 those of qs[32..47], 240-255 digits 0-3
    of qh[0..3], each digit's run in byte order."""
    wtype = G.TQ1_0
    digits = _tq1_digits()

    def extra(self, kb: KernelBuilder, p: ir.Value) -> Vals:
        b = kb.b
        qh = shuffle(b, load_vec(b, kb.byte_ptr(p, i64(self.at["qh"])), I8, 4), None, [0, 1, 2, 3] + [4] * 12)
        tail = concat(b, load_vec(b, kb.byte_ptr(p, i64(self.at["qs"] + 32)), I8, 16), qh)
        return {"bytes": concat(b, load_vec(b, kb.byte_ptr(p, i64(self.at["qs"])), I8, 32), tail)}   # 48 + 4 + 12 zeros

    def values(self, kb: KernelBuilder, row: Vals, j: int) -> ir.Value:
        b = kb.b
        at, power = (d[64 * j:64 * j + 64] for d in self.digits)
        q = b.zext(shuffle(b, row["bytes"], None, at), vec(I16, 64))
        q = b.and_(b.mul(q, const(I16, power)), splat_const(I16, 255, 64))
        return b.trunc(b.lshr(b.mul(q, splat_const(I16, 3, 64)), splat_const(I16, 8, 64)), vec(I8, 64))


TERNARY_KINDS: dict[GGMLType, KQuant] = {k.wtype: k for k in (TQ2(), TQ1())}
