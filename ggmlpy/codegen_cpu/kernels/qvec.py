"""Vector IR pieces for the quantised kernels: constant vectors, shuffles, unaligned loads,
reductions, and the one primitive everything is built on, the u8 x s8 dot step.

`dot_u8s8(acc, u, s)` adds, to each of 16 i32 lanes, the sum of 4 consecutive byte products
(lane i: bytes 4i..4i+3), which is what `vpdpbusd` does. How it is emitted is the *flavour*:

- "vnni512": one `llvm.x86.avx512.vpdpbusd.512` (AVX-512 VNNI; operands `<64 x i8>` in
  LLVM 22, checked by compiling a tiny module);
- "vnni256": two `llvm.x86.avx512.vpdpbusd.256` (AVX-VNNI hosts without AVX-512: the same
  intrinsic is emitted with the VEX encoding there);
- "avx2": AVX2 without VNNI (llama.cpp's AVX2 path): per 32 bytes, `vpmaddubsw` (pairs
  of products summed into i16, with saturation) then `vpmaddwd` against ones (i16 pairs
  into i32). Exact only while a pair cannot saturate, so weights whose bytes can exceed
  127 (`u_max`, Q8_0's 0..255) are split into their low 7 bits and their top bit, each
  summed exactly (the top bit's sums weighted by 128 in the `vpmaddwd`);
- "generic": plain vector IR (widen, multiply, add neighbours) that LLVM legalises for any
  target; the portable path. On AVX2 LLVM does not find `vpmaddubsw` in it, and decode ran
  at a fifth of the memory bandwidth, which is why "avx2" exists.

The flavour comes from the host's features; a backend's Options.cpu_qdot (GGMLPY_CPU_QDOT,
read when the backend is created) picks one for its kernels through `KernelBuilder.qdot`, and
`set_flavour` overrides the default for builders given none (tests run every flavour the
machine can execute). The flavour
changes the IR text, so the object cache never mixes them. Kernels see only `dot_u8s8`, so
the weight decoders and the tiling are written once.
"""
from __future__ import annotations

from typing import Sequence

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, I8, I16, I32, KernelBuilder, vector_const, zero_vector
from ggmlpy.codegen_cpu.target import host
from ggmlpy.ir.types import GGMLType
from ggmlpy.options import QDOT_FLAVOURS

FLAVOURS = QDOT_FLAVOURS  # ("vnni512", "vnni256", "avx2", "generic"), what Options.cpu_qdot accepts
# Float flags: fusing into FMAs, but no reassociation, which would merge the separate
# accumulators the kernels keep to break dependency chains.
CONTRACT = ("contract",)
# The largest unsigned byte each weight type's decoder hands dot_u8s8 (qdot.py's offsets:
# nibbles 0..15, with a fifth bit 0..31, Q2_K's two bits 0..3, Q3_K's q + 4 0..7, Q6_K's q + 32
# 0..63, Q8_0's q xor 0x80 0..255, MXFP4's code values + 12 0..24, IQ4's + 128 1..241:
# kernels/qcodes.py)
WEIGHT_BYTE_MAX: dict[GGMLType, int] = {
    GGMLType.Q4_0: 15, GGMLType.Q4_1: 15, GGMLType.Q5_0: 31, GGMLType.Q5_1: 31, GGMLType.Q8_0: 255,
    GGMLType.Q2_K: 3, GGMLType.Q3_K: 7, GGMLType.Q4_K: 15, GGMLType.Q5_K: 31, GGMLType.Q6_K: 63,
    GGMLType.MXFP4: 24, GGMLType.IQ4_NL: 241, GGMLType.IQ4_XS: 241,
    # kernels/qgrid.py: signed grid values + the grid's largest (IQ2 43, IQ3_XXS 62, IQ3_S 15,
    # IQ1's 8 * grid -+ 1 + 9), the ternary types' q - 1 + 1 (TQ2_0's codes reach 3)
    GGMLType.IQ2_XXS: 86, GGMLType.IQ2_XS: 86, GGMLType.IQ2_S: 86, GGMLType.IQ3_XXS: 124, GGMLType.IQ3_S: 30,
    GGMLType.IQ1_S: 18, GGMLType.IQ1_M: 18, GGMLType.TQ1_0: 2, GGMLType.TQ2_0: 3,
    # kernels/qwide.py: Q1_0's +-1 + 1, Q2_0's codes, NVFP4's MXFP4 codes + 12
    GGMLType.Q1_0: 2, GGMLType.Q2_0: 3, GGMLType.NVFP4: 24,
}
I16_SAFE = 32767  # the largest i16 partial sum the "avx2" flavour lets a lane reach
_override: str | None = None  # set_flavour's; never read from the environment


def vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


V64I8, V32I8, V16I32, V16F32 = vec(I8, 64), vec(I8, 32), vec(I32, 16), vec(F32, 16)


def set_flavour(name: str | None) -> None:
    """Force a dot flavour for kernels built from now on (None: back to the host's best)."""
    global _override
    if name is not None and name not in FLAVOURS:
        raise ValueError(f"unknown quantised-dot flavour {name!r}; expected one of {FLAVOURS}")
    _override = name


def flavour() -> str:
    """The dot flavour of builders given none: set_flavour's, else the best the host has."""
    if _override is not None:
        return _override
    h = host()
    if h.vnni512:
        return "vnni512"
    if h.has("avxvnni") or (h.has("avx512vnni") and h.has("avx512vl")):
        return "vnni256"
    if h.has("avx2"):
        return "avx2"
    return "generic"


# constants and shuffles ----------------------------------------------------------------------
def const(t: ir.Type, values: Sequence) -> ir.Constant:
    return vector_const(t, values)


def splat_const(t: ir.Type, value, n: int) -> ir.Constant:
    return const(t, [value] * n)


def zeros(t: ir.Type, n: int) -> ir.Constant:
    return splat_const(t, 0.0 if t == F32 else 0, n)


def shuffle(b: ir.IRBuilder, x: ir.Value, y: ir.Value | None, mask: Sequence[int]) -> ir.Value:
    """shufflevector; with y None, indices refer to x alone."""
    if y is None:
        y = zero_vector(x.type)
    return b.shuffle_vector(x, y, const(I32, mask))


def concat(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    n = x.type.count
    return shuffle(b, x, y, range(2 * n))


def splat(b: ir.IRBuilder, scalar: ir.Value, n: int) -> ir.Value:
    v = b.insert_element(zero_vector(vec(scalar.type, n)), scalar, ir.Constant(I32, 0))
    return shuffle(b, v, None, [0] * n)


def repeat_lanes(b: ir.IRBuilder, v: ir.Value, each: int) -> ir.Value:
    """<a, b, ...> -> <a x each, b x each, ...>."""
    return shuffle(b, v, None, [i for i in range(v.type.count) for _ in range(each)])


def spread(b: ir.IRBuilder, v: ir.Value, n: int, stride: int) -> ir.Value:
    """An n-lane vector with v's lanes at 0, stride, 2*stride ... and zeros elsewhere."""
    k = v.type.count
    mask = [k] * n
    for i in range(k):
        mask[i * stride] = i
    return shuffle(b, v, zero_vector(v.type), mask)


def load_vec(b: ir.IRBuilder, ptr: ir.Value, t: ir.Type, n: int) -> ir.Value:
    """n elements of t from any address (GGUF blocks are 18-210 bytes: no alignment)."""
    return b.load(ptr, typ=vec(t, n), align=1)


class _VolatileLoad(ir.LoadInstr):
    """A `load volatile` (llvmlite's LoadInstr has no volatile flag to print)."""

    def descr(self, buf: list) -> None:
        [ptr] = self.operands
        align = f", align {self.align}" if self.align is not None else ""
        buf.append(f"load volatile {self.type}, {ptr.type} {ptr.get_reference()}{align}"
                   f"{self._stringify_metadata(leading_comma=True)}\n")


def volatile_load(b: ir.IRBuilder, ptr: ir.Value, t: ir.Type, align: int = 1) -> ir.Value:
    """One load of t that LLVM keeps as it is: not merged with a wider load of the same bytes
    (then taken apart with two-µop lane extractions) nor promoted to a register."""
    load = _VolatileLoad(b.block, ptr, typ=t)
    load.align = align
    b._insert(load)
    return load


def store_vec(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value) -> None:
    b.store(value, ptr, align=1)


def masked_store(kb: "KernelBuilder", value: ir.Value, ptr: ir.Value, mask: ir.Value) -> None:
    """Store the lanes of value where mask (<n x i1>) is set; the others stay untouched."""
    fn_name = f"llvm.masked.store.{_suffix(value.type)}.p0"
    fn = kb.module.globals.get(fn_name)
    if fn is None:
        fn = ir.Function(kb.module, ir.FunctionType(ir.VoidType(), [value.type, ir.PointerType(), I32, mask.type]),
                         fn_name)
    kb.b.call(fn, [value, ptr, ir.Constant(I32, 4), mask])


def load_f16(b: ir.IRBuilder, ptr: ir.Value) -> ir.Value:
    return b.fpext(b.load(ptr, typ=ir.HalfType(), align=1), F32)


def sitofp(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    return b.sitofp(v, vec(F32, v.type.count))


# intrinsics -------------------------------------------------------------------------------
def _suffix(t: ir.Type) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_suffix(t.element)}"
    return {F32: "f32", I8: "i8", I16: "i16", I32: "i32"}[t]


def intrinsic(kb: KernelBuilder, name: str, ret: ir.Type, args: Sequence[ir.Value]) -> ir.Value:
    fn = kb.module.globals.get(name)
    if fn is None:
        fn = ir.Function(kb.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return kb.b.call(fn, list(args))


def prefetch(kb: KernelBuilder, ptr: ir.Value, locality: int = 3) -> None:
    """Ask for the cache line at ptr (read; locality 3: keep in every level, 0: streaming,
    prefetchnta): prefetches never fault."""
    i32 = ir.IntType(32)
    fn = kb.module.globals.get("llvm.prefetch.p0")
    if fn is None:
        fn = ir.Function(kb.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]), "llvm.prefetch.p0")
    kb.b.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])


def vabs(kb: KernelBuilder, v: ir.Value) -> ir.Value:
    return intrinsic(kb, f"llvm.fabs.{_suffix(v.type)}", v.type, [v])


def vrint(kb: KernelBuilder, v: ir.Value) -> ir.Value:
    return intrinsic(kb, f"llvm.rint.{_suffix(v.type)}", v.type, [v])


def reduce_add_i32(kb: KernelBuilder, v: ir.Value) -> ir.Value:
    return intrinsic(kb, f"llvm.vector.reduce.add.{_suffix(v.type)}", I32, [v])


def reduce_max_f32(kb: KernelBuilder, v: ir.Value) -> ir.Value:
    return intrinsic(kb, f"llvm.vector.reduce.fmax.{_suffix(v.type)}", F32, [v])


def reduce_add_f32(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """Horizontal sum by halving (a fixed tree: no reassociation flags needed)."""
    n = v.type.count
    while n > 1:
        n //= 2
        v = b.fadd(shuffle(b, v, None, range(n)), shuffle(b, v, None, range(n, 2 * n)), flags=CONTRACT)
    return b.extract_element(v, ir.Constant(I32, 0))


# the dot step -----------------------------------------------------------------------------
def dot_u8s8(kb: KernelBuilder, acc: ir.Value, u: ir.Value, s: ir.Value, u_max: int = 255) -> ir.Value:
    """acc (<16 x i32>) + per-lane sums of 4 products of unsigned u and signed s bytes.

    `u_max`: the largest value u's bytes can hold (the weight type's, WEIGHT_BYTE_MAX); the
    "avx2" flavour takes its one-instruction path when that is at most 127."""
    kind = kb.qdot
    b = kb.b
    if kind == "avx2" and u_max <= 127:
        return _dot_sum_avx2(kb, acc, [(u, s)], u_max)
    if kind == "avx2":  # u = low7 + 128 * top: both parts' pair sums fit in i16
        top = b.and_(b.bitcast(b.lshr(b.bitcast(u, vec(I16, 32)), splat_const(I16, 7, 32)), V64I8),
                     splat_const(I8, 1, 64))
        low = _dot_sum_avx2(kb, acc, [(b.and_(u, splat_const(I8, 127, 64)), s)], 127)
        return _dot_sum_avx2(kb, low, [(top, s)], 1, weight=128)
    if kind == "vnni512":
        return intrinsic(kb, "llvm.x86.avx512.vpdpbusd.512", V16I32, [acc, u, s])
    if kind == "vnni256":
        halves = []
        for h in range(2):
            lanes = range(32 * h, 32 * h + 32)
            a8 = shuffle(b, acc, None, range(8 * h, 8 * h + 8))
            halves.append(intrinsic(kb, "llvm.x86.avx512.vpdpbusd.256", vec(I32, 8),
                                    [a8, shuffle(b, u, None, lanes), shuffle(b, s, None, lanes)]))
        return concat(b, halves[0], halves[1])
    # generic: u8*s8 fits in i16 (|p| <= 32640); neighbours summed as pmaddwd would
    prod = b.mul(b.zext(u, vec(I16, 64)), b.sext(s, vec(I16, 64)))
    wide = b.sext(prod, vec(I32, 64))
    pairs = b.add(shuffle(b, wide, None, range(0, 64, 2)), shuffle(b, wide, None, range(1, 64, 2)))
    quads = b.add(shuffle(b, pairs, None, range(0, 32, 2)), shuffle(b, pairs, None, range(1, 32, 2)))
    return b.add(acc, quads)


def dot_sum_u8s8(kb: KernelBuilder, acc: ir.Value, pairs: Sequence[tuple[ir.Value, ir.Value]],
                 u_max: int = 255) -> ir.Value:
    """acc + the dots of every (u, s) pair: a kernel's run of dots into one sum.

    With VNNI, two dependency chains of vpdpbusd (consecutive dots do not wait on each
    other). With "avx2" and small weights, up to I16_SAFE // (2 * 128 * u_max) pairs' vpmaddubsw
    results are summed in i16 (exact: no lane can exceed 32767) before one vpmaddwd: per dot
    two instructions instead of three."""
    if kb.qdot == "avx2" and u_max <= 127:
        return _dot_sum_avx2(kb, acc, pairs, u_max)
    b = kb.b
    chains = [acc, zeros(I32, 16)]
    for n, (u, s) in enumerate(pairs):
        chains[n % 2] = dot_u8s8(kb, chains[n % 2], u, s, u_max)
    return b.add(chains[0], chains[1])


def dot_sum_offset128(kb: KernelBuilder, pairs: Sequence[tuple[ir.Value, ir.Value]]) -> ir.Value | None:
    """The dots of every (u, s) pair less their offset, sum((u - 128) * s), for weights
    stored with 128 added (Q8_0), on "avx2"; None on other flavours (they use dot_sum_u8s8
    and take the offset back from the activations' sums).

    llama.cpp's AVX2 sign trick: vpmaddubsw(|w|, sign(s, w)) with w = u - 128 is exact
    because the activations stay within [-127, 127] (qact.py): a pair is at most 32512. It
    replaces splitting u into 7 bits and 1 (twice the instructions)."""
    if kb.qdot != "avx2":
        return None
    b = kb.b
    v32i8, v16i16, v8i32 = vec(I8, 32), vec(I16, 16), vec(I32, 8)
    ones = splat_const(I16, 1, 16)
    abs_fn = kb.module.globals.get("llvm.abs.v32i8")
    if abs_fn is None:
        abs_fn = ir.Function(kb.module, ir.FunctionType(v32i8, [v32i8, ir.IntType(1)]), "llvm.abs.v32i8")
    halves = []
    for h in range(2):
        lanes = range(32 * h, 32 * h + 32)
        total = None
        for u, s in pairs:
            w = b.xor(shuffle(b, u, None, lanes), splat_const(I8, -128, 32))
            magnitude = b.call(abs_fn, [w, ir.Constant(ir.IntType(1), 0)])
            signed = intrinsic(kb, "llvm.x86.avx2.psign.b", v32i8, [shuffle(b, s, None, lanes), w])
            p = intrinsic(kb, "llvm.x86.avx2.pmadd.wd", v8i32,
                          [intrinsic(kb, "llvm.x86.avx2.pmadd.ub.sw", v16i16, [magnitude, signed]), ones])
            total = p if total is None else b.add(total, p)
        halves.append(total)
    return concat(b, halves[0], halves[1])


def _dot_sum_avx2(kb: KernelBuilder, acc: ir.Value, pairs: Sequence[tuple[ir.Value, ir.Value]],
                  u_max: int, weight: int = 1) -> ir.Value:
    """acc + weight * the dots (u_max <= 127): vpmaddubsw per 32-byte half, summed in i16
    in groups that cannot overflow, each group widened by one vpmaddwd against `weight`."""
    b = kb.b
    v16i16, v8i32 = vec(I16, 16), vec(I32, 8)
    ones = splat_const(I16, weight, 16)
    group = max(1, I16_SAFE // (2 * 128 * max(u_max, 1)))
    halves = []
    for h in range(2):
        lanes = range(32 * h, 32 * h + 32)
        total = shuffle(b, acc, None, range(8 * h, 8 * h + 8))
        for g in range(0, len(pairs), group):
            short = None
            for u, s in pairs[g:g + group]:
                p = intrinsic(kb, "llvm.x86.avx2.pmadd.ub.sw", v16i16,
                              [shuffle(b, u, None, lanes), shuffle(b, s, None, lanes)])
                short = p if short is None else b.add(short, p)
            total = b.add(total, intrinsic(kb, "llvm.x86.avx2.pmadd.wd", v8i32, [short, ones]))
        halves.append(total)
    return concat(b, halves[0], halves[1])


def mul_small(kb: KernelBuilder, p: ir.Value, scale: ir.Value) -> ir.Value:
    """p * scale lane-wise (<16 x i32>) for |p| < 2^15 and scales that fit in i16.

    With AVX-512 this is one vpmaddwd (the high 16 bits of each scale lane cleared, so the
    high halves contribute nothing) instead of vpmulld's two micro-ops."""
    b = kb.b
    if kb.qdot != "vnni512":
        return b.mul(p, scale)
    v32i16 = vec(I16, 32)
    low = b.bitcast(b.and_(scale, splat_const(I32, 0xFFFF, 16)), v32i16)
    return intrinsic(kb, "llvm.x86.avx512.pmaddw.d.512", V16I32, [b.bitcast(p, v32i16), low])
