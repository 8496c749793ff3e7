"""Reference encoders for the 32-element formats, following quantize_row_*_ref in ggml.

Each encoder takes float32 blocks, shape (n, 32), and returns n structured blocks. They are
what the CPU kernels use to quantise activations and what tests use to build models, so they
must produce ggml's bytes exactly: same scale choice (first element of largest magnitude),
same float32 arithmetic, same C conversions (truncation for the legacy 4/5-bit formats,
roundf for the 8-bit ones).
"""
from __future__ import annotations

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants.dequant_blocks import KVALUES_MXFP4, e8m0_half
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


def _legacy_block(t: GGMLType, d: np.ndarray, q: np.ndarray, mn: np.ndarray | None = None) -> np.ndarray:
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
    return _legacy_block(GGMLType.Q4_0, d, _truncate(x * inv[:, None] + F32(8.5), 15))


def q4_1(x: np.ndarray) -> np.ndarray:
    mn, d, inv = _range(x, 15)
    q = _truncate((x - mn[:, None]) * inv[:, None] + F32(0.5), 15)
    return _legacy_block(GGMLType.Q4_1, d, q, mn)


def q5_0(x: np.ndarray) -> np.ndarray:
    d, inv = _symmetric(x, -16)
    return _legacy_block(GGMLType.Q5_0, d, _truncate(x * inv[:, None] + F32(16.5), 31))


def q5_1(x: np.ndarray) -> np.ndarray:
    mn, d, inv = _range(x, 31)
    # C: (uint8_t)(x0 + 0.5f) without a clamp; the value never exceeds 31.5
    q = ((x - mn[:, None]) * inv[:, None] + F32(0.5)).astype(np.uint8)
    return _legacy_block(GGMLType.Q5_1, d, q, mn)


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


def mxfp4(x: np.ndarray) -> np.ndarray:
    """quantize_row_mxfp4_ref: the shared exponent e = floor(log2(amax)) - 2 + 127 (0 for an
    all-zero block) puts amax / d in [8, 16) for d = 2^(e - 128), so the largest values clamp
    to the top doubled code 12 (E2M1's 6), as ggml's do; each value becomes the first of the
    sixteen codes whose value times d is nearest (ggml's best_index_mxfp4: float32 products
    and differences, the first minimum). The exponent is float32 log2 and a float -> uint8
    conversion, computed as the gguf package computes it (the oracle of the tests)."""
    amax = np.abs(x).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0).astype(np.uint8)
    d = e8m0_half(e)
    values = KVALUES_MXFP4.astype(F32)
    err = np.abs((d[:, None, None] * values) - x[:, :, None])     # [n, 32, 16], float32
    q = np.argmin(err, axis=2).astype(np.uint8)                     # first of equal errors
    blk = _new(GGMLType.MXFP4, len(x))
    blk["e"] = e
    blk["qs"] = _pack_nibbles(q)
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
