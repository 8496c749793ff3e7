"""The short causal convolution of recurrent layers (ggml_ssm_conv: Mamba's and the gated
delta-net layers' conv1d over a sequence's last d_conv inputs).

ssm_conv(sx, c): sx [d_conv - 1 + n_t, d_inner, n_s] holds, per sequence and channel, the
d_conv - 1 previous inputs followed by the n_t new ones (time along ne[0]); c [d_conv,
d_inner] the per-channel kernel. Result [d_inner, n_t, n_s]:
out[i, t, s] = sum_k sx[t + k, i, s] * c[k, i], summed in float32 in k order, as ggml.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import require
from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.symbolic import simplify
from ggmlpy.ir.types import GGMLType

F32 = GGMLType.F32


def _infer(srcs: Sequence[Any], params: dict) -> Inferred:
    sx, c = srcs
    require(sx.type == F32 and c.type == F32, "ssm_conv", "inputs and kernel must be F32")
    require(sx.ne[3] == 1 and c.ne[2] == 1 and c.ne[3] == 1, "ssm_conv",
            lambda: f"inputs {sx.shape_str()} must be 3-D and the kernel {c.shape_str()} 2-D")
    require(sx.ne[1] == c.ne[1], "ssm_conv", lambda: f"channels differ: {sx.shape_str()} vs kernel {c.shape_str()}")
    n_t = simplify(sx.ne[0] - c.ne[0] + 1)
    require(not isinstance(n_t, int) or n_t >= 0, "ssm_conv",
            lambda: f"{sx.ne[0]} inputs are fewer than the kernel's {c.ne[0]} - 1")
    return Inferred(F32, (c.ne[1], n_t, sx.ne[2], 1))


def _reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    sx, c = np.asarray(x[0], np.float32)[0], np.asarray(x[1], np.float32)[0, 0]   # [n_s, d_inner, T], [d_inner, d_conv]
    d_conv = c.shape[1]
    n_t = sx.shape[2] - d_conv + 1
    out = np.zeros((sx.shape[0], n_t, sx.shape[1]), np.float32)                   # [n_s, n_t, d_inner]
    for k in range(d_conv):   # float32 sums in k order
        out += (sx[:, :, k:k + n_t] * c[None, :, k:k + 1]).transpose(0, 2, 1)
    return out[None]


def _cases() -> list[OpCase]:
    return [OpCase((SrcSpec(F32, (3 + 5, 16, 2, 1)), SrcSpec(F32, (4, 16, 1, 1))), label="5 tokens, 2 sequences"),
            OpCase((SrcSpec(F32, (3 + 1, 37, 1, 1)), SrcSpec(F32, (4, 37, 1, 1))), label="one token"),
            OpCase((SrcSpec(F32, (2 + 9, 64, 3, 1)), SrcSpec(F32, (3, 64, 1, 1))), label="d_conv 3")]


register(OpDef("ssm_conv", Kind.OPAQUE, _infer, _reference,
               api={"ssm_conv": lambda b, sx, c: b.make("ssm_conv", (sx, c))}, cases=_cases,
               doc="a recurrent layer's short causal convolution per channel (ggml_ssm_conv)"))
