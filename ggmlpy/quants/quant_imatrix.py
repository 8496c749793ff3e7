"""Encoders weighted by an importance matrix: what ggml's quantize_* write when llama-quantize
is given `--imatrix` (quantize_row_*_impl with quant_weights).

An importance matrix holds one value per column of a weight (the mean squared activation that
column meets). ggml turns it into per-element weights for its searches, qw * sqrt(sigma2 +
x*x), where sigma2 is a mean square of the row (the legacy 32-blocks) or of the super-block
(twice it for most 256-types); Q6_K weighs by qw alone. The searches are kquant_search's and
the grid searches', with these weights in place of the reference ones, and the sub-block
scales of the K-quants are chosen by make_qp_quants (weighted) rather than by the largest
scale. Sums run in index order in float32 as ggml's loops do.

Every encoder takes whole rows (r, n_per_row) and the matrix (n_per_row,) and returns the
rows' blocks (r * blocks per row,), because the legacy types' sigma2 spans a row.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import quant_iq, quant_iq1, quant_iq2_xs, quant_iq_grid
from ggmlpy.quants.kquant_search import (importance_weights, make_qkx3_quants, make_qp_quants, make_qx_quants,
                                         seq_sum)
from ggmlpy.quants.layouts import QK_K
from ggmlpy.quants.quant_blocks import legacy_block
from ggmlpy.quants.quant_k import k4_blocks, q2_k_blocks, q3_k_blocks, q6_k
from ggmlpy.quants.rounding import F32, to_f16

ImatrixEncoder = Callable[[np.ndarray, np.ndarray], np.ndarray]


def element_weights(rows: np.ndarray, imatrix: np.ndarray, size: int) -> np.ndarray:
    """The matrix value of each element of rows, as blocks of `size` (r * n_per_row / size, size)."""
    return np.broadcast_to(imatrix.astype(F32), rows.shape).reshape(-1, size)


# the legacy 32-blocks: sigma2 = sum(x*x) / n_per_row over the row ------------------------------
def _legacy(t: GGMLType, rows: np.ndarray, imatrix: np.ndarray) -> np.ndarray:
    sub = np.ascontiguousarray(rows.reshape(-1, 32).T)
    w = importance_weights(rows, element_weights(rows, imatrix, rows.shape[1]), 32, 1)
    with np.errstate(all="ignore"):
        if t in (GGMLType.Q4_0, GGMLType.Q5_0):
            scale, levels = make_qx_quants(sub, 8 if t == GGMLType.Q4_0 else 16, w)
            return legacy_block(t, scale, levels.T)
        scale, the_min, levels = make_qkx3_quants(sub, w, 15 if t == GGMLType.Q4_1 else 31, -0.9, 0.05, 36, False)
        return legacy_block(t, scale, levels.T, -the_min)


# the K-quants: per super-block ------------------------------------------------------------------
def _sub_blocks(v: np.ndarray, size: int) -> np.ndarray:
    return np.ascontiguousarray(v.reshape(-1, size).T)


def _per_block(levels: np.ndarray, n: int) -> np.ndarray:
    return np.ascontiguousarray(levels.T).reshape(n, QK_K)


def _scales_and_mins(x: np.ndarray, qw: np.ndarray, size: int, nmax: int, sigma: float, scale_max: int):
    """Q2_K, Q4_K, Q5_K: make_qkx3_quants per sub-block, then the sub-block scales and
    minimums each by make_qp_quants weighted by the sub-blocks' total weights."""
    n, per = len(x), QK_K // size
    w = importance_weights(x, qw, size, sigma)
    sw = seq_sum(w).reshape(n, per).T
    scales, mins, search = make_qkx3_quants(_sub_blocks(x, size), w, nmax, -0.9, 0.05, 36, False)
    d, ls = make_qp_quants(np.ascontiguousarray(scales.reshape(n, per).T), scale_max, sw)
    dmin, lm = make_qp_quants(np.ascontiguousarray(mins.reshape(n, per).T), scale_max, sw)
    return to_f16(d), to_f16(dmin), ls.T, lm.T, _per_block(search, n)


def q2_k(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        d, dmin, ls, lm, search = _scales_and_mins(x, qw, 16, 3, 1, 15)
    return q2_k_blocks(x, d, dmin, ((ls.astype(np.int32) | (lm.astype(np.int32) << 4)) & 0xFF).astype(np.uint8),
                       search)


def q3_k(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    n = len(x)
    with np.errstate(all="ignore"):
        w = importance_weights(x, qw, 16, 2)
        scales, search = make_qx_quants(_sub_blocks(x, 16), 4, w)
        d, l6 = make_qx_quants(np.ascontiguousarray(scales.reshape(n, 16).T), 32, seq_sum(w).reshape(n, 16).T)
    return q3_k_blocks(x, to_f16(d), l6.T, _per_block(search, n))


def q4_k(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return k4_blocks(GGMLType.Q4_K, x, *_scales_and_mins(x, qw, 32, 15, 2, 63))


def q5_k(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        d, dmin, ls, lm, search = _scales_and_mins(x, qw, 32, 31, 2, 63)
    return k4_blocks(GGMLType.Q5_K, x, d, dmin, np.minimum(ls, 63), np.minimum(lm, 63), search)


def _blocks(encode: Callable[[np.ndarray, np.ndarray], np.ndarray], size: int) -> ImatrixEncoder:
    """An encoder of blocks of `size` with per-element weights as an encoder of rows."""
    return lambda rows, imatrix: encode(rows.reshape(-1, size), element_weights(rows, imatrix, size))


def _legacy_rows(t: GGMLType) -> ImatrixEncoder:
    return lambda rows, imatrix: _legacy(t, rows, imatrix)


ENCODERS: dict[GGMLType, ImatrixEncoder] = {
    GGMLType.Q4_0: _legacy_rows(GGMLType.Q4_0),
    GGMLType.Q4_1: _legacy_rows(GGMLType.Q4_1),
    GGMLType.Q5_0: _legacy_rows(GGMLType.Q5_0),
    GGMLType.Q5_1: _legacy_rows(GGMLType.Q5_1),
    GGMLType.Q2_K: _blocks(q2_k, QK_K),
    GGMLType.Q3_K: _blocks(q3_k, QK_K),
    GGMLType.Q4_K: _blocks(q4_k, QK_K),
    GGMLType.Q5_K: _blocks(q5_k, QK_K),
    GGMLType.Q6_K: _blocks(q6_k, QK_K),
    GGMLType.IQ4_NL: _blocks(quant_iq.iq4_nl_weighted, 32),
    GGMLType.IQ4_XS: _blocks(quant_iq.iq4_xs, QK_K),
    GGMLType.IQ3_XXS: _blocks(quant_iq_grid.iq3_xxs, QK_K),
    GGMLType.IQ3_S: _blocks(quant_iq_grid.iq3_s, QK_K),
    GGMLType.IQ2_S: _blocks(quant_iq_grid.iq2_s, QK_K),
    GGMLType.IQ2_XXS: _blocks(quant_iq2_xs.iq2_xxs, QK_K),
    GGMLType.IQ2_XS: _blocks(quant_iq2_xs.iq2_xs, QK_K),
    GGMLType.IQ1_S: _blocks(quant_iq1.iq1_s, QK_K),
    GGMLType.IQ1_M: _blocks(quant_iq1.iq1_m, QK_K),
}
