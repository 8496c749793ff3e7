"""Encoders for the grid I-quants IQ3_XXS, IQ3_S and IQ2_S, after ggml's
quantize_row_iq3_xxs_impl, quantize_row_iq3_s_impl and quantize_row_iq2_s_impl (without an
importance matrix what quantize_row_*_ref runs; with one, its values weigh the search), and
the search machinery and grids of every grid type (quant_iq2_xs.py and quant_iq1.py use them).

Per sub-block (32 elements, or 16 for IQ2_S) ggml takes magnitudes (the signs are stored
apart), tries a range of scales and, for each, rounds every group of 4 (or 8) magnitudes to
levels; a group whose levels are no grid point is moved to the best of its precomputed grid
neighbours (least weighted squared error). The least-squares scale of the best trial wins, the
groups still off the grid are re-placed for that scale, and finally the sub-block scales are
quantised to 4 bits against one fp16 scale.

Everything is vectorised over sub-blocks (arrays are (position in sub-block, sub-block), so a
C loop over positions is a Python loop of vector steps), with ggml's float32 evaluation order:
sums in index order, products rounded before they are added, the first minimum winning.
Where ggml gives up (it aborts on a NaN, or on magnitudes around 1e19 and up, whose squares
overflow float32 and leave no neighbour nearest), these give some bytes instead: such inputs
are not reproduced bit for bit.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Callable
from functools import lru_cache

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import iq_grids
from ggmlpy.quants.kquant_search import importance_weights, mean_square, seq_sum
from ggmlpy.quants.layouts import QK_K, block_dtype
from ggmlpy.quants.rounding import F32, nearest_int, to_f16


@dataclass(frozen=True)
class Grid:
    """A grid as ggml's searches see it: levels l (value 2l + 1) per position, the map from
    packed levels to grid index (-1 off the grid) and each off-grid point's neighbours."""

    levels: np.ndarray      # (points, group) int8
    pos: np.ndarray         # (points, group) float32, 2l + 1
    kmap: np.ndarray        # packed levels -> grid index, or -1
    row: np.ndarray         # packed levels -> its row of `neighbours` (0: none, on the grid)
    neighbours: np.ndarray  # grid indices, padded (the first `count` of a row are valid)
    count: np.ndarray       # neighbours per row
    bits: int               # bits per level in the packed form
    kmax: int               # levels per position: 0 .. kmax - 1


def build_grid(values: np.ndarray, kmax: int, nwant: int) -> Grid:
    """iq2xs_init_impl / iq3xs_init_impl: a point off the grid gets every grid point at the
    nwant smallest squared distances, ordered by (distance, index) as ggml's qsort leaves them."""
    levels = iq_grids.levels(values)
    group = levels.shape[1]
    bits = 3 if group == 4 else 2
    shift = bits * np.arange(group)
    kmap = np.full(1 << (bits * group), -1, dtype=np.int32)
    kmap[(levels.astype(np.int64) << shift).sum(axis=1)] = np.arange(len(levels))
    points = np.array(list(itertools.product(range(kmax), repeat=group)), dtype=np.int64)[:, ::-1]
    codes = (points << shift).sum(axis=1)
    off = kmap[codes] < 0
    p, g = 2 * points[off] + 1, 2 * levels.astype(np.int64) + 1
    d2 = (p * p).sum(axis=1)[:, None] + (g * g).sum(axis=1)[None, :] - 2 * (p @ g.T)
    order = np.argsort(d2, axis=1, kind="stable")
    ranked = np.take_along_axis(d2, order, axis=1)
    distinct = np.cumsum(np.concatenate([np.ones((len(p), 1), bool), ranked[:, 1:] != ranked[:, :-1]], 1), 1)
    count = (distinct <= nwant).sum(axis=1)
    row = np.zeros(len(kmap), dtype=np.int32)
    row[codes[off]] = np.arange(1, len(p) + 1)
    neighbours = np.concatenate([np.zeros((1, count.max()), np.int64), order[:, :count.max()]]).astype(np.int32)
    return Grid(levels, (2 * levels + 1).astype(F32), kmap, row, neighbours,
                np.concatenate([[0], count]).astype(np.int32), bits, kmax)


@lru_cache(maxsize=None)
def grid(t: GGMLType) -> Grid:
    """The search grid of t, built on first use (ggml_quantize_init: iq2xs_init_impl and
    iq3xs_init_impl, each off-grid point with its neighbours at the nwant smallest distances)."""
    if t == GGMLType.IQ3_XXS:
        return build_grid(iq_grids.IQ3XXS_VALUES, 8, 2)
    if t == GGMLType.IQ3_S:
        return build_grid(iq_grids.IQ3S_VALUES, 8, 3)
    if t == GGMLType.IQ2_S:
        return build_grid(iq_grids.IQ2S_VALUES, 3, 1)
    if t == GGMLType.IQ2_XXS:
        return build_grid(iq_grids.IQ2XXS_VALUES, 3, 2)
    if t == GGMLType.IQ2_XS:
        return build_grid(iq_grids.IQ2XS_VALUES, 3, 2)
    if t in (GGMLType.IQ1_S, GGMLType.IQ1_M):   # one grid, its points' 3 nearest distances kept
        return build_grid(iq_grids.IQ1S_VALUES, 3, 3)
    raise ValueError(f"no search grid for {t.name}")


def pack_levels(g: Grid, L: np.ndarray) -> np.ndarray:
    """Levels (groups, group, m) -> packed codes (groups, m)."""
    u = np.zeros((L.shape[0], L.shape[2]), dtype=np.int64)
    for i in range(L.shape[1]):
        u |= L[:, i].astype(np.int64) << (g.bits * i)
    return u


def to_grid(g: Grid, L: np.ndarray, xval: np.ndarray, waux: np.ndarray, scale: np.ndarray,
            which: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Move every group whose levels are off the grid (and `which` selects) to its best
    neighbour for `scale` (ggml's iq*_find_best_neighbour: the first smallest sum of
    waux * diff * diff). L, xval, waux: (groups, group, m), modified L returned with the mask
    of groups that were on the grid."""
    on = g.kmap[pack_levels(g, L)] >= 0
    k_idx, s_idx = np.nonzero(~on if which is None else ~on & which)
    if len(k_idx) == 0:
        return L, on
    rows = g.row[pack_levels(g, L)[k_idx, s_idx]]
    xv, wa, sc = xval[k_idx, :, s_idx], waux[k_idx, :, s_idx], scale[s_idx]
    best_d2 = np.full(len(rows), np.finfo(F32).max, dtype=F32)
    best = np.full(len(rows), -1, dtype=np.int64)
    for slot in range(g.neighbours.shape[1]):
        live = np.flatnonzero(g.count[rows] > slot)
        if len(live) == 0:
            break
        cand = g.neighbours[rows[live], slot]
        d2 = np.zeros(len(live), dtype=F32)
        for i in range(xv.shape[1]):
            diff = sc[live] * g.pos[cand, i] - xv[live, i]
            d2 += wa[live, i] * diff * diff
        better = d2 < best_d2[live]
        best_d2[live[better]] = d2[better]
        best[live[better]] = cand[better]
    L[k_idx, :, s_idx] = g.levels[best]
    return L, on


def level_sums(xval: np.ndarray, weight: np.ndarray, L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum(w*x*q) and sum(w*q*q) over positions, q = 2l + 1."""
    q = (2 * L + 1).astype(F32)
    return seq_sum(weight * xval * q), seq_sum(weight * q * q)


def round_levels(g: Grid, inv: np.ndarray, xval: np.ndarray) -> np.ndarray:
    """nearest_int(0.5 * (inv * x - 1)) clamped to the levels: the value 2l + 1 nearest x*inv."""
    return np.clip(nearest_int(F32(0.5) * (inv * xval - F32(1.0))), 0, g.kmax - 1).astype(np.int8)


def search(g: Grid, xval: np.ndarray, weight: np.ndarray, trials: range, step: float, start_on_grid: bool,
           refit: str, scale: np.ndarray | None = None, denom: np.ndarray | None = None,
           place: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The scale search of every sub-block: xval, weight (positions, m) -> (scale (m,), levels
    (groups, group, m)). Trial i scales by denom / (2 kmax - 1 + step * i) (denom: the largest
    magnitude by default), the best least-squares fit wins (`scale`, by default denom / (2 kmax
    - 1), stays where none fits). Then the groups are re-placed for the winning scale: refit
    "off" the groups off the grid (IQ3_XXS, IQ2_S, IQ2_XS), "all" every group of a sub-block
    with one off the grid (IQ3_S), "always" every group where the scale is positive (IQ2_XXS).
    place: to_grid's work (g's neighbour search by default)."""
    n_pos, m = xval.shape
    group = g.levels.shape[1]
    shape = (n_pos // group, group, m)
    xg, waux = xval.reshape(shape), np.sqrt(weight).reshape(shape)
    denom = xval.max(axis=0) if denom is None else denom
    scale = (denom / F32(2 * g.kmax - 1)).astype(F32) if scale is None else scale
    place = place or functools.partial(to_grid, g)
    best = np.zeros(m, dtype=F32)
    L = np.zeros(shape, dtype=np.int8)
    on_grid = np.full(shape[::2], start_on_grid)
    for trial in trials:
        inv = ((F32(2 * g.kmax - 1) + F32(trial) * F32(step)) / denom).astype(F32)
        cand, on = place(round_levels(g, inv, xg), xg, waux, (F32(1.0) / inv).astype(F32))
        sumqx, sumq2 = level_sums(xval, weight, cand.reshape(n_pos, m))
        better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        scale = np.where(better, sumqx / sumq2, scale).astype(F32)
        best = np.where(better, scale * sumqx, best).astype(F32)
        L = np.where(better, cand, L)
        on_grid = np.where(better, on, on_grid)
    redo = (scale > 0) if refit == "always" else (~on_grid).any(axis=0) & (scale > 0)
    which = ~on_grid & redo if refit == "off" else np.broadcast_to(redo, on_grid.shape)
    if which.any():
        fresh, _ = place(round_levels(g, (F32(1.0) / scale).astype(F32), xg), xg, waux, scale, which)
        L = np.where(which[:, None, :], fresh, L)
        sumqx, sumq2 = level_sums(xval, weight, L.reshape(n_pos, m))
        scale = np.where(redo & (sumq2 > 0), sumqx / sumq2, scale).astype(F32)
    return scale, L


def _prepare(x: np.ndarray, size: int, weights: str,
             qw: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sub-blocks of `size` as (positions, sub-blocks): x, magnitudes and ggml's weights: with
    an importance qw (n, 256) qw * sqrt(sigma2 + x*x), sigma2 = 2 * sum(x*x) / 256 per
    super-block; without, x*x (or IQ2_S's 0.25 * sigma2 + x*x)."""
    n = len(x)
    sub = np.ascontiguousarray(x.reshape(n * (QK_K // size), size).T)
    if qw is not None:
        w = importance_weights(x, qw, size, 2)
    elif weights == "sigma":
        w = (F32(0.25) * np.repeat(mean_square(x, 2), QK_K // size))[None, :] + sub * sub
    else:
        w = sub * sub
    return sub, np.where(sub >= 0, sub, -sub), w     # ggml's magnitudes keep -0.0 as it is


def _signs(sub: np.ndarray) -> np.ndarray:
    """Sign bytes, bit i set where element i of 8 is negative (not >= 0): (bytes, m)."""
    neg = ~(sub >= 0)
    return np.packbits(neg.reshape(-1, 8, sub.shape[1]), axis=1, bitorder="little")[:, 0]


def scale_nibbles(scales: np.ndarray, max_scale: np.ndarray) -> np.ndarray:
    """4-bit sub-block scales: nearest_int(0.5 * (scale / d - 1)) for d = max_scale / 31."""
    d = (max_scale / F32(31)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = (F32(1.0) / d).astype(F32)
        return np.clip(nearest_int(F32(0.5) * (inv[:, None] * scales - F32(1.0))), 0, 15)


def super_block_scale(scales: np.ndarray) -> np.ndarray:
    """ggml's `max_scale = MAX(max_scale, scale)` from 0 over a super-block's sub-blocks."""
    return np.maximum(scales.max(axis=1), F32(0.0)).astype(F32)


def gate_zero(zero: np.ndarray, scale: np.ndarray, L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sub-blocks ggml skips (too small to search): scale 0, levels 0."""
    return np.where(zero, F32(0.0), scale).astype(F32), np.where(zero, 0, L).astype(np.int8)


def grid_index(g: Grid, L: np.ndarray) -> np.ndarray:
    idx = g.kmap[pack_levels(g, L)]
    if (idx < 0).any():   # ggml aborts here ("Oops: found point not on grid")
        raise ValueError("quantisation left a group off the grid (non-finite input?)")
    return idx


def iq3_xxs(x: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """quantize_row_iq3_xxs_ref (with qw, each element's importance: quantize_iq3_xxs with an
    importance matrix). Only 7 sign bits are stored per 8 elements, the eighth
    making the count of minus signs even: a group with an odd count has the sign of its
    element of least w*x*x flipped (its magnitude then enters the search negated)."""
    n = len(x)
    g = grid(GGMLType.IQ3_XXS)
    sub, xval, w = _prepare(x, 32, "square", qw)
    m = sub.shape[1]
    neg = ~(sub >= 0).reshape(4, 8, m)
    cost = (w * sub * sub).reshape(4, 8, m)
    flip = (neg.sum(axis=1) % 2 == 1)[:, None, :] & (np.arange(8)[None, :, None] == np.argmin(cost, axis=1)[:, None, :])
    xval = np.where(flip, -xval.reshape(4, 8, m), xval.reshape(4, 8, m)).reshape(32, m)
    signs = np.packbits(neg ^ flip, axis=1, bitorder="little")[:, 0] & 127
    zero = xval.max(axis=0) < F32(1e-8)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale, L = search(g, xval, w, range(-15, 16), 0.2, True, "off")
    signs = np.where(scale < 0, ~signs & 127, signs).astype(np.uint32)
    scale, L = gate_zero(zero, np.abs(scale), L)
    words = np.where(zero, 0, signs[0] | (signs[1] << 7) | (signs[2] << 14) | (signs[3] << 21)).T.reshape(n, 8)
    scales = scale.reshape(n, 8)
    max_scale = super_block_scale(scales)
    words = (words | (scale_nibbles(scales, max_scale).astype(np.uint32) << 28)).astype("<u4")
    qs = np.concatenate([grid_index(g, L).T.reshape(n, 64).astype(np.uint8), words.view(np.uint8)], axis=1)
    blk = np.zeros(n, dtype=block_dtype(GGMLType.IQ3_XXS))
    live = max_scale != 0       # an all-zero super-block is all zero bytes
    blk["d"] = np.where(live, to_f16((max_scale / F32(31)) * F32(1.0125)), np.float16(0))
    blk["qs"] = np.where(live[:, None], qs, 0)
    return blk


def iq3_s(x: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """quantize_row_iq3_s_ref (with qw: quantize_iq3_s with an importance matrix). As in
    ggml, a sub-block that is exactly zero does not advance
    the qs and signs write positions: the sub-blocks after it are stored one slot early
    (their qh bits stay in place), and the last slots of the block stay zero."""
    n = len(x)
    g = grid(GGMLType.IQ3_S)
    sub, xval, w = _prepare(x, 32, "square", qw)
    signs = _signs(sub)
    zero = xval.max(axis=0) == 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale, L = search(g, xval, w, range(-9, 10), 0.2, False, "all")
    signs = np.where(scale < 0, ~signs, signs).astype(np.uint8)
    scale, L = gate_zero(zero, np.abs(scale), L)
    idx = grid_index(g, L).T.reshape(n, 8, 8)
    live = ~zero.reshape(n, 8)
    b, j = np.nonzero(live)
    slot = (np.cumsum(live, axis=1) - 1)[b, j]
    qs, sg = np.zeros((n, 8, 8), np.uint8), np.zeros((n, 8, 4), np.uint8)
    qs[b, slot] = (idx[b, j] & 255).astype(np.uint8)
    sg[b, slot] = signs.T.reshape(n, 8, 4)[b, j]
    scales = scale.reshape(n, 8)
    max_scale = super_block_scale(scales)
    nib = scale_nibbles(scales, max_scale).astype(np.uint8)
    blk = np.zeros(n, dtype=block_dtype(GGMLType.IQ3_S))
    nonzero = max_scale != 0
    blk["d"] = np.where(nonzero, to_f16((max_scale / F32(31)) * F32(1.033)), np.float16(0))
    blk["qs"] = qs.reshape(n, 64)
    blk["qh"] = np.packbits(((idx >> 8) & 1).astype(bool) & live[:, :, None], axis=2, bitorder="little")[:, :, 0]
    blk["signs"] = sg.reshape(n, 32)
    blk["scales"] = np.where(nonzero[:, None], nib[:, 0::2] | (nib[:, 1::2] << 4), 0)
    return blk


def iq2_s(x: np.ndarray, qw: np.ndarray | None = None) -> np.ndarray:
    """quantize_row_iq2_s_ref (with qw: quantize_iq2_s with an importance matrix): 16-element
    sub-blocks of two 8-element groups, weights
    0.25 * sigma2 + x*x, full sign bytes."""
    n = len(x)
    g = grid(GGMLType.IQ2_S)
    sub, xval, w = _prepare(x, 16, "sigma", qw)
    signs = _signs(sub)
    zero = xval.max(axis=0) < F32(1e-8)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale, L = search(g, xval, w, range(-9, 10), 0.1, True, "off")
    signs = np.where(scale < 0, ~signs, signs).astype(np.uint8)
    scale, L = gate_zero(zero, np.abs(scale), L)
    idx = np.where(zero, 0, grid_index(g, L)).T.reshape(n, 32)
    scales = scale.reshape(n, 16)
    max_scale = super_block_scale(scales)
    nib = scale_nibbles(scales, max_scale).astype(np.uint8)
    blk = np.zeros(n, dtype=block_dtype(GGMLType.IQ2_S))
    nonzero = max_scale != 0
    blk["d"] = np.where(nonzero, to_f16((max_scale / F32(31)) * F32(0.9875)), np.float16(0))
    blk["qs"] = np.concatenate([(idx & 255).astype(np.uint8), np.where(zero, 0, signs).T.reshape(n, 32)], axis=1)
    blk["qh"] = ((idx >> 8).reshape(n, 8, 4) << np.arange(0, 8, 2)).sum(axis=2)
    blk["scales"] = np.where(nonzero[:, None], nib[:, 0::2] | (nib[:, 1::2] << 4), 0)
    return blk
