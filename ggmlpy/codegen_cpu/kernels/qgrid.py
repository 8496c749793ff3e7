"""Dot decoders of ggml's grid I-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
IQ1_M), and their base `GridKind`, which qternary.py's TQ1_0 and TQ2_0 share: super-blocks of
256 values, so they are KQuants (qkind.py) and get the tiles, the prefill groups (qgemm.py)
and get_rows (qdequant.py) as Q4_K does.

A grid type stores, per 8 values (IQ3: per 4), an index into a table of 8 (4) small values,
and per 8 values a sign byte; a scale per 16 or 32 values. A 64-value chunk loads its 8 (16)
table rows from a constant global emitted once per module (`lookup_rows`), so its 64 bytes
are in value order, each row already `offset` + grid value, `offset` the grid's largest
value. The sign bytes, as an i64, are a <64 x i1> mask in value order too: the values whose
sign is minus become 2 offset - u = offset - g (one masked subtraction), all unsigned for
dot_u8s8, and offset * d * scale is taken back through the activation sums as Q6_K's 32 is
(`corr`). IQ2_XXS's and IQ3_XXS's 7-bit sign fields get their eighth bit (ggml's
ksigns_iq2xs: an even number of minus signs) from a popcount, a super-block's 32 at once.

Every value is a small integer times a power-of-two fraction of d, which keeps the sums
integer (ggml's vec_dot_iq*_q8_K do the same): IQ2's d * (0.5 + s) * 0.25 is (d / 8) * (2s + 1),
IQ3_XXS's (d / 4) * (2s + 1), IQ3_S's d * (2s + 1); IQ1's dl * (grid + -0.125) is
(dl / 8) * (8 grid -+ 1), so its table holds 8 * grid + 8 and the delta adds 0 or 2 (offset 9).

Each conversion is exact in f32 (d has 11 significant bits, scale times value at most 12), so
get_rows gives ggml's dequantize_row_* bit for bit.
"""
from __future__ import annotations

from typing import Callable, Sequence

import llvmlite.ir as ir
import numpy as np

from ggmlpy.codegen_cpu.irgen import F32, I8, I16, I32, I64, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.qact import Q8_256_16, Q8_256_32
from ggmlpy.codegen_cpu.kernels.qkind import KQuant, Vals
from ggmlpy.codegen_cpu.kernels.qvec import (
    CONTRACT, WEIGHT_BYTE_MAX, concat, const, dot_u8s8, intrinsic, load_f16, load_vec, repeat_lanes, shuffle, sitofp,
    splat, splat_const, vec, volatile_load, zeros,
)
from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import iq_grids
from ggmlpy.quants.layouts import block_dtype

G = GGMLType


# pieces -------------------------------------------------------------------------------------
def _table(kb: KernelBuilder, name: str, rows: Callable[[], np.ndarray]) -> ir.GlobalVariable:
    """The module's constant global `name` holding rows() (bytes, row after row), made on
    first use: one copy per module however many kernels read it."""
    g = kb.module.globals.get(name)
    if g is None:
        data = bytearray(np.ascontiguousarray(rows(), dtype=np.uint8).tobytes())
        typ = ir.ArrayType(I8, len(data))
        g = ir.GlobalVariable(kb.module, typ, name)
        g.global_constant, g.linkage, g.unnamed_addr, g.align = True, "private", True, 64
        g.initializer = ir.Constant(typ, data)
    return g


def lookup_rows(kb: KernelBuilder, table: ir.GlobalVariable, idx: ir.Value | list[ir.Value],
                width: int) -> ir.Value:
    """Rows idx of `table` (`width` bytes each, 64 / width of them) as their 64 bytes in order.

    Scalar loads put together by shuffles, as ggml's x86 kernels build these vectors: one
    `llvm.masked.gather` (vpgatherqq / vpgatherdd) made decode 1.1-1.3x slower on Zen 4, and
    Intel's gathers are microcoded since the GDS fix. `idx`: scalar indices, or a vector,
    whose lanes LLVM takes out with vpextrw (two µops each). Read from a stack slot by
    volatile loads instead, IQ3_S's 16 indices a chunk made its products 25% slower; where an
    index is a field of the block in memory, loading it alone (volatile_load, so LLVM does not
    merge it with a vector load of the same bytes) is faster (IQ2_XS: 22%)."""
    b = kb.b
    et = ir.IntType(8 * width)
    if not isinstance(idx, list):
        idx = [b.extract_element(idx, ir.Constant(I32, i)) for i in range(idx.type.count)]
    parts = []
    for k in idx:
        row = b.load(b.gep(table, [b.zext(k, I64)], source_etype=et), typ=et, align=width)
        parts.append(b.insert_element(ir.Constant(vec(et, 1), None), row, ir.Constant(I32, 0)))
    while len(parts) > 1:
        parts = [concat(b, parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return b.bitcast(parts[0], vec(I8, 64))


def signed(kb: KernelBuilder, u: ir.Value, signs: ir.Value, j: int, offset: int) -> ir.Value:
    """Table bytes u = offset + g made offset - g where bit i of sign byte l (value 8l + i of
    chunk j) is set: one masked subtraction. `signs` holds the super-block's 32 sign bytes
    (<32 x i8>), or the chunk's 8 (<8 x i8>, j None)."""
    b = kb.b
    bits = b.bitcast(signs, I64) if j is None else b.extract_element(b.bitcast(signs, vec(I64, 4)), ir.Constant(I32, j))
    mask = b.bitcast(bits, vec(ir.IntType(1), 64))
    return b.select(mask, b.sub(splat_const(I8, 2 * offset, 64), u), u)


def with_parity(kb: KernelBuilder, s7: ir.Value) -> ir.Value:
    """7-bit sign fields (<n x i8>) with bit 7 set where their popcount is odd (ksigns_iq2xs)."""
    b = kb.b
    n = s7.type.count
    pop = intrinsic(kb, f"llvm.ctpop.v{n}i8", vec(I8, n), [s7])
    return b.or_(s7, b.shl(b.and_(pop, splat_const(I8, 1, n)), splat_const(I8, 7, n)))


def seven_bit_fields(kb: KernelBuilder, words: ir.Value) -> ir.Value:
    """The 32 sign bytes of a super-block from its 8 words (<8 x i32>) of four 7-bit fields
    each (IQ2_XXS, IQ3_XXS), all at once rather than per chunk."""
    b = kb.b
    w = shuffle(b, words, None, [i // 4 for i in range(32)])
    s7 = b.and_(b.lshr(w, const(I32, [0, 7, 14, 21] * 8)), splat_const(I32, 127, 32))
    return with_parity(kb, b.trunc(s7, vec(I8, 32)))


def offset_table(values: np.ndarray, offset: int) -> np.ndarray:
    """A grid's rows of unsigned values with `offset` added (what `signed` expects)."""
    return (values.astype(np.int16) + offset).astype(np.uint8)


def odd_scales(kb: KernelBuilder, s: ir.Value) -> ir.Value:
    """2s + 1 as i32 lanes (the 3- or 4-bit scale fields of every grid type)."""
    b = kb.b
    n = s.type.count
    s = s if s.type.element == I32 else b.zext(s, vec(I32, n))
    return b.add(b.shl(s, splat_const(I32, 1, n)), splat_const(I32, 1, n))


def nibble_pairs(kb: KernelBuilder, v: ir.Value) -> ir.Value:
    """<n x i8> -> <2n x i8>: the low nibble of byte i, then its high nibble."""
    b = kb.b
    n = v.type.count
    v = shuffle(b, v, None, [i // 2 for i in range(2 * n)])
    return b.and_(b.lshr(v, const(I8, [0, 4] * n)), splat_const(I8, 15, 2 * n))


def bits_of(kb: KernelBuilder, v: ir.Value, lanes: list[int], shifts: list[int], mask: int, t: ir.Type) -> ir.Value:
    """(v[lanes[i]] >> shifts[i]) & mask, widened to t: bit fields spread over lanes."""
    b = kb.b
    x = b.and_(b.lshr(shuffle(b, v, None, lanes), const(v.type.element, shifts)),
               splat_const(v.type.element, mask, len(lanes)))
    return x if t == v.type.element else b.zext(x, vec(t, len(lanes)))


# the kinds ----------------------------------------------------------------------------------
class GridKind(KQuant):
    """A super-block type whose values are offset-free integers n_i with one integer scale per
    sub-block: value = d * factor * scale * n_i. Subclasses give the scales (`scales`), the
    chunks' unsigned bytes n_i + offset (`values`) and any per-row vectors (`extra`)."""

    offset: int
    factor: float = 1.0
    unit_scales = False    # every sub-block's scale is 1
    grid: np.ndarray       # the grid's rows of unsigned values (iq_grids.py)

    def __init__(self) -> None:
        fields = block_dtype(self.wtype).fields
        self.at = {name: fields[name][1] for name in fields}

    def d(self, kb: KernelBuilder, row: Vals) -> ir.Value:
        return load_f16(kb.b, kb.byte_ptr(row["p"], i64(self.at["d"])))

    def row(self, kb: KernelBuilder, wblock: ir.Value, tail: bool) -> Vals:
        b = kb.b
        vals = {"p": wblock, **self.extra(kb, wblock)}
        sc = self.scales(kb, vals)
        wd = b.fmul(self.d(kb, vals), f32(self.factor))
        corr = b.fmul(sitofp(b, sc), splat(b, b.fmul(wd, f32(-float(self.offset))), self.groups), flags=CONTRACT)
        if self.groups == 8:
            corr = shuffle(b, corr, zeros(F32, 8), [*range(8), *[8] * 8])
        return {**vals, "scales": sc, "wd": splat(b, wd, 16), "corr": corr}

    def chunk_dot(self, kb: KernelBuilder, isum: ir.Value, wq: Vals, aq: ir.Value) -> ir.Value:
        if self.unit_scales:   # the ternary types: no sub-block scale to multiply by
            return dot_u8s8(kb, isum, wq["q"], aq, WEIGHT_BYTE_MAX[self.wtype])
        return super().chunk_dot(kb, isum, wq, aq)

    def chunk_w(self, kb: KernelBuilder, row: Vals, j: int) -> Vals:
        sc = shuffle(kb.b, row["scales"], None, [self.corr_lane(j, 4 * lane) for lane in range(16)])
        return {"q": self.values(kb, row, j), "sc": sc}

    def extra(self, kb: KernelBuilder, p: ir.Value) -> Vals:
        return {}

    def table(self, kb: KernelBuilder) -> ir.GlobalVariable:
        """The grid with the offset added, as a constant of the module."""
        return _table(kb, f"ggmlpy_{self.wtype.name.lower()}_grid", lambda: offset_table(self.grid, self.offset))

    def index_bytes(self, kb: KernelBuilder, row: Vals, at: Sequence[int]) -> list[ir.Value]:
        """Bytes `at` of qs, one scalar load each (grid indices that are whole bytes: lookup_rows
        then needs no extraction from a vector)."""
        return [kb.b.load(kb.byte_ptr(row["p"], i64(self.at["qs"] + i)), typ=I8) for i in at]

    def load(self, kb: KernelBuilder, row: Vals, field: str, at: int, t: ir.Type, n: int) -> ir.Value:
        """n elements of t from byte `at` of the block's field `field`."""
        return load_vec(kb.b, kb.byte_ptr(row["p"], i64(self.at[field] + at)), t, n)

    def scales(self, kb: KernelBuilder, row: Vals) -> ir.Value:
        raise NotImplementedError

    def values(self, kb: KernelBuilder, row: Vals, j: int) -> ir.Value:
        raise NotImplementedError




class IQ2XXS(GridKind):
    """Per 32 values 8 bytes of qs: four grid indices, then a word of four 7-bit sign fields
    and the 4-bit scale (bits 28-31); chunk j is qs words 4j..4j+3."""
    wtype, fmt, groups, offset, factor = G.IQ2_XXS, Q8_256_32, 8, 43, 0.125
    grid = iq_grids.IQ2XXS_VALUES

    def extra(self, kb: KernelBuilder, p: ir.Value) -> Vals:
        b = kb.b
        w = load_vec(b, kb.byte_ptr(p, i64(self.at["qs"])), I32, 16)
        return {"w": w, "signs": seven_bit_fields(kb, shuffle(b, w, None, range(1, 16, 2)))}

    def scales(self, kb: KernelBuilder, row: Vals) -> ir.Value:
        b = kb.b
        return odd_scales(kb, b.lshr(shuffle(b, row["w"], None, range(1, 16, 2)), splat_const(I32, 28, 8)))

    def values(self, kb: KernelBuilder, row: Vals, j: int) -> ir.Value:
        idx = self.index_bytes(kb, row, [16 * j + i for i in (0, 1, 2, 3, 8, 9, 10, 11)])
        return signed(kb, lookup_rows(kb, self.table(kb), idx, 8), row["signs"], j, self.offset)


class IQ2XS(GridKind):
    """qs: per 8 values a 16-bit word, a 9-bit grid index and 7 sign bits; scales: per 32
    values a byte, the 4-bit scales of its two halves."""
    wtype, fmt, groups, offset, factor = G.IQ2_XS, Q8_256_16, 16, 43, 0.125
    grid = iq_grids.IQ2XS_VALUES

    def extra(self, kb: KernelBuilder, p: ir.Value) -> Vals:
        b = kb.b
        q = load_vec(b, kb.byte_ptr(p, i64(self.at["qs"])), I16, 32)
        return {"q": q, "signs": with_parity(kb, b.trunc(b.lshr(q, splat_const(I16, 9, 32)), vec(I8, 32)))}

    def scales(self, kb: KernelBuilder, row: Vals) -> ir.Value:
        return odd_scales(kb, nibble_pairs(kb, self.load(kb, row, "scales", 0, I8, 8)))

    def values(self, kb: KernelBuilder, row: Vals, j: int) -> ir.Value:
        b = kb.b
        idx = [b.and_(volatile_load(b, kb.byte_ptr(row["p"], i64(self.at["qs"] + 2 * (8 * j + i))), I16, 2),
                      ir.Constant(I16, 511)) for i in range(8)]
        return signed(kb, lookup_rows(kb, self.table(kb), idx, 8), row["signs"], j, self.offset)


class IQ2S(IQ2XS):
    """qs: 32 index bytes (bits 8-9 of group g's index at bits 2 (g % 4) of qh[g / 4]), then
    32 full sign bytes; scales as IQ2_XS's."""
    wtype = G.IQ2_S
    grid = iq_grids.IQ2S_VALUES

    def extra(self, kb: KernelBuilder, p: ir.Value) -> Vals:
        return {}

    def values(self, kb: KernelBuilder, row: Vals, j: int) -> ir.Value:
        b = kb.b
        high = bits_of(kb, self.load(kb, row, "qh", 2 * j, I8, 2), [0] * 4 + [1] * 4, [0, 2, 4, 6] * 2, 3, I16)
        low = b.zext(self.load(kb, row, "qs", 8 * j, I8, 8), vec(I16, 8))
        idx = b.or_(low, b.shl(high, splat_const(I16, 8, 8)))
        signs = self.load(kb, row, "qs", 32 + 8 * j, I8, 8)
        return signed(kb, lookup_rows(kb, self.table(kb), idx, 8), signs, None, self.offset)


class IQ3XXS(GridKind):
    """qs: 64 indices of 4-value grid points, then per 32 values a word of four 7-bit sign
    fields (one per 8 values) and the 4-bit scale."""
    wtype, fmt, groups, offset, factor = G.IQ3_XXS, Q8_256_32, 8, 62, 0.25
    grid = iq_grids.IQ3XXS_VALUES

    def extra(self, kb: KernelBuilder, p: ir.Value) -> Vals:
        w = load_vec(kb.b, kb.byte_ptr(p, i64(self.at["qs"] + 64)), I32, 8)
        return {"w": w, "signs": seven_bit_fields(kb, w)}

    def scales(self, kb: KernelBuilder, row: Vals) -> ir.Value:
        return odd_scales(kb, kb.b.lshr(row["w"], splat_const(I32, 28, 8)))

    def values(self, kb: KernelBuilder, row: Vals, j: int) -> ir.Value:
        u = lookup_rows(kb, self.table(kb), self.index_bytes(kb, row, range(16 * j, 16 * j + 16)), 4)
        return signed(kb, u, row["signs"], j, self.offset)


class IQ3S(GridKind):
    """qs: 64 index bytes (bit 8 of index g: bit g % 8 of qh[g / 8]); a sign byte per 8
    values; a 4-bit scale s per 32 values (nibbles of `scales`), d * (1 + 2s)."""
    wtype, fmt, groups, offset = G.IQ3_S, Q8_256_32, 8, 15
    grid = iq_grids.IQ3S_VALUES

    def scales(self, kb: KernelBuilder, row: Vals) -> ir.Value:
        return odd_scales(kb, nibble_pairs(kb, self.load(kb, row, "scales", 0, I8, 4)))

    def values(self, kb: KernelBuilder, row: Vals, j: int) -> ir.Value:
        b = kb.b
        qh = self.load(kb, row, "qh", 2 * j, I8, 2)
        high = bits_of(kb, qh, [g // 8 for g in range(16)], [g % 8 for g in range(16)], 1, I16)
        low = b.zext(self.load(kb, row, "qs", 16 * j, I8, 16), vec(I16, 16))
        idx = b.or_(low, b.shl(high, splat_const(I16, 8, 16)))
        signs = self.load(kb, row, "signs", 8 * j, I8, 8)
        return signed(kb, lookup_rows(kb, self.table(kb), idx, 4), signs, None, self.offset)


# IQ1's -1/0/1 grid as 8 * grid + 8: with the delta's 0 or 2 added, 8 * grid -+ 1 + 9
IQ1_TABLE = (8 * iq_grids.IQ1S_VALUES.astype(np.int16) + 8).astype(np.uint8)


def iq1_values(kb: KernelBuilder, idx: ir.Value, negative: ir.Value) -> ir.Value:
    """The 64 bytes of 8 groups: grid entries idx (<8 x i16>) plus 0 where the group's delta
    is negative (`negative`, <8 x i8> of 0 or 1), else 2."""
    b = kb.b
    g = lookup_rows(kb, _table(kb, "ggmlpy_iq1_grid", lambda: IQ1_TABLE), idx, 8)
    delta = b.shl(b.xor(negative, splat_const(I8, 1, 8)), splat_const(I8, 1, 8))
    return b.add(g, repeat_lanes(b, delta, 8))


class IQ1S(GridKind):
    """qs: 32 index bytes; qh: per 32 values a word, bits 3l..3l+2 the top of group l's
    11-bit index, bits 12-14 the scale s (d * (2s + 1)), bit 15 the delta's sign."""
    wtype, fmt, groups, offset, factor = G.IQ1_S, Q8_256_32, 8, 9, 0.125

    def extra(self, kb: KernelBuilder, p: ir.Value) -> Vals:
        return {"qh": load_vec(kb.b, kb.byte_ptr(p, i64(self.at["qh"])), I16, 8)}

    def scales(self, kb: KernelBuilder, row: Vals) -> ir.Value:
        return odd_scales(kb, bits_of(kb, row["qh"], list(range(8)), [12] * 8, 7, I16))

    def values(self, kb: KernelBuilder, row: Vals, j: int) -> ir.Value:
        b = kb.b
        lanes = [2 * j] * 4 + [2 * j + 1] * 4
        high = bits_of(kb, row["qh"], lanes, [0, 3, 6, 9] * 2, 7, I16)
        idx = b.or_(b.zext(self.load(kb, row, "qs", 8 * j, I8, 8), vec(I16, 8)), b.shl(high, splat_const(I16, 8, 8)))
        negative = b.trunc(bits_of(kb, row["qh"], lanes, [15] * 8, 1, I16), vec(I8, 8))
        return iq1_values(kb, idx, negative)


class IQ1M(GridKind):
    """No d field: the f16 super-block scale is the top nibbles of the four scale words,
    whose low 12 bits are four 3-bit scales s (d * (2s + 1)), one per 16 values. qh: per 8
    values a nibble (nibble g % 2 of qh[g / 2]): bits 0-2 the top of the 11-bit index, bit 3
    the delta's sign."""
    wtype, fmt, groups, offset, factor = G.IQ1_M, Q8_256_16, 16, 9, 0.125

    def extra(self, kb: KernelBuilder, p: ir.Value) -> Vals:
        return {"sc": load_vec(kb.b, kb.byte_ptr(p, i64(self.at["scales"])), I16, 4)}

    def d(self, kb: KernelBuilder, row: Vals) -> ir.Value:
        b = kb.b
        top = b.and_(b.lshr(row["sc"], const(I16, [12, 8, 4, 0])), const(I16, [0xF, 0xF0, 0xF00, 0xF000]))
        bits = b.extract_element(top, ir.Constant(I32, 0))
        for i in range(1, 4):
            bits = b.or_(bits, b.extract_element(top, ir.Constant(I32, i)))
        return b.fpext(b.bitcast(bits, ir.HalfType()), F32)

    def scales(self, kb: KernelBuilder, row: Vals) -> ir.Value:
        return odd_scales(kb, bits_of(kb, row["sc"], [g // 4 for g in range(16)], [3 * (g % 4) for g in range(16)],
                                      7, I16))

    def values(self, kb: KernelBuilder, row: Vals, j: int) -> ir.Value:
        b = kb.b
        nib = bits_of(kb, self.load(kb, row, "qh", 4 * j, I8, 4), [g // 2 for g in range(8)], [0, 4] * 4, 15, I8)
        high = b.zext(b.and_(nib, splat_const(I8, 7, 8)), vec(I16, 8))
        idx = b.or_(b.zext(self.load(kb, row, "qs", 8 * j, I8, 8), vec(I16, 8)), b.shl(high, splat_const(I16, 8, 8)))
        return iq1_values(kb, idx, b.lshr(nib, splat_const(I8, 3, 8)))


GRID_KINDS: dict[GGMLType, KQuant] = {k.wtype: k for k in (IQ2XXS(), IQ2XS(), IQ2S(), IQ3XXS(), IQ3S(), IQ1S(), IQ1M())}
