"""The native K-quant searches (kquant_native) against their numpy definitions
(kquant_search.*_ref), bit for bit, with every parameter set an encoder uses and on inputs
that reach each branch: flat and all-zero sub-blocks, signed zeros, a single spike, values
that overflow the error sums, denormals, one-signed runs, ties, and a partial last group.
The encoders' own tests (test_quants_ggml, test_quants_imatrix) compare the bytes with ggml
through these same searches."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.quants import kquant_native, kquant_search
from ggmlpy.quants.rounding import F32


def _columns(k: int, n: int, seed: int) -> np.ndarray:
    """n sub-blocks of k values as columns (k, n): random ones of many scales, and the edges."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((k, n)).astype(F32) * (10.0 ** rng.integers(-6, 4, n)).astype(F32)
    x[:, 0] = 0.0                                           # all zero
    x[:, 1] = F32(0.37)                                     # flat, positive
    x[:, 2] = F32(-2.5)                                     # flat, negative
    x[:, 3] = np.where(np.arange(k) % 2, F32(-0.0), F32(0.0))   # signed zeros
    x[:, 4] = 0.0
    x[k // 2, 4] = F32(3.0)                                 # one spike
    x[:, 5] = rng.standard_normal(k).astype(F32) * F32(1e19)    # sums overflow to inf
    x[:, 6] = rng.standard_normal(k).astype(F32) * F32(1e-39)   # denormals
    x[:, 7] = np.abs(x[:, 7])                               # positive only
    x[:, 8] = -np.abs(x[:, 8])                              # negative only
    x[:, 9] = np.round(x[:, 9] * 4) / 4                      # ties on the grid
    x[:, 10] = np.linspace(-1, 1, k, dtype=F32)
    return x


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# (k, nmax, rmin, rdelta, nstep, use_mad, weights): Q4_K, Q5_K, Q2_K, and the importance-matrix
# searches (make_qkx3_quants) of Q4_1/Q5_1 and of the K-quants
QKX2 = [(32, 15, -1.0, 0.1, 20, False, "q4_k"), (32, 31, -0.5, 0.1, 15, False, "q4_k"),
        (16, 3, -0.5, 0.1, 15, True, "abs"), (32, 15, -0.9, 0.05, 36, False, "random"),
        (16, 3, -0.9, 0.05, 36, False, "random"), (32, 31, -0.9, 0.05, 36, False, "random")]


@pytest.mark.parametrize("k, nmax, rmin, rdelta, nstep, use_mad, weights", QKX2)
@pytest.mark.parametrize("n", [16, 133])
def test_qkx2_search_is_the_numpy_one(k, nmax, rmin, rdelta, nstep, use_mad, weights, n):
    x = _columns(k, n, seed=n + k + nmax)
    if weights == "q4_k":
        with np.errstate(over="ignore"):
            w = (np.sqrt(kquant_search.seq_sum(x * x) / F32(k))[None, :] + np.abs(x)).astype(F32)
    elif weights == "abs":
        w = np.abs(x)
    else:
        w = np.random.default_rng(1).lognormal(size=x.shape).astype(F32)
        w[:, 0] = 0.0   # a sub-block with no weight
    with np.errstate(all="ignore"):
        ref = kquant_search.make_qkx2_quants_ref(x, w, nmax, rmin, rdelta, nstep, use_mad)
    got = kquant_native.make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep, use_mad)
    assert all(_same(a, b) for a, b in zip(got, ref))


@pytest.mark.parametrize("k, nmax, weighted", [(16, 32, False), (16, 32, True), (32, 8, True), (32, 16, True),
                                               (16, 4, True)])
@pytest.mark.parametrize("n", [16, 133])
def test_qx_search_is_the_numpy_one(k, nmax, weighted, n):
    x = _columns(k, n, seed=3 * n + nmax)
    w = np.random.default_rng(2).lognormal(size=x.shape).astype(F32) if weighted else None
    with np.errstate(all="ignore"):
        ref = kquant_search.make_qx_quants_ref(x, nmax, w)
    got = kquant_native.make_qx_quants(x, nmax, w)
    assert all(_same(a, b) for a, b in zip(got, ref))


@pytest.mark.parametrize("n", [16, 133])
def test_q3_search_is_the_numpy_one(n):
    x = _columns(16, n, seed=5 * n)
    with np.errstate(all="ignore"):
        ref = kquant_search.make_q3_quants_ref(x, 4)
    got = kquant_native.make_q3_quants(x, 4)
    assert all(_same(a, b) for a, b in zip(got, ref))


def test_enough_sub_blocks_take_the_native_search(monkeypatch):
    """The dispatch: from NATIVE_MIN_SUB_BLOCKS on, make_qkx2_quants and make_qx_quants are
    the native ones (so the encoders' ggml tests, whose inputs are that large, cover them)."""
    calls = []
    monkeypatch.setattr(kquant_native, "make_qx_quants", lambda *a: calls.append("native") or ("s", "l"))
    n = kquant_search.NATIVE_MIN_SUB_BLOCKS
    assert kquant_search.make_qx_quants(np.ones((16, n), F32), 32) == ("s", "l") and calls == ["native"]
    assert kquant_search.make_qx_quants(np.ones((16, n - 1), F32), 32)[0].shape == (n - 1,)
    assert calls == ["native"]
