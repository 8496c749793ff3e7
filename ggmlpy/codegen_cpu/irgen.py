"""A small kit for writing kernels with llvmlite.ir: the kernel ABI, loops, thread ranges,
typed loads and stores, symbolic dims as code, and vectorisable math (exp, tanh).

Every kernel has the same signature, so the graph function can call any of them:

    void kernel(ptr dst, ptr src0, ptr src1, ptr src2, ptr src3, ptr src4, ptr src5,
                ptr ctx, ptr scratch, ptr barrier, i32 ith, i32 nth)

(six sources: gated_delta_net has six, ggml's GGML_MAX_SRC is ten; most kernels read one or two.)

`ctx` points at the symbol values the kernel reads (as i64), so shapes that depend on the
ubatch are computed at run time and one kernel serves every size. A kernel built for a graph
reads them in its own order (`symbols`: lowering.kernel_signature's), from a block the
graph's node table gives each node; by default they are SYMBOLS, in that order.
"""
from __future__ import annotations

import contextlib
import functools
import math
import struct
from typing import Callable, Iterator, Sequence

import llvmlite.ir as ir

from ggmlpy.ir.symbolic import Dim, SymExpr
from ggmlpy.ir.types import GGMLType

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()
VOID = ir.VoidType()
FAST = ("fast",)
VECTOR_WIDTH = 16  # float lanes of the explicit vector loops: one AVX-512 register

# order of the symbol values at the start of the ctx array
SYMBOLS = ("n_tokens", "n_kv", "n_outputs", "n_kv_swa")
MAX_SRC = 6        # source pointers a kernel is passed
KERNEL_ARGS = ("dst", *(f"src{i}" for i in range(MAX_SRC)), "ctx", "scratch", "barrier", "ith", "nth")
KERNEL_TYPE = ir.FunctionType(VOID, [PTR] * (MAX_SRC + 4) + [I32, I32])
BARRIER_TYPE = ir.FunctionType(VOID, [PTR, I32])


class VectorConstant(ir.Constant):
    """A constant vector written `zeroinitializer` when every lane is zero. llvmlite formats a
    vector constant lane by lane, and did so at every use: building a quantised product's IR
    spent most of its time there (a third of a cold start), and the text was mostly `i8 0`."""

    def __init__(self, typ: ir.VectorType, lanes: list[ir.Constant], zero: bool):
        super().__init__(typ, lanes)
        self._zero = zero

    def _get_reference(self) -> str:
        return "zeroinitializer" if self._zero else super()._get_reference()


def vector_const(t: ir.Type, values: Sequence) -> ir.Constant:
    """The constant <values> of element type t, one shared object per distinct value (its text
    is then formatted once, however many kernels use it)."""
    values = tuple(values)
    return _vector_const(t, repr(values), values)   # repr: 0.0 and -0.0 are different constants


@functools.lru_cache(maxsize=8192)
def _vector_const(t: ir.Type, key: str, values: tuple) -> ir.Constant:
    zero = all(v == 0 and math.copysign(1.0, v) > 0 for v in values)   # -0.0 is not zeroinitializer
    return VectorConstant(ir.VectorType(t, len(values)), [ir.Constant(t, v) for v in values], zero)


def zero_vector(typ: ir.VectorType) -> ir.Constant:
    """A vector of zeros of type typ (also what the unused operand of a shuffle is given)."""
    return vector_const(typ.element, [0] * typ.count)


def i64(v: int) -> ir.Constant:
    return ir.Constant(I64, int(v))


def f32(v: float) -> ir.Constant:
    return ir.Constant(F32, float(v))


class KernelBuilder:
    """Builds one kernel function; `b` is the IRBuilder positioned in its body."""

    def __init__(self, module: ir.Module, name: str, qdot: str | None = None,
                 symbols: Sequence[str] = SYMBOLS, extra_args: Sequence[tuple[str, ir.Type]] = ()):
        """qdot: the quantised dot flavour (kernels/qvec.py) this kernel is built with, the
        backend's Options.cpu_qdot; None: qvec.flavour() (set_flavour's, else the host's best).
        symbols: the symbols whose values `ctx` holds, in order (a symbol not among them is
        an error naming it). extra_args: (name, type) of arguments after the kernel's own (a
        helper function's, see `call_helper`)."""
        if qdot is None:
            from ggmlpy.codegen_cpu.kernels.qvec import flavour  # (qvec imports this module)

            qdot = flavour()
        self.qdot = qdot
        self.symbols = tuple(symbols)
        self.module = module
        fn_type = ir.FunctionType(VOID, [*KERNEL_TYPE.args, *(t for _, t in extra_args)])
        self.fn = ir.Function(module, fn_type, name)
        self.fn.linkage = "internal"
        self.fn.attributes.add("noinline")  # kernels are shared; inlining ~1000 calls would bloat compile time
        names = (*KERNEL_ARGS, *(n for n, _ in extra_args))
        for arg, n in zip(self.fn.args, names):
            arg.name = n
        self.args = {n: a for n, a in zip(names, self.fn.args)}
        self._entry = self.fn.append_basic_block("entry")
        body = self.fn.append_basic_block("body")
        self.b = ir.IRBuilder(body)
        self._sym_cache: dict[str, ir.Value] = {}
        self.ith = self.b.sext(self.args["ith"], I64, name="ith64")
        self.nth = self.b.sext(self.args["nth"], I64, name="nth64")

    # values ---------------------------------------------------------------------------------
    def arg(self, name: str) -> ir.Value:
        return self.args[name]

    def sym(self, name: str) -> ir.Value:
        if name not in self._sym_cache:
            if name not in self.symbols:
                raise KeyError(f"kernel {self.fn.name} reads symbol {name!r}, not among its {self.symbols}")
            with self.b.goto_block(self._entry):
                p = self.b.gep(self.args["ctx"], [i64(self.symbols.index(name))], source_etype=I64)
                self._sym_cache[name] = self.b.load(p, name=name, typ=I64)
        return self._sym_cache[name]

    def dim(self, d: Dim) -> ir.Value:
        """A (possibly symbolic) dimension or stride as an i64 value."""
        if not isinstance(d, SymExpr):
            return i64(d)
        total: ir.Value | None = None
        for mono, coef in d.terms.items():
            term: ir.Value = i64(coef)
            for s in mono:
                term = self.b.mul(term, self.sym(s))
            total = term if total is None else self.b.add(total, term)
        return total if total is not None else i64(0)

    def var(self, typ: ir.Type, init: ir.Value, name: str = "") -> ir.AllocaInstr:
        """A mutable local (an alloca in the entry block; LLVM promotes it to a register)."""
        with self.b.goto_block(self._entry):
            slot = self.b.alloca(typ, name=name)
        self.b.store(init, slot)
        return slot

    def finish(self) -> ir.Function:
        self.b.ret_void()
        with self.b.goto_block(self._entry):
            self.b.branch(self.fn.blocks[1])
        return self.fn

    def call_helper(self, name: str, extra_args: Sequence[tuple[str, ir.Type]],
                    build: Callable[["KernelBuilder"], None], values: Sequence[ir.Value]) -> None:
        """Call this kernel's helper function `name` with the kernel's own arguments and
        `values` for `extra_args`; the first call builds it, by build(helper), where `helper`
        is a KernelBuilder over it (same module, flavour and symbols; `helper.arg(name)` reads
        an extra argument). Code a kernel repeats for every tile shape (the attention's softmax
        row: nine copies) is then compiled once, not inlined: a tenth of the IR to optimise."""
        full = f"{self.fn.name}.{name}"
        fn = self.module.globals.get(full)
        if fn is None:
            helper = KernelBuilder(self.module, full, self.qdot, self.symbols, extra_args)
            build(helper)
            fn = helper.finish()
        self.b.call(fn, [*self.fn.args[:len(KERNEL_ARGS)], *values])

    # control flow ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def loop(self, start: ir.Value, stop: ir.Value, name: str = "i", step: int = 1) -> Iterator[ir.Value]:
        with self._while_below(start, stop, name, lambda i: self.b.add(i, i64(step))) as i:
            yield i

    @contextlib.contextmanager
    def _while_below(self, start: ir.Value, stop: ir.Value, name: str,
                     advance: Callable[[ir.Value], ir.Value]) -> Iterator[ir.Value]:
        """A loop over i from start while i < stop, i's next value `advance(i)` (emitted at
        the end of the body)."""
        b = self.b
        pre = b.block
        head = b.append_basic_block(f"{name}.head")
        body = b.append_basic_block(f"{name}.body")
        done = b.append_basic_block(f"{name}.done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name=name)
        i.add_incoming(start, pre)
        b.cbranch(b.icmp_signed("<", i, stop), body, done)
        b.position_at_end(body)
        yield i
        i.add_incoming(advance(i), b.block)
        b.branch(head)
        b.position_at_end(done)

    @contextlib.contextmanager
    def if_then(self, cond: ir.Value) -> Iterator[None]:
        with self.b.if_then(cond):
            yield

    def thread_range(self, n: ir.Value) -> tuple[ir.Value, ir.Value]:
        """This thread's share [start, end) of n items, as ggml splits rows."""
        b = self.b
        per = b.sdiv(b.add(n, b.sub(self.nth, i64(1))), self.nth)
        start = b.mul(per, self.ith)
        end = b.add(start, per)
        start = b.select(b.icmp_signed("<", start, n), start, n)
        end = b.select(b.icmp_signed("<", end, n), end, n)
        return start, end

    @contextlib.contextmanager
    def claimed_chunks(self, n: ir.Value, name: str = "chunk") -> Iterator[ir.Value]:
        """Chunks 0..n-1 of work taken by whichever thread is free: thread ith starts with
        chunk ith, then claims the next unclaimed one from the shared counter (ggml's
        chunking). A thread slowed by its neighbours (a shared VM's memory, an interrupt)
        then does less, instead of the others waiting for it at the barrier. The counter
        must have been set by `reset_chunks` before a barrier all threads passed since."""
        def claim(_: ir.Value) -> ir.Value:
            return self.b.atomic_rmw("add", self._chunk_counter(), i64(1), "monotonic")

        with self._while_below(self.ith, n, name, claim) as chunk:
            yield chunk

    def reset_chunks(self) -> None:
        """Thread 0 sets the chunk counter to nth (the chunks the threads start with); a
        barrier must follow before `claimed_chunks` runs."""
        with self.b.if_then(self.b.icmp_signed("==", self.ith, i64(0))):
            self.b.atomic_rmw("xchg", self._chunk_counter(), self.nth, "monotonic")

    def _chunk_counter(self) -> ir.Value:
        """An i64 in the barrier's memory, a cache line after its own words (CHUNK_COUNTER)."""
        return self.byte_ptr(self.args["barrier"], i64(CHUNK_COUNTER))

    def barrier(self) -> None:
        fn = self.module.globals.get("ggmlpy_barrier")
        self.b.call(fn, [self.args["barrier"], self.args["nth"]])

    # memory ---------------------------------------------------------------------------------
    def byte_ptr(self, base: ir.Value, offset: ir.Value) -> ir.Value:
        return self.b.gep(base, [offset], source_etype=I8)

    def elem_ptr(self, base: ir.Value, index: ir.Value, typ: ir.Type) -> ir.Value:
        return self.b.gep(base, [index], source_etype=typ)

    def load(self, ptr: ir.Value, t: GGMLType) -> ir.Value:
        """An element of type t, as f32."""
        b = self.b
        if t == GGMLType.F32:
            return b.load(ptr, typ=F32, align=4)
        if t == GGMLType.F16:
            return b.fpext(b.load(ptr, typ=F16, align=2), F32)
        if t == GGMLType.BF16:
            bits = b.zext(b.load(ptr, typ=I16, align=2), I32)
            return b.bitcast(b.shl(bits, ir.Constant(I32, 16)), F32)
        if t == GGMLType.I32:
            return b.sitofp(b.load(ptr, typ=I32, align=4), F32)
        raise NotImplementedError(f"load of {t.name}")

    def store(self, ptr: ir.Value, value: ir.Value, t: GGMLType) -> None:
        b = self.b
        if t == GGMLType.F32:
            b.store(value, ptr, align=4)
        elif t == GGMLType.F16:
            b.store(b.fptrunc(value, F16), ptr, align=2)
        elif t == GGMLType.BF16:
            b.store(b.trunc(b.lshr(self._bf16_round(value), ir.Constant(I32, 16)), I16), ptr, align=2)
        else:
            raise NotImplementedError(f"store of {t.name}")

    def load_i64(self, ptr: ir.Value, t: GGMLType) -> ir.Value:
        if t == GGMLType.I32:
            return self.b.sext(self.b.load(ptr, typ=I32, align=4), I64)
        if t == GGMLType.I64:
            return self.b.load(ptr, typ=I64, align=8)
        raise NotImplementedError(f"index load of {t.name}")

    # vectors --------------------------------------------------------------------------------
    # The math below takes scalars or <n x float> vectors alike: a scalar operand (a constant
    # of a formula, a row's mean) meeting a vector is splatted first, so each formula (exp,
    # silu, gelu ...) is written once and serves the scalar and the vector loops.
    def splat(self, scalar: ir.Value, n: int) -> ir.Value:
        """An n-lane vector of `scalar` (a constant stays a constant)."""
        vt = ir.VectorType(scalar.type, n)
        if isinstance(scalar, ir.Constant):
            return vector_const(scalar.type, [scalar.constant] * n)
        v = self.b.insert_element(zero_vector(vt), scalar, ir.Constant(I32, 0))
        return self.b.shuffle_vector(v, zero_vector(vt), vector_const(I32, [0] * n))

    def like(self, value: ir.Value, ref: ir.Value) -> ir.Value:
        """`value` splatted to ref's lane count when ref is a vector and value a scalar."""
        if isinstance(ref.type, ir.VectorType) and not isinstance(value.type, ir.VectorType):
            return self.splat(value, ref.type.count)
        return value

    def _same_shape(self, args: Sequence[ir.Value]) -> list[ir.Value]:
        ref = next((a for a in args if isinstance(a.type, ir.VectorType)), None)
        return list(args) if ref is None else [self.like(a, ref) for a in args]

    def reduce(self, v: ir.Value, combine: Callable[[ir.Value, ir.Value], ir.Value]) -> ir.Value:
        """Fold a vector's lanes to a scalar by halving: combine(low half, high half) until
        one lane is left (a fixed tree, so no reassociation flags are needed)."""
        n = v.type.count
        while n > 1:
            n //= 2
            unused = zero_vector(v.type)
            lo = self.b.shuffle_vector(v, unused, vector_const(I32, range(n)))
            hi = self.b.shuffle_vector(v, unused, vector_const(I32, range(n, 2 * n)))
            v = combine(lo, hi)
        return self.b.extract_element(v, ir.Constant(I32, 0))

    def lane_mask(self, n_valid: ir.Value, n: int) -> ir.Value:
        """<n x i1>: lanes below n_valid (an i64 in [0, n]) set, for a row's last partial vector."""
        lanes = vector_const(I64, range(n))
        return self.b.icmp_signed("<", lanes, self.splat(n_valid, n))

    def vector_chunks(self, n: ir.Value, body: Callable[[ir.Value, ir.Value | None], None],
                      width: int = VECTOR_WIDTH) -> None:
        """body(i, mask) for i = 0, width, 2*width ... below n (an i64): full chunks get mask
        None, the last partial one (if any) a lane mask, for masked loads and stores. The body
        is emitted twice, once per kind of chunk."""
        b = self.b
        if isinstance(n, ir.Constant):  # a static size: no run-time test for the tail
            n_full = i64(n.constant - n.constant % width)
            with self.loop(i64(0), n_full, "v", step=width) as i:
                body(i, None)
            if n.constant % width:
                body(n_full, self.lane_mask(i64(n.constant % width), width))
            return
        n_full = b.and_(n, i64(-width))
        with self.loop(i64(0), n_full, "v", step=width) as i:
            body(i, None)
        with self.if_then(b.icmp_signed("<", n_full, n)):
            body(n_full, self.lane_mask(b.sub(n, n_full), width))

    def _masked_mem(self, op: str, vt: ir.VectorType, mask_type: ir.Type) -> ir.Function:
        name = f"llvm.masked.{op}.{_suffix(vt)}.p0"
        fn = self.module.globals.get(name)
        if fn is None:
            if op == "load":
                ftype = ir.FunctionType(vt, [PTR, I32, mask_type, vt])
            else:
                ftype = ir.FunctionType(VOID, [vt, PTR, I32, mask_type])
            fn = ir.Function(self.module, ftype, name)
        return fn

    def _raw_vector(self, ptr: ir.Value, vt: ir.VectorType, align: int, mask: ir.Value | None,
                    fill: ir.Value) -> ir.Value:
        if mask is None:
            return self.b.load(ptr, typ=vt, align=align)
        return self.b.call(self._masked_mem("load", vt, mask.type), [ptr, ir.Constant(I32, align), mask, fill])

    def load_vector(self, ptr: ir.Value, t: GGMLType, n: int, mask: ir.Value | None = None,
                    fill: float = 0.0) -> ir.Value:
        """n consecutive elements of type t as <n x float>; with a mask, the unset lanes are
        not read (they may lie past the end of the buffer) and hold `fill`."""
        b = self.b
        if t == GGMLType.F32:
            return self._raw_vector(ptr, ir.VectorType(F32, n), 4, mask, self.splat(f32(fill), n))
        if t == GGMLType.F16:
            raw = self._raw_vector(ptr, ir.VectorType(F16, n), 2, mask, self.splat(ir.Constant(F16, fill), n))
            return b.fpext(raw, ir.VectorType(F32, n))
        if t == GGMLType.BF16:
            fill_bits = (struct.unpack("<I", struct.pack("<f", fill))[0] >> 16) & 0xFFFF
            raw = self._raw_vector(ptr, ir.VectorType(I16, n), 2, mask, self.splat(ir.Constant(I16, fill_bits), n))
            bits = b.shl(b.zext(raw, ir.VectorType(I32, n)), self.splat(ir.Constant(I32, 16), n))
            return b.bitcast(bits, ir.VectorType(F32, n))
        raise NotImplementedError(f"vector load of {t.name}")

    def store_vector(self, ptr: ir.Value, value: ir.Value, t: GGMLType, mask: ir.Value | None = None) -> None:
        """Store <n x float> as n elements of type t; with a mask, only the set lanes."""
        b = self.b
        n = value.type.count
        if t == GGMLType.F32:
            raw, align = value, 4
        elif t == GGMLType.F16:
            raw, align = b.fptrunc(value, ir.VectorType(F16, n)), 2
        elif t == GGMLType.BF16:
            raw, align = b.trunc(b.lshr(self._bf16_round(value), self.splat(ir.Constant(I32, 16), n)),
                                 ir.VectorType(I16, n)), 2
        else:
            raise NotImplementedError(f"vector store of {t.name}")
        if mask is None:
            b.store(raw, ptr, align=align)
        else:
            b.call(self._masked_mem("store", raw.type, mask.type), [raw, ptr, ir.Constant(I32, align), mask])

    def _bf16_round(self, value: ir.Value) -> ir.Value:
        """f32 bits rounded to nearest even at bit 16, as ggml_compute_fp32_to_bf16 (not yet shifted)."""
        b = self.b
        i32 = ir.VectorType(I32, value.type.count) if isinstance(value.type, ir.VectorType) else I32
        bits = b.bitcast(value, i32)
        c = lambda v: self.like(ir.Constant(I32, v), bits)  # noqa: E731
        return b.add(bits, b.add(c(0x7FFF), b.and_(b.lshr(bits, c(16)), c(1))))

    # math -----------------------------------------------------------------------------------
    def fadd(self, x, y):
        x, y = self._same_shape((x, y))
        return self.b.fadd(x, y, flags=FAST)

    def fmul(self, x, y):
        x, y = self._same_shape((x, y))
        return self.b.fmul(x, y, flags=FAST)

    def fsub(self, x, y):
        x, y = self._same_shape((x, y))
        return self.b.fsub(x, y, flags=FAST)

    def fdiv(self, x, y, fast: bool = True):
        """x / y; `fast=False` for an IEEE quotient (fast-math vector code may use a
        reciprocal estimate)."""
        x, y = self._same_shape((x, y))
        return self.b.fdiv(x, y, flags=FAST if fast else ())

    def select(self, cond: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
        x, y = self._same_shape((cond, x, y))[1:]
        return self.b.select(cond, x, y)

    def fcmp(self, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
        """Ordered compare (false when either side is NaN), lane-wise for vectors."""
        x, y = self._same_shape((x, y))
        return self.b.fcmp_ordered(op, x, y)

    def intrinsic(self, name: str, args: Sequence[ir.Value], typ: ir.Type = F32) -> ir.Value:
        """Call an overloaded math intrinsic (llvm.sqrt, llvm.maxnum ...) on `typ` values, or on
        vectors when an argument is one (scalar arguments are then splatted)."""
        args = self._same_shape(args)
        typ = next((a.type for a in args if isinstance(a.type, ir.VectorType)), typ)
        full = f"{name}.{_suffix(typ)}"
        fn = self.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(typ, [typ] * len(args)), full)
        return self.b.call(fn, list(args))

    def fmax(self, x, y):
        return self.intrinsic("llvm.maxnum", [x, y])

    def sqrt(self, x):
        return self.intrinsic("llvm.sqrt", [x])

    def exp(self, x: ir.Value) -> ir.Value:
        """exp(x) with a polynomial (no libm call), for scalars and float vectors alike.

        Range reduction x = n*ln2 + r, |r| <= ln2/2, then a degree-6 polynomial for e^r and
        2^n built in the exponent bits; relative error about 2e-7 over float32's range. A NaN
        comes out NaN, as from expf (the clamp below would turn it into a finite number).
        """
        b = self.b
        nan_in = x
        x = self.intrinsic("llvm.maxnum", [self.intrinsic("llvm.minnum", [x, f32(88.3762626647949)]), f32(-88.0)])
        n = self.intrinsic("llvm.rint", [self.fmul(x, f32(1.44269504088896341))])
        r = self.fsub(x, self.fmul(n, f32(0.693359375)))
        r = self.fadd(r, self.fmul(n, f32(2.12194440e-4)))
        p = f32(1.9875691500e-4)
        for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
            p = self.fadd(self.fmul(p, r), f32(c))
        p = self.fadd(self.fmul(self.fmul(p, r), r), self.fadd(r, f32(1.0)))
        i32 = ir.VectorType(I32, x.type.count) if isinstance(x.type, ir.VectorType) else I32
        ni = b.fptosi(n, i32)
        biased = b.add(ni, self.like(ir.Constant(I32, 127), ni))
        scale = b.bitcast(b.shl(biased, self.like(ir.Constant(I32, 23), ni)), x.type)
        return self.select(b.fcmp_unordered("uno", nan_in, nan_in), nan_in, self.fmul(p, scale))

    def log(self, x: ir.Value) -> ir.Value:
        """ln(x) with a polynomial (no libm call; Cephes' logf), for scalars and float
        vectors: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), then ln(m) by a degree-9
        polynomial in m - 1; relative error about 1e-7 for normal x > 0, NaN for x < 0,
        -inf at 0 (subnormals are taken as 0)."""
        b = self.b
        n = x.type.count if isinstance(x.type, ir.VectorType) else None
        i32 = ir.VectorType(I32, n) if n else I32
        c = (lambda v: self.like(ir.Constant(I32, v), bits))
        bits = b.bitcast(x, i32)
        e = b.sub(b.and_(b.lshr(bits, c(23)), c(0xFF)), c(126))
        m = b.bitcast(b.or_(b.and_(bits, c(0x807FFFFF)), c(0x3F000000)), x.type)   # [0.5, 1)
        small = self.fcmp("<", m, f32(0.70710678118654752))
        e = b.sub(e, b.zext(small, i32))
        m = self.fsub(self.select(small, self.fadd(m, m), m), f32(1.0))
        z = self.fmul(m, m)
        p = f32(7.0376836292e-2)
        for k in (-1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
                  2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1):
            p = self.fadd(self.fmul(p, m), f32(k))
        ef = b.sitofp(e, x.type)
        y = self.fadd(self.fmul(self.fmul(p, m), z), self.fmul(ef, f32(-2.12194440e-4)))
        y = self.fadd(y, self.fmul(z, f32(-0.5)))
        y = self.fadd(self.fadd(m, y), self.fmul(ef, f32(0.693359375)))
        # no fast-math on these compares: they sort out the inputs the polynomial cannot take
        y = self.select(b.fcmp_ordered(">", x, self.like(f32(0.0), x)), y, self.like(f32(float("nan")), x))
        y = self.select(b.fcmp_ordered("==", x, self.like(f32(0.0), x)), self.like(f32(float("-inf")), x), y)
        return self.select(b.fcmp_ordered("==", x, self.like(f32(float("inf")), x)), x, y)

    def erf(self, x: ir.Value) -> ir.Value:
        """erf(x) by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7, plus exp's),
        for scalars and vectors: 1 - t*poly(t)*exp(-x^2) with t = 1/(1 + p|x|), x's sign.
        Close to libm's erff where it matters for gelu_erf, 0.5*x*(1 + erf(x/sqrt 2)), whose
        error stays absolute in (1 + erf)."""
        ax = self.intrinsic("llvm.fabs", [x])
        t = self.fdiv(f32(1.0), self.fadd(f32(1.0), self.fmul(f32(0.3275911), ax)))
        poly = f32(1.061405429)
        for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
            poly = self.fadd(self.fmul(poly, t), f32(c))
        e = self.exp(self.b.fneg(self.fmul(ax, ax)))
        y = self.fsub(f32(1.0), self.fmul(self.fmul(poly, t), e))
        return self.intrinsic("llvm.copysign", [y, x])

    def tanh(self, x: ir.Value) -> ir.Value:
        """tanh(x) = 1 - 2 / (exp(2x) + 1), saturating cleanly for large |x|."""
        e = self.exp(self.fmul(x, f32(2.0)))
        return self.fsub(f32(1.0), self.fdiv(f32(2.0), self.fadd(e, f32(1.0))))


def _suffix(t: ir.Type) -> str:
    """An intrinsic's type suffix: f32, v16f32, v16i16 ..."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_suffix(t.element)}"
    return {F32: "f32", F64: "f64", F16: "f16", I16: "i16", I32: "i32", I8: "i8", I64: "i64"}[t]


def round_f16(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """x (f32, scalar or vector) rounded to f16 and back: where ggml's CPU backend computes
    through f16, kernels that match its results do the same."""
    half = ir.VectorType(F16, x.type.count) if isinstance(x.type, ir.VectorType) else F16
    return b.fpext(b.fptrunc(x, half), x.type)


def declare_barrier(module: ir.Module) -> ir.Function:
    """Declare the barrier; its body (BARRIER_IR) is appended to the module's text, since
    llvmlite's builder cannot emit atomic stores through opaque pointers."""
    return ir.Function(module, BARRIER_TYPE, "ggmlpy_barrier")


# The barrier's memory (CpuSplit.barrier, BARRIER_BYTES): its {count, phase} words, and one
# cache line on the work counter of `claimed_chunks`.
CHUNK_COUNTER = 64
BARRIER_BYTES = 128


def barrier_ir(triple: str) -> str:
    """A sense-reversing spin barrier over {i32 count, i32 phase} shared by the threads.

    After a short spin a waiting thread yields its core: on a loaded machine the thread it
    waits for may have been preempted, and spinning would only keep it off the CPU."""
    pause = "call void @llvm.x86.sse2.pause()" if triple.startswith("x86_64") else ""
    text = BARRIER_IR.replace("PAUSE", pause)
    text += "declare i32 @sched_yield()\n"
    return text + ("declare void @llvm.x86.sse2.pause()\n" if pause else "")


BARRIER_IR = r"""
define internal void @ggmlpy_barrier(ptr %state, i32 %nth) {
entry:
  %one = icmp sle i32 %nth, 1
  br i1 %one, label %ret, label %work
work:
  %phase_p = getelementptr i32, ptr %state, i64 1
  %phase = load atomic i32, ptr %phase_p acquire, align 4
  %arrived = atomicrmw add ptr %state, i32 1 acq_rel
  %lastn = sub i32 %nth, 1
  %last = icmp eq i32 %arrived, %lastn
  br i1 %last, label %release, label %spin
release:
  store atomic i32 0, ptr %state monotonic, align 4
  %next = add i32 %phase, 1
  store atomic i32 %next, ptr %phase_p release, align 4
  br label %ret
spin:
  %n = phi i32 [0, %work], [%n1, %yield], [%n1, %relax]
  %now = load atomic i32, ptr %phase_p acquire, align 4
  %same = icmp eq i32 %now, %phase
  br i1 %same, label %pause, label %ret
pause:
  %n1 = add i32 %n, 1
  %long = icmp sgt i32 %n, 2000
  br i1 %long, label %yield, label %relax
yield:
  %r = call i32 @sched_yield()
  br label %spin
relax:
  PAUSE
  br label %spin
ret:
  ret void
}
"""
