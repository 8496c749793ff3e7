"""mul_mat with ggml's meaning: result[i, j] = dot(row i of a, row j of b).

`a` [K, M, A2, A3] (weights, possibly quantised), `b` [K, N, B2, B3] -> [M, N, B2, B3], with
`a` broadcast over dims 2 and 3 when B2 is a multiple of A2 (grouped-query attention).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import can_repeat, require
from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.types import GGMLType, block_size

F32 = GGMLType.F32


def _infer(srcs: Sequence[Any], params: dict) -> Inferred:
    a, b = srcs
    require(a.ne[0] == b.ne[0], "mul_mat", lambda: f"inner dimensions differ: a {a.shape_str()}, b {b.shape_str()}")
    require(can_repeat(a.ne[2:], b.ne[2:]), "mul_mat",
            lambda: f"a {a.shape_str()} cannot broadcast over b {b.shape_str()} in dims 2, 3")
    require(not b.type.name.startswith("Q"), "mul_mat", "b must not be quantised")
    return Inferred(F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]))


def _reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    a, b = np.asarray(x[0], dtype=np.float32), np.asarray(x[1], dtype=np.float32)
    if a.shape[:2] == (1, 1) and b.shape[:2] == (1, 1):  # the common 2-D case: one BLAS call
        return np.dot(b[0, 0], a[0, 0].T)[None, None]
    r2, r3 = b.shape[1] // a.shape[1], b.shape[0] // a.shape[0]
    if r2 > 1:
        a = np.repeat(a, r2, axis=1)
    if r3 > 1:
        a = np.repeat(a, r3, axis=0)
    return np.matmul(b, np.swapaxes(a, -1, -2)).astype(np.float32)


def _api(b, a, x):
    return b.make("mul_mat", (a, x))


def _cases() -> list[OpCase]:
    cases = []
    for t in (F32, GGMLType.F16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
              GGMLType.MXFP4, GGMLType.IQ4_NL, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.IQ4_XS,
              GGMLType.IQ3_S, GGMLType.IQ3_XXS, GGMLType.IQ2_S, GGMLType.IQ2_XS,
              GGMLType.IQ2_XXS, GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.TQ2_0, GGMLType.TQ1_0,
              GGMLType.Q2_0, GGMLType.Q1_0, GGMLType.NVFP4):
        k = max(block_size(t), 64)
        for n in (1, 7):
            cases.append(OpCase((SrcSpec(t, (k, 9, 1, 1)), SrcSpec(F32, (k, n, 1, 1))), label=f"{t.name} n={n}"))
    cases.append(OpCase((SrcSpec(F32, (16, 5, 2, 1)), SrcSpec(F32, (16, 3, 6, 1))), label="gqa broadcast"))
    cases.append(OpCase((SrcSpec(F32, (16, 5, 3, 1), permute=(0, 2, 1, 3)), SrcSpec(F32, (16, 4, 5, 1))),
                        label="noncontiguous a"))
    # stacks of quantised matrices, one per head (MLA's attn_k_b / attn_v_b): x's heads of one
    # token and of several, broadcast over twice the heads, and read through a permutation
    for t in (GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K):
        k = max(block_size(t), 64)
        for n in (1, 7):
            cases.append(OpCase((SrcSpec(t, (k, 9, 4, 1)), SrcSpec(F32, (k, n, 4, 1))), label=f"{t.name} heads n={n}"))
        cases.append(OpCase((SrcSpec(t, (k, 9, 2, 1)), SrcSpec(F32, (k, 3, 4, 1))), label=f"{t.name} heads broadcast"))
        cases.append(OpCase((SrcSpec(t, (k, 9, 4, 1)), SrcSpec(F32, (k, 4, 5, 1), permute=(0, 2, 1, 3))),
                            label=f"{t.name} heads permuted x"))
    return cases


register(OpDef("mul_mat", Kind.MATMUL, _infer, _reference, api={"mul_mat": _api}, cases=_cases,
               doc="ggml_mul_mat(a, b) = b @ a^T per batch, a broadcast over dims 2-3"))
