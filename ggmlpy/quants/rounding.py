"""The exact rounding rules of ggml's C quantisers, as float32 numpy operations.

Matching ggml byte for byte means reproducing C's float32 arithmetic: every intermediate
stays float32 (numpy keeps float32 when a Python scalar meets a float32 array), products are
rounded before they are added (no fused multiply-add), and each of C's rounding idioms gets a
twin here.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32

NEAREST_INT_MAGIC = F32(12582912.0)  # 1.5 * 2**23: adding it leaves round-to-nearest-even in the mantissa


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's `nearest_int`: add 1.5*2^23, read the mantissa bits.

    For |v| < 2^22 this is round-half-to-even; beyond that (or for inf/nan, which ggml's
    searches can produce and then clamp) it returns the same garbage the C code does, so the
    clamped results stay identical.
    """
    bits = (np.asarray(v, dtype=F32) + NEAREST_INT_MAGIC).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def round_away(v: np.ndarray) -> np.ndarray:
    """C's `roundf`: halves go away from zero (np.rint would round them to even)."""
    whole = np.trunc(v)
    frac = v - whole  # exact in float32
    step = np.where(np.abs(frac) >= F32(0.5), np.sign(v), F32(0.0))
    return whole + step


def to_f16(v: np.ndarray) -> np.ndarray:
    """GGML_FP32_TO_FP16: round to nearest even, as numpy's float16 cast does."""
    return np.asarray(v, dtype=F32).astype(np.float16)


def first_absmax(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(value, |value|) of the first element with the largest magnitude along `axis`.

    ggml scans with `amax = 0; if (ax > amax) { amax = ax; max = x; }`: among equal
    magnitudes the first wins, NaNs never win, and an all-zero run gives +0.0.
    """
    ax = np.abs(x)
    ranked = np.where(np.isnan(ax), F32(-1.0), ax)
    idx = np.expand_dims(np.argmax(ranked, axis=axis), axis)
    amax = np.take_along_axis(ranked, idx, axis=axis).squeeze(axis)
    value = np.take_along_axis(x, idx, axis=axis).squeeze(axis)
    found = amax > 0
    return (np.where(found, value, F32(0.0)).astype(x.dtype),
            np.where(found, amax, F32(0.0)).astype(x.dtype))


def safe_inverse(d: np.ndarray) -> np.ndarray:
    """`d ? 1.0f/d : 0.0f` elementwise."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F32(1.0) / d, F32(0.0)).astype(F32)
