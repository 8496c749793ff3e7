"""Per-format block decoders: structured blocks in, float32 values out.

Each decoder fills `out` (shape (n_blocks, block_size), float32, C-contiguous) from `blk`
(n_blocks structured blocks). numpy's cost is per inner loop, and a block's fields are only
16-128 bytes long, so the quants are unpacked *plane-major*: the packed bytes are first
copied to a (groups, n_blocks, bytes) layout, then every bit operation runs over all blocks in
one long loop, producing one "plane" of 16 or 32 elements per block at a time. Then:

1. one int->float32 copy into `out` reorders planes back into element order;
2. `out` is scaled (and shifted) in place, one float32 pass per term.

The float formulas are ggml's dequantize_row_* exactly (a product of the float32 scale and
the integer quant, then minus the float32 min), so results are bit-identical to ggml and to
the `gguf` package. Comments give each format's element order as ggml's loops define it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggmlpy.ir.types import GGMLType

F32 = np.float32
Decoder = Callable[[np.ndarray, np.ndarray], None]

_SHIFT_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(4, 1, 1)
_SHIFT_1BIT = np.arange(8, dtype=np.uint8).reshape(8, 1, 1)
_KMASK_LOW4 = np.uint32(0x0F0F0F0F)
_KMASK_LOW2 = np.uint32(0x03030303)
_KMASK_LOW6 = np.uint32(0x3F3F3F3F)


def _f32(field: np.ndarray) -> np.ndarray:
    return field.astype(F32)


def _plane_major(field: np.ndarray, groups: int) -> np.ndarray:
    """(n, groups * k) bytes of every block -> contiguous (groups, n, k)."""
    n = len(field)
    return np.ascontiguousarray(field.reshape(n, groups, -1).transpose(1, 0, 2))


def _nibbles(src: np.ndarray) -> np.ndarray:
    """(..., n, k) bytes -> (..., 2, n, k): low nibbles, then high nibbles."""
    q = np.empty(src.shape[:-2] + (2,) + src.shape[-2:], dtype=np.uint8)
    np.bitwise_and(src, 0x0F, out=q[..., 0, :, :])
    np.right_shift(src, 4, out=q[..., 1, :, :])
    return q


def _crumbs(src: np.ndarray) -> np.ndarray:
    """(..., n, k) bytes -> (..., 4, n, k): bits 0-1, then bits 2-3, 4-5, 6-7."""
    q = np.right_shift(src[..., None, :, :], _SHIFT_2BIT)
    q &= 3
    return q


def _bits(src: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (8, n, k): bit 0 of every byte, then bit 1, ... bit 7."""
    q = np.right_shift(np.ascontiguousarray(src)[None], _SHIFT_1BIT)
    q &= 1
    return q


def _fill(out: np.ndarray, planes: np.ndarray, d: np.ndarray, groups: int) -> np.ndarray:
    """out = quant * d, quants given plane-major (..., n, k) in element order of the planes;
    one scale per group of consecutive elements. Returns the grouped view of `out`."""
    n = out.shape[0]
    k = planes.shape[-1]
    np.copyto(out.reshape(n, -1, k), planes.reshape(-1, n, k).transpose(1, 0, 2))
    grouped = out.reshape(n, groups, -1)
    grouped *= d.reshape(n, groups, 1)
    return grouped


def _nibble_planes(blk: np.ndarray) -> np.ndarray:
    """Legacy 32-element blocks: element j in the low nibble of byte j, j + 16 in the high."""
    return _nibbles(_plane_major(blk["qs"], 1)).reshape(2, len(blk), 16)


def _fill_offset(blk: np.ndarray, out: np.ndarray, q: np.ndarray, offset: int) -> None:
    """d * (q - offset): Q4_0 and Q5_0, whose unsigned quants stand for signed ones."""
    q = q.view(np.int8)
    q -= offset
    _fill(out, q, _f32(blk["d"]), 1)


def _fill_min(blk: np.ndarray, out: np.ndarray, q: np.ndarray) -> None:
    """d * q + m: Q4_1 and Q5_1, whose blocks carry their minimum."""
    grouped = _fill(out, q, _f32(blk["d"]), 1)
    grouped += _f32(blk["m"]).reshape(-1, 1, 1)


def q4_0(blk: np.ndarray, out: np.ndarray) -> None:
    _fill_offset(blk, out, _nibble_planes(blk), 8)


def q4_1(blk: np.ndarray, out: np.ndarray) -> None:
    _fill_min(blk, out, _nibble_planes(blk))


# byte -> its eight bits, each moved to bit 4 of its own byte (little-endian bit order),
# packed in a uint64: one lookup spreads eight fifth bits
_FIFTH_BITS = (np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
               << 4).view(np.uint64).reshape(256)


def _q5_planes(blk: np.ndarray) -> np.ndarray:
    """5-bit quants: the nibbles plus bit j of the little-endian qh word as bit 4 of element j."""
    n = len(blk)
    q = _nibble_planes(blk)
    q |= np.take(_FIFTH_BITS, blk["qh"]).view(np.uint8).reshape(n, 2, 16).transpose(1, 0, 2)
    return q


def q5_0(blk: np.ndarray, out: np.ndarray) -> None:
    _fill_offset(blk, out, _q5_planes(blk), 16)


def q5_1(blk: np.ndarray, out: np.ndarray) -> None:
    _fill_min(blk, out, _q5_planes(blk))


def q8_0(blk: np.ndarray, out: np.ndarray) -> None:
    _fill(out, blk["qs"][None], _f32(blk["d"]), 1)


def q2_k(blk: np.ndarray, out: np.ndarray) -> None:
    # Each 128-element half h uses 32 bytes; element 32*s + l of the half is bits 2s..2s+1
    # of byte l. Scale byte e // 16: low nibble scales the quant, high nibble the min.
    q = _crumbs(_plane_major(blk["qs"], 2))
    scales = blk["scales"]
    dl = _f32(blk["d"])[:, None] * (scales & 0x0F)
    ml = _f32(blk["dmin"])[:, None] * (scales >> 4)
    grouped = _fill(out, q, dl, 16)
    grouped -= ml[:, :, None]


def _words(packed: np.ndarray) -> np.ndarray:
    """A block's packed scale bytes as little-endian 32-bit words, one column per word."""
    return np.ascontiguousarray(packed).view("<u4")


def _q3_scales(packed: np.ndarray) -> np.ndarray:
    """Twelve bytes -> sixteen signed 6-bit scales, minus 32. Scale j has its low nibble in
    byte j (j < 8: low half; else byte j - 8, high half) and its two high bits at bits
    2*(j // 4) of byte 8 + j % 4; ggml decodes four at a time with 32-bit masks, as here."""
    w = _words(packed)
    lo, mid, high = w[:, 0], w[:, 1], w[:, 2]
    sc = np.empty((len(w), 4), dtype=np.uint32)
    for i, (src, shift) in enumerate([(lo, 0), (mid, 0), (lo, 4), (mid, 4)]):
        sc[:, i] = ((src >> shift) & _KMASK_LOW4) | (((high >> (2 * i)) & _KMASK_LOW2) << 4)
    q = sc.view(np.int8)
    q -= 32
    return q


def q3_k(blk: np.ndarray, out: np.ndarray) -> None:
    # Low two bits as in Q2_K; the high bit of element 32*m + l (m = 0..7 across both halves)
    # is bit m of hmask[l], and a CLEAR bit means "subtract 4".
    n = len(blk)
    q = _crumbs(_plane_major(blk["qs"], 2)).reshape(8, n, 32)
    q |= _bits(blk["hmask"]) << 2
    q = q.view(np.int8)
    q -= 4
    dl = _f32(blk["d"])[:, None] * _q3_scales(blk["scales"])
    _fill(out, q, dl, 16)


def _k4_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for all eight sub-blocks: twelve bytes -> 6-bit scales, mins.
    Sub-blocks 0-3 are the low six bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 take a
    nibble of bytes 8-11 plus the top two bits of bytes 0-3 (scales) or 4-7 (mins)."""
    w = _words(packed)
    lo, mid, high = w[:, 0], w[:, 1], w[:, 2]
    sc = np.empty((len(w), 2), dtype=np.uint32)
    mn = np.empty((len(w), 2), dtype=np.uint32)
    sc[:, 0] = lo & _KMASK_LOW6
    mn[:, 0] = mid & _KMASK_LOW6
    sc[:, 1] = (high & _KMASK_LOW4) | (((lo >> 6) & _KMASK_LOW2) << 4)
    mn[:, 1] = ((high >> 4) & _KMASK_LOW4) | (((mid >> 6) & _KMASK_LOW2) << 4)
    return sc.view(np.uint8), mn.view(np.uint8)


def _k4_apply(blk: np.ndarray, out: np.ndarray, q: np.ndarray) -> None:
    sc, mn = _k4_scales(blk["scales"])
    d1 = _f32(blk["d"])[:, None] * sc
    m1 = _f32(blk["dmin"])[:, None] * mn
    grouped = _fill(out, q, d1, 8)
    grouped -= m1[:, :, None]


def _k4_nibbles(blk: np.ndarray) -> np.ndarray:
    """Four runs of 32 bytes: 32 low nibbles (sub-block 2c), then 32 high nibbles (2c + 1)."""
    return _nibbles(_plane_major(blk["qs"], 4)).reshape(8, len(blk), 32)


def q4_k(blk: np.ndarray, out: np.ndarray) -> None:
    _k4_apply(blk, out, _k4_nibbles(blk))


def q5_k(blk: np.ndarray, out: np.ndarray) -> None:
    # As Q4_K, plus bit j of qh[l] as bit 4 of element l of sub-block j.
    q = _k4_nibbles(blk)
    q |= _bits(blk["qh"]) << 4
    _k4_apply(blk, out, q)


def q6_k(blk: np.ndarray, out: np.ndarray) -> None:
    # Per 128-element half h: element 32*k + l takes the low nibble (k < 2) or high nibble
    # (k >= 2) of ql[64h + 32*(k % 2) + l] and bits 2k..2k+1 of qh[32h + l]; scale e // 16.
    n = len(blk)
    ql = _plane_major(blk["ql"], 4).reshape(2, 2, n, 32)
    q = np.empty((2, 4, n, 32), dtype=np.uint8)
    np.bitwise_and(ql, 0x0F, out=q[:, 0:2])
    np.right_shift(ql, 4, out=q[:, 2:4])
    q |= _crumbs(_plane_major(blk["qh"], 2)) << 4
    q = q.view(np.int8)
    q -= 32
    dl = _f32(blk["d"])[:, None] * blk["scales"]
    _fill(out, q, dl, 16)


def q8_k(blk: np.ndarray, out: np.ndarray) -> None:
    _fill(out, blk["qs"][None], blk["d"].astype(F32), 1)


# ggml's kvalues_mxfp4: the sixteen E2M1 (FP4) values doubled, so that they are integers
# (the half goes into the scale, GGML_E8M0_TO_FP32_HALF); code 8 is a second zero (+0)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128) as float32, built from its bits. e >= 2 is a
    normal number (exponent field e - 1); e = 0 and 1 are the subnormals 2^-128 and 2^-127.
    (e = 255 is 2^127, not NaN: ggml does not treat it specially either.)"""
    e = np.asarray(e, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(F32)


def mxfp4(blk: np.ndarray, out: np.ndarray) -> None:
    # the nibbles as Q4_0's, each looked up in the doubled E2M1 table, times the half scale;
    # e >= 254 can give +-inf (12 * 2^126 and up), as in ggml
    with np.errstate(over="ignore"):
        _fill(out, np.take(KVALUES_MXFP4, _nibble_planes(blk)), e8m0_half(blk["e"]), 1)


# ggml_ue4m3_to_fp32 for every byte: NVFP4's unsigned E4M3 scales (bias 7, subnormals
# man * 2^-9), halved for the doubled E2M1 codes. Bit 7 is ignored and 0x7F (E4M3's NaN) reads
# as 0, as in ggml; every value is exact in float64 and float32 alike.
_UE4M3 = np.arange(256)
_UE4M3_EXP, _UE4M3_MAN = (_UE4M3 >> 3) & 0xF, _UE4M3 & 7
UE4M3_HALF = (np.where(_UE4M3_EXP == 0, np.ldexp(_UE4M3_MAN, -9),
                       np.ldexp(1 + _UE4M3_MAN / 8, _UE4M3_EXP - 7)) * 0.5).astype(F32)
UE4M3_HALF[[0, 0x7F]] = 0.0


def nvfp4(blk: np.ndarray, out: np.ndarray) -> None:
    # four 16-element sub-blocks, each MXFP4's nibble layout over its 8 bytes, each with its
    # own E4M3 scale
    q = np.take(KVALUES_MXFP4, _nibbles(_plane_major(blk["qs"], 4)))
    _fill(out, q, UE4M3_HALF[blk["d"]], 4)


def q1_0(blk: np.ndarray, out: np.ndarray) -> None:
    # element j is bit j % 8 of byte j // 8: set means +d, clear -d (so a zero d gives -0.0)
    d = _f32(blk["d"])[:, None]
    bit = np.unpackbits(blk["qs"], axis=1, bitorder="little").astype(bool)
    np.copyto(out, np.where(bit, d, -d))


def q2_0(blk: np.ndarray, out: np.ndarray) -> None:
    # element j is bits 2*(j % 4) of byte j // 4, a code 0-3 standing for -1, 0, 1, 2
    n = len(blk)
    q = np.right_shift(blk["qs"][:, :, None], _SHIFT_2BIT.reshape(4)).view(np.int8)
    q &= 3
    q -= 1
    _fill(out, q.reshape(1, n, 64), _f32(blk["d"]), 1)


def tq2_0(blk: np.ndarray, out: np.ndarray) -> None:
    # Q2_K's crumb order (element 128*h + 32*l + m is bits 2l of byte 32h + m), codes - 1
    q = _crumbs(_plane_major(blk["qs"], 2)).view(np.int8)
    q -= 1
    _fill(out, q, _f32(blk["d"]), 1)


_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _trits(packed: np.ndarray, count: int) -> np.ndarray:
    """(n, k) bytes -> (count, n, k) trits - 1: byte b holds the fixed-point fraction
    b / 256 of 3^5 (or 3^4); trit i is the integer part of 3 * (b * 3^i mod 256) / 256."""
    q = np.multiply(packed[None], _POW3[:count, None, None])  # uint8: wraps, as in C
    t = ((q.astype(np.uint16) * 3) >> 8).astype(np.int8)
    t -= 1
    return t


def tq1_0(blk: np.ndarray, out: np.ndarray) -> None:
    # elements 0-159: trit i of qs[m] (m < 32) is element 32i + m; 160-239: trit i of
    # qs[32 + m] is 160 + 16i + m; 240-255: trit i of qh[j] is 240 + 4i + j
    n = len(blk)
    qs = np.ascontiguousarray(blk["qs"])
    q = np.concatenate([_trits(qs[:, :32], 5).transpose(1, 0, 2).reshape(n, 160),
                        _trits(qs[:, 32:], 5).transpose(1, 0, 2).reshape(n, 80),
                        _trits(np.ascontiguousarray(blk["qh"]), 4).transpose(1, 0, 2).reshape(n, 16)], axis=1)
    np.multiply(q, _f32(blk["d"])[:, None], out=out)


DECODERS: dict[GGMLType, Decoder] = {
    GGMLType.Q4_0: q4_0,
    GGMLType.Q4_1: q4_1,
    GGMLType.Q5_0: q5_0,
    GGMLType.Q5_1: q5_1,
    GGMLType.Q8_0: q8_0,
    GGMLType.Q8_1: q8_0,  # same values; the extra sum field is only for dot products
    GGMLType.Q2_K: q2_k,
    GGMLType.Q3_K: q3_k,
    GGMLType.Q4_K: q4_k,
    GGMLType.Q5_K: q5_k,
    GGMLType.Q6_K: q6_k,
    GGMLType.Q8_K: q8_k,
    GGMLType.MXFP4: mxfp4,
    GGMLType.TQ1_0: tq1_0,
    GGMLType.TQ2_0: tq2_0,
    GGMLType.NVFP4: nvfp4,
    GGMLType.Q1_0: q1_0,
    GGMLType.Q2_0: q2_0,
}
