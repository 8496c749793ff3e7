"""Reference encoders for the non-linear 4-bit formats IQ4_NL and IQ4_XS, after ggml's
quantize_row_iq4_nl_impl (without an importance matrix).

Each 32-element sub-block gets a scale from a small search: levels for the scale that maps its
largest-magnitude value onto the outermost level (-127), the least-squares scale for those
levels, then (ntry > 0) 2*ntry + 1 further trial scales, each keeping its least-squares scale
when that fits better. IQ4_XS then quantises the eight sub-block scales to 6 bits against one
fp16 scale and re-picks every level for the scale it will be decoded with.

ggml runs this search with two settings: quantize_row_iq4_nl_ref (ntry = -1: no trials and the
first levels kept), which is ggml's from_float for IQ4_NL (a KV cache of that type), and
quantize_iq4_nl / quantize_iq4_xs (ntry = 7), what llama-quantize writes; IQ4_XS's _ref is the
latter. Sums run in index order in float32 as ggml's loops do (kquant_search.seq_sum).
"""
from __future__ import annotations

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants.iq_grids import KVALUES_IQ4NL
from ggmlpy.quants.kquant_search import GROUP_MAX_EPS, seq_sum
from ggmlpy.quants.layouts import QK_K, block_dtype
from ggmlpy.quants.rounding import F32, first_absmax, nearest_int, to_f16

NTRY_REF = -1      # quantize_row_iq4_nl_ref
NTRY_FILE = 7      # quantize_iq4_nl, quantize_iq4_xs (and quantize_row_iq4_xs_ref)

_VALUES = KVALUES_IQ4NL.astype(F32)


def best_index(x: np.ndarray) -> np.ndarray:
    """ggml's best_index_int8 over kvalues_iq4nl: the nearer of the two levels around x, the
    upper one on a tie (float32 differences), the end levels beyond them; NaN gives 15."""
    with np.errstate(invalid="ignore"):
        upper = np.clip(np.searchsorted(_VALUES, x, side="right"), 1, 15)
        lower_wins = (x - _VALUES[upper - 1]) < (_VALUES[upper] - x)
    return np.where(lower_wins, upper - 1, upper).astype(np.uint8)


def _sums(x: np.ndarray, w: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum(w*q*x) and sum(w*q*q) over axis 0, q the levels' values, as ggml evaluates them."""
    q = _VALUES[levels]
    wq = w * q
    return seq_sum(wq * x), seq_sum(wq * q)


def sub_block_scales(x: np.ndarray, ntry: int,
                     w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scale search of every 32-element sub-block: x is (32, n), element i of sub-block b
    in row i; w its weights (x*x where None). Returns (scale, levels of the first pass, zero),
    zero marking the sub-blocks below GROUP_MAX_EPS, which ggml skips (scale 0, levels not
    written)."""
    mx, amax = first_absmax(x, axis=0)
    zero = amax < GROUP_MAX_EPS
    if w is None:
        w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = (-mx if ntry > 0 else mx) / _VALUES[0]
        levels = best_index((F32(1.0) / d) * x)
        sumqx, sumq2 = _sums(x, w, levels)
        d = np.where(sumq2 > 0, sumqx / sumq2, F32(0.0)).astype(F32)
        best = d * sumqx
        for itry in range(-ntry, ntry + 1):
            inv = F32(itry + int(KVALUES_IQ4NL[0])) / mx
            sumqx, sumq2 = _sums(x, w, best_index(inv * x))
            better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            d = np.where(better, sumqx / sumq2, d).astype(F32)
            best = np.where(better, d * sumqx, best).astype(F32)
    return np.where(zero, F32(0.0), d).astype(F32), levels, zero


def _pack(levels: np.ndarray) -> np.ndarray:
    """Levels (n, k*32) -> bytes: per 32, element j in the low nibble of byte j, j+16 high."""
    L = levels.reshape(len(levels), -1, 2, 16)
    return (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(len(levels), -1)


def importance(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """The weights of super-blocks x (n, k) with importance qw (n, k): qw * sqrt(sigma2 +
    x*x), sigma2 = sum(x*x) * (2 / k), as quantize_row_iq4_nl_impl forms them."""
    xt = np.ascontiguousarray(x.T)
    sigma2 = seq_sum(xt * xt) * F32(2.0 / x.shape[1])
    return (qw * np.sqrt(sigma2[:, None] + x * x)).astype(F32)


def iq4_nl(x: np.ndarray, ntry: int = NTRY_REF, qw: np.ndarray | None = None) -> np.ndarray:
    """IQ4_NL blocks of x (n, 32). ntry = -1 is quantize_row_iq4_nl_ref, 7 quantize_iq4_nl;
    qw (n, 32): the importance of each element (an importance matrix's column).

    A block below GROUP_MAX_EPS gets d = 0 and every level 8 (value 1, nearest to 0), as
    ntry = 7 writes it; with ntry = -1 ggml leaves there whatever its level buffer last held
    (the previous block's levels, or uninitialised memory), which decodes to 0 all the same."""
    xt = np.ascontiguousarray(x.T)
    w = None if qw is None else np.ascontiguousarray(importance(x, qw).T)
    d, levels, zero = sub_block_scales(xt, ntry, w)
    if ntry > 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(F32)
            levels = best_index(inv * xt)
    levels = np.where(zero, 8, levels).T
    blk = np.zeros(len(x), dtype=block_dtype(GGMLType.IQ4_NL))
    blk["d"] = to_f16(d)
    blk["qs"] = _pack(levels)
    return blk


def iq4_nl_file(x: np.ndarray) -> np.ndarray:
    """quantize_iq4_nl without an importance matrix: what llama-quantize writes (ntry = 7)."""
    return iq4_nl(x, NTRY_FILE)


def iq4_nl_weighted(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """quantize_iq4_nl with an importance matrix (qw (n, 32): each element's value)."""
    return iq4_nl(x, NTRY_FILE, qw)


def iq4_xs(x: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """quantize_row_iq4_xs_ref (= quantize_iq4_xs without an importance matrix; with qw (n,
    256), each element's importance, quantize_iq4_xs with one): the eight sub-block scales as
    6-bit multiples l - 32 of d = -(scale of largest magnitude) / 32, then every level
    re-picked for its decoded scale d * l (all levels 8, the value 1, where that is 0)."""
    n = len(x)
    sub = np.ascontiguousarray(x.reshape(n * 8, 32).T)
    w = None if qw is None else np.ascontiguousarray(importance(x, qw).reshape(n * 8, 32).T)
    scales, _, _ = sub_block_scales(sub, NTRY_FILE, w)
    scales = scales.reshape(n, 8)
    max_scale, _ = first_absmax(scales, axis=1)
    d = (-max_scale / F32(32)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(F32)
        ls = np.clip(nearest_int(inv[:, None] * scales), -32, 31)
        dl = d[:, None] * ls.astype(F32)
        idl = np.where(dl != 0, F32(1.0) / dl, F32(0.0)).astype(F32)
        levels = best_index(idl[:, :, None] * x.reshape(n, 8, 32))
    ls = (ls + 32).astype(np.uint16)
    blk = np.zeros(n, dtype=block_dtype(GGMLType.IQ4_XS))
    blk["d"] = to_f16(d)
    blk["scales_l"] = (ls[:, 0::2] & 0x0F) | ((ls[:, 1::2] & 0x0F) << 4)
    blk["scales_h"] = ((ls >> 4) << np.arange(0, 16, 2, dtype=np.uint16)).sum(axis=1)
    blk["qs"] = _pack(levels.reshape(n, QK_K))
    return blk
