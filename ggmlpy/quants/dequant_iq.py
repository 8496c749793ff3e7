"""Block decoders of ggml's I-quants (IQ1_S ... IQ4_XS): structured blocks in, float32 out.

The grid formats store, per group of 8 (or 4) elements, an index into a fixed grid of points
(iq_grids.py) and, except IQ1_*, a sign byte; per 16 or 32 elements a small scale. They are
decoded by gathers: all indices of all blocks at once look up their grid rows, which land in
`out` in element order; then `out` is scaled per sub-block and multiplied by the signs' +-1
factors. The float formulas and their order are ggml's dequantize_row_iq* exactly (the
sub-block scale `db` first, then `db * grid[j]`, then the sign; IQ1's `dl * (grid[j] + delta)`),
so results are bit-identical with ggml and the gguf package, NaN and -0.0 included.
"""
from __future__ import annotations

import numpy as np

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants.dequant_blocks import F32, Decoder, _f32, _fill, _nibble_planes, _nibbles, _plane_major
from ggmlpy.quants.iq_grids import (IQ1S_VALUES, IQ2S_VALUES, IQ2XS_VALUES, IQ2XXS_VALUES, IQ3S_VALUES,
                                    IQ3XXS_VALUES, KSIGNS_IQ2XS, KVALUES_IQ4NL, SIGN_FACTORS)

IQ1S_DELTA = F32(0.125)
_SHIFT_7 = np.array([0, 7, 14, 21], dtype=np.uint32)   # four 7-bit sign fields of a word
_SHIFT_IQ1 = np.array([0, 3, 6, 9], dtype=np.uint16)   # four 3-bit index tops of an IQ1_S word


def _bytes(field: np.ndarray) -> np.ndarray:
    """A block field's bytes, contiguous, one row per block."""
    return np.ascontiguousarray(field).view(np.uint8).reshape(len(field), -1)


def _gather(out: np.ndarray, values: np.ndarray, idx: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """out = scale * grid[idx]: grid rows in element order, one scale per equal run of
    elements. Returns out grouped as (n, scales, run)."""
    n = len(out)
    np.copyto(out.reshape(n, -1, values.shape[1]), np.take(values, idx, axis=0))
    grouped = out.reshape(n, scale.shape[1], -1)
    grouped *= scale[:, :, None]
    return grouped


def _sign(out: np.ndarray, signs: np.ndarray) -> None:
    """Multiply each run of 8 elements by the -1/+1 factors of its sign byte (a product, not
    a negation, so that NaN keeps its sign bit as ggml's `* -1.f` does)."""
    out.reshape(len(out), -1, 8)[...] *= np.take(SIGN_FACTORS, signs, axis=0)


def _packed_signs(words: np.ndarray) -> np.ndarray:
    """(n, k) words of four 7-bit sign fields -> (n, 4k) sign bytes (ksigns_iq2xs adds the
    eighth bit that makes the number of minus signs even)."""
    return KSIGNS_IQ2XS[(words[:, :, None] >> _SHIFT_7) & 127].reshape(len(words), -1)


def _half_scale(d: np.ndarray, s: np.ndarray, factor: float) -> np.ndarray:
    """ggml's `d * (0.5f + s) * factor` for 4-bit sub-block scales s."""
    return (d[:, None] * (F32(0.5) + s.astype(F32))) * F32(factor)


def _nibble_pairs(scales: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k): the low nibble of byte i, then its high nibble."""
    s = _bytes(scales)
    return np.stack([s & 0x0F, s >> 4], axis=2).reshape(len(s), -1)


def iq2_xxs(blk: np.ndarray, out: np.ndarray) -> None:
    # per 32 elements 8 bytes: 4 grid indices (8 elements each), then a word holding four
    # 7-bit sign fields and, in its top 4 bits, the scale: db = d * (0.5 + s) * 0.25
    n = len(blk)
    raw = _bytes(blk["qs"]).reshape(n, 8, 8)
    words = np.ascontiguousarray(raw[:, :, 4:]).view("<u4").reshape(n, 8)
    db = _half_scale(_f32(blk["d"]), words >> 28, 0.25)
    _gather(out, IQ2XXS_VALUES, raw[:, :, :4].reshape(n, 32), db)
    _sign(out, _packed_signs(words))


def iq2_xs(blk: np.ndarray, out: np.ndarray) -> None:
    # each 16-bit qs: a 9-bit grid index and 7 sign bits; scales[i] holds the 4-bit scales of
    # elements 32i..32i+15 (low nibble) and 32i+16..32i+31 (high)
    qs = blk["qs"]
    db = _half_scale(_f32(blk["d"]), _nibble_pairs(blk["scales"]), 0.25)
    _gather(out, IQ2XS_VALUES, qs & 511, db)
    _sign(out, KSIGNS_IQ2XS[qs >> 9])


def iq2_s(blk: np.ndarray, out: np.ndarray) -> None:
    # group g (8 elements) takes index byte qs[g] plus bits 2*(g % 4) of qh[g // 4] as its
    # bits 8-9, and the full sign byte qs[32 + g]; scales as IQ2_XS
    qs = _bytes(blk["qs"])
    qh = np.repeat(_bytes(blk["qh"]).astype(np.uint16), 4, axis=1)
    idx = qs[:, :32] | (((qh >> np.tile(np.arange(0, 8, 2, dtype=np.uint16), 8)) & 3) << 8)
    db = _half_scale(_f32(blk["d"]), _nibble_pairs(blk["scales"]), 0.25)
    _gather(out, IQ2S_VALUES, idx, db)
    _sign(out, qs[:, 32:])


def iq3_xxs(blk: np.ndarray, out: np.ndarray) -> None:
    # 64 indices of 4-element grid points, then per 32 elements a word of four 7-bit sign
    # fields (one per 8 elements) and a 4-bit scale: db = d * (0.5 + s) * 0.5
    qs = _bytes(blk["qs"])
    words = np.ascontiguousarray(qs[:, 64:]).view("<u4")
    db = _half_scale(_f32(blk["d"]), words >> 28, 0.5)
    _gather(out, IQ3XXS_VALUES, qs[:, :64], db)
    _sign(out, _packed_signs(words))


def iq3_s(blk: np.ndarray, out: np.ndarray) -> None:
    # index g (4 elements) is qs[g] plus bit g % 8 of qh[g // 8] as bit 8; one full sign byte
    # per 8 elements; scale of 32 elements i: d * (1 + 2 * nibble i % 2 of scales[i // 2])
    bits = np.unpackbits(_bytes(blk["qh"]), axis=1, bitorder="little").astype(np.uint16)
    idx = _bytes(blk["qs"]) | (bits << 8)
    odd = (1 + 2 * _nibble_pairs(blk["scales"])).astype(F32)
    _gather(out, IQ3S_VALUES, idx, _f32(blk["d"])[:, None] * odd)
    _sign(out, _bytes(blk["signs"]))


def _iq1_fill(out: np.ndarray, idx: np.ndarray, negative: np.ndarray, dl: np.ndarray) -> None:
    """y = dl * (grid[j] + delta), delta = -+0.125 per 8 elements: the IQ1 formula."""
    n = len(out)
    np.copyto(out.reshape(n, 32, 8), np.take(IQ1S_VALUES, idx, axis=0))
    out.reshape(n, 32, 8)[...] += np.where(negative, -IQ1S_DELTA, IQ1S_DELTA)[:, :, None]
    out.reshape(n, dl.shape[1], -1)[...] *= dl[:, :, None]


def iq1_s(blk: np.ndarray, out: np.ndarray) -> None:
    # per 32 elements a 16-bit qh: bits 3l..3l+2 are the top bits of group l's 11-bit index,
    # bits 12-14 the scale (dl = d * (2s + 1)), bit 15 the sign of the 0.125 shift
    qh = np.ascontiguousarray(blk["qh"])
    idx = _bytes(blk["qs"]).astype(np.uint16).reshape(len(qh), 8, 4)
    idx |= ((qh[:, :, None] >> _SHIFT_IQ1) & 7) << 8
    dl = _f32(blk["d"])[:, None] * (2 * ((qh >> 12) & 7) + 1).astype(F32)
    _iq1_fill(out, idx.reshape(len(qh), 32), np.repeat((qh & 0x8000) != 0, 4, axis=1), dl)


def iq1_m_scale(blk: np.ndarray) -> np.ndarray:
    """IQ1_M's f16 super-block scale, whose four nibbles are the top nibbles of the four
    little-endian scale words (ggml's iq1m_scale_t), as float32."""
    sc = np.ascontiguousarray(blk["scales"]).view("<u2")
    u16 = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
    return u16.astype(np.uint16).view(np.float16).astype(F32)


def iq1_m(blk: np.ndarray, out: np.ndarray) -> None:
    # group g (8 elements): index qs[g] | (nibble g % 2 of qh[g // 2]) & 7 << 8, the nibble's
    # bit 3 the sign of the shift; 3-bit scale j of 16 elements: bits 3*(j % 4) of word j // 4
    n = len(blk)
    sc = np.ascontiguousarray(blk["scales"]).view("<u2")
    nib = _nibble_pairs(blk["qh"]).astype(np.uint16)
    idx = _bytes(blk["qs"]).astype(np.uint16) | ((nib & 7) << 8)
    s = (np.repeat(sc, 4, axis=1) >> np.tile(np.arange(0, 12, 3, dtype=np.uint16), 4)) & 7
    dl = iq1_m_scale(blk)[:, None] * (2 * s + 1).astype(F32)
    _iq1_fill(out, idx, (nib & 8) != 0, dl.reshape(n, 16))


def iq4_nl(blk: np.ndarray, out: np.ndarray) -> None:
    # Q4_0's nibble layout, each nibble an index into the non-linear levels
    _fill(out, np.take(KVALUES_IQ4NL, _nibble_planes(blk)), _f32(blk["d"]), 1)


def iq4_xs(blk: np.ndarray, out: np.ndarray) -> None:
    # eight IQ4_NL-like sub-blocks of 32 (16 bytes each); 6-bit scale of sub-block i: nibble
    # i % 2 of scales_l[i // 2], plus bits 2i..2i+1 of scales_h as bits 4-5; dl = d * (ls - 32)
    q = np.take(KVALUES_IQ4NL, _nibbles(_plane_major(blk["qs"], 8)))
    high = (blk["scales_h"][:, None] >> np.arange(0, 16, 2, dtype=np.uint16)) & 3
    ls = (_nibble_pairs(blk["scales_l"]) | (high << 4)).astype(np.int16) - 32
    _fill(out, q, _f32(blk["d"])[:, None] * ls.astype(F32), 8)


DECODERS: dict[GGMLType, Decoder] = {
    GGMLType.IQ2_XXS: iq2_xxs,
    GGMLType.IQ2_XS: iq2_xs,
    GGMLType.IQ2_S: iq2_s,
    GGMLType.IQ3_XXS: iq3_xxs,
    GGMLType.IQ3_S: iq3_s,
    GGMLType.IQ1_S: iq1_s,
    GGMLType.IQ1_M: iq1_m,
    GGMLType.IQ4_NL: iq4_nl,
    GGMLType.IQ4_XS: iq4_xs,
}
