"""Encoders for IQ1_S and IQ1_M with an importance matrix, byte for byte ggml's quantize_iq1_s
and quantize_iq1_m (quantize_row_iq1_s_impl / quantize_row_iq1_m_impl), what llama-quantize
writes for these types.

Each sub-block (32 elements for IQ1_S, 16 for IQ1_M) takes the values -1, 0, 1 shifted by
+-0.125 (x_p or x_m; IQ1_M picks the shift per group of 8). ggml sorts the sub-block, and for
every split of the sorted values into three runs (i1 <= i2) and every shift choice computes
the weighted least-squares fit from prefix sums, keeping the first strictly better one. Groups
of 8 whose levels are no grid point move to their best grid neighbour (least weighted squared
error), the scale is refitted if any did, and the sub-block scales are quantised to 3 bits
against the super-block scale (IQ1_M refits that scale once more over all its elements and
stores it as fp16 in the top nibbles of its four scale words).

The search is vectorised over sub-blocks: arrays are (candidate or position, sub-block), so a
C loop over candidates or positions is a Python loop of vector steps. ggml's float32
evaluation order is kept: products rounded before they are added, sums in index order, the
first strict improvement winning; glibc's qsort is a merge sort for these sizes, so equal
values keep their index order (a stable sort). Huge magnitudes (checked up to 1e30) match
too, ggml's overflows included; not reproduced are NaNs (ggml's qsort then has no consistent
order) and a group whose every neighbour has a non-finite error (ggml then falls back to a loop
that reads past the sub-block): that raises ValueError here.
"""
from __future__ import annotations

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants.kquant_search import importance_weights, seq_sum
from ggmlpy.quants.layouts import QK_K, block_dtype
from ggmlpy.quants.quant_iq_grid import Grid, grid, pack_levels
from ggmlpy.quants.rounding import F32, nearest_int, to_f16

_DELTA = F32(0.125)                    # IQ1S_DELTA == IQ1M_DELTA
# the value of level 0, 1, 2 for shift selector 0 (x_p) and 1 (x_m)
_XX = np.array([[-1 + _DELTA, _DELTA, 1 + _DELTA], [-1 - _DELTA, -_DELTA, 1 - _DELTA]], dtype=F32)
_FLT_MAX = np.finfo(F32).max
_CHUNK = 4096                          # sub-blocks per candidate scan (memory: candidates x chunk)
_IQ1M_MASKS = np.array([0x00, 0x80, 0x08, 0x88], dtype=np.uint8)


def _prepare(x: np.ndarray, qw: np.ndarray | None, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Sub-blocks as (positions, sub-blocks) and ggml's weights: qw * sqrt(sigma2 + x*x) with
    sigma2 = 2 * sum(x*x) / 256 per super-block, or x*x without an importance matrix."""
    n, nsub = len(x), QK_K // size
    sub = np.ascontiguousarray(x.reshape(n * nsub, size).T)
    if qw is None:
        return sub, sub * sub
    return sub, importance_weights(x, qw, size, 2)


def _prefix(terms: np.ndarray) -> np.ndarray:
    """[0, t0, t0 + t1, ...] along axis 0, accumulated in order in float32 (ggml's sumx/sumw)."""
    out = np.zeros((terms.shape[0] + 1, terms.shape[1]), dtype=F32)
    np.add.accumulate(np.concatenate([out[:1], terms]), axis=0, dtype=F32, out=out)
    return out


def _candidates_s(i1: np.ndarray, i2: np.ndarray, ws: np.ndarray, wx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ1_S: sumqx, sumq2 of every split (i1, i2) for x_p then x_m, as (pair * 2 + shift, m)."""
    sx, sw = _prefix(wx), _prefix(ws)
    qx, q2 = [], []
    for v in _XX:
        qx.append((sx[i1] - sx[0]) * v[0] + (sx[i2] - sx[i1]) * v[1] + (sx[-1] - sx[i2]) * v[2])
        q2.append((sw[i1] - sw[0]) * v[0] * v[0] + (sw[i2] - sw[i1]) * v[1] * v[1] + (sw[-1] - sw[i2]) * v[2] * v[2])
    m = ws.shape[1]
    return np.stack(qx, axis=1).reshape(-1, m), np.stack(q2, axis=1).reshape(-1, m)


def _candidates_m(i1: np.ndarray, i2: np.ndarray, ws: np.ndarray, wx: np.ndarray,
                  first_half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ1_M: prefix sums kept per half (group) of the sub-block, each half with its own shift;
    candidates (pair * 4 + k), k = 2 * (first half on x_m) + (second half on x_m)."""
    xp, xm = _XX[0], _XX[1]
    cp1, cp2 = xp[0] * xp[0] - xp[1] * xp[1], xp[1] * xp[1] - xp[2] * xp[2]
    cm1, cm2 = xm[0] * xm[0] - xm[1] * xm[1], xm[1] * xm[1] - xm[2] * xm[2]
    qx, q2 = [], []
    for half in (first_half, ~first_half):
        # ggml carries the other half's sums unchanged; adding +0.0 instead is the same
        # because these sums never become -0.0
        px, pw = _prefix(np.where(half, wx, F32(0))), _prefix(np.where(half, ws, F32(0)))
        sx = px[i1] + px[i2]
        qx.append((px[-1] * xp[2] - sx, px[-1] * xm[2] - sx))
        q2.append((pw[-1] * xp[2] * xp[2] + pw[i1] * cp1 + pw[i2] * cp2,
                   pw[-1] * xm[2] * xm[2] + pw[i1] * cm1 + pw[i2] * cm2))
    combos = ((0, 0), (0, 1), (1, 0), (1, 1))
    m = ws.shape[1]
    return (np.stack([qx[0][a] + qx[1][b] for a, b in combos], axis=1).reshape(-1, m),
            np.stack([q2[0][a] + q2[1][b] for a, b in combos], axis=1).reshape(-1, m))


def _first_best(sqx: np.ndarray, sq2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's scan `if (sumq2 > 0 && sumqx*sumqx > best*sumq2) { scale = sumqx/sumq2;
    best = scale*sumqx; }` over the candidates in order: (candidate taken or -1, its scale)."""
    m = sqx.shape[1]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = sqx / sq2
        score, sq, positive = scale * sqx, sqx * sqx, sq2 > 0
        best = np.full(m, -_FLT_MAX, dtype=F32)
        pick = np.full(m, -1, dtype=np.int64)
        for c in range(len(sqx)):
            take = sq[c] > best * sq2[c]
            take &= positive[c]
            np.copyto(best, score[c], where=take)
            np.copyto(pick, c, where=take)
    return pick, np.take_along_axis(scale, np.maximum(pick, 0)[None], axis=0)[0]


def _search(sub: np.ndarray, w: np.ndarray, per_half: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The exhaustive split search of every sub-block: (levels (positions, m) of the best split,
    its signed scale, its shift combination (-1: no candidate, ggml gives up))."""
    size, m = sub.shape
    order = np.argsort(sub + F32(0.0), axis=0, kind="stable")   # -0.0 ties with 0.0, as in C
    ws = np.take_along_axis(w, order, axis=0)
    wx = ws * np.take_along_axis(sub, order, axis=0)
    i1, i2 = np.triu_indices(size + 1)                          # i1 outer, i2 = i1 .. size
    ncombo = 4 if per_half else 2
    pick, scale = np.empty(m, dtype=np.int64), np.empty(m, dtype=F32)
    for lo in range(0, m, _CHUNK):
        part = slice(lo, lo + _CHUNK)
        if per_half:
            cands = _candidates_m(i1, i2, ws[:, part], wx[:, part], order[:, part] < size // 2)
        else:
            cands = _candidates_s(i1, i2, ws[:, part], wx[:, part])
        pick[part], scale[part] = _first_best(*cands)
    pair = np.maximum(pick, 0) // ncombo
    rank = np.arange(size)[:, None]
    levels = np.empty((size, m), dtype=np.int8)
    np.put_along_axis(levels, order, ((rank >= i1[pair]).astype(np.int8) + (rank >= i2[pair])), axis=0)
    return levels, scale, np.where(pick >= 0, pick % ncombo, -1)


def _to_grid(g: Grid, L: np.ndarray, xg: np.ndarray, wg: np.ndarray, sel: np.ndarray, scale: np.ndarray,
             live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Grid indices (groups, m) of the levels L (groups, 8, m), every off-grid group of a live
    sub-block moved to its best neighbour (iq1_find_best_neighbour2: the first least sum of
    w*diff*diff, diff = scale*xx[l] - x); L is updated in place. Also the off-grid mask."""
    code = pack_levels(g, L)
    idx = g.kmap[code]
    off = (idx < 0) & live[None, :]
    k_idx, s_idx = np.nonzero(off)
    for lo in range(0, len(k_idx), 8192):
        k, s = k_idx[lo:lo + 8192], s_idx[lo:lo + 8192]
        rows = g.row[code[k, s]]
        cand = g.neighbours[rows]                                    # (groups, slots)
        xx = _XX[sel[k, s]]                                          # (groups, 3)
        sc, xv, wv = scale[s][:, None], xg[k, :, s], wg[k, :, s]
        d2 = np.zeros(cand.shape, dtype=F32)
        with np.errstate(over="ignore", invalid="ignore"):
            for i in range(8):
                diff = sc * np.take_along_axis(xx, g.levels[cand, i].astype(np.intp), axis=1) - xv[:, i, None]
                d2 += wv[:, i, None] * diff * diff
            ok = (np.arange(cand.shape[1])[None, :] < g.count[rows][:, None]) & (d2 < _FLT_MAX)
        if not ok.any(axis=1).all():     # ggml falls back to a loop reading past the sub-block
            raise ValueError("no grid neighbour with a finite error (overflowing or non-finite input)")
        best = np.take_along_axis(cand, np.argmin(np.where(ok, d2, np.inf), axis=1)[:, None], axis=1)[:, 0]
        idx[k, s] = best
        L[k, :, s] = g.levels[best]
    return idx, off


def _group_values(L: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """xx[l] per position: L (positions, m), sel (groups, m) the shift of each group of 8."""
    sel_pos = np.repeat(sel, 8, axis=0)
    return np.where(sel_pos == 1, _XX[1][L], _XX[0][L])


def _quantize(x: np.ndarray, qw: np.ndarray | None, size: int, eps: float) -> tuple[np.ndarray, ...]:
    """Both types' per-sub-block work: (sub, w, scale >= 0, grid index (groups, m), shift
    selector (groups, m)). Sub-blocks ggml skips (max |x| < eps, or no candidate) get scale 0,
    index 0 and selector 0, as ggml leaves them."""
    g = grid(GGMLType.IQ1_S)
    sub, w = _prepare(x, qw, size)
    groups, m = size // 8, sub.shape[1]
    L, scale, combo = _search(sub, w, per_half=size == 16)
    live = (np.abs(sub).max(axis=0) >= F32(eps)) & (combo >= 0)
    sel = np.stack([combo >> 1, combo & 1]) if size == 16 else np.broadcast_to(combo, (groups, m))
    neg = scale < 0                                             # mirror the levels and shifts
    L = np.where(neg, 2 - L, L).astype(np.int8)
    scale = np.where(live, np.abs(scale), F32(0)).astype(F32)
    sel = np.where(live, np.where(neg, 1 - sel, sel), 0)
    shape = (groups, 8, m)
    Lg = L.reshape(shape)
    idx, off = _to_grid(g, Lg, sub.reshape(shape), w.reshape(shape), sel, scale, live)
    refit = off.any(axis=0)
    if refit.any():
        q = _group_values(Lg.reshape(size, m), sel)
        wq = w * q
        sumqx, sumq2 = seq_sum(wq * sub), seq_sum(wq * q)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(refit & (sumqx > 0) & (sumq2 > 0), sumqx / sumq2, scale).astype(F32)
    return sub, w, scale, np.where(live, idx, 0), sel


def _sub_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(3-bit sub-block scales, d = max_scale / 15, live: max_scale != 0) of each super-block."""
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    d = (max_scale / F32(15)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        l = np.clip(nearest_int(F32(0.5) * ((F32(1) / d)[:, None] * scales - F32(1))), 0, 7)
    return l.astype(np.uint16), d, max_scale != 0


def iq1_s(x: np.ndarray, qw: np.ndarray) -> np.ndarray:
    """quantize_iq1_s: x, qw float32 (n, 256) -> n block_iq1_s. qw is required, as in ggml."""
    if qw is None:
        raise ValueError("IQ1_S needs an importance matrix")
    x = np.asarray(x, dtype=F32).reshape(-1, QK_K)
    n = len(x)
    _, _, scale, idx, sel = _quantize(x, qw, 32, 1e-12)
    idx = idx.T.reshape(n, 8, 4)
    qh = ((idx >> 8).astype(np.uint16) << np.array([0, 3, 6, 9], dtype=np.uint16)).sum(axis=2, dtype=np.uint16)
    l, d, live = _sub_scales(scale.reshape(n, 8))
    l |= sel[0].reshape(n, 8).astype(np.uint16) << 3
    blk = np.zeros(n, dtype=block_dtype(GGMLType.IQ1_S))
    with np.errstate(over="ignore"):                            # ggml's fp16 overflows to inf too
        blk["d"] = to_f16(d * F32(1.125))
    blk["qs"] = (idx & 255).reshape(n, 32)
    blk["qh"] = np.where(live[:, None], qh | (l << 12), qh)
    return blk


def iq1_m(x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    """quantize_iq1_m: x, qw float32 (n, 256) -> n block_iq1_m. Without qw ggml weighs by x*x."""
    x = np.asarray(x, dtype=F32).reshape(-1, QK_K)
    n = len(x)
    sub, w, scale, idx, sel = _quantize(x, qw, 16, 1e-7)
    m = sub.shape[1]
    l, d, live = _sub_scales(scale.reshape(n, 16))
    # ggml's last refit: every element against its decoded value xx[level] * (2l + 1)
    levels = grid(GGMLType.IQ1_S).levels[idx].transpose(0, 2, 1).reshape(16, m)
    q = _group_values(levels, sel) * (F32(2) * l.reshape(m).astype(F32) + F32(1))[None, :]
    wq = w * q
    per_block = (16, n, 16)

    def row_sum(t: np.ndarray) -> np.ndarray:   # (16, m) in position order of each super-block
        return seq_sum(np.ascontiguousarray(t.reshape(per_block).transpose(2, 0, 1).reshape(QK_K, n)))

    sumqx, sumq2 = row_sum(wq * sub), row_sum(wq * q)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(sumq2 > 0, sumqx / sumq2, d).astype(F32)
    with np.errstate(over="ignore"):
        s = to_f16(d * F32(1.1125)).view(np.uint16)
    sc = (l.reshape(n, 4, 4) << np.array([0, 3, 6, 9], dtype=np.uint16)).sum(axis=2, dtype=np.uint16)
    sc |= np.stack([(s & 0x000F) << 12, (s & 0x00F0) << 8, (s & 0x0F00) << 4, s & 0xF000], axis=1)
    idx = idx.T.reshape(n, 16, 2)
    qh = ((idx[:, :, 0] >> 8) | ((idx[:, :, 1] >> 8) << 4)).astype(np.uint8)
    masks = _IQ1M_MASKS[(2 * sel[0] + sel[1]).reshape(n, 16)]
    blk = np.zeros(n, dtype=block_dtype(GGMLType.IQ1_M))
    blk["qs"] = (idx & 255).reshape(n, 32)
    blk["qh"] = np.where(live[:, None], qh | masks, qh)
    blk["scales"] = np.where(live[:, None], sc, 0).astype("<u2").view(np.uint8).reshape(n, 8)
    return blk
