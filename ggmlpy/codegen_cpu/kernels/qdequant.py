"""Quantised rows back to f32 in native code (get_rows on quantised embedding tables).

It reuses the weight decoders of the dot products (kernels/qdot.py), which give each 64
values as unsigned bytes plus their scales, and applies the scales in f32 instead of
feeding a dot product:

- 32-blocks: d * (u - offset), or d * u + m for Q4_1;
- K-quants: d * scale(lane) * u + correction(lane), the correction being the minimum
  (Q4_K, Q5_K: -dmin * m) or the offset (Q6_K: -32 * d * scale).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, I32, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.qdot import KINDS, Block32, KQuant, Q6K
from ggmlpy.codegen_cpu.kernels.qvec import CONTRACT, load_f16, shuffle, sitofp, splat, store_vec, vec
from ggmlpy.ir.types import GGMLType, block_size, type_size

DEQUANTIZABLE = tuple(KINDS)


def dequant_row(kb: KernelBuilder, t: GGMLType, src: ir.Value, dst: ir.Value, k: int) -> None:
    """k values of type t at src (a row of blocks) as f32 at dst."""
    kind = KINDS[t]
    b = kb.b
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
    b = kb.b
    u = _u8_to_f32(b, shuffle(b, kind.decode(kb, bp, None), None, range(32)))
    d = splat(b, load_f16(b, bp), 32)
    if kind.offset is None:
        m = splat(b, load_f16(b, kb.byte_ptr(bp, i64(2))), 32)
        v = b.fadd(b.fmul(u, d, flags=CONTRACT), m, flags=CONTRACT)
    else:
        v = b.fmul(b.fsub(u, splat(b, f32(float(kind.offset)), 32)), d)
    store_vec(b, v, out)


def _corr_lane(kind: KQuant, j: int, e: int) -> int:
    """Which lane of the row's correction vector applies to value e of chunk j."""
    if isinstance(kind, Q6K):
        h, upper = divmod(j, 2)
        return 8 * h + 4 * upper + e // 16
    return 2 * j + e // 32


def _kquant(kb: KernelBuilder, kind: KQuant, bp: ir.Value, out: ir.Value) -> None:
    b = kb.b
    row = kind.row(kb, bp, False)
    for j in range(kind.chunks):
        w = kind.chunk_w(kb, row, j)
        scale = shuffle(b, w["sc"], None, [e // 4 for e in range(64)])
        u = sitofp(b, b.mul(b.zext(w["q"], vec(I32, 64)), scale))
        d = shuffle(b, row["wd"], None, [0] * 64)
        corr = shuffle(b, row["corr"], None, [_corr_lane(kind, j, e) for e in range(64)])
        v = b.fadd(b.fmul(u, d, flags=CONTRACT), corr, flags=CONTRACT)
        store_vec(b, v, kb.elem_ptr(out, i64(64 * j), F32))

