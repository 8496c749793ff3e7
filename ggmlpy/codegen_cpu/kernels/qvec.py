"""Vector IR pieces for the quantised kernels: constant vectors, shuffles, unaligned loads,
reductions, and the one primitive everything is built on, the u8 x s8 dot step.

`dot_u8s8(acc, u, s)` adds, to each of 16 i32 lanes, the sum of 4 consecutive byte products
(lane i: bytes 4i..4i+3), which is what `vpdpbusd` does. How it is emitted is the *flavour*:

- "vnni512": one `llvm.x86.avx512.vpdpbusd.512` (AVX-512 VNNI; operands `<64 x i8>` in
  LLVM 22, checked by compiling a tiny module);
- "vnni256": two `llvm.x86.avx512.vpdpbusd.256` (AVX-VNNI hosts without AVX-512: the same
  intrinsic is emitted with the VEX encoding there);
- "generic": plain vector IR (widen, multiply, add neighbours) that LLVM legalises for any
  target; the portable path.

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

from ggmlpy.codegen_cpu.irgen import F32, I8, I16, I32, KernelBuilder
from ggmlpy.codegen_cpu.target import host
from ggmlpy.options import QDOT_FLAVOURS

FLAVOURS = QDOT_FLAVOURS  # ("vnni512", "vnni256", "generic"), what Options.cpu_qdot accepts
# Float flags: fusing into FMAs, but no reassociation, which would merge the separate
# accumulators the kernels keep to break dependency chains.
CONTRACT = ("contract",)
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
    return "generic"


# constants and shuffles ----------------------------------------------------------------------
def const(t: ir.Type, values: Sequence) -> ir.Constant:
    return ir.Constant(vec(t, len(values)), [ir.Constant(t, v) for v in values])


def splat_const(t: ir.Type, value, n: int) -> ir.Constant:
    return const(t, [value] * n)


def zeros(t: ir.Type, n: int) -> ir.Constant:
    return splat_const(t, 0.0 if t == F32 else 0, n)


def shuffle(b: ir.IRBuilder, x: ir.Value, y: ir.Value | None, mask: Sequence[int]) -> ir.Value:
    """shufflevector; with y None, indices refer to x alone."""
    if y is None:
        y = ir.Constant(x.type, None)
    return b.shuffle_vector(x, y, const(I32, list(mask)))


def concat(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    n = x.type.count
    return shuffle(b, x, y, range(2 * n))


def splat(b: ir.IRBuilder, scalar: ir.Value, n: int) -> ir.Value:
    v = b.insert_element(ir.Constant(vec(scalar.type, n), None), scalar, ir.Constant(I32, 0))
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
    return shuffle(b, v, ir.Constant(v.type, [ir.Constant(v.type.element, 0)] * k), mask)


def load_vec(b: ir.IRBuilder, ptr: ir.Value, t: ir.Type, n: int) -> ir.Value:
    """n elements of t from any address (GGUF blocks are 18-210 bytes: no alignment)."""
    return b.load(ptr, typ=vec(t, n), align=1)


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


def prefetch(kb: KernelBuilder, ptr: ir.Value) -> None:
    """Ask for the cache line at ptr (read, keep in every level): prefetches never fault."""
    i32 = ir.IntType(32)
    fn = kb.module.globals.get("llvm.prefetch.p0")
    if fn is None:
        fn = ir.Function(kb.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]), "llvm.prefetch.p0")
    kb.b.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


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
def dot_u8s8(kb: KernelBuilder, acc: ir.Value, u: ir.Value, s: ir.Value) -> ir.Value:
    """acc (<16 x i32>) + per-lane sums of 4 products of unsigned u and signed s bytes."""
    kind = kb.qdot
    b = kb.b
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
