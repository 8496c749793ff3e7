"""The ops of a mixture-of-experts layer: each token's products with the weights of the
experts it selected (mul_mat_id) and the selected experts' biases (add_id), with ggml's
meaning (ggml.c, ggml-cpu/ops.cpp).

mul_mat_id(as, b, ids): `as` [K, M, n_expert] (one weight matrix per expert, possibly
quantised), `b` [K, n_b, n_tokens] (n_b is 1, the same input for every selected expert, or
n_used), `ids` [n_used, n_tokens] I32 -> [M, n_used, n_tokens], where
out[:, e, t] = as[:, :, ids[e, t]] @ b[:, e % n_b, t].

add_id(a, b, ids): a [N, n_used, n_tokens] + b [N, n_expert] at ids [n_used, n_tokens]:
out[:, e, t] = a[:, e, t] + b[:, ids[e, t]].
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import require
from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.types import GGMLType, block_size, is_quantized

F32, I32 = GGMLType.F32, GGMLType.I32


# mul_mat_id ---------------------------------------------------------------------------------
def _mul_mat_id_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    w, b, ids = srcs
    require(ids.type == I32, "mul_mat_id", lambda: f"expert ids must be I32, got {ids.type.name}")
    require(w.ne[3] == 1 and b.ne[3] == 1 and ids.ne[2] == 1 and ids.ne[3] == 1, "mul_mat_id",
            lambda: f"weights {w.shape_str()}, input {b.shape_str()} and ids {ids.shape_str()} must be 3-D, 3-D, 2-D")
    require(w.ne[0] == b.ne[0], "mul_mat_id", lambda: f"inner dimensions differ: {w.shape_str()} vs {b.shape_str()}")
    require(ids.ne[1] == b.ne[2], "mul_mat_id",
            lambda: f"ids {ids.shape_str()} need one list of experts per token of {b.shape_str()}")
    require(not isinstance(ids.ne[0], int) or not isinstance(b.ne[1], int) or ids.ne[0] % b.ne[1] == 0,
            "mul_mat_id", lambda: f"{b.ne[1]} inputs per token cannot broadcast to {ids.ne[0]} experts")
    require(not is_quantized(b.type), "mul_mat_id", "the input must not be quantised")
    return Inferred(F32, (w.ne[1], ids.ne[0], b.ne[2], 1))


def _mul_mat_id_ref(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    w, b, ids = np.asarray(x[0], np.float32)[0], np.asarray(x[1], np.float32)[0], x[2][0, 0]
    n_tokens, n_used = ids.shape
    out = np.empty((1, n_tokens, n_used, w.shape[1]), np.float32)
    for e in np.unique(ids):   # each expert's weights once, as the CPU backend groups them
        t, u = np.nonzero(ids == e)
        out[0, t, u] = b[t, u % b.shape[1]] @ w[e].T
    return out


def _mul_mat_id_cases() -> list[OpCase]:
    cases = []
    for t in (F32, GGMLType.F16, GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.MXFP4, GGMLType.IQ4_NL, GGMLType.Q4_K,
              GGMLType.Q6_K, GGMLType.IQ4_XS, GGMLType.IQ3_S, GGMLType.IQ3_XXS, GGMLType.IQ2_S, GGMLType.IQ2_XS,
              GGMLType.IQ2_XXS, GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.TQ2_0, GGMLType.TQ1_0,
              GGMLType.Q2_0, GGMLType.Q1_0, GGMLType.NVFP4):
        k = max(block_size(t), 64)
        for n_b, n_tok in ((1, 1), (1, 5), (2, 3)):
            cases.append(OpCase((SrcSpec(t, (k, 6, 4, 1)), SrcSpec(F32, (k, n_b, n_tok, 1)),
                                 SrcSpec(I32, (2, n_tok), fill="unique_rows:4")),
                                label=f"{t.name} inputs={n_b} tokens={n_tok}"))
    return cases


register(OpDef("mul_mat_id", Kind.MATMUL, _mul_mat_id_infer, _mul_mat_id_ref,
               api={"mul_mat_id": lambda b, w, x, ids: b.make("mul_mat_id", (w, x, ids))},
               cases=_mul_mat_id_cases,
               doc="each token's product with its selected experts' matrices (ggml_mul_mat_id)"))


# add_id ---------------------------------------------------------------------------------------
def _add_id_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    a, b, ids = srcs
    require(ids.type == I32, "add_id", lambda: f"ids must be I32, got {ids.type.name}")
    require(a.type == F32 and b.type == F32, "add_id", "a and b must be F32")
    require(a.ne[0] == b.ne[0] and a.ne[1] == ids.ne[0] and a.ne[2] == ids.ne[1], "add_id",
            lambda: f"a {a.shape_str()}, b {b.shape_str()} and ids {ids.shape_str()} do not match")
    return Inferred(F32, a.ne)


def _add_id_ref(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    a, b, ids = np.asarray(x[0], np.float32), np.asarray(x[1], np.float32), x[2]
    rows = b[0, 0][ids[0, 0]]                 # [n_tokens, n_used, N]
    return a + rows[None] if a.ndim == 4 else a + rows


def _add_id_cases() -> list[OpCase]:
    return [OpCase((SrcSpec(F32, (7, 2, 3, 1)), SrcSpec(F32, (7, 5, 1, 1)), SrcSpec(I32, (2, 3), fill="unique_rows:5")),
                   label="7 x 2 of 5 experts, 3 tokens"),
            OpCase((SrcSpec(F32, (32, 4, 1, 1)), SrcSpec(F32, (32, 8, 1, 1)), SrcSpec(I32, (4, 1), fill="unique_rows:8")),
                   label="one token")]


register(OpDef("add_id", Kind.OPAQUE, _add_id_infer, _add_id_ref,
               api={"add_id": lambda b, a, bias, ids: b.make("add_id", (a, bias, ids))}, cases=_add_id_cases,
               doc="a plus the rows of b its ids select, per token and slot (ggml_add_id)"))
