"""out_prod with ggml's meaning: result[i0, i1] = sum_k a[i0, k] * b[i1, k] per batch.

`a` [M, K, A2, A3] (possibly quantised: its rows, along M, are what is read), `b` [N, K, B2,
B3] -> [M, N, B2, B3], `a` broadcast over dims 2 and 3 as in mul_mat (ggml_out_prod).

The attention over a quantised V cache is built with it (llama/kv_attention.py): the weights
times V sums the cached V rows (one per key, along the head's dims) scaled by each key's
weight, and a quantised row can only be read along its blocks, which mul_mat's transposed V
view cannot do. out_prod(V, transpose(weights)) reads V by rows, as ggml's flash attention
does; for float caches the graph keeps mul_mat.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import can_repeat, require
from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.types import GGMLType, block_size, is_quantized, type_size

F32 = GGMLType.F32
QUANT_A = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.IQ4_NL, GGMLType.Q5_0, GGMLType.Q5_1)


def _infer(srcs: Sequence[Any], params: dict) -> Inferred:
    a, b = srcs
    require(a.ne[1] == b.ne[1], "out_prod", lambda: f"inner dimensions differ: a {a.shape_str()}, b {b.shape_str()}")
    require(can_repeat(a.ne[2:], b.ne[2:]), "out_prod",
            lambda: f"a {a.shape_str()} cannot broadcast over b {b.shape_str()} in dims 2, 3")
    require(not is_quantized(b.type), "out_prod", "b must not be quantised")
    require(not is_quantized(a.type) or (a.nb[0] == type_size(a.type) and isinstance(a.ne[0], int)
                                         and a.ne[0] % block_size(a.type) == 0),
            "out_prod", lambda: f"a quantised a needs rows of whole {a.type.name} blocks")
    return Inferred(F32, (a.ne[0], b.ne[0], b.ne[2], b.ne[3]))


def _reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    a, b = np.asarray(x[0], dtype=np.float32), np.asarray(x[1], dtype=np.float32)  # [A3, A2, K, M], [B3, B2, K, N]
    r2, r3 = b.shape[1] // a.shape[1], b.shape[0] // a.shape[0]
    if r2 > 1:
        a = np.repeat(a, r2, axis=1)
    if r3 > 1:
        a = np.repeat(a, r3, axis=0)
    return np.matmul(np.swapaxes(b, -1, -2), a).astype(np.float32)   # [.., N, M]


def _api(b, a, x):
    return b.make("out_prod", (a, x))


def _cases() -> list[OpCase]:
    """b mostly transposed, as the attention gives it (the weights of a key along b's dim 1)."""
    t = (1, 0, 2, 3)
    cases = [OpCase((SrcSpec(F32, (16, 7, 1, 1)), SrcSpec(F32, (7, 5, 1, 1), permute=t)), label="f32"),
             OpCase((SrcSpec(GGMLType.F16, (32, 9, 2, 1)), SrcSpec(F32, (9, 3, 4, 1), permute=t)),
                    label="f16 broadcast"),
             OpCase((SrcSpec(F32, (16, 5, 3, 1), permute=(0, 2, 1, 3)), SrcSpec(F32, (3, 4, 5, 1), permute=t)),
                    label="permuted a"),
             OpCase((SrcSpec(F32, (16, 7, 1, 1)), SrcSpec(F32, (5, 7, 1, 1))), label="contiguous b")]
    cases += [OpCase((SrcSpec(q, (64, 11, 2, 1)), SrcSpec(F32, (11, 3, 4, 1), permute=t)), label=f"{q.name} broadcast")
              for q in QUANT_A]
    return cases


register(OpDef("out_prod", Kind.MATMUL, _infer, _reference, api={"out_prod": _api}, cases=_cases,
               doc="ggml_out_prod(a, b) = a @ b^T per batch (rows of a summed with b's weights)"))
