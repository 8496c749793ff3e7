"""The K-quants' repacked layout as bit moves, run by native code.

repack.py defines the K-quant layout in numpy, slowly: a 1.5B Q4_K_M model's first decode
spent 4 s repacking. Unlike the 32-block types (repack_native.py), a K-quant's bytes are
not moves of whole source bytes: Q6_K joins two source nibbles in one byte, Q2_K and Q3_K
spread two-bit and one-bit fields, Q4_K's scales are 6-bit fields and Q3_K's are less 32.
But every output *bit* is one input bit, or a constant, or one input bit inverted (Q3_K's
scales less 32 flip bit 5 and copy its inverse to the sign bits), so the whole layout is
a table: per output word, a few *terms* `rotl(32 source bits at byte o, r) & mask`,
xor-ed together and with the word's constant. The terms of a quants' vector are whole
words (4 source bytes shifted alike), so most words have one to four.

The table is derived from numpy's own layout function run on probe inputs whose bits
hold their bit positions, and checked against it on arbitrary rows: numpy stays the one
definition. A small LLVM loop (compiled once into the disk cache) applies it to every
group outside the GIL.
"""
from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

log = logging.getLogger("ggmlpy.codegen_cpu")

_BITS_IR = r"""
define void @ggmlpy_repack_bits(ptr %dst, ptr %src, ptr %init, ptr %terms, i64 %n_terms,
                                i64 %n_groups, i64 %src_stride, i64 %dst_stride) {
entry:
  %none = icmp sle i64 %n_groups, 0
  %empty = icmp sle i64 %n_terms, 0
  %skip = or i1 %none, %empty
  br i1 %skip, label %exit, label %group
group:
  %g = phi i64 [0, %entry], [%g1, %group_end]
  %so = mul i64 %g, %src_stride
  %s = getelementptr i8, ptr %src, i64 %so
  %do = mul i64 %g, %dst_stride
  %d = getelementptr i8, ptr %dst, i64 %do
  br label %term
term:
  %j = phi i64 [0, %group], [%j1, %term]
  %tp = getelementptr [4 x i32], ptr %terms, i64 %j
  %w = load i32, ptr %tp, align 4
  %op = getelementptr i32, ptr %tp, i64 1
  %o = load i32, ptr %op, align 4
  %rp = getelementptr i32, ptr %tp, i64 2
  %rf = load i32, ptr %rp, align 4
  %mp = getelementptr i32, ptr %tp, i64 3
  %m = load i32, ptr %mp, align 4
  %o64 = zext i32 %o to i64
  %sp = getelementptr i8, ptr %s, i64 %o64
  %v = load i32, ptr %sp, align 1
  %rv = call i32 @llvm.fshl.i32(i32 %v, i32 %v, i32 %rf)
  %bits = and i32 %rv, %m
  %w64 = zext i32 %w to i64
  %dp = getelementptr i32, ptr %d, i64 %w64
  %ip = getelementptr i32, ptr %init, i64 %w64
  %firstbit = and i32 %rf, 256
  %first = icmp ne i32 %firstbit, 0
  %basep = select i1 %first, ptr %ip, ptr %dp
  %cur = load i32, ptr %basep, align 4
  %new = xor i32 %cur, %bits
  store i32 %new, ptr %dp, align 4
  %j1 = add i64 %j, 1
  %more = icmp slt i64 %j1, %n_terms
  br i1 %more, label %term, label %group_end
group_end:
  %g1 = add i64 %g, 1
  %again = icmp slt i64 %g1, %n_groups
  br i1 %again, label %group, label %exit
exit:
  ret void
}
declare i32 @llvm.fshl.i32(i32, i32, i32)
"""

_BITS = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)

FIRST = 256   # flag in a term's rotation field: the word's first term (starts from its constant)


@dataclass(frozen=True)
class BitTable:
    """One group's output words from its 16 rows: word w = init[w] ^ the xor of its terms
    (w, o, r | FIRST on the word's first, mask): rotl(the 4 source bytes at o, r) & mask.
    Every word has a first term (a mask of 0 where it is all constant)."""
    terms: np.ndarray      # int32 [n_terms, 4], sorted by word
    init: np.ndarray       # uint32 [out_bytes // 4]: the constant bits
    in_bytes: int
    out_bytes: int


def bit_sources(layout: Callable[[np.ndarray], np.ndarray], in_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per output bit of `layout` (input bytes -> output bytes), the input bit it copies
    (-1: a constant), and the output of all-zero input. Read from probes whose input bit
    P is set where bit k of P + 1 is; only meaningful where the layout is such a copy (or
    its inverse): check the table made from it."""
    constant = layout(np.zeros(in_bytes, np.uint8))
    n_bits = 8 * in_bytes
    label = np.arange(1, n_bits + 1, dtype=np.int64)
    position = np.zeros(8 * constant.size, np.int64)
    for k in range(int(n_bits).bit_length()):
        probe = np.packbits(((label >> k) & 1).astype(np.uint8), bitorder="little")
        position |= np.unpackbits(layout(probe) ^ constant, bitorder="little").astype(np.int64) << k
    return position - 1, constant


def make_table(sources: np.ndarray, constant: np.ndarray, in_bytes: int) -> BitTable | None:
    """The terms that copy output bit q from input bit sources[q] (as `bit_sources` gives,
    perhaps widened to more steps), or None when that is not a table of whole words."""
    if constant.size % 4 or in_bytes < 4 or sources.max(initial=-1) >= 8 * in_bytes:
        return None
    n_words = constant.size // 4
    q = np.flatnonzero(sources >= 0)
    src = sources[q]
    w, b = q // 32, q % 32
    # load the 4 bytes that put the source byte in the output bit's byte (clamped in the rows)
    o = np.clip(src // 8 - b // 8, 0, in_bytes - 4)
    r = (b - (src - 8 * o)) % 32
    key = (w * in_bytes + o) * 32 + r
    order = np.argsort(key, kind="stable")
    keys, start = np.unique(key[order], return_index=True)
    masks = np.bitwise_or.reduceat((np.uint32(1) << b[order].astype(np.uint32)), start) if keys.size else \
        np.zeros(0, np.uint32)
    words = keys // (32 * in_bytes)
    # words without a source bit: one term of mask 0 (their constant only)
    bare = np.setdiff1d(np.arange(n_words), words)
    words = np.concatenate([words, bare])
    terms = np.stack([words, np.concatenate([keys // 32 % in_bytes, np.zeros(bare.size, np.int64)]),
                      np.concatenate([keys % 32, np.zeros(bare.size, np.int64)]),
                      np.concatenate([masks.astype(np.int64), np.zeros(bare.size, np.int64)])], axis=1)
    terms = terms[np.argsort(words, kind="stable")]
    first = np.ones(terms.shape[0], bool)
    first[1:] = terms[1:, 0] != terms[:-1, 0]
    terms[first, 2] |= FIRST
    return BitTable(terms.astype(np.uint32).view(np.int32), constant.view(np.uint32).copy(),
                    in_bytes, constant.size)


def widen(table: BitTable, n: int, rows: int) -> BitTable | None:
    """A step's table (`rows` rows of one block each) for rows of n blocks, whose steps
    follow one another: each term reads the same bytes of block s of its row in step s.
    None where a term reads bits of two blocks (the table of the wide sources then)."""
    bb = table.in_bytes // rows
    terms = table.terms.view(np.uint32).astype(np.int64)
    w, o, rf, mask = terms.T
    bit = np.arange(32)
    used = ((mask[:, None] >> bit) & 1).astype(bool)                  # [terms, output bit]
    src_byte = o[:, None] + (bit - (rf[:, None] & 31)) % 32 // 8       # the source byte of each
    block = np.where(used, src_byte // bb, -1)
    lo = np.where(used, block, 1 << 40).min(axis=1)
    if np.any((block.max(axis=1) != lo) & (mask != 0)):
        return None
    row = np.where(mask != 0, lo, 0)
    # the term's first byte, moved with its block (its offset into the block may be negative)
    o_wide = row * (n * bb) + (o - row * bb)
    words = table.out_bytes // 4
    steps = np.arange(n, dtype=np.int64)[:, None]
    wide = np.stack([np.broadcast_to(w + steps * words, (n, w.size)), o_wide + steps * bb,
                     np.broadcast_to(rf, (n, w.size)), np.broadcast_to(mask, (n, w.size))], axis=2)
    wide = wide.reshape(-1, 4)
    if wide[:, 1].min(initial=0) < 0 or wide[:, 1].max(initial=0) > n * table.in_bytes - 4:
        return None
    return BitTable(wide.astype(np.uint32).view(np.int32), np.tile(table.init, n), n * table.in_bytes,
                    n * table.out_bytes)


def reproduces(table: BitTable, layout: Callable[[np.ndarray], np.ndarray]) -> bool:
    """Whether the table gives the layout's bytes on arbitrary rows (a multiplicative hash
    of the position: importing numpy.random would cost a warm start more than this)."""
    x = np.arange(table.in_bytes, dtype=np.uint64) * np.uint64(2654435761)
    rows = (((x ^ (x >> np.uint64(15))) * np.uint64(2246822519)) >> np.uint64(24)).astype(np.uint8)
    if np.array_equal(emulate(table, rows), layout(rows)):
        return True
    log.warning("a K-quant repack table does not reproduce its numpy layout; numpy moves the bits")
    return False


def emulate(table: BitTable, rows: np.ndarray) -> np.ndarray:
    """The table applied to one group's rows in numpy (what the native loop computes)."""
    padded = np.concatenate([rows.reshape(-1), np.zeros(4, np.uint8)])
    w, o, rf, mask = (table.terms.view(np.uint32)[:, i] for i in range(4))
    v = np.zeros(w.size, np.uint32)
    for i in range(4):
        v |= padded[o + i].astype(np.uint32) << np.uint32(8 * i)
    r = rf & np.uint32(31)
    rotated = (v << r) | np.where(r > 0, v >> ((np.uint32(32) - r) % np.uint32(32)), np.uint32(0))
    out = table.init.copy()
    np.bitwise_xor.at(out, w, rotated & mask)
    return out.view(np.uint8)


@functools.lru_cache(maxsize=1)
def _bits() -> tuple[object, ctypes._CFuncPtr]:
    from ggmlpy.codegen_cpu.runtime import compile_module

    module = compile_module(_BITS_IR)
    return module, _BITS(module.address("ggmlpy_repack_bits"))


def apply(table: BitTable, rows: np.ndarray, out: np.ndarray) -> None:
    """Every group of `rows` (whole groups of GGUF rows, contiguous) into `out` (their
    repacked bytes, contiguous, 4-byte aligned), natively and without the GIL."""
    n_groups = rows.nbytes // table.in_bytes
    if rows.nbytes != n_groups * table.in_bytes or out.nbytes != n_groups * table.out_bytes:
        raise ValueError(f"{rows.nbytes} bytes of rows into {out.nbytes} bytes do not make whole groups")
    if not (rows.flags.c_contiguous and out.flags.c_contiguous) or out.ctypes.data % 4:
        raise ValueError("repack rows and output must be contiguous, the output word-aligned")
    _, run = _bits()
    run(out.ctypes.data, rows.ctypes.data, table.init.ctypes.data, table.terms.ctypes.data,
        table.terms.shape[0], n_groups, table.in_bytes, table.out_bytes)
