"""Quantised activations: the f32 rows of a matrix product's right operand, as 8-bit blocks in
the kernel's scratch, so that the dot products work on integers (as ggml's Q8_0/Q8_1/Q8_K).

The format is internal to the kernel, so it is laid out for the dot loop rather than as
ggml's structs. A row is a run of *steps* (the values one iteration of the dot loop
consumes: 64 for 32-block weights, 256 for K-quants), each step 64-byte aligned:

    q    step_elems x i8   the quantised values, in order
    ad   16 x f32          the activation scale of each of the 16 dot lanes
    aux  16 x f32          scale times sums of quantised values, in the lanes the weight
                           side's correction vector uses (see qdot.py)

`ad` and `aux` are what every weight row would otherwise rebuild from the scales and sums
(broadcasts, conversions, a multiply): stored once per token, they are plain memory operands
in the dot loop, which matters most for decode, where one token meets every weight row.

- "q8_32_*" (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL, and Q2_0, Q1_0, NVFP4 as ggml multiplies them
  against Q8_0): a step is two blocks of 32 with their own f32
  scale; lanes 0-7 belong to the first block, 8-15 to the second. For weights stored with an
  offset o (Q4_0: 8, Q5_0: 16, Q8_0: 128, MXFP4's decoded codes: 12) aux is the i32 vector
  that starts the dot's accumulator, -o * sum(q) in lanes 0 and 8, so the offset is undone
  exactly and for free;
  for Q4_1 and Q5_1 ("q8_32_min") aux holds d * sum(q) in lanes 1 and 3, where the weight side puts
  the blocks' minimums. An odd last block gets a step whose second half is zero. Weights
  whose scale changes every 16 values (NVFP4) take "q8_32_off*_sum4": -o * the sum of
  each lane's own four values, in every lane.
- "q8_256_32" (Q4_K, Q5_K) and "q8_256_16" (Q6_K): one scale per 256 values (ggml's Q8_K);
  aux lane i holds d * the sum of the i-th group of 32 (lanes 0-7) or of 16 values.

The numbers are those of ggml's x86 quantize_row_q8_0 / q8_1 / q8_K, bit for bit:
q = round-half-even(x * (127 / amax)); for 32-blocks d = amax / 127 rounded to f16, and Q8_1's
sum term f16(d * sum(q)) with the unrounded d; for Q8_K d = 1 / (127 / amax). Rounding as
llama.cpp rounds keeps our results close to its own (its activation rounding errors are then
ours too, rather than independent ones adding up), which is what golden comparisons measure.
The scales are stored as f32, so the dot loop needs no conversion.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, I8, I32, I64, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.kernels.qvec import (
    CONTRACT, concat, shuffle, sitofp, splat, splat_const, store_vec, vabs, vec, vrint, zeros,
)
from ggmlpy.ir.tensor import Tensor

ALIGN = 64


@dataclass(frozen=True)
class ActFormat:
    name: str
    block: int                 # values per scale
    step_elems: int            # values per dot-loop step
    sum_group: int             # values per activation sum in aux
    offset: int | None = None  # q8_32: aux holds -offset * sum(q) as i32 (else d * sum(q))

    @property
    def step_bytes(self) -> int:
        return self.step_elems + 2 * 64

    def n_steps(self, k: int) -> int:
        return -(-k // self.step_elems)

    def row_bytes(self, k: int) -> int:
        return self.n_steps(k) * self.step_bytes

    def scratch_bytes(self, k: int, rows: int) -> int:
        return rows * self.row_bytes(k) + ALIGN  # + room to align the base


def q8_32(offset: int | None, sum_group: int = 32) -> ActFormat:
    """sum_group 4: the offset's sums per dot lane (weights whose scale changes within a block of
    32, NVFP4's per-16 scales: kernels/qwide.py)."""
    name = "q8_32_min" if offset is None else f"q8_32_off{offset}"
    return ActFormat(name if sum_group == 32 else f"{name}_sum{sum_group}", 32, 64, sum_group, offset)


Q8_256_32 = ActFormat("q8_256_32", 256, 256, 32)
Q8_256_16 = ActFormat("q8_256_16", 256, 256, 16)


def aligned_scratch(kb: KernelBuilder) -> ir.Value:
    """The scratch pointer rounded up to 64 bytes (numpy gives 16-byte aligned buffers)."""
    b = kb.b
    p = b.ptrtoint(kb.arg("scratch"), I64)
    p = b.and_(b.add(p, i64(ALIGN - 1)), i64(-ALIGN))
    return b.inttoptr(p, ir.PointerType())


def quantize_rows(kb: KernelBuilder, x: Tensor, fmt: ActFormat, k: int, base: ir.Value,
                  x_arg: str = "src1") -> None:
    """Every row of x (the kernel argument `x_arg`, split over the threads) quantised into
    `base` rows of fmt.row_bytes(k)."""
    b = kb.b
    start, end = kb.thread_range(n_rows(kb, x))
    with kb.loop(start, end, "qr") as r:
        i1, i2, i3 = unravel_row(kb, x, r)
        xrow = row_ptr(kb, kb.arg(x_arg), x, i1, i2, i3)
        qrow = kb.byte_ptr(base, b.mul(r, i64(fmt.row_bytes(k))))
        if fmt.block == 32:
            _rows_q8_32(kb, xrow, qrow, fmt, k)
        else:
            _rows_q8_256(kb, xrow, qrow, fmt, k)


# pieces -------------------------------------------------------------------------------------
def _load32(kb: KernelBuilder, xrow: ir.Value, first: ir.Value) -> ir.Value:
    return kb.b.load(kb.elem_ptr(xrow, first, F32), typ=vec(F32, 32), align=4)


def _vmax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.fcmp_ordered(">", x, y), x, y)


def _amax(kb: KernelBuilder, xs: list[ir.Value]) -> ir.Value:
    """max |x| over 32-value vectors, by halving (compiles to vmaxps, no NaN bookkeeping)."""
    b = kb.b
    m = vabs(kb, xs[0])
    for x in xs[1:]:
        m = _vmax(b, m, vabs(kb, x))
    n = m.type.count
    while n > 1:
        n //= 2
        m = _vmax(b, shuffle(b, m, None, range(n)), shuffle(b, m, None, range(n, 2 * n)))
    return b.extract_element(m, ir.Constant(I32, 0))


def _scale(kb: KernelBuilder, amax: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(d, 1/d) mapping [-amax, amax] onto [-127, 127]; 1/d = 0 for an all-zero block."""
    b = kb.b
    d = b.fdiv(amax, f32(127.0))
    inv = b.select(b.fcmp_ordered(">", amax, f32(0.0)), b.fdiv(f32(127.0), amax), f32(0.0))
    return d, inv


def _quantize32(kb: KernelBuilder, x: ir.Value, inv: ir.Value) -> ir.Value:
    """<32 x float> -> <32 x i32> of round-to-nearest-even(x * inv)."""
    b = kb.b
    return b.fptosi(vrint(kb, b.fmul(x, splat(b, inv, 32), flags=CONTRACT)), vec(I32, 32))


def _sum_groups(kb: KernelBuilder, q: ir.Value, group: int) -> list[ir.Value]:
    """Sums of consecutive groups of `group` lanes of an i32 vector, by pairwise halving."""
    b = kb.b
    n = q.type.count
    v = q
    while n > q.type.count // group:
        n //= 2
        v = b.add(shuffle(b, v, None, range(0, 2 * n, 2)), shuffle(b, v, None, range(1, 2 * n, 2)))
    return [b.extract_element(v, ir.Constant(I32, i)) for i in range(n)]


def _store_step_tail(kb: KernelBuilder, sp: ir.Value, fmt: ActFormat, ad: ir.Value, aux: ir.Value) -> None:
    b = kb.b
    store_vec(b, ad, kb.byte_ptr(sp, i64(fmt.step_elems)))
    store_vec(b, aux, kb.byte_ptr(sp, i64(fmt.step_elems + 64)))


def _f16(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """v rounded to half precision (and back), as ggml stores its activation scales."""
    return b.fpext(b.fptrunc(v, ir.HalfType()), F32)


def _block32(kb: KernelBuilder, xrow: ir.Value, blk: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """One block of 32 as ggml's quantize_row_q8_0/q8_1 make it: (q as <32 x i32>, d as the
    f16 scale, sum(q), f16(d * sum(q)) with the unrounded d, Q8_1's s)."""
    b = kb.b
    x = _load32(kb, xrow, b.mul(blk, i64(32)))
    d, inv = _scale(kb, _amax(kb, [x]))
    q = _quantize32(kb, x, inv)
    s = _sum_groups(kb, q, 32)[0]
    return q, _f16(b, d), s, _f16(b, b.fmul(d, b.sitofp(s, F32)))


def _lane_sums(b: ir.IRBuilder, q: ir.Value) -> ir.Value:
    """<32 x i32> -> <8 x i32>: the sums of the four values each dot lane holds."""
    pairs = b.add(shuffle(b, q, None, range(0, 32, 2)), shuffle(b, q, None, range(1, 32, 2)))
    return b.add(shuffle(b, pairs, None, range(0, 16, 2)), shuffle(b, pairs, None, range(1, 16, 2)))


def _lanes(b: ir.IRBuilder, t: ir.Type, values: dict[int, ir.Value]) -> ir.Value:
    v = zeros(t, 16)
    for lane, x in values.items():
        v = b.insert_element(v, x, ir.Constant(I32, lane))
    return v


def _rows_q8_32(kb: KernelBuilder, xrow: ir.Value, qrow: ir.Value, fmt: ActFormat, k: int) -> None:
    b = kb.b
    n_blocks = k // 32
    pairs, odd = divmod(n_blocks, 2)

    def step(s: ir.Value, second: bool) -> None:
        sp = kb.byte_ptr(qrow, b.mul(s, i64(fmt.step_bytes)))
        q0, d0, s0, ds0 = _block32(kb, xrow, b.mul(s, i64(2)))
        if second:
            q1, d1, s1, ds1 = _block32(kb, xrow, b.add(b.mul(s, i64(2)), i64(1)))
        else:
            q1, d1, s1, ds1 = zeros(I32, 32), f32(0.0), ir.Constant(I32, 0), f32(0.0)
        store_vec(b, b.trunc(concat(b, q0, q1), vec(I8, 64)), sp)
        ad = shuffle(b, _lanes(b, F32, {0: d0, 8: d1}), None, [0] * 8 + [8] * 8)
        if fmt.offset is None:
            aux = _lanes(b, F32, {1: ds0, 3: ds1})
        elif fmt.sum_group == 4:
            aux = b.mul(concat(b, _lane_sums(b, q0), _lane_sums(b, q1)), splat_const(I32, -fmt.offset, 16))
        else:
            neg = ir.Constant(I32, -fmt.offset)
            aux = _lanes(b, I32, {0: b.mul(s0, neg), 8: b.mul(s1, neg)})
        _store_step_tail(kb, sp, fmt, ad, aux)

    with kb.loop(i64(0), i64(pairs), "qs") as s:
        step(s, True)
    if odd:
        step(i64(pairs), False)


def _rows_q8_256(kb: KernelBuilder, xrow: ir.Value, qrow: ir.Value, fmt: ActFormat, k: int) -> None:
    b = kb.b
    with kb.loop(i64(0), i64(k // 256), "qs") as sb:
        first = b.mul(sb, i64(256))
        sp = kb.byte_ptr(qrow, b.mul(sb, i64(fmt.step_bytes)))
        xs = [_load32(kb, xrow, b.add(first, i64(32 * c))) for c in range(8)]
        _, inv = _scale(kb, _amax(kb, xs))
        d = b.fdiv(f32(1.0), inv)  # ggml's Q8_K: d = 1 / iscale
        sums: list[ir.Value] = []
        for c, x in enumerate(xs):
            q = _quantize32(kb, x, inv)
            store_vec(b, b.trunc(q, vec(I8, 32)), kb.byte_ptr(sp, i64(32 * c)))
            sums += _sum_groups(kb, q, fmt.sum_group)
        aux = zeros(I32, 16)
        for i, s in enumerate(sums):
            aux = b.insert_element(aux, s, ir.Constant(I32, i))
        aux = b.fmul(sitofp(b, aux), splat(b, d, 16), flags=CONTRACT)
        _store_step_tail(kb, sp, fmt, splat(b, d, 16), aux)
