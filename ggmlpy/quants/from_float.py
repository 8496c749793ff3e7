"""`quantize_rows_cpu`: float32 rows to ggml blocks the way ggml's CPU backend writes them into
a quantised destination (set_rows into a quantised KV cache, cpy into one: its
type_traits_cpu[type].from_float).

That is the reference quantiser (quantize_row_*_ref, `quantize`) for every type but Q8_0,
whose from_float is the x86 quantize_row_q8_0 of ggml-cpu/arch/x86/quants.c (AVX/AVX2): the
scale's inverse is 127 / amax rather than 1 / (amax / 127), and the products are rounded half
to even (_mm256_round_ps) rather than away from zero (roundf). The two differ in the last bit
of a few quants per row; matching the x86 one keeps a q8_0 KV cache byte-identical to
llama.cpp's for the same inputs (the CPU kernels' activation quantisation, kernels/qact.py,
rounds the same way).
"""
from __future__ import annotations

import numpy as np

from ggmlpy.ir.types import GGMLType, block_size
from ggmlpy.quants.layouts import block_dtype
from ggmlpy.quants.quant import quantize
from ggmlpy.quants.rounding import F32, to_f16


def q8_0_x86(x: np.ndarray) -> np.ndarray:
    """Q8_0 blocks of x (n, 32) as ggml-cpu's AVX quantize_row_q8_0 writes them."""
    amax = np.abs(x).max(axis=1).astype(F32)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    blk = np.zeros(len(x), dtype=block_dtype(GGMLType.Q8_0))
    blk["d"] = to_f16(d)
    blk["qs"] = np.rint((x * inv[:, None]).astype(F32)).astype(np.int8)
    return blk


def quantize_rows_cpu(x: np.ndarray, t: GGMLType) -> np.ndarray:
    """Rows of x (last axis = ne[0]) as type t's bytes, shape x.shape[:-1] + (row bytes,)."""
    t = GGMLType(t)
    if t != GGMLType.Q8_0:
        return quantize(x, t)
    arr = np.ascontiguousarray(x, dtype=np.float32)
    blocks = q8_0_x86(arr.reshape(-1, block_size(t)))
    return blocks.view(np.uint8).reshape(arr.shape[:-1] + (-1,))


def q8_values(x: np.ndarray) -> np.ndarray:
    """x (last axis a multiple of 32) as the values its Q8_0 blocks decode to, as ggml's x86
    quantize_row_q8_0 makes them: what ggml's flash attention multiplies a quantised K with
    (Q converted to K's vec_dot_type), the kernels too (codegen_cpu/kernels/kv_quant.py)."""
    arr = np.ascontiguousarray(x, dtype=np.float32)
    blocks = q8_0_x86(arr.reshape(-1, 32))
    values = blocks["qs"].astype(np.float32) * blocks["d"].astype(np.float32)[:, None]
    return values.reshape(arr.shape)
