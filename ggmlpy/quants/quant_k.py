"""Reference encoders for the K-quants (256-element super-blocks), after ggml's
quantize_row_q{2,3,4,5,6,8}_K_ref.

The pattern is shared: search a scale (and min) per 16- or 32-element sub-block
(kquant_search), quantise those scales to 4, 6 or 8 bits against one fp16 super-block scale,
then re-quantise every value against the scale it will really be decoded with. A sub-block
whose decoded scale is exactly zero keeps the levels of the search, as in ggml.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants.kquant_search import (GROUP_MAX_EPS, make_q3_quants, make_qkx2_quants,
                                         make_qx_quants, seq_sum)
from ggmlpy.quants.layouts import QK_K, block_dtype
from ggmlpy.quants.rounding import F32, first_absmax, nearest_int, to_f16


def _sub_blocks(x: np.ndarray, size: int) -> np.ndarray:
    """(n, 256) -> (size, n * 256 / size): element i of every sub-block in row i."""
    return np.ascontiguousarray(x.reshape(-1, size).T)


def _per_block(values: np.ndarray, n: int) -> np.ndarray:
    """Undo _sub_blocks for per-element results: (size, n*k) -> (n, 256)."""
    return np.ascontiguousarray(values.T).reshape(n, QK_K)


def _positive_max(v: np.ndarray) -> np.ndarray:
    """ggml's `m = 0; if (v > m) m = v;` over each row (never -0.0)."""
    m = v.max(axis=1)
    return np.where(m > 0, m, F32(0.0)).astype(F32)


def _as_int8(v: np.ndarray) -> np.ndarray:
    """C's conversion of an int to int8_t (wraps)."""
    return v.astype(np.int32).astype(np.int8)


def _requantize(x: np.ndarray, search: np.ndarray, d: np.ndarray, m: np.ndarray | None,
                lo: int, hi: int, group: int) -> np.ndarray:
    """nearest_int((x + m) / d) clamped to [lo, hi], shifted to start at 0; sub-blocks whose
    d is zero keep the searched levels."""
    n = len(x)
    xs = x.reshape(n, -1, group)
    dd = d[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        v = xs if m is None else xs + m[:, :, None]
        levels = np.clip(nearest_int(v / dd), lo, hi) - lo
    keep = np.broadcast_to(dd == 0, levels.shape)
    return np.where(keep, search.reshape(levels.shape), levels).reshape(n, QK_K).astype(np.uint8)


def _pack_crumbs(levels: np.ndarray) -> np.ndarray:
    """2-bit levels -> bytes: in each 128-element half, byte l holds elements l, l+32, l+64,
    l+96 at bits 0, 2, 4, 6."""
    L = levels.reshape(len(levels), 2, 4, 32).astype(np.uint8)
    return (L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)).reshape(-1, 64)


def _pack_k4_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins -> the 12 bytes get_scale_min_k4 reads."""
    out = np.empty((len(ls), 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)
    return out


def _k4_common(x: np.ndarray, nmax: int, rmin: float, nstep: int):
    """Shared Q4_K/Q5_K path: search, 6-bit scales, fp16 super-scales, requantised levels."""
    n = len(x)
    sub = _sub_blocks(x, 32)
    av_x = np.sqrt(seq_sum(sub * sub) / F32(32))
    weights = av_x + np.abs(sub)
    scales, mins, search = make_qkx2_quants(sub, weights, nmax, rmin, 0.1, nstep, False)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    max_scale, max_min = _positive_max(scales), _positive_max(mins)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0.0)).astype(F32)
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0.0)).astype(F32)
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(nearest_int(inv_min[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    return to_f16(max_scale / F32(63)), to_f16(max_min / F32(63)), ls, lm, _per_block(search, n)


def k4_blocks(t: GGMLType, x: np.ndarray, d: np.ndarray, dmin: np.ndarray, ls: np.ndarray, lm: np.ndarray,
              search: np.ndarray) -> np.ndarray:
    """Q4_K or Q5_K blocks of x (n, 256): fp16 d and dmin, 6-bit scales and minimums (n, 8;
    larger values are packed as ggml's byte stores cut them), the searched levels (n, 256)
    kept where a decoded scale is 0, every other level re-picked for its decoded scale."""
    n, nmax = len(x), 15 if t == GGMLType.Q4_K else 31
    packed = _pack_k4_scales(ls, lm)
    sc = np.concatenate([packed[:, 0:4] & 63, (packed[:, 8:12] & 15) | ((packed[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([packed[:, 4:8] & 63, (packed[:, 8:12] >> 4) | ((packed[:, 4:8] >> 6) << 4)], axis=1)
    levels = _requantize(x, search, d.astype(F32)[:, None] * sc, dmin.astype(F32)[:, None] * mn, 0, nmax, 32)
    blk = np.zeros(n, dtype=block_dtype(t))
    blk["d"], blk["dmin"], blk["scales"] = d, dmin, packed
    L = levels.reshape(n, 4, 2, 32)
    blk["qs"] = ((L[:, :, 0] & 0x0F) | ((L[:, :, 1] & 0x0F) << 4)).reshape(-1, 128)
    if t == GGMLType.Q5_K:
        high = (levels.reshape(n, 8, 32) >> 4) & 1  # sub-block j's fifth bits go to bit j
        blk["qh"] = np.bitwise_or.reduce(high << np.arange(8, dtype=np.uint8)[:, None], axis=1)
    return blk


def q4_k(x: np.ndarray) -> np.ndarray:
    return k4_blocks(GGMLType.Q4_K, x, *_k4_common(x, 15, -1.0, 20))


def q5_k(x: np.ndarray) -> np.ndarray:
    return k4_blocks(GGMLType.Q5_K, x, *_k4_common(x, 31, -0.5, 15))


def q2_k(x: np.ndarray) -> np.ndarray:
    n = len(x)
    sub = _sub_blocks(x, 16)
    scales, mins, search = make_qkx2_quants(sub, np.abs(sub), 3, -0.5, 0.1, 15, True)
    scales, mins = scales.reshape(n, 16), mins.reshape(n, 16)
    max_scale, max_min = _positive_max(scales), _positive_max(mins)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(15) / max_scale, F32(0.0)).astype(F32)
        inv_min = np.where(max_min > 0, F32(15) / max_min, F32(0.0)).astype(F32)
    ls = np.where(max_scale[:, None] > 0, nearest_int(inv_scale[:, None] * scales), 0)
    lm = np.where(max_min[:, None] > 0, nearest_int(inv_min[:, None] * mins), 0)
    packed = (((ls & 0xFF) | (lm << 4)) & 0xFF).astype(np.uint8)
    return q2_k_blocks(x, to_f16(max_scale / F32(15)), to_f16(max_min / F32(15)), packed, _per_block(search, n))


def q2_k_blocks(x: np.ndarray, d: np.ndarray, dmin: np.ndarray, packed: np.ndarray, search: np.ndarray) -> np.ndarray:
    """Q2_K blocks: fp16 d and dmin, the scale bytes (scale | minimum << 4), the searched
    levels kept where a decoded scale is 0 and re-picked elsewhere."""
    dl = d.astype(F32)[:, None] * (packed & 0x0F)
    ml = dmin.astype(F32)[:, None] * (packed >> 4)
    levels = _requantize(x, search, dl, ml, 0, 3, 16)
    blk = np.zeros(len(x), dtype=block_dtype(GGMLType.Q2_K))
    blk["scales"], blk["d"], blk["dmin"] = packed, d, dmin
    blk["qs"] = _pack_crumbs(levels)
    return blk


def _scales16(x: np.ndarray, make: Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]],
              nmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Q3_K's and Q6_K's sub-block scales: `make` (make_q3_quants, make_qx_quants) over each
    block's 16 sub-blocks of 16, as [n, 16], the search behind them, and their first
    absmax per block (signed) with its magnitude."""
    scales, search = make(_sub_blocks(x, 16), nmax)
    scales = scales.reshape(len(x), 16)
    max_scale, max_abs = first_absmax(scales, axis=1)
    return scales, search, max_scale, max_abs


def q3_k(x: np.ndarray) -> np.ndarray:
    scales, search, max_scale, _ = _scales16(x, make_q3_quants, 4)
    nonzero = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = (F32(-32) / max_scale).astype(F32)
        l6 = np.clip(_as_int8(nearest_int(iscale[:, None] * scales)), -32, 31) + 32
        d = to_f16(np.where(nonzero, F32(1.0) / iscale, F32(0.0)))
    l6 = np.where(nonzero[:, None], l6, 0).astype(np.uint8)  # 6-bit scales, offset by 32
    return q3_k_blocks(x, d, l6, _per_block(search, len(x)))


def q3_k_blocks(x: np.ndarray, d: np.ndarray, l6: np.ndarray, search: np.ndarray) -> np.ndarray:
    """Q3_K blocks: fp16 d, the 6-bit scales plus 32 (n, 16), the searched levels (+4) kept
    where a decoded scale is 0 and re-picked elsewhere."""
    n = len(x)
    packed = np.empty((n, 12), dtype=np.uint8)
    packed[:, :8] = (l6[:, :8] & 0x0F) | ((l6[:, 8:] & 0x0F) << 4)
    high = (l6 >> 4).reshape(n, 4, 4)  # [j // 4, j % 4]
    packed[:, 8:] = high[:, 0] | (high[:, 1] << 2) | (high[:, 2] << 4) | (high[:, 3] << 6)
    dl = d.astype(F32)[:, None] * (l6.astype(np.int8) - np.int8(32))
    levels = _requantize(x, search, dl, None, -4, 3, 16)
    blk = np.zeros(n, dtype=block_dtype(GGMLType.Q3_K))
    blk["scales"], blk["d"] = packed, d
    high_bits = (levels.reshape(n, 8, 32) > 3).astype(np.uint8)  # bit m of hmask[l]
    blk["hmask"] = np.bitwise_or.reduce(high_bits << np.arange(8, dtype=np.uint8)[:, None], axis=1)
    blk["qs"] = _pack_crumbs(levels & 3)
    return blk


def q6_k(x: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """quantize_row_q6_K_ref, or with importance weights qw (n, 256) quantize_row_q6_K_impl,
    whose sub-block searches weigh by qw itself."""
    n = len(x)
    w = None if qw is None else _sub_blocks(qw, 16)
    scales, search, max_scale, max_abs = _scales16(x, lambda sub, nmax: make_qx_quants(sub, nmax, w), 32)
    zero = max_abs < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = (F32(-128) / max_scale).astype(F32)
        d = to_f16(np.where(zero, F32(0.0), F32(1.0) / iscale))
        sc = _as_int8(np.minimum(nearest_int(iscale[:, None] * scales), 127))
    sc = np.where(zero[:, None], np.int8(0), sc)
    dl = d.astype(F32)[:, None] * sc
    levels = _requantize(x, _per_block(search, n), dl, None, -32, 31, 16)
    levels[zero] = 0
    L = levels.reshape(n, 2, 4, 32)
    blk = np.zeros(n, dtype=block_dtype(GGMLType.Q6_K))
    ql = np.empty((n, 2, 2, 32), dtype=np.uint8)
    ql[:, :, 0] = (L[:, :, 0] & 0x0F) | ((L[:, :, 2] & 0x0F) << 4)
    ql[:, :, 1] = (L[:, :, 1] & 0x0F) | ((L[:, :, 3] & 0x0F) << 4)
    blk["ql"] = ql.reshape(n, 128)
    hi = L >> 4
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    blk["qh"] = qh.reshape(n, 64)
    blk["scales"], blk["d"] = sc, d
    return blk


def q8_k(x: np.ndarray) -> np.ndarray:
    """8-bit quants with a float32 scale and per-16 sums, for dot products with K-quants."""
    n = len(x)
    mx, amax = first_absmax(x, axis=1)
    zero = amax == 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = (F32(-127) / mx).astype(F32)
        q = _as_int8(np.minimum(nearest_int(iscale[:, None] * x), 127))
        d = np.where(zero, F32(0.0), F32(1.0) / iscale).astype(F32)
    q[zero] = 0
    blk = np.zeros(n, dtype=block_dtype(GGMLType.Q8_K))
    blk["d"], blk["qs"] = d, q
    blk["bsums"] = q.reshape(n, 16, 16).sum(axis=2, dtype=np.int32).astype(np.int16)
    return blk
