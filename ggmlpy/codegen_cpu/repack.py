"""The CPU backend's own layout for quantised weights (ggml's CPU "repack" buffers).

A GGUF row stores its blocks one after the other, so a dot product of one row with one
token needs a horizontal sum per block. Here 16 rows are interleaved, so that the 16 lanes
of one `vpdpbusd` are 16 weight rows and a token's 4 activation bytes are broadcast to all
of them: no horizontal sums, one conversion and multiply-add per block and 16 rows, and
one result vector per token. Each thread streams whole groups, one contiguous region.

The super-block types' layout (the K-quants, IQ4_XS and the codes of IQ3_S, IQ3_XXS, IQ2_XS,
IQ2_S) is defined in repack_superblocks.py.
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

Q1_0 (blocks of 128 sign bits and one d) keeps its bits as masks: 2 vectors of qs, vector h's
64-bit word c holding values 4c..4c+3 of block h (32 values) of the 16 rows, bit 4r + i for
value 4c + i of row r, so one word is the mask of one dot (kernels/qrepacked.py); then d,
laid out as the 32-block types' (the block's d for both halves of each of its two steps).

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
from ggmlpy.codegen_cpu.repack_superblocks import CODE_VALUES, GROUP, moved as _moved, repack_superblock_groups
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants import block_dtype

ALIGN = 64   # bytes; the repacked buffers start on a cache line


def _qs_bytes(t: GGMLType) -> int:
    return {GGMLType.Q8_0: 16 * 64, GGMLType.Q1_0: 2 * 64}.get(t, 8 * 64)


STEP_BYTES = {  # bytes per step of a group (16 rows x 64 values; K-quants: 256 values)
    GGMLType.Q4_0: 8 * 64 + 64,
    GGMLType.Q4_1: 8 * 64 + 2 * 64,
    GGMLType.Q5_0: 8 * 64 + 2 * 64 + 64,
    GGMLType.Q5_1: 8 * 64 + 2 * 64 + 2 * 64,
    GGMLType.Q8_0: 16 * 64 + 64,
    GGMLType.MXFP4: 8 * 64 + 64,
    GGMLType.IQ4_NL: 8 * 64 + 64,
    GGMLType.Q1_0: 2 * 64 + 64,
    GGMLType.Q2_K: 16 * 64 + 4 * 64 + 64,
    GGMLType.Q3_K: 24 * 64 + 4 * 64 + 64,
    GGMLType.Q4_K: 32 * 64 + 4 * 64 + 64,
    GGMLType.Q5_K: 40 * 64 + 4 * 64 + 64,
    GGMLType.Q6_K: 32 * 64 + 16 * 64 + 4 * 64 + 64,
    GGMLType.IQ4_XS: 32 * 64 + 2 * 64 + 64,
    GGMLType.IQ3_S: 32 * 64 + 2 * 64 + 64,   # as codes, laid out as IQ4_XS (repack_superblocks.py)
    GGMLType.IQ3_XXS: 32 * 64 + 2 * 64 + 64,  # the same
    GGMLType.IQ2_XS: 24 * 64 + 4 * 64 + 64,  # as codes, laid out as Q3_K
    GGMLType.IQ2_S: 24 * 64 + 4 * 64 + 64,   # the same
}
# the super-block types (one step: 256 values), the K-quants, IQ4_XS, and IQ3_S, IQ3_XXS, IQ2_XS
# and IQ2_S, whose codes sit where IQ4_XS's and Q3_K's values do
KQUANTS = (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_XS,
           GGMLType.IQ3_S, GGMLType.IQ3_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S)


def step_elems(t: GGMLType) -> int:
    return 256 if t in KQUANTS else 64


def unit_elems(t: GGMLType) -> int:
    """The values of a GGUF block a repacked row must come in whole: a super-block, Q1_0's
    block of 128, else a block of 32."""
    return 256 if t in KQUANTS else max(32, block_size(t))


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
    a supported type whose rows come in whole groups, not flagged FILE_LAYOUT. (The same
    answer for every graph, so a tensor has one repacked copy.)"""
    return (_own_layout_allowed(t) and isinstance(t.ne[1], int) and t.ne[1] % GROUP == 0
            and t.ne[2] == 1 and t.ne[3] == 1)


def experts_repacked(t: Tensor) -> bool:
    """Whether 3-D expert weights [K, M, n_expert] are kept repacked: every expert's matrix
    as a 2-D weight would be, one after the other (the stack repacked as one matrix of
    M * n_expert rows, groups never straddling two experts since M is whole groups)."""
    return (_own_layout_allowed(t) and all(isinstance(n, int) for n in t.ne) and t.ne[3] == 1
            and t.ne[1] % GROUP == 0)


def _own_layout_allowed(t: Tensor) -> bool:
    """A whole weight, not flagged FILE_LAYOUT, of a type with a repacked layout, its rows
    whole steps."""
    return (t.view_src is None and t.flags & (Flag.WEIGHT | Flag.FILE_LAYOUT) == Flag.WEIGHT
            and t.type in STEP_BYTES and isinstance(t.ne[0], int) and t.ne[0] % unit_elems(t.type) == 0)


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
    per_block = unit_elems(t)
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
        return repack_superblock_groups(rows, t, k)
    if t == GGMLType.Q1_0:
        return _q1_groups(rows, k)
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
    if t in KQUANTS or t not in STEP_BYTES or k % 32 or t == GGMLType.Q1_0:   # Q1_0: bit moves
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
    if t not in KQUANTS or t in CODE_VALUES or k % 256:   # the codes of IQ3_S, IQ3_XXS and IQ2: grid lookups
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


def _q1_groups(rows: np.ndarray, k: int, per: int = 16) -> np.ndarray:
    """Q1_0's layout (module docstring) of whole groups of rows, [g, steps, STEP_BYTES], `per`
    groups at a time (the bits unpacked to bytes take 8x the source's memory)."""
    g = rows.shape[0] // GROUP
    out = np.empty((g, k // 64, STEP_BYTES[GGMLType.Q1_0]), np.uint8)
    for g0 in range(0, g, per):
        out[g0:g0 + per] = _q1_some_groups(rows[g0 * GROUP:(g0 + per) * GROUP], k)
    return out


def _q1_some_groups(rows: np.ndarray, k: int) -> np.ndarray:
    """The sign bits regrouped so that word c of vector h holds values 32h + 4c .. + 3 of the
    16 rows, four bits a row, and each block's d repeated for its two steps' blocks."""
    g, s = rows.shape[0] // GROUP, k // 64
    blocks = rows.reshape(g, GROUP, k // 128, type_size(GGMLType.Q1_0))
    bits = np.unpackbits(blocks[..., 2:], axis=-1, bitorder="little")       # [g, r, block, 128]
    bits = bits.reshape(g, GROUP, s, 2, 8, 4).transpose(0, 2, 3, 4, 1, 5)    # [g, s, h, c, r, i]
    qs = np.packbits(bits.reshape(g, s, 2 * 8 * 64), axis=-1, bitorder="little")
    d = np.ascontiguousarray(blocks[..., :2]).view(np.uint16)[..., 0]        # [g, r, block]
    d = np.repeat(d, 4, axis=2).reshape(g, GROUP, s, 2).transpose(0, 2, 3, 1)  # [g, s, h, r]
    return np.concatenate([qs, np.ascontiguousarray(d).view(np.uint8).reshape(g, s, 64)], axis=2)


def _q5_planes(blocks: np.ndarray, at: int) -> np.ndarray:
    """The high-bit vectors of every step, [g, s, 2 * 64] (from `_blocks`' array, whose
    blocks hold their qh word at byte `at`)."""
    g, s = blocks.shape[0], blocks.shape[2]
    qh = np.ascontiguousarray(blocks[..., at:at + 4]).view(np.uint32)[..., 0]   # [g, r, s, h]
    words = _qh_planes(qh).view(np.uint32)[..., 0]                          # [g, r, s, h]
    return np.ascontiguousarray(words.transpose(0, 2, 3, 1)).view(np.uint8).reshape(g, s, -1)


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
