"""ggml's scale searches for the K-quants, vectorised over sub-blocks.

ggml picks each sub-block's scale (and min) by trying a few candidate scales and keeping the
one with the smallest weighted error (make_qx_quants, make_q3_quants, make_qkx2_quants in
ggml-quants.c). To reproduce its bytes exactly, these versions keep the C code's float32
evaluation order: every sum is accumulated element by element in index order (a Python loop
over the 16 or 32 positions of a sub-block, each step a vector operation over all sub-blocks;
numpy's own sum would add pairwise and round differently), every product is rounded before it
is added, and per-sub-block decisions become masks.

Arrays are laid out transposed, `x[i, b]` = element i of sub-block b, so each step of a sum
reads one contiguous row.

The `*_ref` functions are the definitions. make_qkx2_quants, make_qx_quants and make_q3_quants
run their native twins (kquant_native: the same operations compiled, bit for bit) once there
are NATIVE_MIN_SUB_BLOCKS sub-blocks or more.
"""
from __future__ import annotations

import numpy as np

from ggmlpy.quants.rounding import F32, first_absmax, nearest_int

GROUP_MAX_EPS = F32(1e-15)
NATIVE_MIN_SUB_BLOCKS = 64   # from this many sub-blocks on, the native searches (kquant_native) run


def seq_sum(terms: np.ndarray) -> np.ndarray:
    """Sum over axis 0 in index order, starting from 0.0f, as a C loop does."""
    acc = np.zeros(terms.shape[1], dtype=F32)
    for row in terms:
        acc += row
    return acc


def mean_square(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """ggml's sigma2 of each row of x (n, k): `sumx2 += x*x` in order, then scale * sumx2 / k."""
    t = np.ascontiguousarray(x.T)
    return ((F32(scale) * seq_sum(t * t)) / F32(x.shape[1])).astype(F32)


def importance_weights(x: np.ndarray, qw: np.ndarray, size: int, scale: float) -> np.ndarray:
    """The weights ggml's quantize_row_*_impl search with given an importance matrix: per
    element qw * sqrt(sigma2 + x*x), sigma2 = mean_square(row of x, scale). x, qw (n, k) ->
    (size, n * k / size), the sub-blocks of `size` as columns."""
    sigma2 = np.repeat(mean_square(x, scale), x.shape[1] // size)
    sub = np.ascontiguousarray(x.reshape(-1, size).T)
    qsub = np.ascontiguousarray(np.asarray(qw, dtype=F32).reshape(-1, size).T)
    return (qsub * np.sqrt(sigma2[None, :] + sub * sub)).astype(F32)


def _rmse_sums(x: np.ndarray, w: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sum(w*x*l) and sum(w*l*l), each product evaluated left to right."""
    lf = levels.astype(F32)
    return seq_sum(w * x * lf), seq_sum(w * lf * lf)


def make_qx_quants(x: np.ndarray, nmax: int, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants_ref, natively where there are enough sub-blocks to repay a first compile."""
    if x.shape[1] >= NATIVE_MIN_SUB_BLOCKS:
        from ggmlpy.quants import kquant_native
        return kquant_native.make_qx_quants(x, nmax, w)
    return make_qx_quants_ref(x, nmax, w)


def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int, use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants_ref, natively where there are enough sub-blocks to repay a first compile.
    Given its weights, ggml's make_qkx3_quants (the importance-matrix encoders' search)
    computes the same: make_qkx3_quants is this function."""
    if x.shape[1] >= NATIVE_MIN_SUB_BLOCKS:
        from ggmlpy.quants import kquant_native
        return kquant_native.make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep, use_mad)
    return make_qkx2_quants_ref(x, w, nmax, rmin, rdelta, nstep, use_mad)


make_qkx3_quants = make_qkx2_quants


def make_qx_quants_ref(x: np.ndarray, nmax: int, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric levels in [-nmax, nmax) (rmse_type 1): weights w, x*x where None.

    Returns (scale per sub-block, levels + nmax as uint8), like ggml's make_qx_quants.
    """
    mx, amax = first_absmax(x, axis=0)
    if w is None:
        w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        levels, scale, best = None, None, None
        for step in [0] + [s for s in range(-9, 10) if s != 0]:
            if step == 0:
                iscale = F32(-nmax) / mx
            else:
                iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
            cand = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
            sumlx, suml2 = _rmse_sums(x, w, cand)
            if step == 0:
                levels = cand
                scale = np.where(suml2 != 0, sumlx / suml2, F32(0.0)).astype(F32)
                best = scale * sumlx
                continue
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            levels = np.where(better, cand, levels)
            scale = np.where(better, sumlx / suml2, scale).astype(F32)
            best = np.where(better, scale * sumlx, best).astype(F32)
    zero = amax < GROUP_MAX_EPS
    scale = np.where(zero, F32(0.0), scale).astype(F32)
    out = np.where(zero, 0, levels + nmax).astype(np.uint8)
    return scale, out


def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_q3_quants_ref, natively where there are enough sub-blocks to repay a first compile."""
    if x.shape[1] >= NATIVE_MIN_SUB_BLOCKS:
        from ggmlpy.quants import kquant_native
        return kquant_native.make_q3_quants(x, nmax)
    return make_q3_quants_ref(x, nmax)


def make_q3_quants_ref(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_q3_quants with do_rmse: start from the max-based levels, then up to five
    sweeps that move single levels when that improves the weighted fit.

    ggml stops sweeping a sub-block once a sweep changes nothing; a further sweep from the
    same state changes nothing either, so running all five for every sub-block is identical.
    """
    mx, amax = first_absmax(x, axis=0)
    w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-nmax) / mx
        levels = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
        sumlx, suml2 = _rmse_sums(x, w, levels)
        for _sweep in range(5):
            for i in range(x.shape[0]):
                xi, wi, li = x[i], w[i], levels[i].astype(F32)
                slx = sumlx - wi * xi * li
                sl2 = suml2 - wi * li * li
                new = np.clip(nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
                newf = new.astype(F32)
                slx_new = slx + wi * xi * newf
                sl2_new = sl2 + wi * newf * newf
                accept = ((slx > 0) & (new != levels[i]) & (sl2_new > 0)
                          & (slx_new * slx_new * suml2 > sumlx * sumlx * sl2_new))
                levels[i] = np.where(accept, new, levels[i])
                sumlx = np.where(accept, slx_new, sumlx)
                suml2 = np.where(accept, sl2_new, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0.0)).astype(F32)
    zero = amax < GROUP_MAX_EPS
    scale = np.where(zero, F32(0.0), scale).astype(F32)
    out = np.where(zero, 0, levels + nmax).astype(np.uint8)
    return scale, out


def _weighted_error(x: np.ndarray, w: np.ndarray, levels: np.ndarray, scale: np.ndarray,
                    minimum: np.ndarray, use_mad: bool) -> np.ndarray:
    diff = scale * levels.astype(F32) + minimum - x
    diff = np.abs(diff) if use_mad else diff * diff
    return seq_sum(w * diff)


def make_qkx2_quants_ref(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                         nstep: int, use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric levels in [0, nmax] with a min, searched over nstep+1 candidate scales.

    Returns (scale, the_min = -min >= 0, levels as uint8), like ggml's make_qkx2_quants. As
    in C, an accepted candidate's min shifts the grid of every later candidate.
    """
    mx = x.max(axis=0)
    # C keeps the first of equal minima (`if (x[i] < min)`): a zero minimum has its sign
    mn = np.take_along_axis(x, np.argmin(x, axis=0)[None, :], axis=0)[0]
    sum_w = w[0].copy()
    sum_x = sum_w * x[0]
    for i in range(1, x.shape[0]):
        sum_w += w[i]
        sum_x += w[i] * x[i]
    mn = np.where(mn > 0, F32(0.0), mn).astype(F32)
    flat = mx == mn  # C returns here, before the search can move the min
    flat_min = mn
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(nmax) / (mx - mn)
        scale = (F32(1.0) / iscale).astype(F32)
        levels = np.clip(nearest_int(iscale * (x - mn)), 0, nmax)
        best = _weighted_error(x, w, levels, scale, mn, use_mad)
        for step in range(nstep + 1):
            factor = F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)
            iscale = factor / (mx - mn)
            cand = np.clip(nearest_int(iscale * (x - mn)), 0, nmax)
            cf = cand.astype(F32)
            wl = w * cf
            sum_l = seq_sum(wl)
            sum_l2 = seq_sum(wl * cf)
            sum_xl = seq_sum(wl * x)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            clamp = this_min > 0
            this_min = np.where(clamp, F32(0.0), this_min).astype(F32)
            this_scale = np.where(clamp, sum_xl / sum_l2, this_scale).astype(F32)
            err = _weighted_error(x, w, cand, this_scale, this_min, use_mad)
            better = (det > 0) & (err < best)
            levels = np.where(better, cand, levels)
            best = np.where(better, err, best)
            scale = np.where(better, this_scale, scale)
            mn = np.where(better, this_min, mn)
    scale = np.where(flat, F32(0.0), scale).astype(F32)
    levels = np.where(flat, 0, levels).astype(np.uint8)
    mn = np.where(flat, flat_min, mn).astype(F32)
    return scale, -mn, levels


def make_qp_quants(x: np.ndarray, nmax: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_qp_quants: non-negative levels up to nmax for values x >= 0 (a super-block's
    sub-block scales or minimums) weighted by w, the best of nine scales by weighted squared
    error, then up to five sweeps moving single levels. x, w (n, blocks). Returns (scale,
    levels as uint8; ggml stores them in uint8_t, so a negative level wraps as there)."""
    mx = np.maximum(x.max(axis=0), F32(0.0))    # `max = MAX(max, x[i])` from 0
    zero = mx < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = (F32(nmax) / mx).astype(F32)
        first = nearest_int(iscale * x) & 0xFF       # stored unclamped, as uint8
        scale = (F32(1.0) / iscale).astype(F32)
        best = seq_sum(w * (x - scale * first.astype(F32)) * (x - scale * first.astype(F32)))
        for step in (-4, -3, -2, -1, 1, 2, 3, 4):
            trial = ((F32(0.1) * F32(step) + F32(nmax)) / mx).astype(F32)
            trial_scale = (F32(1.0) / trial).astype(F32)
            diff = x - trial_scale * np.minimum(nmax, nearest_int(trial * x)).astype(F32)
            mse = seq_sum(w * diff * diff)
            better = mse < best
            best = np.where(better, mse, best).astype(F32)
            iscale = np.where(better, trial, iscale).astype(F32)
        levels = np.minimum(nmax, nearest_int(iscale * x))
        lf = levels.astype(F32)
        sumlx, suml2 = seq_sum(w * x * lf), seq_sum(w * lf * lf)
        levels = levels & 0xFF
        for _sweep in range(5):        # a sweep that changes nothing leaves the next one idle too
            for i in range(x.shape[0]):
                xi, wi, li = x[i], w[i], levels[i].astype(F32)
                slx = sumlx - wi * xi * li
                sl2 = suml2 - wi * li * li
                new = np.minimum(nmax, nearest_int(xi * sl2 / slx))
                newf = new.astype(F32)
                slx_new = slx + wi * xi * newf
                sl2_new = sl2 + wi * newf * newf
                accept = ((slx > 0) & (sl2 > 0) & (new != levels[i])
                          & (slx_new * slx_new * suml2 > sumlx * sumlx * sl2_new))
                levels[i] = np.where(accept, new & 0xFF, levels[i])
                sumlx = np.where(accept, slx_new, sumlx).astype(F32)
                suml2 = np.where(accept, sl2_new, suml2).astype(F32)
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0.0)).astype(F32)
    scale = np.where(zero, F32(0.0), scale).astype(F32)
    return scale, np.where(zero, 0, levels).astype(np.uint8)
