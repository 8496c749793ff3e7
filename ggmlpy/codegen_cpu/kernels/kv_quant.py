"""The attention's reads of a quantised KV cache (Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, Q5_1), for
the float kernels of kernels/matmul_float.py, and out_prod, the weights times a quantised V.

K (k . q, the dot form, fused with the softmax or not) and V (the axpy form: each key's V
row scaled by its weight) are read a block of 32 at a time and decoded to f32 with the
dequantisers of kernels/qdequant.py (ggml's dequantize_row_*: d * (q - offset), d * q + m,
IQ4_NL's code book); each 16-lane chunk is half a block.

The numbers follow ggml's CPU flash attention (ggml_compute_forward_flash_attn_ext_f16_one_chunk),
which llama.cpp runs for a quantised V cache: Q is converted to K's vec_dot_type (Q8_0, Q8_1
for Q4_1/Q5_1: the same 8-bit values) by the x86 quantize_row_q8_0 before k . q, so q's
values here are rounded the same way (`q8_operand`: round-half-even(q * 127 / amax) times the
f16 scale) and multiplied with K's decoded values in f32, which gives ggml's integer dot
products up to the order of the f32 roundings; V rows are decoded to f32 (its v_to_float)
and summed with the f32 weights (its ggml_vec_mad_f32). The softmax is ggml's non-flash one
(the graph's chain), not the online rescaling of its flash kernel: the two differ by f32
roundings.
"""
from __future__ import annotations

import dataclasses

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F16, F32, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.kv_store import STORABLE
from ggmlpy.codegen_cpu.kernels.qdequant import block32_values
from ggmlpy.codegen_cpu.kernels.qvec import (
    concat, intrinsic, load_vec, reduce_max_f32, shuffle, splat, vabs, vec,
)
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size

KV_QUANT = STORABLE   # the quantised KV cache types
VEC = 16


class ChunkReader:
    """16-value chunks of rows of type t: chunk c of a row holds its values 16c .. 16c + 15.
    A quantised row's block is decoded once for its two chunks (one reader per stretch of
    straight-line code: the decoded values are reused only there)."""

    def __init__(self, kb: KernelBuilder, t: GGMLType):
        self.kb, self.t = kb, t
        self._blocks: dict[tuple[int, int], ir.Value] = {}

    def __call__(self, row: ir.Value, c: int) -> ir.Value:
        kb, b, t = self.kb, self.kb.b, self.t
        if t in KV_QUANT:
            key = (id(row), c // 2)
            block = self._blocks.get(key)
            if block is None:
                block = self._blocks[key] = block32_values(kb, t, kb.byte_ptr(row, i64(c // 2 * type_size(t))))
            return shuffle(b, block, None, range(VEC * (c % 2), VEC * (c % 2) + VEC))
        ptr = kb.byte_ptr(row, i64(VEC * c * type_size(t)))
        if t == GGMLType.F16:
            return b.fpext(load_vec(b, ptr, F16, VEC), vec(F32, VEC))
        return load_vec(b, ptr, F32, VEC)


def q8_operand(kb: KernelBuilder, chunks: list[ir.Value]) -> list[ir.Value]:
    """Chunks of an f32 row (pairs of them whole blocks of 32) as the values ggml's x86
    quantize_row_q8_0 gives them: q = round-half-even(x * 127 / amax), times f16(amax / 127)."""
    b = kb.b
    out = []
    for c in range(0, len(chunks), 2):
        x = concat(b, chunks[c], chunks[c + 1])
        amax = reduce_max_f32(kb, vabs(kb, x))
        d = b.fpext(b.fptrunc(b.fdiv(amax, f32(127.0)), F16), F32)
        inv = b.select(b.fcmp_ordered(">", amax, f32(0.0)), b.fdiv(f32(127.0), amax), f32(0.0))
        q = intrinsic(kb, "llvm.rint.v32f32", vec(F32, 32), [b.fmul(x, splat(b, inv, 32))])
        v = b.fmul(q, splat(b, d, 32))
        out += [shuffle(b, v, None, range(VEC)), shuffle(b, v, None, range(VEC, 2 * VEC))]
    return out


# out_prod ---------------------------------------------------------------------------------------
def as_axpy_product(node: Tensor) -> Tensor:
    """out_prod(a, b) as the mul_mat the axpy form computes: a' = a with its first two dims
    swapped (row k of a is a' [k, :], read along a's rows), x = b's first two dims swapped
    (b's column k, the weights of key k, is x[k] of each output row). Only the kernel sees
    it: its operands are still out_prod's pointers."""
    a, x = node.src

    def swapped(t: Tensor) -> Tensor:
        ne, nb = t.ne, t.nb
        return dataclasses.replace(t, ne=(ne[1], ne[0], ne[2], ne[3]), nb=(nb[1], nb[0], nb[2], nb[3]))

    return dataclasses.replace(node, op="mul_mat", src=(swapped(a), swapped(x)))


def _out_prod_supported(node: Tensor) -> bool:
    a, x = node.src
    if node.type != GGMLType.F32 or x.type != GGMLType.F32 or node.nb[0] != 4 or x.nb[1] != 4:
        return False
    m = a.ne[0]
    if not isinstance(m, int) or m > 16 * VEC:
        return False
    if a.type in KV_QUANT:
        return a.nb[0] == type_size(a.type) and m % 32 == 0
    return a.type in (GGMLType.F32, GGMLType.F16) and a.nb[0] == type_size(a.type) and m % VEC == 0


@lowering("out_prod", supports=_out_prod_supported)
def _out_prod(kb: KernelBuilder, node: Tensor) -> None:
    """The weights times V over a quantised V cache (llama/kv_attention.py): the axpy form of
    kernels/matmul_float.py on the rows of V, each decoded as it is read. With zero_tail
    (codegen_cpu/fusion.py: the weights are a softmax) the keys whose weights are all 0 are
    skipped, as for mul_mat."""
    from ggmlpy.codegen_cpu.kernels.matmul_float import float_axpy

    float_axpy(kb, as_axpy_product(node))
