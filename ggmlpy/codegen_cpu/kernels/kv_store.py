"""f32 rows quantised into a KV cache of a quantised type (set_rows into a q8_0 ... cache), the
blocks as ggml's CPU backend writes them (its from_float, ggmlpy/quants/from_float.py): Q8_0 as
the x86 quantize_row_q8_0 (127 / amax, products rounded half to even), Q4_0, Q4_1, Q5_0, Q5_1
and IQ4_NL as their quantize_row_*_ref. The same bytes as the numpy reference, which tests
check: every step is the C code's float32 operation in its order (no fast-math flags, no
contraction into fused multiply-adds, the sums of IQ4_NL's scale fit added in index order).

A block is 32 values, held as one <32 x float>; the quants are computed on all lanes at once
and only the scale searches reduce across them. Whole rows are also decoded and stored
again for the K-shift of a quantised K cache (cont and cpy, kernels/elementwise.py).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F16, F32, I1, I8, I32, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.kernels.qvec import intrinsic, load_vec, reduce_max_f32, shuffle, splat, store_vec, vabs, vec
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size
from ggmlpy.quants.iq_grids import KVALUES_IQ4NL

G = GGMLType
STORABLE = (G.Q8_0, G.Q4_0, G.Q4_1, G.IQ4_NL, G.Q5_0, G.Q5_1)
GROUP_MAX_EPS = 1e-15   # ggml-quants.c: an IQ4_NL block below this gets scale 0


def quantize_row(kb: KernelBuilder, t: GGMLType, src: ir.Value, dst: ir.Value, k: int) -> None:
    """k contiguous f32 values at src as a row of type t's blocks at dst."""
    b = kb.b
    with kb.loop(i64(0), i64(k // 32), "qb") as blk:
        x = load_vec(b, kb.byte_ptr(src, b.mul(blk, i64(4 * 32))), F32, 32)
        quantize_block(kb, t, x, kb.byte_ptr(dst, b.mul(blk, i64(type_size(t)))))


def quantize_block(kb: KernelBuilder, t: GGMLType, x: ir.Value, bp: ir.Value) -> None:
    """The 32 values x (<32 x float>) as one block of type t at bp."""
    if t == G.Q8_0:
        _q8_0(kb, x, bp)
    elif t in (G.Q4_0, G.Q5_0):
        _symmetric(kb, t, x, bp)
    elif t in (G.Q4_1, G.Q5_1):
        _ranged(kb, t, x, bp)
    elif t == G.IQ4_NL:
        _iq4_nl(kb, x, bp)
    else:
        raise NotImplementedError(f"KV cache rows of {t.name}")


# helpers ---------------------------------------------------------------------------------------
def _f16_store(b: ir.IRBuilder, v: ir.Value, p: ir.Value) -> None:
    b.store(b.fptrunc(v, F16), p, align=1)


def _ci(n: int, value: int) -> ir.Constant:
    return ir.Constant(vec(I32, n), [value] * n)


def _cf(n: int, value: float) -> ir.Constant:
    return ir.Constant(vec(F32, n), [value] * n)


def _safe_inverse(b: ir.IRBuilder, d: ir.Value) -> ir.Value:
    """C's `d ? 1.0f/d : 0.0f`."""
    return b.select(b.fcmp_unordered("!=", d, f32(0.0)), b.fdiv(f32(1.0), d), f32(0.0))


def _first_absmax(kb: KernelBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(amax, max): the largest magnitude and the first value that has it, +0 for an
    all-zero block (ggml's `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` from 0)."""
    b = kb.b
    ax = vabs(kb, x)
    amax = reduce_max_f32(kb, ax)
    hits = b.bitcast(b.fcmp_ordered("==", ax, splat(b, amax, 32)), I32)
    first = intrinsic(kb, "llvm.cttz.i32", I32, [hits, ir.Constant(I1, 0)])
    mx = b.select(b.fcmp_ordered(">", amax, f32(0.0)), b.extract_element(x, first), f32(0.0))
    return amax, mx


def _nibbles(b: ir.IRBuilder, q: ir.Value) -> ir.Value:
    """<32 x i32> quants -> 16 bytes: value j's low 4 bits low, value j + 16's high."""
    lo = b.and_(shuffle(b, q, None, range(16)), _ci(16, 15))
    hi = b.and_(shuffle(b, q, None, range(16, 32)), _ci(16, 15))
    return b.trunc(b.or_(lo, b.shl(hi, _ci(16, 4))), vec(I8, 16))


def _fifth_bits(b: ir.IRBuilder, q: ir.Value) -> ir.Value:
    """qh: bit 4 of value j as bit j of a little-endian 32-bit word."""
    return b.bitcast(b.trunc(b.lshr(q, _ci(32, 4)), vec(I1, 32)), I32)


# the types ---------------------------------------------------------------------------------------
def _q8_0(kb: KernelBuilder, x: ir.Value, bp: ir.Value) -> None:
    b = kb.b
    amax = reduce_max_f32(kb, vabs(kb, x))
    _f16_store(b, b.fdiv(amax, f32(127.0)), bp)
    inv = b.select(b.fcmp_ordered(">", amax, f32(0.0)), b.fdiv(f32(127.0), amax), f32(0.0))
    q = intrinsic(kb, "llvm.rint.v32f32", vec(F32, 32), [b.fmul(x, splat(b, inv, 32))])
    store_vec(b, b.trunc(b.fptosi(q, vec(I32, 32)), vec(I8, 32)), kb.byte_ptr(bp, i64(2)))


def _symmetric(kb: KernelBuilder, t: GGMLType, x: ir.Value, bp: ir.Value) -> None:
    """Q4_0 (d = max / -8, quants MIN(15, (int8_t)(x / d + 8.5))) and Q5_0 (-16, 16.5, 31)."""
    b = kb.b
    half, top = (8, 15) if t == G.Q4_0 else (16, 31)
    _, mx = _first_absmax(kb, x)
    d = b.fdiv(mx, f32(-float(half)))
    _f16_store(b, d, bp)
    v = b.fadd(b.fmul(x, splat(b, _safe_inverse(b, d), 32)), _cf(32, half + 0.5))
    qi = b.fptosi(v, vec(I32, 32))
    q = b.select(b.icmp_signed("<", qi, _ci(32, top)), qi, _ci(32, top))
    _store_quants(kb, t, q, bp)


def _ranged(kb: KernelBuilder, t: GGMLType, x: ir.Value, bp: ir.Value) -> None:
    """Q4_1 (d = (max - min) / 15, m = min, quants MIN(15, (int8_t)((x - min) / d + 0.5))) and
    Q5_1 (31, and (uint8_t)(...) without the MIN)."""
    b = kb.b
    levels = 15 if t == G.Q4_1 else 31
    mn = intrinsic(kb, "llvm.vector.reduce.fmin.v32f32", F32, [x])
    mx = reduce_max_f32(kb, x)
    d = b.fdiv(b.fsub(mx, mn), f32(float(levels)))
    _f16_store(b, d, bp)
    _f16_store(b, mn, kb.byte_ptr(bp, i64(2)))
    v = b.fadd(b.fmul(b.fsub(x, splat(b, mn, 32)), splat(b, _safe_inverse(b, d), 32)), _cf(32, 0.5))
    if t == G.Q4_1:
        qi = b.fptosi(v, vec(I32, 32))
        q = b.select(b.icmp_signed("<", qi, _ci(32, 15)), qi, _ci(32, 15))
    else:
        q = b.and_(b.fptoui(v, vec(I32, 32)), _ci(32, 255))
    _store_quants(kb, t, q, bp)


def _store_quants(kb: KernelBuilder, t: GGMLType, q: ir.Value, bp: ir.Value) -> None:
    """The nibbles (and the 5-bit types' qh word before them) after the block's scales."""
    b = kb.b
    scales = {G.Q4_0: 2, G.Q5_0: 2, G.Q4_1: 4, G.Q5_1: 4}[t]
    if t in (G.Q5_0, G.Q5_1):
        b.store(_fifth_bits(b, q), kb.byte_ptr(bp, i64(scales)), align=1)
        scales += 4
    store_vec(b, _nibbles(b, q), kb.byte_ptr(bp, i64(scales)))


def _iq4_nl(kb: KernelBuilder, x: ir.Value, bp: ir.Value) -> None:
    """quantize_row_iq4_nl_impl with ntry = -1: d = max / -127, each value's nearest code
    level for x / d (best_index_int8: the upper one on a tie), then the least-squares scale
    for those levels with weights x^2, sums in index order. A block below GROUP_MAX_EPS:
    scale 0, every level 8 (as the numpy reference)."""
    b = kb.b
    values = [float(v) for v in KVALUES_IQ4NL]
    amax, mx = _first_absmax(kb, x)
    inv = b.fdiv(f32(1.0), b.fdiv(mx, f32(values[0])))
    al = b.fmul(splat(b, inv, 32), x)
    lower, upper, count = _cf(32, values[0]), _cf(32, values[15]), _ci(32, 0)
    for k, v in enumerate(values):
        below = b.fcmp_ordered("<=", _cf(32, v), al)
        count = b.add(count, b.zext(below, vec(I32, 32)))
        if k:
            lower = b.select(below, _cf(32, v), lower)
    for v in reversed(values[:15]):
        upper = b.select(b.fcmp_ordered(">", _cf(32, v), al), _cf(32, v), upper)
    lower_wins = b.fcmp_ordered("<", b.fsub(al, lower), b.fsub(upper, al))
    level = b.select(lower_wins, b.sub(count, _ci(32, 1)), count)
    level = b.select(b.icmp_signed("<", level, _ci(32, 0)), _ci(32, 0), level)
    level = b.select(b.icmp_signed(">", level, _ci(32, 15)), _ci(32, 15), level)
    q = b.select(lower_wins, lower, upper)
    wq = b.fmul(b.fmul(x, x), q)
    terms_qx, terms_q2 = b.fmul(wq, x), b.fmul(wq, q)
    sumqx, sumq2 = f32(0.0), f32(0.0)
    for j in range(32):
        sumqx = b.fadd(sumqx, b.extract_element(terms_qx, ir.Constant(I32, j)))
        sumq2 = b.fadd(sumq2, b.extract_element(terms_q2, ir.Constant(I32, j)))
    d = b.select(b.fcmp_ordered(">", sumq2, f32(0.0)), b.fdiv(sumqx, sumq2), f32(0.0))
    tiny = b.fcmp_unordered("<", amax, f32(GROUP_MAX_EPS))
    _f16_store(b, b.select(tiny, f32(0.0), d), bp)
    level = b.select(tiny, _ci(32, 8), level)
    store_vec(b, _nibbles(b, level), kb.byte_ptr(bp, i64(2)))


# whole rows: the K-shift of a quantised K cache (cont: decoded; cpy: quantised back) ------------
def _block_rows(t: Tensor, q: Tensor) -> bool:
    """t's rows are contiguous whole blocks of type q.type (q is t, or the other side)."""
    return (q.type in STORABLE and isinstance(t.ne[0], int) and t.ne[0] % 32 == 0
            and t.nb[0] == type_size(t.type))


def decode_supported(node: Tensor) -> bool:
    """cont of a quantised KV cache view into f32 rows of the same shape."""
    src = node.src[0]
    return (node.type == G.F32 and tuple(node.ne) == tuple(src.ne) and _block_rows(src, src)
            and node.nb[0] == 4)


def decode_rows(kb: KernelBuilder, node: Tensor, src: Tensor, src_arg: ir.Value) -> None:
    from ggmlpy.codegen_cpu.kernels.qdequant import dequant_row

    start, end = kb.thread_range(n_rows(kb, node))
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        dequant_row(kb, src.type, row_ptr(kb, src_arg, src, i1, i2, i3),
                    row_ptr(kb, kb.arg("dst"), node, i1, i2, i3), src.ne[0])


def store_supported(node: Tensor) -> bool:
    """cpy of f32 rows into a quantised KV cache view of the same shape."""
    dst, src = node.src
    return (src.type == G.F32 and src.nb[0] == 4 and tuple(dst.ne) == tuple(src.ne)
            and _block_rows(node, node))


def store_rows(kb: KernelBuilder, node: Tensor, src: Tensor, src_arg: ir.Value) -> None:
    start, end = kb.thread_range(n_rows(kb, node))
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        quantize_row(kb, node.type, row_ptr(kb, src_arg, src, i1, i2, i3),
                     row_ptr(kb, kb.arg("dst"), node, i1, i2, i3), node.ne[0])
