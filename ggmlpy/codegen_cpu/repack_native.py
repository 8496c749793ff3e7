"""The repacked layout's byte moves, run by native code.

repack.py defines the layout in numpy, and numpy moves Q8_0's bytes slowly: its quants sit
two bytes off word alignment, and the transposes ran at 0.35-0.4 GB/s, so repacking was
most of a warm start (Gemma 3's 168 MB tied Q8_0 embedding: 0.45 s of one core; this loop
0.11 s). For Q4_0, Q4_1, Q8_0 and
Q5_0, every half-word of a repacked group is a half-word of the group's 16 GGUF rows
(or a constant: padding), and-ed and xor-ed with constants (Q8_0's + 128); only Q5_0's
high-bit planes are computed from bits. So each (type, K) gets a *table*, derived from
numpy's own layout function run on probe rows that hold their byte positions, and checked
against it on random rows: per output half-word, its source offset and two masks.
A small native loop (LLVM IR, compiled once into the disk cache like the kernels) applies
the table to every group, outside the GIL, and numpy fills Q5_0's planes afterwards. The
numpy code stays the one definition of the layout; this only runs it faster.
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

_PERMUTE_IR = r"""
define void @ggmlpy_repack_u16(ptr %dst, ptr %src, ptr %table, ptr %andm, ptr %xorm,
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
  %v = load i16, ptr %sp, align 1
  %ap = getelementptr i16, ptr %andm, i64 %j
  %a = load i16, ptr %ap, align 2
  %xp = getelementptr i16, ptr %xorm, i64 %j
  %x = load i16, ptr %xp, align 2
  %va = and i16 %v, %a
  %vx = xor i16 %va, %x
  %dp = getelementptr i16, ptr %d, i64 %j
  store i16 %vx, ptr %dp, align 1
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

_PERMUTE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)


@dataclass(frozen=True)
class GroupTable:
    """How one group's output half-words come from its 16 rows: out[j] = (in16 at byte
    offset[j] & and_mask[j]) ^ xor_mask[j]. Half-words in `computed` (byte ranges of each
    step) are left zero here and filled by numpy (Q5_0's planes)."""
    offset: np.ndarray     # int32 [n_units]
    and_mask: np.ndarray   # uint16 [n_units]
    xor_mask: np.ndarray   # uint16 [n_units]
    in_bytes: int          # bytes of the group's 16 rows
    out_bytes: int         # bytes of the group's repacked layout


def derive_table(layout: Callable[[np.ndarray], np.ndarray], in_bytes: int, step_bytes: int,
                 computed: Sequence[tuple[int, int]] = ()) -> GroupTable | None:
    """The table of `layout` (one group's input bytes -> its output bytes), or None when
    the layout is not such a move. `computed`: byte ranges of every step of `step_bytes`
    that the table leaves to numpy. Derived from probe rows holding their byte positions
    (+1, over PROBE_BYTES probes), then checked on random rows."""
    if in_bytes + 1 >= 1 << (8 * PROBE_BYTES):
        return None
    constant = layout(np.zeros(in_bytes, np.uint8))
    position = np.zeros(constant.size, np.int64)   # source position + 1, 0 for a constant
    for i in range(PROBE_BYTES):
        probe = ((np.arange(in_bytes, dtype=np.int64) + 1) >> (8 * i)).astype(np.uint8)
        position |= (layout(probe) ^ constant).astype(np.int64) << (8 * i)
    moved = np.ones(constant.size, bool)   # the bytes the table moves
    steps = moved.reshape(-1, step_bytes)
    for lo, hi in computed:
        steps[:, lo:hi] = False
    lo_pos, hi_pos = position[0::2] - 1, position[1::2] - 1
    units = moved[0::2]
    from_rows = (lo_pos >= 0) & (hi_pos == lo_pos + 1)
    is_constant = (lo_pos < 0) & (hi_pos < 0)
    if not np.all((units == moved[1::2]) & (~units | from_rows | is_constant)):
        return None
    offset = np.where(from_rows & units, lo_pos, 0).astype(np.int32)
    and_mask = np.where(from_rows & units, 0xFFFF, 0).astype(np.uint16)
    xor_mask = np.where(units, constant.view(np.uint16), 0).astype(np.uint16)
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
    padded = np.concatenate([rows.reshape(-1), np.zeros(1, np.uint8)])
    words = padded[table.offset].astype(np.uint16) | (padded[table.offset + 1].astype(np.uint16) << 8)
    return ((words & table.and_mask) ^ table.xor_mask).view(np.uint8)


@functools.lru_cache(maxsize=1)
def _permute() -> tuple[object, ctypes._CFuncPtr]:
    from ggmlpy.codegen_cpu.runtime import compile_module

    module = compile_module(_PERMUTE_IR)
    return module, _PERMUTE(module.address("ggmlpy_repack_u16"))


def apply(table: GroupTable, rows: np.ndarray, out: np.ndarray) -> None:
    """Every group of `rows` (whole groups of GGUF rows, contiguous) into `out` (their
    repacked bytes, contiguous), natively and without the GIL."""
    n_groups = rows.nbytes // table.in_bytes
    if rows.nbytes != n_groups * table.in_bytes or out.nbytes != n_groups * table.out_bytes:
        raise ValueError(f"{rows.nbytes} bytes of rows into {out.nbytes} bytes do not make whole groups")
    if not (rows.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("repack rows and output must be contiguous")
    _, permute = _permute()
    permute(out.ctypes.data, rows.ctypes.data, table.offset.ctypes.data, table.and_mask.ctypes.data,
            table.xor_mask.ctypes.data, table.out_bytes // 2, n_groups, table.in_bytes, table.out_bytes)
