"""Reference encoders for the small-block formats and the ternary ones, following
quantize_row_*_ref in ggml.

Each encoder takes float32 blocks, shape (n, block size), and returns n structured blocks. They are
what the CPU kernels use to quantise activations and what tests use to build models, so they
must produce ggml's bytes exactly: same scale choice (first element of largest magnitude),
same float32 arithmetic, same C conversions (truncation for the legacy 4/5-bit formats,
roundf for the 8-bit ones).
"""
from __future__ import annotations

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants.dequant_blocks import KVALUES_MXFP4, UE4M3_HALF, e8m0_half
from ggmlpy.quants.kquant_search import seq_sum
from ggmlpy.quants.layouts import block_dtype
from ggmlpy.quants.rounding import F32, first_absmax, round_away, safe_inverse, to_f16


def _new(t: GGMLType, n: int) -> np.ndarray:
    return np.zeros(n, dtype=block_dtype(t))


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """Element j in the low nibble and element j + 16 in the high nibble of byte j."""
    lo, hi = q[:, :16] & 0x0F, q[:, 16:] & 0x0F
    return (lo | (hi << 4)).astype(np.uint8)


def _fifth_bits(q: np.ndarray) -> np.ndarray:
    """Bit 4 of element j as bit j of a little-endian 32-bit word, as 4 bytes."""
    return np.packbits((q >> 4) & 1, axis=1, bitorder="little")


def _truncate(v: np.ndarray, top: int) -> np.ndarray:
    """C's `MIN(top, (int8_t)v)`: truncation toward zero, then the upper clamp."""
    return np.minimum(v.astype(np.int8), top).astype(np.uint8)


def _symmetric(x: np.ndarray, divisor: float) -> tuple[np.ndarray, np.ndarray]:
    """d = (value of largest magnitude) / divisor, and its safe inverse."""
    mx, _ = first_absmax(x, axis=1)
    d = (mx / F32(divisor)).astype(F32)
    return d, safe_inverse(d)


def _range(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """min, d = (max - min) / levels, and its safe inverse."""
    mn, mx = x.min(axis=1), x.max(axis=1)
    d = ((mx - mn) / F32(levels)).astype(F32)
    return mn, d, safe_inverse(d)


def legacy_block(t: GGMLType, d: np.ndarray, q: np.ndarray, mn: np.ndarray | None = None) -> np.ndarray:
    """The Q4_0/Q4_1/Q5_0/Q5_1 blocks of scales d, quants q and (the _1 types) minimums mn:
    the low nibbles in qs, the 5-bit types' fifth bits in qh."""
    blk = _new(t, len(d))
    blk["d"] = to_f16(d)
    if mn is not None:
        blk["m"] = to_f16(mn)
    if t in (GGMLType.Q5_0, GGMLType.Q5_1):
        blk["qh"] = _fifth_bits(q)
    blk["qs"] = _pack_nibbles(q)
    return blk


def q4_0(x: np.ndarray) -> np.ndarray:
    d, inv = _symmetric(x, -8)
    return legacy_block(GGMLType.Q4_0, d, _truncate(x * inv[:, None] + F32(8.5), 15))


def q4_1(x: np.ndarray) -> np.ndarray:
    mn, d, inv = _range(x, 15)
    q = _truncate((x - mn[:, None]) * inv[:, None] + F32(0.5), 15)
    return legacy_block(GGMLType.Q4_1, d, q, mn)


def q5_0(x: np.ndarray) -> np.ndarray:
    d, inv = _symmetric(x, -16)
    return legacy_block(GGMLType.Q5_0, d, _truncate(x * inv[:, None] + F32(16.5), 31))


def q5_1(x: np.ndarray) -> np.ndarray:
    mn, d, inv = _range(x, 31)
    # C: (uint8_t)(x0 + 0.5f) without a clamp; the value never exceeds 31.5
    q = ((x - mn[:, None]) * inv[:, None] + F32(0.5)).astype(np.uint8)
    return legacy_block(GGMLType.Q5_1, d, q, mn)


def _q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = (np.abs(x).max(axis=1) / F32(127)).astype(F32)
    q = round_away(x * safe_inverse(d)[:, None]).astype(np.int8)
    return d, q


def q8_0(x: np.ndarray) -> np.ndarray:
    d, q = _q8(x)
    blk = _new(GGMLType.Q8_0, len(x))
    blk["d"] = to_f16(d)
    blk["qs"] = q
    return blk


def q8_1(x: np.ndarray) -> np.ndarray:
    """Q8_0 plus s = d * sum(q), which dot products with Q4_1/Q5_1 use for the min term."""
    d, q = _q8(x)
    blk = _new(GGMLType.Q8_1, len(x))
    blk["d"] = to_f16(d)
    blk["s"] = to_f16(q.sum(axis=1, dtype=np.int32).astype(F32) * d)
    blk["qs"] = q
    return blk


def _nearest_fp4(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's best_index_mxfp4 for every element: the first of the sixteen doubled E2M1 codes
    whose value times the block's d is nearest (float32 products and differences)."""
    err = np.abs((d[..., None] * KVALUES_MXFP4.astype(F32)) - x[..., None])
    return np.argmin(err, axis=-1).astype(np.uint8)                 # first of equal errors


def mxfp4(x: np.ndarray) -> np.ndarray:
    """quantize_row_mxfp4_ref: the shared exponent e = floor(log2(amax)) - 2 + 127 (0 for an
    all-zero block) puts amax / d in [8, 16) for d = 2^(e - 128), so the largest values clamp
    to the top doubled code 12 (E2M1's 6), as ggml's do; each value becomes the first of the
    sixteen codes whose value times d is nearest. The exponent is float32 log2 and a float ->
    uint8 conversion, computed as the gguf package computes it (the oracle of the tests)."""
    amax = np.abs(x).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0).astype(np.uint8)
    blk = _new(GGMLType.MXFP4, len(x))
    blk["e"] = e
    blk["qs"] = _pack_nibbles(_nearest_fp4(x, e8m0_half(e)[:, None]))
    return blk


def _positive_max(ax: np.ndarray) -> np.ndarray:
    """ggml's `amax = 0; if (amax < v) amax = v;` along the last axis: NaNs never win."""
    return np.where(np.isnan(ax), F32(0.0), ax).max(axis=-1)


def fp32_to_ue4m3(x: np.ndarray) -> np.ndarray:
    """ggml_fp32_to_ue4m3: unsigned E4M3 (bias 7) by the float32 bits, the mantissa rounded
    half up on its first dropped bit; at most 448 (0x7E), subnormals man * 2^-9 rounded by
    `(int)(x * 512 + 0.5)`, and 0 for anything not above zero (NaN included)."""
    x = np.asarray(x, dtype=F32)
    positive = x > 0
    with np.errstate(invalid="ignore"):
        x = np.where(x > F32(448.0), F32(448.0), x).astype(F32)
        bits = x.view(np.uint32)
        exp = ((bits >> 23) & 0xFF).astype(np.int32) - 127 + 7
        subnormal = exp <= 0
        man = ((bits >> 20) & 7).astype(np.int32) + ((bits >> 19) & 1).astype(np.int32)
        exp += man > 7      # the rounding carried into the exponent
        man = np.where(man > 7, 0, man)
        sub = np.minimum((x * F32(512.0) + F32(0.5)).astype(np.int32), 7)
    code = np.where(subnormal, np.where(sub < 1, 0, sub), np.where(exp >= 15, 0x7E, (exp << 3) | man))
    return np.where(positive, code, 0).astype(np.uint8)


def nvfp4(x: np.ndarray) -> np.ndarray:
    """quantize_row_nvfp4_ref: per 16 elements an E4M3 scale of amax / 6 (E2M1's top value),
    then MXFP4's nearest-code search against the scale as decoded, halved for the doubled
    codes; each 16 elements packed as MXFP4's 32 are, element j low and j + 8 high."""
    sub = x.reshape(len(x), 4, 16)
    ue = fp32_to_ue4m3(_positive_max(np.abs(sub)) / F32(6.0))
    q = _nearest_fp4(sub, UE4M3_HALF[ue][:, :, None])
    blk = _new(GGMLType.NVFP4, len(x))
    blk["d"] = ue
    blk["qs"] = (q[:, :, :8] | (q[:, :, 8:] << 4)).reshape(len(x), 32)
    return blk


def q1_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q1_0_ref: d = mean |x| (summed in index order, as the C loop), and per
    element one bit, set for x >= 0 (so -0.0 too; NaN clear)."""
    d = (seq_sum(np.abs(x).T) / F32(x.shape[1])).astype(F32)
    blk = _new(GGMLType.Q1_0, len(x))
    blk["d"] = to_f16(d)
    blk["qs"] = np.packbits(x >= 0, axis=1, bitorder="little")
    return blk


def q2_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q2_0_ref: d = amax, codes roundf(x / d) + 1 clamped to 0-3 (in practice
    0-2: the code 3, 2d, is never chosen), element j at bits 2 * (j % 4) of byte j // 4."""
    d = _positive_max(np.abs(x))
    code = np.clip(round_away(x * safe_inverse(d)[:, None]) + 1, 0, 3).astype(np.uint8)
    blk = _new(GGMLType.Q2_0, len(x))
    blk["d"] = to_f16(d)
    blk["qs"] = (code.reshape(len(x), 16, 4) << np.array([0, 2, 4, 6], np.uint8)).sum(axis=2, dtype=np.uint8)
    return blk


def _c_amax(x: np.ndarray) -> np.ndarray:
    """The ternary types' `amax = MAX(amax, fabsf(v))` in index order: a NaN is kept until
    the next element replaces it (MAX is `a > b ? a : b`), so it rarely survives."""
    ax = np.abs(x)
    if not np.isnan(ax).any():
        return ax.max(axis=1)
    acc = np.zeros(len(x), dtype=F32)
    for col in ax.T:
        acc = np.where(acc > col, acc, col)
    return acc


def _trits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d = amax, lroundf(x / d) + 1): each element as a trit 0, 1, 2 for -d, 0, +d."""
    d = _c_amax(x)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(F32)
    return d, (round_away(x * inv[:, None]) + 1).astype(np.uint16)


def _base3(t: np.ndarray) -> np.ndarray:
    """Trits along axis 1 -> one number, the first trit most significant, then scaled to a
    byte as the fraction q / 3^5 rounded up: byte = ceil(q * 256 / 243)."""
    q = np.zeros(t.shape[:1] + t.shape[2:], dtype=np.uint16)
    for i in range(t.shape[1]):
        q = q * 3 + t[:, i]
    if t.shape[1] == 4:
        q *= 3          # four trits are shifted up to the top, as five would be
    return ((q * 256 + 242) // 243).astype(np.uint8)


def tq1_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_tq1_0_ref: five trits per byte, elements 32i + m (i < 5) in qs[m],
    160 + 16i + m in qs[32 + m], and four per byte, 240 + 4i + j in qh[j]."""
    n = len(x)
    d, t = _trits(x)
    blk = _new(GGMLType.TQ1_0, n)
    blk["qs"] = np.concatenate([_base3(t[:, :160].reshape(n, 5, 32)),
                                _base3(t[:, 160:240].reshape(n, 5, 16))], axis=1)
    blk["qh"] = _base3(t[:, 240:].reshape(n, 4, 4))
    blk["d"] = to_f16(d)
    return blk


def tq2_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_tq2_0_ref: 2-bit trits in Q2_K's crumb order (element 128h + 32i + m at
    bits 2i of byte 32h + m)."""
    n = len(x)
    d, t = _trits(x)
    blk = _new(GGMLType.TQ2_0, n)
    blk["qs"] = (t.reshape(n, 2, 4, 32) << np.array([0, 2, 4, 6], np.uint16)[:, None]).sum(axis=2).reshape(n, 64)
    blk["d"] = to_f16(d)
    return blk


def bf16(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16: round to nearest even; NaNs stay NaN (made quiet)."""
    u = x.reshape(-1).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16
    quiet_nan = (u >> 16) | 64
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


def f16(x: np.ndarray) -> np.ndarray:
    return to_f16(x.reshape(-1))


def f32(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1).copy()
