"""The CPU backend's repacked layout of the super-block types (one step: 256 values of 16
rows): the K-quants, IQ4_XS and IQ3_S, as repack.py does it for the 32-block types. The numpy
functions here define the layout; repack_bits.py derives the native bit moves from them.

IQ3_S is repacked as IQ4_XS is, as 4-bit codes with an i8 scale per 32 values: each of its
values is d * (1 + 2s) * (+-(2k + 1)) with k in 0..7 (its grid's entries are odd, 1 to 15),
so code k + 8 * (sign) with the scale 1 + 2s holds it exactly (`CODE_VALUES`). The codes are
decoded by one byte-table lookup per vector, where the GGUF layout needs a grid row load per
4 values: products stream the 27% larger layout at the 4-bit types' rate. IQ3_XXS the same:
its grid's entries are eight levels, 4 to 62, and its scale (d / 4) * (1 + 2s) (`K_FACTOR`);
39% larger than its file (140 bytes a super-block for 98).

IQ2_XS and IQ2_S are repacked as Q3_K is, as 3-bit codes with an i8 scale per 16 values:
their grids' entries are 8, 25 and 43 (ggml's iq2xs_grid, iq2s_grid), so each value is
(d / 8) * (1 + 2s) * +-g, code l + 4 * sign for level l of the three, scale 1 + 2s
(`CODE_VALUES`, `K_FACTOR`). The layout is 57% (IQ2_XS) or 41% (IQ2_S) larger than the
file's (116 bytes a super-block for 74 or 82); the grid kernels spent 40 instructions per 64
values on row loads and shuffles, the codes take one table lookup.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ggmlpy.ir.types import GGMLType, type_size
from ggmlpy.quants import block_dtype
from ggmlpy.quants.iq_grids import IQ2S_VALUES, IQ2XS_VALUES, IQ3S_VALUES, IQ3XXS_VALUES, KSIGNS_IQ2XS

GROUP = 16   # rows per group: one per dot lane


# K-quant steps (one super-block of 256 values): four chunks of 64 values, each its value
# vectors and the scales of its sub-blocks, then d. A step is read as one ascending stream,
# each vector first read in the order stored and the sub-blocks that share vectors taken
# one after the other (qrepacked.RepackedMatmul._sub_order): the hardware prefetchers then
# keep more of the stream in flight. One-token products streamed from DRAM (one thread /
# two, `python bench/prefetch_ab.py --type T -k 2048 -m 4096 --tokens 1 --ahead 0
# --chain-mb 128 -t N`, layouts taking turns): with the scales after the four chunks Q4_K
# 35-36 / 61-62 GB/s, Q5_K 22 / 39, Q6_K 16.4 / 32-34; with each chunk's scales after its
# values, 37 / 67-68, 24 / 41, 18.8 / 34.5-35; with Q6_K's scales after the vectors its
# first sub-block reads and its sub-blocks paired, Q6_K 17.6 -> 24.6 on one thread (the
# scales moved alone 21.0, the sub-blocks paired alone 20.6). With its high bits in a
# region of their own, 2 KiB after the low nibbles, Q6_K had streamed at 10 GB/s on one
# thread. The header (d) stays after the values: put first, it made Q4_K 25% slower.
#
# A chunk's vectors, natural order (K_VECTORS: low bits, high bits, then the scales):
#   Q4_K, Q5_K, Q6_K  8 vectors of nibbles: vector c, lane r, byte i: value 64j + 4c + i
#               (low nibble) and 64j + 32 + 4c + i (high nibble)
#   Q2_K, Q3_K  4 vectors of two-bit values: vector c, lane r, byte i, bits 2e..2e+1: value
#               64j + 16e + 4c + i
#   Q6_K        4 vectors of high bits: vector c, byte i: bits 2e..2e+1 (low nibble of vector
#               2c + e) and 4 + 2e.. (its high nibble)
#   Q3_K        2 vectors of third bits: vector h, byte i, bit b: value 64j + 32h + 4b + i
#   Q5_K        2 vectors of fifth bits, laid out as Q3_K's third bits
#   then one vector of the chunk's sub-blocks' scales, 16 rows each (k_scale_offset,
#   k_min_offset): Q4_K and Q5_K sc u8 of its two sub-blocks, then their mn u8; Q2_K the
#   GGUF scale bytes of its four (scale in the low nibble, minimum in the high one); Q3_K
#   sc i8 of its four (less its 32); Q6_K sc i8 of its four.
# They are stored in K_CHUNK_ORDER: the scales right after the vectors the chunk's first
# sub-block reads. IQ4_XS has no scale vector: its sc[8][16] i8 (less 32) follow the four
# chunks. Then d[16] f16 (Q2_K, Q4_K, Q5_K: then dmin[16] f16; the others 32 bytes of
# padding).
K_VECTORS = {GGMLType.Q2_K: (4, 0), GGMLType.Q3_K: (4, 2), GGMLType.Q4_K: (8, 0), GGMLType.Q5_K: (8, 2),
             GGMLType.Q6_K: (8, 4), GGMLType.IQ4_XS: (8, 0), GGMLType.IQ3_S: (8, 0), GGMLType.IQ3_XXS: (8, 0),
             GGMLType.IQ2_XS: (4, 2), GGMLType.IQ2_S: (4, 2)}
K_CHUNK = {t: 64 * (lo + hi) for t, (lo, hi) in K_VECTORS.items()}   # value bytes per chunk of 64 values
# the types whose chunks carry their own sub-blocks' scales (one vector after the values):
# every K-quant and the IQ2 types; IQ4_XS keeps its 128 bytes of scales after the four chunks
IQ2 = (GGMLType.IQ2_XS, GGMLType.IQ2_S)   # repacked as codes in Q3_K's layout
K_CHUNK_SCALES = (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K) + IQ2
K_STRIDE = {t: chunk + (64 if t in K_CHUNK_SCALES else 0) for t, chunk in K_CHUNK.items()}   # bytes a chunk
K_D = {t: 4 * K_STRIDE[t] + (0 if t in K_CHUNK_SCALES else 128) for t in K_CHUNK}   # d[16] f16 after the scales
# stored q + offset, i8 scales; else u8 scales and minimums (IQ4_XS: its codes decode to
# kvalues + 128, kernels/qcodes.py)
K_OFFSET = {GGMLType.Q3_K: 4, GGMLType.Q6_K: 32, GGMLType.IQ4_XS: 128, GGMLType.IQ3_S: 15, GGMLType.IQ3_XXS: 62,
            **{t: 43 for t in IQ2}}
# the value each 4-bit code stands for, of a type whose repacked codes are not its own (IQ3_S:
# code k + 8 * sign for +-(2k + 1); IQ3_XXS: code l + 8 * sign for +-(4, 12, ..., 52, 62)[l];
# IQ2_XS, IQ2_S: code l + 4 * sign for +-(8, 25, 43)[l], codes 3 and 7 unused); IQ4_XS's codes
# are its kvalues_iq4nl indices (qcodes.py)
_IQ2_LEVELS = (8, 25, 43, 0)
_IQ3XXS_LEVELS = (4, 12, 20, 28, 36, 44, 52, 62)
CODE_VALUES = {GGMLType.IQ3_S: tuple((2 * (c % 8) + 1) * (-1 if c >= 8 else 1) for c in range(16)),
               GGMLType.IQ3_XXS: tuple(_IQ3XXS_LEVELS[c % 8] * (-1 if c >= 8 else 1) for c in range(16)),
               **{t: tuple(_IQ2_LEVELS[c % 4] * (-1 if c & 4 else 1) * (c < 8) for c in range(16)) for t in IQ2}}
# d's factor where a type's scale is a fraction of its f16 d (IQ2: d * (0.5 + s) / 4 = d / 8 * (1 + 2s),
# IQ3_XXS: d * (0.5 + s) / 2 = d / 4 * (1 + 2s))
K_FACTOR = {GGMLType.IQ3_XXS: 0.25, **{t: 0.125 for t in IQ2}}


def _levels(grid: np.ndarray, levels: tuple[int, ...], word: type) -> np.ndarray:
    """Per row of a grid, its values' levels (their indices in `levels`) as one `word`."""
    return np.ascontiguousarray(np.searchsorted(np.array(levels), grid).astype(np.uint8)).view(word)[:, 0]


def _sign_code_bits(signs: np.ndarray, bit: int) -> np.ndarray:
    """Per sign byte (ggml's: bit j minus for value j), its 8 values' code bit `bit` as a u64."""
    return np.ascontiguousarray((((signs[:, None].astype(np.int64) >> np.arange(8)) & 1) << bit)
                                .astype(np.uint8)).view(np.uint64)[:, 0]


_IQ2XS_LEVELS, _IQ2S_LEVELS = (_levels(g, _IQ2_LEVELS[:3], np.uint64) for g in (IQ2XS_VALUES, IQ2S_VALUES))
_IQ3XXS_ROW_LEVELS = _levels(IQ3XXS_VALUES, _IQ3XXS_LEVELS, np.uint32)   # 4 values a row
_IQ2XS_SIGN_BITS = _sign_code_bits(KSIGNS_IQ2XS, 2)   # per 7-bit field (ksigns adds the parity bit)
_IQ2S_SIGN_BITS = _sign_code_bits(np.arange(256), 2)  # per full sign byte
_IQ3XXS_SIGN_BITS = _sign_code_bits(KSIGNS_IQ2XS, 3)  # per 7-bit field
_IQ3S_SIGN_BITS = _sign_code_bits(np.arange(256), 3)  # per full sign byte
_IQ3S_HALVES = np.ascontiguousarray(IQ3S_VALUES >> 1).view(np.uint32)[:, 0]   # per grid row, its 4 values' k
# A chunk's stored vectors as natural indices (low 0.., high n_lo.., scales n_lo + n_hi):
# what the first sub-block reads, its scales, then the rest (Q6_K: low 0-3 and their high
# bits 0-1, the scales, low 4-7 and high 2-3; Q3_K and Q5_K: the second high-bit vector
# after the scales).
K_CHUNK_ORDER = {GGMLType.Q2_K: (0, 1, 2, 3, 4), GGMLType.Q3_K: (0, 1, 2, 3, 4, 6, 5),
                 GGMLType.Q4_K: tuple(range(9)), GGMLType.Q5_K: (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 9),
                 GGMLType.Q6_K: (0, 1, 2, 3, 8, 9, 12, 4, 5, 6, 7, 10, 11), GGMLType.IQ4_XS: tuple(range(8)),
                 GGMLType.IQ3_S: tuple(range(8)), GGMLType.IQ3_XXS: tuple(range(8)),
                 **{t: (0, 1, 2, 3, 4, 6, 5) for t in IQ2}}
_SLOT = {t: {v: i for i, v in enumerate(order)} for t, order in K_CHUNK_ORDER.items()}


def _subs_per_chunk(t: GGMLType) -> int:
    return 2 if t in (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.IQ4_XS, GGMLType.IQ3_S, GGMLType.IQ3_XXS) else 4


def k_scale_offset(t: GGMLType, g: int) -> int:
    """Sub-block g's scales for the 16 rows (16 bytes; Q2_K: the GGUF byte, scale and minimum)."""
    if t not in K_CHUNK_SCALES:
        return 4 * K_STRIDE[t] + 16 * g
    chunk, i = divmod(g, _subs_per_chunk(t))
    return K_STRIDE[t] * chunk + 64 * _SLOT[t][sum(K_VECTORS[t])] + 16 * i


def k_min_offset(t: GGMLType, g: int) -> int:
    """Sub-block g's minimums for the 16 rows (Q4_K, Q5_K: after the chunk's two scales)."""
    return k_scale_offset(t, g) + 32


def k_values_offset(t: GGMLType, j: int, c: int) -> int:
    """Vector c of chunk j's low bits (see above for what its bytes hold)."""
    return K_STRIDE[t] * j + 64 * _SLOT[t][c]


def k_high_offset(t: GGMLType, j: int, c: int) -> int:
    """Vector c of chunk j's high bits (Q6_K: c = 0..3, Q3_K and Q5_K: 0..1)."""
    return K_STRIDE[t] * j + 64 * _SLOT[t][K_VECTORS[t][0] + c]


def q6_high_offset(j: int, c: int) -> int:
    """Vector c (0..3) of Q6_K chunk j's high bits (two bits for each of two low-nibble vectors)."""
    return k_high_offset(GGMLType.Q6_K, j, c)



def moved(x: np.ndarray, word: type, order: tuple[int, ...]) -> np.ndarray:
    """x's last axis (the bytes of one word) read as one `word`, the other axes put in
    `order`, back as contiguous bytes. numpy then moves whole words, not single bytes:
    repacking SmolLM2 or Gemma 3 runs 2 to 3 times faster than transposing bytes."""
    words = x.view(word)[..., 0]
    return np.ascontiguousarray(words.transpose(order)).view(np.uint8)



def repack_superblock_groups(rows: np.ndarray, t: GGMLType, k: int) -> np.ndarray:
    """[groups, steps, STEP_BYTES] for K-quant rows (one step = one super-block)."""
    m = rows.shape[0]
    g, s = m // GROUP, k // 256
    blk = rows.reshape(g, GROUP, s, type_size(t))          # [g, r, s, block bytes]

    def lanes(x: np.ndarray) -> np.ndarray:
        """[g, r, s, V, 4] -> [g, s, V * 64]: lane r of each of the V vectors."""
        return moved(x, np.uint32, (0, 2, 3, 1)).reshape(g, s, -1)

    def per_row(x: np.ndarray) -> np.ndarray:
        """[g, r, s, n] bytes -> [g, s, n * 16]: byte 16i + r."""
        return x.transpose(0, 2, 3, 1).reshape(g, s, -1)

    if t in (GGMLType.Q2_K, GGMLType.Q3_K):
        return _repack_crumb_groups(blk, t, lanes, per_row)
    if t in IQ2:
        return _repack_iq2_groups(blk, t, lanes, per_row)
    if t == GGMLType.IQ4_XS:
        return _repack_iq4_xs_groups(blk, lanes, per_row)
    if t == GGMLType.IQ3_S:
        return _repack_iq3_s_groups(blk, lanes, per_row)
    if t == GGMLType.IQ3_XXS:
        return _repack_iq3_xxs_groups(blk, lanes, per_row)
    if t in (GGMLType.Q4_K, GGMLType.Q5_K):
        at = block_dtype(t).fields["qs"][1]
        qs = blk[..., at:at + 128].reshape(g, GROUP, s, 32, 4)   # vector 8j + c = bytes 32j + 4c..
        sc, mn = _k4_scales(blk[..., 4:16])
        d = blk[..., 0:4].reshape(g, GROUP, s, 2, 2)        # d, dmin: 16 f16 each
        halves = moved(d, np.uint16, (0, 2, 3, 1)).reshape(g, s, -1)
        values = lanes(qs)
        if t == GGMLType.Q5_K:   # the fifth bits as Q3_K's third bits, after each chunk's nibbles
            values = np.concatenate([values.reshape(g, s, 4, 8 * 64),
                                     _fifth_bit_vectors(blk[..., 16:48], lanes)], axis=3).reshape(g, s, -1)
        chunks = _stored_chunks(t, [values.reshape(g, s, 4, -1), per_row(sc).reshape(g, s, 4, 32),
                                    per_row(mn).reshape(g, s, 4, 32)])   # each chunk's two sub-blocks
        return np.concatenate([chunks, halves], axis=2)
    q = _q6_values(blk)                                       # [g, r, s, 256] in 0..63
    q = q.reshape(g, GROUP, s, 4, 2, 8, 4)                    # chunk j, half, c, i
    ql = (q[:, :, :, :, 0] & 15) | ((q[:, :, :, :, 1] & 15) << 4)           # [g,r,s,4,8,4]
    hi = (q >> 4).reshape(g, GROUP, s, 4, 2, 4, 2, 4)         # j, half, c', e, i
    qh = (hi[..., 0, :, 0, :] | (hi[..., 0, :, 1, :] << 2)
          | (hi[..., 1, :, 0, :] << 4) | (hi[..., 1, :, 1, :] << 6))         # [g,r,s,4,4,4]
    d = moved(blk[..., 208:210].reshape(g, GROUP, s, 1, 2), np.uint16, (0, 2, 3, 1)).reshape(g, s, -1)
    chunks = _stored_chunks(t, [lanes(ql.reshape(g, GROUP, s, 32, 4)).reshape(g, s, 4, 8 * 64),
                                lanes(qh.reshape(g, GROUP, s, 16, 4)).reshape(g, s, 4, 4 * 64),
                                per_row(blk[..., 192:208]).reshape(g, s, 4, 64)])   # sub-blocks 4j..4j + 3
    return np.concatenate([chunks, d, np.zeros((g, s, 32), np.uint8)], axis=2)


def _stored_chunks(t: GGMLType, parts: list[np.ndarray]) -> np.ndarray:
    """A chunk's parts [g, s, 4, bytes] in natural order (the values' vectors, then the
    scales) -> [g, s, 4 * K_STRIDE], the vectors of each chunk in K_CHUNK_ORDER."""
    g, s = parts[0].shape[:2]
    natural = np.concatenate(parts, axis=3).reshape(g, s, 4, -1, 64)
    return natural[:, :, :, list(K_CHUNK_ORDER[t])].reshape(g, s, -1)


def _nibble_chunks(q: np.ndarray, lanes: Callable) -> np.ndarray:
    """Values [g, r, s, 256] of 4 bits -> [g, s, 4 chunks * 8 vectors * 64]: vector c of
    chunk j, lane r, byte i: value 64j + 4c + i in its low nibble, 64j + 32 + 4c + i in its
    high one (Q4_K's layout)."""
    g, s = q.shape[0], q.shape[2]
    q = q.reshape(g, GROUP, s, 4, 2, 8, 4)                    # chunk j, half, c, i
    nibbles = (q[:, :, :, :, 0] & 15) | ((q[:, :, :, :, 1] & 15) << 4)    # [g, r, s, 4, 8, 4]
    return lanes(nibbles.reshape(g, GROUP, s, 32, 4))


def _repack_iq4_xs_groups(blk: np.ndarray, lanes: Callable, per_row: Callable) -> np.ndarray:
    """IQ4_XS blocks [g, r, s, 136] -> [g, s, STEP_BYTES]: the codes as Q4_K's nibbles, the
    eight 6-bit scales less 32 as i8 (sub-block b: low four bits in nibble b % 2 of
    scales_l[b / 2], top two at bits 2b of scales_h), then d and 32 bytes of padding."""
    g, s = blk.shape[0], blk.shape[2]
    qs = blk[..., 8:136].reshape(g, GROUP, s, 8, 16)
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1).reshape(g, GROUP, s, 256)   # value 32b + l
    low = blk[..., 4:8]
    low = np.stack([low & 15, low >> 4], axis=-1).reshape(g, GROUP, s, 8)
    high = blk[..., 2:4].astype(np.uint16)
    high = (high[..., 0] | (high[..., 1] << 8))[..., None] >> (2 * np.arange(8, dtype=np.uint16))
    scales = ((low | ((high & 3) << 4).astype(np.uint8)).astype(np.int16) - 32).astype(np.int8).view(np.uint8)
    return _code_step(codes, scales, blk[..., 0:2], lanes, per_row)


def _code_step(codes: np.ndarray, scales: np.ndarray, d: np.ndarray, lanes: Callable, per_row: Callable) -> np.ndarray:
    """The steps of a type repacked as codes ([g, r, s, 256] codes, [g, r, s, 8] i8 scales as
    bytes, [g, r, s, 2] f16 d): the codes as Q4_K's nibbles, the scales, d, 32 bytes of padding."""
    g, s = codes.shape[0], codes.shape[2]
    d = moved(d.reshape(g, GROUP, s, 1, 2), np.uint16, (0, 2, 3, 1)).reshape(g, s, -1)
    return np.concatenate([_nibble_chunks(codes, lanes), per_row(scales), d, np.zeros((g, s, 32), np.uint8)],
                          axis=2)


def _repack_iq3_s_groups(blk: np.ndarray, lanes: Callable, per_row: Callable) -> np.ndarray:
    """IQ3_S blocks [g, r, s, 110] -> [g, s, STEP_BYTES]: value i's code k + 8 * sign (its grid
    entry 2k + 1, ggml's `signs` bit i), sub-block b's scale 1 + 2 * (nibble b % 2 of
    scales[b / 2]), laid out as IQ4_XS's (`_code_step`)."""
    g, s = blk.shape[0], blk.shape[2]
    b = np.ascontiguousarray(blk).reshape(-1, type_size(GGMLType.IQ3_S)).view(block_dtype(GGMLType.IQ3_S))[:, 0]
    n = len(b)
    high = np.unpackbits(b["qh"].reshape(n, -1), axis=1, bitorder="little").astype(np.uint16)
    # (2k + 1) >> 1 of each value; mode "clip" (indices are 9 bits) skips numpy's bounds checks: 8x faster
    k = np.take(_IQ3S_HALVES, b["qs"].reshape(n, -1) | (high << 8), mode="clip").view(np.uint8)
    codes = k | np.take(_IQ3S_SIGN_BITS, b["signs"].reshape(n, -1), mode="clip").view(np.uint8)
    sc = b["scales"].reshape(n, -1)
    scales = (1 + 2 * np.stack([sc & 15, sc >> 4], axis=2).reshape(n, 8)).astype(np.uint8)
    return _code_step(codes.reshape(g, GROUP, s, 256), scales.reshape(g, GROUP, s, 8),
                      blk[..., 0:2], lanes, per_row)


def _repack_iq3_xxs_groups(blk: np.ndarray, lanes: Callable, per_row: Callable) -> np.ndarray:
    """IQ3_XXS blocks [g, r, s, 98] -> [g, s, STEP_BYTES]: value i's code l + 8 * sign (its grid
    entry the l-th level, row qs[i / 4]; its sign from field i % 32 / 8 of word i / 32 of the
    words after the 64 indices, through ggml's ksigns_iq2xs), sub-block b's scale 1 + 2 * (bits
    28-31 of word b), laid out as IQ4_XS's (`_code_step`)."""
    g, s = blk.shape[0], blk.shape[2]
    b = np.ascontiguousarray(blk).reshape(-1, type_size(GGMLType.IQ3_XXS))
    n = len(b)
    levels = np.take(_IQ3XXS_ROW_LEVELS, b[:, 2:66], mode="clip").view(np.uint8)          # [n, 256]
    words = np.ascontiguousarray(b[:, 66:98]).view(np.uint32)                               # [n, 8]
    fields = (words[:, :, None] >> (7 * np.arange(4, dtype=np.uint32))) & 127                # [n, 8, 4]
    signs = np.take(_IQ3XXS_SIGN_BITS, fields, mode="clip").view(np.uint8).reshape(n, 256)
    scales = (1 + 2 * (words >> 28)).astype(np.uint8)
    return _code_step((levels | signs).reshape(g, GROUP, s, 256), scales.reshape(g, GROUP, s, 8),
                      blk[..., 0:2], lanes, per_row)


def _repack_crumb_groups(blk: np.ndarray, t: GGMLType, lanes: Callable, per_row: Callable) -> np.ndarray:
    """Q2_K and Q3_K blocks [g, r, s, block bytes] -> [g, s, STEP_BYTES] (layout above)."""
    g, s = blk.shape[0], blk.shape[2]
    at = block_dtype(t).fields["qs"][1]
    qs = blk[..., at:at + 64].reshape(g, GROUP, s, 2, 1, 32)   # half n, -, l
    crumbs = ((qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3).reshape(g, GROUP, s, 256)
    if t == GGMLType.Q2_K:
        d = moved(blk[..., 80:84].reshape(g, GROUP, s, 2, 2), np.uint16, (0, 2, 3, 1)).reshape(g, s, -1)
        return _crumb_step(t, crumbs, None, per_row(blk[..., 0:16]), d, lanes)
    return _crumb_step(t, crumbs, _bit_planes(blk[..., 0:32]), per_row(_q3_scales(blk[..., 96:108]).view(np.uint8)),
                       _padded_d(blk[..., 108:110]), lanes)


def _repack_iq2_groups(blk: np.ndarray, t: GGMLType, lanes: Callable, per_row: Callable) -> np.ndarray:
    """IQ2_XS or IQ2_S blocks [g, r, s, block bytes] -> [g, s, STEP_BYTES]: value i's code, its
    level in the low two bits and its sign in bit 2, the 16 scales 1 + 2 * (nibble b % 2 of
    scales[b / 2]), laid out as Q3_K's. IQ2_XS: word i / 8 of qs holds the grid row (bits 0-8)
    and the sign field (9-15); IQ2_S: byte i / 8 of qs the row's low 8 bits, bits 2 (i / 8 % 4)
    of qh[i / 32] its top two, byte 32 + i / 8 of qs the signs."""
    g, s = blk.shape[0], blk.shape[2]
    b = np.ascontiguousarray(blk).reshape(-1, type_size(t)).view(block_dtype(t))[:, 0]
    n = len(b)
    # mode "clip" (the indices are in range by their bits) skips numpy's bounds checks
    if t == GGMLType.IQ2_XS:
        qs = b["qs"].reshape(n, -1)
        codes = np.take(_IQ2XS_LEVELS, qs & 511, mode="clip") | np.take(_IQ2XS_SIGN_BITS, qs >> 9, mode="clip")
    else:
        qs = b["qs"].reshape(n, 64)
        top = (b["qh"].reshape(n, 8, 1) >> (2 * np.arange(4, dtype=np.uint8))) & 3       # [n, 8, 4]
        rows = qs[:, :32].astype(np.uint16) | (top.reshape(n, 32).astype(np.uint16) << 8)
        codes = np.take(_IQ2S_LEVELS, rows, mode="clip") | np.take(_IQ2S_SIGN_BITS, qs[:, 32:], mode="clip")
    codes = codes.view(np.uint8).reshape(g, GROUP, s, 256)
    sc = b["scales"].reshape(n, -1)
    scales = (1 + 2 * np.stack([sc & 15, sc >> 4], axis=2).reshape(n, 16)).astype(np.uint8)
    return _crumb_step(t, codes & 3, codes >> 2, per_row(scales.reshape(g, GROUP, s, 16)),
                       _padded_d(blk[..., 0:2]), lanes)


def _padded_d(d: np.ndarray) -> np.ndarray:
    """[g, r, s, 2] f16 bytes -> [g, s, 64]: the 16 rows' d, then 32 bytes of padding."""
    g, s = d.shape[0], d.shape[2]
    return np.concatenate([moved(d.reshape(g, GROUP, s, 1, 2), np.uint16, (0, 2, 3, 1)).reshape(g, s, -1),
                           np.zeros((g, s, 32), np.uint8)], axis=2)


def _crumb_step(t: GGMLType, crumbs: np.ndarray, third: np.ndarray | None, scales: np.ndarray, d: np.ndarray,
                lanes: Callable) -> np.ndarray:
    """The steps of a type laid out as Q2_K or Q3_K from its values in order ([g, r, s, 256]: the
    low two bits, and the third bits or None), its sub-blocks' scales ([g, s, 16 * 16], sub-block
    i's 16 rows at byte 16i) and the bytes after the chunks ([g, s, 64])."""
    g, s = crumbs.shape[0], crumbs.shape[2]
    q = crumbs.reshape(g, GROUP, s, 4, 4, 4, 4)                             # chunk j, e, c, i
    packed = q[..., 0, :, :] | (q[..., 1, :, :] << 2) | (q[..., 2, :, :] << 4) | (q[..., 3, :, :] << 6)
    chunks = [lanes(packed.reshape(g, GROUP, s, 16, 4)).reshape(g, s, 4, 4 * 64)]
    if third is not None:
        chunks.append(_bit_vectors(third, lanes))
    values = _stored_chunks(t, chunks + [scales.reshape(g, s, 4, 64)])   # 4 sub-blocks a chunk
    return np.concatenate([values, d], axis=2)


def _bit_vectors(bits: np.ndarray, lanes: Callable) -> np.ndarray:
    """One bit per value, in order ([g, r, s, 256]) -> [g, s, 4, 2 * 64]: chunk j's vector h,
    lane r, byte i, bit b = value 64j + 32h + 4b + i (Q3_K's third bits, Q5_K's fifth)."""
    g, s = bits.shape[0], bits.shape[2]
    # the 4 bytes of b (values 4b..4b + 3) as one word shifted by b: each byte's 0 or 1 moves
    # to bit b of its own byte (no carry), in any byte order
    words = np.ascontiguousarray(bits).reshape(g, GROUP, s, 4, 2, 8, 4).view(np.uint32)[..., 0]   # j, h, b
    hbytes = np.bitwise_or.reduce(words << np.arange(8, dtype=np.uint32), axis=-1).view(np.uint8)
    return lanes(hbytes.reshape(g, GROUP, s, 8, 4)).reshape(g, s, 4, 2 * 64)


def _bit_planes(planes: np.ndarray) -> np.ndarray:
    """32 bytes per block ([g, r, s, 32]) holding one bit per value, value 32b + l at bit b of
    byte l (Q3_K's hmask, Q5_K's qh) -> the bits in value order ([g, r, s, 256])."""
    g, s = planes.shape[0], planes.shape[2]
    return ((planes[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1).reshape(g, GROUP, s, 256)


def _fifth_bit_vectors(qh: np.ndarray, lanes: Callable) -> np.ndarray:
    """Q5_K's qh[32] per block as _bit_vectors."""
    return _bit_vectors(_bit_planes(qh), lanes)


def _q3_scales(packed: np.ndarray) -> np.ndarray:
    """Q3_K's 12 scale bytes -> the 16 scales as int8, less 32: scale i has its low nibble
    in byte i (i < 8) or the high one of byte i - 8, its top two bits at bits 2 (i // 4) of
    byte 8 + i % 4."""
    q = packed.astype(np.int16)
    low = np.concatenate([q[..., 0:8] & 15, q[..., 0:8] >> 4], axis=-1)
    top = (q[..., [8 + i % 4 for i in range(16)]] >> np.array([2 * (i // 4) for i in range(16)])) & 3
    return ((low | (top << 4)) - 32).astype(np.int8)


def _k4_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for the 8 sub-blocks: 12 bytes -> (scales, mins), 6 bits each."""
    q = packed.astype(np.uint8)
    sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)], axis=-1)
    mn = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], axis=-1)
    return sc, mn


def _q6_values(blk: np.ndarray) -> np.ndarray:
    """Q6_K blocks [..., 210] -> the 256 unsigned 6-bit values (q + 32) in order: value
    128n + 32k + l has the low (k < 2) or high nibble of ql[64n + 32(k % 2) + l] and bits
    2k..2k+1 of qh[32n + l]."""
    ql = blk[..., 0:128].reshape(blk.shape[:-1] + (2, 2, 32))      # n, k % 2, l
    qh = blk[..., 128:192].reshape(blk.shape[:-1] + (2, 1, 32))     # n, -, l
    out = np.empty(blk.shape[:-1] + (2, 4, 32), np.uint8)
    for kk in range(4):
        nib = ql[..., kk % 2, :] & 15 if kk < 2 else ql[..., kk % 2, :] >> 4
        out[..., kk, :] = nib | (((qh[..., 0, :] >> (2 * kk)) & 3) << 4)
    return out.reshape(blk.shape[:-1] + (256,))
