"""Encoders for IQ2_XXS and IQ2_XS with an importance matrix, byte for byte as ggml's
quantize_iq2_xxs / quantize_iq2_xs (quantize_row_iq2_xxs_impl, quantize_row_iq2_xs_impl in
ggml-quants.c). ggml has no encoder for these types without an importance matrix.

Both work on 8-element groups of magnitudes, of which only 7 signs are stored: a group with an
odd count of minus signs has the sign of its element of least weight*x*x flipped (that
magnitude then enters the search negated). The weights are qw * sqrt(sigma2 + x*x), sigma2 the
mean square of the super-block. Per sub-block (32 elements for IQ2_XXS, 16 for IQ2_XS) a range
of scales is tried; for each, every group is rounded to levels and, where that is no grid point,
moved to the best of its precomputed grid neighbours. The least-squares scale of the best trial
wins and its groups are re-placed for that scale: every group for IQ2_XXS (whose trial scales
come from make_qp_quants), only the groups that were off the grid for IQ2_XS (like IQ3_XXS).

As in quant_iq_grid.py, arrays are (position in sub-block, sub-block), so each C loop over
positions is a Python loop of vector steps over all sub-blocks, keeping ggml's float32
evaluation order (sums in index order, products rounded before they are added, the first
minimum winning). The neighbour search is ragged (a few to a few hundred neighbours per point),
so it runs over one flat array of all (group, neighbour) pairs with per-group reductions rather
than over neighbour slots. Inputs where ggml aborts (NaNs, magnitudes whose weighted squares
overflow float32, around 1e15 and up) give some bytes instead: they are not reproduced.
"""
from __future__ import annotations

import functools

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants.kquant_search import GROUP_MAX_EPS, importance_weights, make_qp_quants
from ggmlpy.quants.layouts import QK_K, block_dtype
from ggmlpy.quants.quant_iq_grid import (gate_zero, grid, grid_index, pack_levels, scale_nibbles, search,
                                         super_block_scale)
from ggmlpy.quants.rounding import F32, to_f16

KMAXQ = 3           # levels 0..2, values 1, 3, 5


def _prepare(x: np.ndarray, qw: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sub-blocks of `size` as (positions, sub-blocks): the magnitudes the search sees (one
    negated in each group with an odd count of minus signs), the weights, and the 7-bit sign
    fields (groups, sub-blocks)."""
    sub = np.ascontiguousarray(x.reshape(-1, size).T)
    weight = importance_weights(x, qw, size, 1)
    groups = (size // 8, 8, sub.shape[1])
    neg = ~(sub >= 0).reshape(groups)
    cost = (weight * sub * sub).reshape(groups)
    least = np.arange(8)[None, :, None] == np.argmin(cost, axis=1)[:, None, :]
    flip = (neg.sum(axis=1) % 2 == 1)[:, None, :] & least
    mag = np.where(sub >= 0, sub, -sub).reshape(groups)   # ggml's magnitudes keep -0.0 as it is
    xval = np.where(flip, -mag, mag).reshape(size, -1)
    signs = np.packbits(neg ^ flip, axis=1, bitorder="little")[:, 0] & 127
    return xval, weight, signs


@functools.lru_cache(maxsize=None)
def _neighbour_lists(t: GGMLType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The grid's neighbour rows without their padding, one after another: the grid indices,
    where each row starts, and per position (8, entries) each entry's level plus 3 * position,
    its column in a group's cost table."""
    g = grid(t)
    flat = g.neighbours[np.arange(g.neighbours.shape[1])[None, :] < g.count[:, None]]
    starts = np.concatenate([[0], np.cumsum(g.count)[:-1]])
    columns = g.levels[flat].astype(np.int32) + KMAXQ * np.arange(8, dtype=np.int32)
    return flat, starts, np.ascontiguousarray(columns.T)


def _to_grid(t: GGMLType, L: np.ndarray, xg: np.ndarray, waux: np.ndarray, scale: np.ndarray,
             which: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Move every group whose levels are off the grid (and `which` selects) to its best
    neighbour for `scale`, as quant_iq_grid.to_grid does (iq2_find_best_neighbour: the first
    least sum over positions of waux * diff * diff). A position's term takes one of 3 values
    (one per level), so these are tabled per group and the sums run over one flat array of
    every (group, neighbour) pair, the minimum taken per group. L, xg, waux are
    (groups, 8, sub-blocks); returns L modified and the mask of groups that were on the grid."""
    g = grid(t)
    codes = pack_levels(g, L)
    on = g.kmap[codes] >= 0
    k_idx, s_idx = np.nonzero(~on if which is None else ~on & which)
    if len(k_idx) == 0:
        return L, on
    flat, row_start, columns = _neighbour_lists(t)
    rows = g.row[codes[k_idx, s_idx]]
    count = g.count[rows]
    starts = np.concatenate([[0], np.cumsum(count)[:-1]])
    pair = np.repeat(np.arange(len(rows)), count)
    entry = np.repeat(row_start[rows] - starts, count) + np.arange(len(pair))
    diff = scale[s_idx][:, None, None] * np.arange(1, 2 * KMAXQ, 2, dtype=F32) - xg[k_idx, :, s_idx][:, :, None]
    table = (waux[k_idx, :, s_idx][:, :, None] * diff * diff).reshape(-1)    # (group, position, level)
    base = pair * (8 * KMAXQ)
    d2 = np.zeros(len(pair), dtype=F32)
    for i in range(8):
        d2 += table[columns[i][entry] + base]
    least = np.minimum.reduceat(d2, starts)
    first = np.minimum.reduceat(np.where(d2 == least[pair], np.arange(len(pair)), len(pair) - 1), starts)
    L[k_idx, :, s_idx] = g.levels[flat[entry[first]]]
    return L, on


def _inputs(x: np.ndarray, qw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x and qw as float32 (n, 256)."""
    x = np.ascontiguousarray(x, dtype=F32).reshape(-1, QK_K)
    return x, np.ascontiguousarray(qw, dtype=F32).reshape(x.shape)


def _d(max_scale: np.ndarray) -> np.ndarray:
    """The fp16 super-block scale max_scale / 31 (inf past fp16's range, as in ggml)."""
    with np.errstate(over="ignore"):
        return to_f16(max_scale / F32(31))


def iq2_xxs(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """quantize_iq2_xxs: x, qw (n, 256) -> n blocks. The trials scale around make_qp_quants'
    scale (nmax 4) times 3; a sub-block where that is not positive is stored as zero. Each
    sub-block is two words: four grid index bytes, then four 7-bit sign fields and the 4-bit
    scale."""
    x, qw = _inputs(x, qw)
    n, g = len(x), grid(GGMLType.IQ2_XXS)
    xval, weight, signs = _prepare(x, qw, 32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale0, _ = make_qp_quants(xval, KMAXQ + 1, weight)
        eff_max = (scale0 * F32(KMAXQ)).astype(F32)
        zero = (xval.max(axis=0) < GROUP_MAX_EPS) | (eff_max <= 0)
        scale, L = search(g, xval, weight, range(-6, 7), 0.1, True, "always", scale0, eff_max,
                          functools.partial(_to_grid, GGMLType.IQ2_XXS))
    signs = np.where(scale < 0, ~signs & 127, signs).astype(np.uint32)
    scale, L = gate_zero(zero, np.abs(scale), L)
    index_word = np.ascontiguousarray(grid_index(g, L).T.astype(np.uint8)).view("<u4")[:, 0]
    sign_word = np.where(zero, 0, signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21))
    scales = scale.reshape(n, 8)
    max_scale = super_block_scale(scales)
    sign_word = sign_word.reshape(n, 8) | (scale_nibbles(scales, max_scale).astype(np.uint32) << 28)
    words = np.stack([index_word.reshape(n, 8), sign_word], axis=2).astype("<u4").reshape(n, 16)
    live = max_scale != 0       # a super-block with no scale is all zero bytes
    blk = np.zeros(n, dtype=block_dtype(GGMLType.IQ2_XXS))
    blk["d"] = np.where(live, _d(max_scale), np.float16(0))
    blk["qs"] = np.where(live[:, None], words.view("<u2"), 0)
    return blk


def iq2_xs(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """quantize_iq2_xs: x, qw (n, 256) -> n blocks. 16-element sub-blocks, trials around
    max / 5; each group is stored as a 9-bit grid index and its 7 sign bits."""
    x, qw = _inputs(x, qw)
    n, g = len(x), grid(GGMLType.IQ2_XS)
    xval, weight, signs = _prepare(x, qw, 16)
    mx = xval.max(axis=0)
    zero = mx < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale, L = search(g, xval, weight, range(-9, 10), 0.1, True, "off",
                          place=functools.partial(_to_grid, GGMLType.IQ2_XS))
    signs = np.where(scale < 0, ~signs & 127, signs).astype(np.uint16)
    scale, L = gate_zero(zero, np.abs(scale), L)
    qs = np.where(zero, 0, grid_index(g, L) | (signs << 9)).T.reshape(n, 32)
    scales = scale.reshape(n, 16)
    max_scale = super_block_scale(scales)
    nib = scale_nibbles(scales, max_scale).astype(np.uint8)
    live = max_scale != 0
    blk = np.zeros(n, dtype=block_dtype(GGMLType.IQ2_XS))
    blk["d"] = np.where(live, _d(max_scale), np.float16(0))
    blk["qs"] = np.where(live[:, None], qs, 0)
    blk["scales"] = np.where(live[:, None], nib[:, 0::2] | (nib[:, 1::2] << 4), 0)
    return blk
