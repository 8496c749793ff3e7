"""The CPU backend's own layout for quantised weights (ggml's CPU "repack" buffers).

A GGUF row stores its blocks one after the other, so a dot product of one row with one
token needs a horizontal sum per block. Here 16 rows are interleaved, so that the 16 lanes
of one `vpdpbusd` are 16 weight rows and a token's 4 activation bytes are broadcast to all
of them: no horizontal sums, one conversion and multiply-add per block and 16 rows, and
one result vector per token. Each thread streams whole groups, one contiguous region.

The layout keeps the bits of the format (a group is as many bytes as its 16 rows in the
GGUF file), so decode stays a stream of the same bytes. A *step* is two 32-blocks (64
values) of the group's 16 rows, 64-byte aligned:

    qs   Q4_0/Q4_1/Q5_0/Q5_1/MXFP4/IQ4_NL: 8 vectors; vector 4h + c, lane r: bytes 4c..4c+3 of
         row r's block h (low nibbles: values 4c..4c+3; high nibbles: values 16+4c..16+4c+3;
         MXFP4's and IQ4_NL's nibbles are their codes, as stored).
         Q8_0: 16 vectors; vector 8h + c, lane r: values 4c..4c+3 of row r's block h, + 128.
    qh   Q5_0/Q5_1 only: 2 vectors; vector h, lane r: byte i holds bit 4 of value 4c+i in its bit
         c and of value 16+4c+i in its bit 4+c (c = 0..3), so one shift and mask fetch them.
    d    one vector: the scales of block h of row r as f16 at half-word 16h + r; MXFP4: its
         E8M0 exponent bytes e instead (no f16 holds 2^-128..2^127), at byte 16h + r, the
         vector's last 32 bytes zero (the kernels build the f32 scale: kernels/qcodes.py).
    m    Q4_1/Q5_1 only: the minimums, laid out as d.

Which of these a 32-block type has follows from its GGUF block's fields (`high_bits`,
`minimums`, `exponents`: a `qh` word, an `m` half, an `e` byte), so a type's facts are its
block layout (ggmlpy/quants/layouts.py) plus its STEP_BYTES entry.

Rows of K not a multiple of 64 get a last step whose second block is zero bytes (scale
zero; MXFP4: code 0, whose value is zero; IQ4_NL: code 0, met by the zero scale).
Weights are repacked once per model (`WeightLayouts`), from the memory map; the map's pages
of a repacked tensor are then released, so the weights are resident once. The numpy code
here defines the layout; for the 32-block types its byte moves run natively
(repack_native.py: a table derived from this code; Q8_0 4x faster than numpy's unaligned
word transposes, Q4_1's aligned ones about the same), and for the K-quants its bit moves
(repack_bits.py, the same idea per bit; 5-8x faster than numpy here: a 1.5B Q4_K_M
model's first decode 4 -> 1 s).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import mmap
from typing import Callable

import numpy as np

from ggmlpy.codegen_cpu import repack_bits, repack_native
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.ir.types import GGMLType, type_size
from ggmlpy.quants import block_dtype

GROUP = 16   # rows per group: one per dot lane
ALIGN = 64   # bytes; the repacked buffers start on a cache line


def _qs_bytes(t: GGMLType) -> int:
    return 16 * 64 if t == GGMLType.Q8_0 else 8 * 64


STEP_BYTES = {  # bytes per step of a group (16 rows x 64 values; K-quants: 256 values)
    GGMLType.Q4_0: 8 * 64 + 64,
    GGMLType.Q4_1: 8 * 64 + 2 * 64,
    GGMLType.Q5_0: 8 * 64 + 2 * 64 + 64,
    GGMLType.Q5_1: 8 * 64 + 2 * 64 + 2 * 64,
    GGMLType.Q8_0: 16 * 64 + 64,
    GGMLType.MXFP4: 8 * 64 + 64,
    GGMLType.IQ4_NL: 8 * 64 + 64,
    GGMLType.Q2_K: 16 * 64 + 4 * 64 + 64,
    GGMLType.Q3_K: 24 * 64 + 4 * 64 + 64,
    GGMLType.Q4_K: 32 * 64 + 4 * 64 + 64,
    GGMLType.Q5_K: 40 * 64 + 4 * 64 + 64,
    GGMLType.Q6_K: 32 * 64 + 16 * 64 + 4 * 64 + 64,
    GGMLType.IQ4_XS: 32 * 64 + 2 * 64 + 64,
}
# the super-block types (one step: 256 values), the K-quants and IQ4_XS, whose codes sit where
# Q4_K's nibbles do
KQUANTS = (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_XS)

# K-quant steps (one super-block of 256 values): four chunks of 64 values, each its value
# vectors and then the scales of its sub-blocks, then d. A step is so read as one ascending
# stream: with the scales after the four chunks the one-token products streamed from DRAM
# at (one thread / two) Q4_K 35-36 / 61-62 GB/s, Q5_K 22 / 39, Q6_K 16.4 / 32-34; with each
# chunk's scales after it, 37 / 67-68, 24 / 41, 18.8 / 34.5-35 (Q2_K and Q3_K about the same;
# `python bench/prefetch_ab.py --type T -k 2048 -m 4096 --tokens 1 --ahead 0 --chain-mb 128
# -t N`, the layouts taking turns). With its high bits in a region of their own, 2 KiB after
# the low nibbles, Q6_K had streamed at 10 GB/s on one thread. The header (d) stays after
# the values: put first, it made Q4_K 25% slower.
#
# A chunk: the low bits' vectors, then the high bits' vectors (per type: K_VECTORS).
#   Q4_K, Q5_K, Q6_K  8 vectors of nibbles: vector c, lane r, byte i: value 64j + 4c + i
#               (low nibble) and 64j + 32 + 4c + i (high nibble)
#   Q2_K, Q3_K  4 vectors of two-bit values: vector c, lane r, byte i, bits 2e..2e+1: value
#               64j + 16e + 4c + i
#   Q6_K        4 vectors of high bits: vector c, byte i: bits 2e..2e+1 (low nibble of vector
#               2c + e) and 4 + 2e.. (its high nibble); the chunk's vectors are stored in
#               the order the kernel first reads them (Q6_K_ORDER: low 0-3, high 0-1, low
#               4-7, high 2-3)
#   Q3_K        2 vectors of third bits: vector h, byte i, bit b: value 64j + 32h + 4b + i
#   Q5_K        2 vectors of fifth bits, laid out as Q3_K's third bits
# Then one vector of the chunk's sub-blocks' scales, 16 rows each (k_scale_offset,
# k_min_offset): Q4_K and Q5_K sc u8 of its two sub-blocks, then their mn u8; Q2_K the GGUF
# scale bytes of its four (scale in the low nibble, minimum in the high one); Q3_K sc i8 of
# its four (less its 32); Q6_K sc i8 of its four. IQ4_XS has no such vector: its sc[8][16]
# i8 (less 32) follow the four chunks. Then d[16] f16 (Q2_K, Q4_K, Q5_K: then dmin[16] f16;
# the others 32 bytes of padding).
K_VECTORS = {GGMLType.Q2_K: (4, 0), GGMLType.Q3_K: (4, 2), GGMLType.Q4_K: (8, 0), GGMLType.Q5_K: (8, 2),
             GGMLType.Q6_K: (8, 4), GGMLType.IQ4_XS: (8, 0)}
K_CHUNK = {t: 64 * (lo + hi) for t, (lo, hi) in K_VECTORS.items()}   # value bytes per chunk of 64 values
# the types whose chunks carry their own sub-blocks' scales (one vector after the values):
# every K-quant; IQ4_XS keeps its 128 bytes of scales after the four chunks
K_CHUNK_SCALES = (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
K_STRIDE = {t: chunk + (64 if t in K_CHUNK_SCALES else 0) for t, chunk in K_CHUNK.items()}   # bytes a chunk
K_D = {t: 4 * K_STRIDE[t] + (0 if t in K_CHUNK_SCALES else 128) for t in K_CHUNK}   # d[16] f16 after the scales
# stored q + offset, i8 scales; else u8 scales and minimums (IQ4_XS: its codes decode to
# kvalues + 128, kernels/qcodes.py)
K_OFFSET = {GGMLType.Q3_K: 4, GGMLType.Q6_K: 32, GGMLType.IQ4_XS: 128}
# Q6_K's chunk vectors in the order the kernel first reads them: low bits 0-3, their high
# bits, low bits 4-7, theirs (Q6_K_ORDER[i]: which of the low (0-7) and high (8-11) vectors
# is the chunk's i-th)
Q6_K_ORDER = (0, 1, 2, 3, 8, 9, 4, 5, 6, 7, 10, 11)
_Q6_K_SLOT = {v: i for i, v in enumerate(Q6_K_ORDER)}


def _subs_per_chunk(t: GGMLType) -> int:
    return 2 if t in (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.IQ4_XS) else 4


def k_scale_offset(t: GGMLType, g: int) -> int:
    """Sub-block g's scales for the 16 rows (16 bytes; Q2_K: the GGUF byte, scale and minimum)."""
    if t not in K_CHUNK_SCALES:
        return 4 * K_STRIDE[t] + 16 * g
    chunk, i = divmod(g, _subs_per_chunk(t))
    return K_STRIDE[t] * chunk + K_CHUNK[t] + 16 * i


def k_min_offset(t: GGMLType, g: int) -> int:
    """Sub-block g's minimums for the 16 rows (Q4_K, Q5_K: after the chunk's two scales)."""
    return k_scale_offset(t, g) + 32


def k_values_offset(t: GGMLType, j: int, c: int) -> int:
    """Vector c of chunk j's low bits (see above for what its bytes hold)."""
    return K_STRIDE[t] * j + 64 * (_Q6_K_SLOT[c] if t == GGMLType.Q6_K else c)


def k_high_offset(t: GGMLType, j: int, c: int) -> int:
    """Vector c of chunk j's high bits (Q6_K: c = 0..3, Q3_K and Q5_K: 0..1)."""
    v = K_VECTORS[t][0] + c
    return K_STRIDE[t] * j + 64 * (_Q6_K_SLOT[v] if t == GGMLType.Q6_K else v)


def q6_high_offset(j: int, c: int) -> int:
    """Vector c (0..3) of Q6_K chunk j's high bits (two bits for each of two low-nibble vectors)."""
    return k_high_offset(GGMLType.Q6_K, j, c)


def step_elems(t: GGMLType) -> int:
    return 256 if t in KQUANTS else 64


def field_at(t: GGMLType, name: str) -> int | None:
    """The byte of field `name` in a GGUF block of t (None: t has no such field)."""
    fields = block_dtype(t).fields
    return fields[name][1] if name in fields else None


def high_bits(t: GGMLType) -> bool:
    """Whether a 32-block type has a fifth bit per value (a qh word: Q5_0, Q5_1)."""
    return field_at(t, "qh") is not None


def minimums(t: GGMLType) -> bool:
    """Whether a 32-block type adds a minimum per block (an m half: Q4_1, Q5_1)."""
    return field_at(t, "m") is not None


def exponents(t: GGMLType) -> bool:
    """Whether a 32-block type's scale is an E8M0 exponent byte (an `e` byte: MXFP4), kept as
    bytes in the d vector, rather than an f16 d."""
    return field_at(t, "e") is not None


def qh_offset(t: GGMLType) -> int:
    """Byte offset of the qh vectors within a step (Q5_0, Q5_1)."""
    return _qs_bytes(t)


def d_offset(t: GGMLType) -> int:
    return _qs_bytes(t) + (2 * 64 if high_bits(t) else 0)


def m_offset(t: GGMLType) -> int:
    return d_offset(t) + 64


def is_repacked(t: Tensor) -> bool:
    """Whether the CPU backend keeps weight `t` in the repacked layout: a whole 2-D weight of
    a supported type whose rows come in whole groups. (The same answer for every graph, so
    a tensor has one repacked copy.)"""
    return (t.view_src is None and bool(t.flags & Flag.WEIGHT) and t.type in STEP_BYTES
            and isinstance(t.ne[0], int) and isinstance(t.ne[1], int)
            and t.ne[0] % (256 if t.type in KQUANTS else 32) == 0
            and t.ne[1] % GROUP == 0 and t.ne[2] == 1 and t.ne[3] == 1)


def experts_repacked(t: Tensor) -> bool:
    """Whether 3-D expert weights [K, M, n_expert] are kept repacked: every expert's matrix
    as a 2-D weight would be, one after the other (the stack repacked as one matrix of
    M * n_expert rows, groups never straddling two experts since M is whole groups)."""
    return (t.view_src is None and bool(t.flags & Flag.WEIGHT) and t.type in STEP_BYTES
            and all(isinstance(n, int) for n in t.ne) and t.ne[3] == 1
            and t.ne[0] % (256 if t.type in KQUANTS else 32) == 0 and t.ne[1] % GROUP == 0)


def repacked_rows(t: Tensor) -> int:
    """The rows of t's repacked layout: M, or M * n_expert for stacked experts."""
    return int(t.ne[1]) * int(t.ne[2])


# which sources of which ops a kernel reads repacked: matrix products (codegen_cpu/fusion.py
# adds the fused ones), get_rows' tables (kernels/qdequant.py reads the 32-block layouts)
# and the experts of mul_mat_id
REPACKED_OPERANDS: dict[str, tuple[int, ...]] = {
    "mul_mat": (0,), "mul_mat_add": (0,), "mul_mat_glu": (0, 1), "get_rows": (0,), "mul_mat_id": (0,),
    "mul_mat_id_glu": (0, 1),
}


def operand_repacked(node: Tensor, j: int) -> bool:
    """Whether source j of `node` is read in the repacked layout (a tied embedding, read by
    get_rows and the output product, is then resident once, repacked)."""
    if j not in REPACKED_OPERANDS.get(node.op, ()):
        return False
    if node.op in ("mul_mat_id", "mul_mat_id_glu"):
        return experts_repacked(node.src[j])
    if not is_repacked(node.src[j]):
        return False
    return node.op != "get_rows" or node.src[j].type not in KQUANTS


def repacked_nbytes(t: GGMLType, k: int, m: int) -> int:
    return (m // GROUP) * n_steps(t, k) * STEP_BYTES[t]


def n_steps(t: GGMLType, k: int) -> int:
    return -(-k // step_elems(t))


def _blocks(raw: np.ndarray, t: GGMLType, k: int, m: int) -> np.ndarray:
    """The rows' blocks as [groups, 16 rows, steps, 2 blocks, block bytes], an odd last
    block padded with a zero block."""
    bb = type_size(t)
    nb = k // 32
    rows = raw.reshape(m, nb * bb)
    if nb % 2:
        rows = np.concatenate([rows, np.zeros((m, bb), np.uint8)], axis=1)
    return rows.reshape(m // GROUP, GROUP, n_steps(t, k), 2, bb)


def _moved(x: np.ndarray, word: type, order: tuple[int, ...]) -> np.ndarray:
    """x's last axis (the bytes of one word) read as one `word`, the other axes put in
    `order`, back as contiguous bytes. numpy then moves whole words, not single bytes:
    repacking SmolLM2 or Gemma 3 runs 2 to 3 times faster than transposing bytes."""
    words = x.view(word)[..., 0]
    return np.ascontiguousarray(words.transpose(order)).view(np.uint8)


def _lanes(x: np.ndarray) -> np.ndarray:
    """[g, r, s, h, c, 4 bytes] -> [g, s, h, c, r * 4]: lane r of vector (h, c)."""
    return _moved(x, np.uint32, (0, 2, 3, 4, 1))


def _scales(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of every block, as [g, s, h * 16 + r] bytes (one vector)."""
    f = blocks[..., at:at + 2]                      # [g, r, s, h, 2]
    return _moved(f, np.uint16, (0, 2, 3, 1)).reshape(f.shape[0], f.shape[2], 64)



def _exponents(blocks: np.ndarray, at: int) -> np.ndarray:
    """The byte at `at` of every block (MXFP4's e), as [g, s, 64]: byte 16h + r, then zeros."""
    e = blocks[..., at]                                         # [g, r, s, h]
    g, s = e.shape[0], e.shape[2]
    out = np.zeros((g, s, 64), np.uint8)
    out[..., :32] = e.transpose(0, 2, 3, 1).reshape(g, s, 32)
    return out


def _word_aligned(blocks: np.ndarray, at: int) -> tuple[np.ndarray, int]:
    """The blocks copied with leading padding so that byte `at` of each lands on a 4-byte
    boundary: (padded blocks, the new offset). One contiguous run per block to copy."""
    pad = -at % 4
    bb = blocks.shape[-1]
    out = np.empty(blocks.shape[:-1] + (-(-(bb + pad) // 4) * 4,), np.uint8)
    out[..., pad:pad + bb] = blocks
    return out, at + pad


def _qh_planes(qh: np.ndarray) -> np.ndarray:
    """Q5_0's 32 high bits per block (uint32 [...]) -> 4 bytes: byte i, bit c = bit 4c+i;
    bit 4+c = bit 16+4c+i. Byte j of qh holds bits 8j..8j+7, so it gives every byte i two
    bits (c = 2j and 2j+1 of the low nibble for j < 2, of the high one for j >= 2): one
    lookup per qh byte of all four output bytes' share (`_PLANE_BITS`), or-ed together."""
    qb = qh[..., None].view(np.uint8)                                  # [..., 4] little-endian
    out = _PLANE_BITS[0][qb[..., 0]]
    for j in range(1, 4):
        out |= _PLANE_BITS[j][qb[..., j]]
    return out.view(np.uint8).reshape(qh.shape + (4,))


def _plane_bits() -> np.ndarray:
    """[qh byte j, its value] -> uint32 whose byte i holds that byte's bits for output byte
    i: bits i and 4 + i of byte j (qh bits 8j + i, 8j + 4 + i, that is 4c + i for c = 2j,
    2j + 1, or 16 + 4c + i for c = 2j - 4, 2j - 3) at bits c of byte i (c + 4 for j >= 2)."""
    table = np.zeros((4, 256), np.uint32)
    value = np.arange(256, dtype=np.uint32)
    for j in range(4):
        for i in range(4):
            for half in range(2):                 # bit i + 4 * half of byte j
                c = 2 * (j % 2) + half            # its position in the nibble
                shift = c + (4 if j >= 2 else 0) + 8 * i
                table[j] |= ((value >> (i + 4 * half)) & 1) << shift
    return table


_PLANE_BITS = _plane_bits()


def repack(raw: np.ndarray, t: GGMLType, k: int, m: int,
           done: Callable[[np.ndarray], None] | None = None, native: bool = True) -> np.ndarray:
    """GGUF bytes of an m x k weight -> the repacked layout (uint8, 64-byte aligned). Done
    a slice of rows at a time, so the temporaries stay small next to the weight; `done` is
    told each slice of the source once it has been read (to release its pages)."""
    out, jobs = repack_jobs(raw, t, k, m, done, native)
    for job in jobs:
        job()
    return out


def repack_jobs(raw: np.ndarray, t: GGMLType, k: int, m: int,
                done: Callable[[np.ndarray], None] | None = None,
                native: bool = True) -> tuple[np.ndarray, list[Callable[[], None]]]:
    """`repack`'s output array, still empty, and the jobs that fill it: one per slice of
    about 4 MiB of groups, independent of each other, so that threads can share one large
    tensor (Gemma 3's 178 MB tied embedding was a third of its warm start on one thread).
    `native`: the byte moves by repack_native's loop where the type allows, the K-quants'
    bit moves by repack_bits' (the same bytes as numpy's, which `native=False` keeps for
    the tests' comparison)."""
    if t not in STEP_BYTES:
        raise ValueError(f"no repacked layout for {t.name}")
    per_block = 256 if t in KQUANTS else 32
    if k % per_block or m % GROUP:
        raise ValueError(f"a {t.name} weight of {m} x {k} does not come in whole groups of {GROUP} rows")
    row_bytes = k // per_block * type_size(t)
    rows = np.ascontiguousarray(raw).reshape(-1)
    if rows.nbytes != m * row_bytes:
        raise ValueError(f"a {t.name} weight of {m} x {k} needs {m * row_bytes} bytes, got {rows.nbytes}")
    rows = rows.reshape(m, row_bytes)
    out = aligned_empty(repacked_nbytes(t, k, m))
    group_bytes = repacked_nbytes(t, k, GROUP)
    per_slice = max(1, (4 << 20) // group_bytes)  # groups per slice: about 4 MiB

    bit_table = kquant_table(t, k) if native and t in KQUANTS else None
    table = native_table(t, k) if native else None
    computed = _computed(t, table.unit) if table is not None else []

    def fill(g0: int, g1: int) -> None:
        src, dst = rows[g0 * GROUP:g1 * GROUP], out[g0 * group_bytes:g1 * group_bytes]
        if bit_table is not None:
            repack_bits.apply(bit_table, src, dst)
        elif table is None:
            dst[:] = _repack_groups(src, t, k).reshape(-1)
        else:
            repack_native.apply(table, src, dst)
            steps = dst.reshape(g1 - g0, -1, STEP_BYTES[t])
            for lo, hi, compute in computed:
                steps[:, :, lo:hi] = compute(_blocks(src, t, k, src.shape[0]))
        if done is not None:
            done(src)

    n_groups = m // GROUP
    jobs = [functools.partial(fill, g0, min(g0 + per_slice, n_groups)) for g0 in range(0, n_groups, per_slice)]
    return out, jobs


def _repack_groups(rows: np.ndarray, t: GGMLType, k: int) -> np.ndarray:
    if t in KQUANTS:
        return _repack_kquant_groups(rows, t, k)
    blocks = _blocks(rows, t, k, rows.shape[0])
    g, s = blocks.shape[0], blocks.shape[2]
    parts: list[np.ndarray] = []
    qs_at, n_qs = field_at(t, "qs"), block_dtype(t).fields["qs"][0].itemsize
    quants = blocks
    if qs_at % 4:  # quants off 4-byte alignment: numpy's unaligned word copies are slow
        quants, qs_at = _word_aligned(blocks, qs_at)
    q = quants[..., qs_at:qs_at + n_qs].reshape(g, GROUP, s, 2, n_qs // 4, 4)
    lanes = _lanes(q)
    if t == GGMLType.Q8_0:
        lanes ^= np.uint8(0x80)
    parts.append(lanes.reshape(g, s, -1))
    if high_bits(t):
        parts.append(_q5_planes(blocks, field_at(t, "qh")))
    parts.append(_exponents(blocks, field_at(t, "e")) if exponents(t) else _scales(blocks, field_at(t, "d")))
    if minimums(t):
        parts.append(_scales(blocks, field_at(t, "m")))
    return np.concatenate(parts, axis=2)


@functools.lru_cache(maxsize=None)
def native_table(t: GGMLType, k: int) -> repack_native.GroupTable | None:
    """repack_native's table for groups of (t, K) rows: whole words where the scales are
    left to numpy (the quants' lanes are 4 source bytes each: twice the bytes a step of the
    loop), else half-words; either way Q5_0's and Q5_1's high-bit vectors are numpy's. None for the
    K-quants (bit fields: `kquant_table`)."""
    if t in KQUANTS or t not in STEP_BYTES or k % 32:
        return None
    row_bytes = k // 32 * type_size(t)
    for unit in (4, 2):
        table = repack_native.derive_table(
            lambda rows: _repack_groups(rows.reshape(GROUP, row_bytes), t, k).reshape(-1),
            GROUP * row_bytes, STEP_BYTES[t], [(lo, hi) for lo, hi, _ in _computed(t, unit)], unit)
        if table is not None:
            return table
    return None


@functools.lru_cache(maxsize=None)
def kquant_table(t: GGMLType, k: int) -> repack_bits.BitTable | None:
    """repack_bits' table for groups of (t, K) rows of a K-quant (None where the layout
    is not bit moves, or t no K-quant): the bit sources of one step (a super-block of 16
    rows) and its table, widened to K's steps, then checked against the layout at K."""
    if t not in KQUANTS or k % 256:
        return None
    bb, n = type_size(t), k // 256
    sources, constant = repack_bits.bit_sources(
        lambda rows: _repack_groups(rows.reshape(GROUP, bb), t, 256).reshape(-1), GROUP * bb)
    step = repack_bits.make_table(sources, constant, GROUP * bb)
    table = repack_bits.widen(step, n, GROUP) if step is not None else None
    if table is None and step is not None:   # a term across two blocks: widen the bits instead
        table = repack_bits.make_table(widen_sources(sources, n, bb), np.tile(constant, n), GROUP * n * bb)
    layout = lambda rows: _repack_groups(rows.reshape(GROUP, n * bb), t, k).reshape(-1)  # noqa: E731
    return table if table is not None and repack_bits.reproduces(table, layout) else None


def widen_sources(sources: np.ndarray, n: int, bb: int) -> np.ndarray:
    """One step's bit sources (16 rows of one block of bb bytes) for rows of n blocks: the
    same bits of block s of each row, for step s."""
    byte, bit = sources // 8, sources % 8
    row, at = byte // bb, byte % bb
    steps = np.arange(n, dtype=np.int64)[:, None]
    return np.where(sources >= 0, 8 * (row * (n * bb) + steps * bb + at) + bit, -1).reshape(-1)


def _computed(t: GGMLType, unit: int) -> list[tuple[int, int, Callable[[np.ndarray], np.ndarray]]]:
    """The byte ranges of every step that a table of `unit`-byte moves leaves to numpy,
    with what computes them from `_blocks`' array ([g, s, hi - lo]): the high-bit
    vectors (Q5_0, Q5_1), MXFP4's exponent bytes, and for word moves the f16 scales (16
    rows' halves side by side, no word of which comes from one place)."""
    out = []
    if high_bits(t):
        at = field_at(t, "qh")
        out.append((qh_offset(t), qh_offset(t) + 2 * 64, lambda blocks: _q5_planes(blocks, at)))
    if exponents(t):   # single bytes of 16 rows side by side: no move of a half-word or word
        at_e = field_at(t, "e")
        out.append((d_offset(t), d_offset(t) + 64, lambda blocks: _exponents(blocks, at_e)))
    elif unit == 4:
        out.append((d_offset(t), d_offset(t) + 64, lambda blocks: _scales(blocks, 0)))
        if minimums(t):
            at_m = field_at(t, "m")
            out.append((m_offset(t), m_offset(t) + 64, lambda blocks: _scales(blocks, at_m)))
    return out


def _q5_planes(blocks: np.ndarray, at: int) -> np.ndarray:
    """The high-bit vectors of every step, [g, s, 2 * 64] (from `_blocks`' array, whose
    blocks hold their qh word at byte `at`)."""
    g, s = blocks.shape[0], blocks.shape[2]
    qh = np.ascontiguousarray(blocks[..., at:at + 4]).view(np.uint32)[..., 0]   # [g, r, s, h]
    words = _qh_planes(qh).view(np.uint32)[..., 0]                          # [g, r, s, h]
    return np.ascontiguousarray(words.transpose(0, 2, 3, 1)).view(np.uint8).reshape(g, s, -1)


def _repack_kquant_groups(rows: np.ndarray, t: GGMLType, k: int) -> np.ndarray:
    """[groups, steps, STEP_BYTES] for K-quant rows (one step = one super-block)."""
    m = rows.shape[0]
    g, s = m // GROUP, k // 256
    blk = rows.reshape(g, GROUP, s, type_size(t))          # [g, r, s, block bytes]

    def lanes(x: np.ndarray) -> np.ndarray:
        """[g, r, s, V, 4] -> [g, s, V * 64]: lane r of each of the V vectors."""
        return _moved(x, np.uint32, (0, 2, 3, 1)).reshape(g, s, -1)

    def per_row(x: np.ndarray) -> np.ndarray:
        """[g, r, s, n] bytes -> [g, s, n * 16]: byte 16i + r."""
        return x.transpose(0, 2, 3, 1).reshape(g, s, -1)

    if t in (GGMLType.Q2_K, GGMLType.Q3_K):
        return _repack_crumb_groups(blk, t, lanes, per_row)
    if t == GGMLType.IQ4_XS:
        return _repack_iq4_xs_groups(blk, lanes, per_row)
    if t in (GGMLType.Q4_K, GGMLType.Q5_K):
        at = field_at(t, "qs")
        qs = blk[..., at:at + 128].reshape(g, GROUP, s, 32, 4)   # vector 8j + c = bytes 32j + 4c..
        sc, mn = _k4_scales(blk[..., 4:16])
        d = blk[..., 0:4].reshape(g, GROUP, s, 2, 2)        # d, dmin: 16 f16 each
        halves = _moved(d, np.uint16, (0, 2, 3, 1)).reshape(g, s, -1)
        values = lanes(qs)
        if t == GGMLType.Q5_K:   # the fifth bits as Q3_K's third bits, after each chunk's nibbles
            values = np.concatenate([values.reshape(g, s, 4, 8 * 64),
                                     _fifth_bit_vectors(blk[..., 16:48], lanes)], axis=3).reshape(g, s, -1)
        chunks = np.concatenate([values.reshape(g, s, 4, -1), per_row(sc).reshape(g, s, 4, 32),
                                 per_row(mn).reshape(g, s, 4, 32)], axis=3)   # each chunk's two sub-blocks
        return np.concatenate([chunks.reshape(g, s, -1), halves], axis=2)
    q = _q6_values(blk)                                       # [g, r, s, 256] in 0..63
    q = q.reshape(g, GROUP, s, 4, 2, 8, 4)                    # chunk j, half, c, i
    ql = (q[:, :, :, :, 0] & 15) | ((q[:, :, :, :, 1] & 15) << 4)           # [g,r,s,4,8,4]
    hi = (q >> 4).reshape(g, GROUP, s, 4, 2, 4, 2, 4)         # j, half, c', e, i
    qh = (hi[..., 0, :, 0, :] | (hi[..., 0, :, 1, :] << 2)
          | (hi[..., 1, :, 0, :] << 4) | (hi[..., 1, :, 1, :] << 6))         # [g,r,s,4,4,4]
    d = _moved(blk[..., 208:210].reshape(g, GROUP, s, 1, 2), np.uint16, (0, 2, 3, 1)).reshape(g, s, -1)
    chunks = np.concatenate([lanes(ql.reshape(g, GROUP, s, 32, 4)).reshape(g, s, 4, 8, 64),
                             lanes(qh.reshape(g, GROUP, s, 16, 4)).reshape(g, s, 4, 4, 64)], axis=3)
    chunks = chunks[:, :, :, list(Q6_K_ORDER)].reshape(g, s, 4, 12 * 64)
    scales = per_row(blk[..., 192:208]).reshape(g, s, 4, 64)     # sub-blocks 4j..4j + 3
    return np.concatenate([np.concatenate([chunks, scales], axis=3).reshape(g, s, -1), d,
                           np.zeros((g, s, 32), np.uint8)], axis=2)


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
    d = _moved(blk[..., 0:2].reshape(g, GROUP, s, 1, 2), np.uint16, (0, 2, 3, 1)).reshape(g, s, -1)
    return np.concatenate([_nibble_chunks(codes, lanes), per_row(scales), d, np.zeros((g, s, 32), np.uint8)],
                          axis=2)


def _repack_crumb_groups(blk: np.ndarray, t: GGMLType, lanes: Callable, per_row: Callable) -> np.ndarray:
    """Q2_K and Q3_K blocks [g, r, s, block bytes] -> [g, s, STEP_BYTES] (layout above)."""
    g, s = blk.shape[0], blk.shape[2]
    qs = blk[..., field_at(t, "qs"):field_at(t, "qs") + 64].reshape(g, GROUP, s, 2, 1, 32)   # half n, -, l
    crumbs = (qs >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3        # [g, r, s, n, s', l]
    q = crumbs.reshape(g, GROUP, s, 4, 4, 4, 4)                             # chunk j, e, c, i
    packed = q[..., 0, :, :] | (q[..., 1, :, :] << 2) | (q[..., 2, :, :] << 4) | (q[..., 3, :, :] << 6)
    chunks = [lanes(packed.reshape(g, GROUP, s, 16, 4)).reshape(g, s, 4, 4 * 64)]
    if t == GGMLType.Q2_K:
        scales = per_row(blk[..., 0:16])
        d = _moved(blk[..., 80:84].reshape(g, GROUP, s, 2, 2), np.uint16, (0, 2, 3, 1)).reshape(g, s, -1)
    else:
        hm = blk[..., 0:32].reshape(g, GROUP, s, 1, 1, 32)
        bits = (hm >> np.arange(8, dtype=np.uint8)[:, None]).reshape(g, GROUP, s, 2, 4, 32) & 1  # n, s', l
        hb = bits.reshape(g, GROUP, s, 4, 2, 8, 4)                          # chunk j, h, b, i
        hbytes = sum(hb[..., b, :] << b for b in range(8)).astype(np.uint8)   # [g, r, s, j, h, i]
        chunks.append(lanes(hbytes.reshape(g, GROUP, s, 8, 4)).reshape(g, s, 4, 2 * 64))
        scales = per_row(_q3_scales(blk[..., 96:108]).view(np.uint8))
        d = np.concatenate([_moved(blk[..., 108:110].reshape(g, GROUP, s, 1, 2), np.uint16, (0, 2, 3, 1))
                            .reshape(g, s, -1), np.zeros((g, s, 32), np.uint8)], axis=2)
    values = np.concatenate(chunks + [scales.reshape(g, s, 4, 64)], axis=3).reshape(g, s, -1)   # 4 sub-blocks a chunk
    return np.concatenate([values, d], axis=2)


def _fifth_bit_vectors(qh: np.ndarray, lanes: Callable) -> np.ndarray:
    """Q5_K's qh[32] per block ([g, r, s, 32]; value 64j + 32h + l has bit 2j + h of byte l)
    -> [g, s, 4, 2 * 64]: chunk j's vector h, lane r, byte i, bit b = value 64j + 32h + 4b + i."""
    g, s = qh.shape[0], qh.shape[2]
    bits = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1    # [g, r, s, 2j + h, l]
    hb = bits.reshape(g, GROUP, s, 4, 2, 8, 4)                                # j, h, b, i
    hbytes = sum(hb[..., b, :] << b for b in range(8)).astype(np.uint8)       # [g, r, s, j, h, i]
    return lanes(hbytes.reshape(g, GROUP, s, 8, 4)).reshape(g, s, 4, 2 * 64)


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


def aligned_empty(nbytes: int) -> np.ndarray:
    buf = np.empty(nbytes + ALIGN, np.uint8)
    skip = -buf.ctypes.data % ALIGN
    return buf[skip:skip + nbytes]


def release_pages(data: np.ndarray) -> None:
    """Tell the kernel the pages wholly inside `data` are not needed now (MADV_DONTNEED).
    For a read-only file mapping this only drops them from memory: touched again, they are
    read back from the file. Anything else (an anonymous array or map) is left alone."""
    if not from_mmap(data):
        return
    start, end = pages_inside(data)
    if end > start:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 4)  # MADV_DONTNEED
        # later reads (get_rows of a tied embedding) fetch single rows: MADV_RANDOM keeps a
        # cold read from pulling its neighbours in from disk (readahead); the pages a warm
        # read maps around it (fault-around) are unmapped after each run (mapped_rows.py)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), 1)  # MADV_RANDOM


def pages_inside(data: np.ndarray) -> tuple[int, int]:
    """The addresses of the whole pages inside data: a neighbour's pages are left alone."""
    page = mmap.PAGESIZE
    return -(-data.ctypes.data // page) * page, (data.ctypes.data + data.nbytes) // page * page


def from_mmap(data: np.ndarray) -> bool:
    """Whether data's memory belongs to a read-only memory map (ndarray bases, memoryviews):
    a file mapped for reading, whose pages MADV_DONTNEED only unmaps (an anonymous map is
    always writable, and there it would zero them)."""
    base = data
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return isinstance(base, mmap.mmap) and memoryview(base).readonly


class WeightLayouts:
    """Repacked copies of a model's weights, made on first use and shared by every context
    (and CPU backend) of the model, as ggml's repack buffers are made once at load."""

    def __init__(self, release: bool = True) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.release = release

    def get(self, t: Tensor, data: np.ndarray) -> np.ndarray:
        """The repacked copy of weight t (whose GGUF bytes are `data`), made on first use;
        the source's pages are released slice by slice as they are read, so a large tensor
        (a 178 MB tied embedding) is never resident twice."""
        out = self.arrays.get(t.name)
        if out is None:
            out = self.arrays[t.name] = self._repacked(t, data)
        return out

    def _repacked(self, t: Tensor, data: np.ndarray) -> np.ndarray:
        return repack(data, t.type, t.ne[0], repacked_rows(t), release_pages if self.release else None)

    def prepare(self, pending: list[tuple[Tensor, np.ndarray]], n_threads: int) -> None:
        """Repack every weight of `pending` not yet done, on up to n_threads threads at once,
        slice by slice (`repack_jobs`), so one large tensor is shared too: numpy and the
        native loop let go of the GIL while they move the bytes, so a first decode (the warm
        start's largest part) repacks about twice as fast on two cores. The results are the
        same as `get`'s. (Starting this in the background as soon as a graph was compiled
        was measured and dropped: it slowed the context's compile by more than it saved.)"""
        todo = {t.name: (t, data) for t, data in pending if t.name not in self.arrays}
        if n_threads < 2 or not todo:
            for t, data in todo.values():
                self.get(t, data)
            return
        release = release_pages if self.release else None
        outs, jobs = {}, []
        for name, (t, data) in todo.items():
            outs[name], filling = repack_jobs(data, t.type, t.ne[0], repacked_rows(t), release)
            jobs += filling
        with concurrent.futures.ThreadPoolExecutor(n_threads, thread_name_prefix="ggmlpy-repack") as pool:
            for job in [pool.submit(job) for job in jobs]:
                job.result()
        self.arrays.update(outs)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())
