"""The repacked layout's byte moves, run by native code.

repack.py defines the layout in numpy, and numpy moves Q8_0's bytes slowly: its quants sit
two bytes off word alignment, and the transposes ran at 0.35-0.4 GB/s, so repacking was
most of a warm start (Gemma 3's 168 MB tied Q8_0 embedding: 0.45 s of one core; this loop
0.11 s). For Q4_0, Q4_1, Q8_0,
Q5_0, Q5_1 and MXFP4, every half-word of a repacked group is a half-word of the group's 16 GGUF
rows (or a constant: padding), and-ed and xor-ed with constants (Q8_0's + 128); only Q5_0's
and Q5_1's high-bit planes are computed from bits, and MXFP4's exponent bytes (16 rows' bytes
side by side) are numpy's. So each (type, K) gets a *table*, derived from
numpy's own layout function run on probe rows that hold their byte positions, and checked
against it on random rows: per output half-word, its source offset and two masks.
A small native loop (LLVM IR, compiled once into the disk cache like the kernels) applies
the table to every group, outside the GIL, and numpy fills the high-bit planes afterwards. The
numpy code stays the one definition of the layout; this only runs it faster.

The quants' lanes are whole words of 4 consecutive source bytes, so repack.py asks first
for a table of words (`unit` 4) that leaves the f16 scales to numpy too (16 rows' halves
side by side: no word of them comes from one place): half the loop's steps for the bulk
of the bytes (Gemma 3's 223 MB repacked: 0.30 -> 0.20 s of native time on the Zen 1 host).
"""
from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

log = logging.getLogger("ggmlpy.codegen_cpu")

PROBE_BYTES = 3     # a probe row's byte positions (+1) in 3 bytes: groups up to 16 MiB

_PERMUTE_IR_TEMPLATE = r"""
define void @ggmlpy_repack_uBITS(ptr %dst, ptr %src, ptr %table, ptr %andm, ptr %xorm,
                               i64 %n_units, i64 %n_groups, i64 %src_stride, i64 %dst_stride) {
entry:
  %none = icmp sle i64 %n_groups, 0
  br i1 %none, label %exit, label %group
group:
  %g = phi i64 [0, %entry], [%g1, %group_end]
  %so = mul i64 %g, %src_stride
  %s = getelementptr i8, ptr %src, i64 %so
  %do = mul i64 %g, %dst_stride
  %d = getelementptr i8, ptr %dst, i64 %do
  br label %unit
unit:
  %j = phi i64 [0, %group], [%j1, %unit]
  %tp = getelementptr i32, ptr %table, i64 %j
  %t = load i32, ptr %tp, align 4
  %t64 = sext i32 %t to i64
  %sp = getelementptr i8, ptr %s, i64 %t64
  %v = load iBITS, ptr %sp, align 1
  %ap = getelementptr iBITS, ptr %andm, i64 %j
  %a = load iBITS, ptr %ap, align ALIGN
  %xp = getelementptr iBITS, ptr %xorm, i64 %j
  %x = load iBITS, ptr %xp, align ALIGN
  %va = and iBITS %v, %a
  %vx = xor iBITS %va, %x
  %dp = getelementptr iBITS, ptr %d, i64 %j
  store iBITS %vx, ptr %dp, align 1
  %j1 = add i64 %j, 1
  %more = icmp slt i64 %j1, %n_units
  br i1 %more, label %unit, label %group_end
group_end:
  %g1 = add i64 %g, 1
  %again = icmp slt i64 %g1, %n_groups
  br i1 %again, label %group, label %exit
exit:
  ret void
}
"""
# one loop per unit: half-words (the general case) and words (moves of 4 source bytes)
_PERMUTE_IR = "".join(_PERMUTE_IR_TEMPLATE.replace("BITS", str(8 * u)).replace("ALIGN", str(u)) for u in (2, 4))

_PERMUTE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)


@dataclass(frozen=True)
class GroupTable:
    """How one group's output units (half-words, or words where every one is a move of 4
    source bytes) come from its 16 rows: out[j] = (in at byte offset[j] & and_mask[j]) ^
    xor_mask[j]. Units in `computed` (byte ranges of each step) are left zero here and
    filled by numpy (Q5_0's planes, the scales of a word table)."""
    offset: np.ndarray     # int32 [n_units]
    and_mask: np.ndarray   # uint16 or uint32 [n_units]
    xor_mask: np.ndarray   # the same
    in_bytes: int          # bytes of the group's 16 rows
    out_bytes: int         # bytes of the group's repacked layout

    @property
    def unit(self) -> int:
        """Bytes per unit: 2 or 4."""
        return self.and_mask.itemsize


def derive_table(layout: Callable[[np.ndarray], np.ndarray], in_bytes: int, step_bytes: int,
                 computed: Sequence[tuple[int, int]] = (), unit: int = 2) -> GroupTable | None:
    """The table of `layout` (one group's input bytes -> its output bytes) in units of
    `unit` bytes (2 or 4), or None when the layout is not such a move. `computed`: byte
    ranges of every step of `step_bytes` that the table leaves to numpy. Derived from probe
    rows holding their byte positions (+1, over PROBE_BYTES probes), then checked on random
    rows."""
    if in_bytes + 1 >= 1 << (8 * PROBE_BYTES):
        return None
    constant = layout(np.zeros(in_bytes, np.uint8))
    if constant.size % unit:
        return None
    position = np.zeros(constant.size, np.int64)   # source position + 1, 0 for a constant
    for i in range(PROBE_BYTES):
        probe = ((np.arange(in_bytes, dtype=np.int64) + 1) >> (8 * i)).astype(np.uint8)
        position |= (layout(probe) ^ constant).astype(np.int64) << (8 * i)
    moved = np.ones(constant.size, bool)   # the bytes the table moves
    steps = moved.reshape(-1, step_bytes)
    for lo, hi in computed:
        steps[:, lo:hi] = False
    pos = (position - 1).reshape(-1, unit)              # per unit, its bytes' sources (-1: constant)
    units = moved[0::unit]
    from_rows = (pos[:, 0] >= 0) & np.all(pos == pos[:, :1] + np.arange(unit), axis=1)
    is_constant = np.all(pos < 0, axis=1)
    if not np.all(np.all(moved.reshape(-1, unit) == units[:, None], axis=1) & (~units | from_rows | is_constant)):
        return None
    word = np.uint16 if unit == 2 else np.uint32
    offset = np.where(from_rows & units, pos[:, 0], 0).astype(np.int32)
    and_mask = np.where(from_rows & units, np.iinfo(word).max, 0).astype(word)
    xor_mask = np.where(units, constant.view(word), 0).astype(word)
    table = GroupTable(offset, and_mask, xor_mask, in_bytes, constant.size)
    # arbitrary bytes (a multiplicative hash of the position: importing numpy.random would
    # cost a warm start more than the whole derivation)
    x = np.arange(in_bytes, dtype=np.uint64) * np.uint64(2654435761)
    rows = (((x ^ (x >> np.uint64(15))) * np.uint64(2246822519)) >> np.uint64(24)).astype(np.uint8)
    if not np.array_equal(emulate(table, rows)[moved], layout(rows)[moved]):
        log.warning("a repack table does not reproduce its numpy layout; numpy moves the bytes")
        return None
    return table


def emulate(table: GroupTable, rows: np.ndarray) -> np.ndarray:
    """The table applied to one group's rows in numpy (what the native loop computes)."""
    padded = np.concatenate([rows.reshape(-1), np.zeros(table.unit, np.uint8)])
    word = table.and_mask.dtype.type
    words = np.zeros(table.offset.size, word)
    for b in range(table.unit):
        words |= padded[table.offset + b].astype(word) << word(8 * b)
    return ((words & table.and_mask) ^ table.xor_mask).view(np.uint8)


@functools.lru_cache(maxsize=1)
def _permute() -> tuple[object, dict[int, ctypes._CFuncPtr]]:
    from ggmlpy.codegen_cpu.runtime import compile_module

    module = compile_module(_PERMUTE_IR)
    return module, {u: _PERMUTE(module.address(f"ggmlpy_repack_u{8 * u}")) for u in (2, 4)}


def apply(table: GroupTable, rows: np.ndarray, out: np.ndarray) -> None:
    """Every group of `rows` (whole groups of GGUF rows, contiguous) into `out` (their
    repacked bytes, contiguous), natively and without the GIL."""
    n_groups = rows.nbytes // table.in_bytes
    if rows.nbytes != n_groups * table.in_bytes or out.nbytes != n_groups * table.out_bytes:
        raise ValueError(f"{rows.nbytes} bytes of rows into {out.nbytes} bytes do not make whole groups")
    if not (rows.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("repack rows and output must be contiguous")
    _, permute = _permute()
    permute[table.unit](out.ctypes.data, rows.ctypes.data, table.offset.ctypes.data, table.and_mask.ctypes.data,
                        table.xor_mask.ctypes.data, table.out_bytes // table.unit, n_groups, table.in_bytes,
                        table.out_bytes)
