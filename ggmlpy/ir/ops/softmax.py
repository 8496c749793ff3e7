"""soft_max_ext: softmax over ne[0] of (a * scale + mask), with ALiBi slopes when max_bias > 0.

The mask [n_kv, >= n_tokens, ...] broadcasts over heads (dims 2, 3); -inf masks a cell.
Attention sinks (gpt-oss; ggml_soft_max_add_sinks), a third source [ne[2]] F32 after the
mask: one more logit per head (row dim 2) that joins each row's max and sum but has no
output column, so a row's probabilities sum to less than 1.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import require
from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.types import GGMLType

F32 = GGMLType.F32


def _infer(srcs: Sequence[Any], params: dict) -> Inferred:
    a = srcs[0]
    if len(srcs) > 1:
        m = srcs[1]
        require(m.ne[0] == a.ne[0], "soft_max", lambda: f"mask {m.shape_str()} does not match {a.shape_str()}")
        require(m.type in (F32, GGMLType.F16), "soft_max", "mask must be F32 or F16")
    if len(srcs) > 2:
        s = srcs[2]
        require(s.type == F32 and s.ne[0] == a.ne[2] and tuple(s.ne[1:]) == (1, 1, 1), "soft_max",
                lambda: f"sinks {s.shape_str()} must be F32 with one value per head ({a.ne[2]})")
    return Inferred(F32, a.ne)


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ggml's per-head ALiBi slope (1 for every head when max_bias is 0)."""
    if max_bias <= 0:
        return np.ones(n_head, dtype=np.float32)
    n_head_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_head_log2)
    h = np.arange(n_head)
    return np.where(h < n_head_log2, m0 ** (h + 1), m1 ** (2 * (h - n_head_log2) + 1)).astype(np.float32)


def _reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    a = x[0].astype(np.float32) * np.float32(params["scale"])
    if len(x) > 1:
        m = x[1].astype(np.float32)[:, :, : a.shape[2], :]  # mask rows may be padded
        r2, r3 = a.shape[1] // m.shape[1], a.shape[0] // m.shape[0]
        m = np.tile(m, (r3, r2, 1, 1)) if (r2 > 1 and m.shape[1] > 1) or (r3 > 1 and m.shape[0] > 1) else m
        slopes = alibi_slopes(a.shape[1], params.get("max_bias", 0.0)).reshape(1, -1, 1, 1)
        a = a + slopes * m
    if len(x) > 2:   # the sink joins the max and the sum, as ggml's soft_max with src2
        sink = x[2].astype(np.float32).reshape(1, -1, 1, 1)
        mx = np.maximum(np.max(a, axis=-1, keepdims=True), sink)
        e = np.exp(a - mx)
        return (e / (np.sum(e, axis=-1, keepdims=True) + np.exp(sink - mx))).astype(np.float32)
    a = a - np.max(a, axis=-1, keepdims=True)
    e = np.exp(a)
    return (e / np.sum(e, axis=-1, keepdims=True)).astype(np.float32)


def _api(b, a, mask=None, scale: float = 1.0, max_bias: float = 0.0, sinks=None):
    require(sinks is None or mask is not None, "soft_max", "sinks need a mask (pass an all-zero one)")
    srcs = (a,) if mask is None else (a, mask) if sinks is None else (a, mask, sinks)
    return b.make("soft_max", srcs, {"scale": float(scale), "max_bias": float(max_bias)})


def _cases() -> list[OpCase]:
    return [
        OpCase((SrcSpec(F32, (7, 3, 1, 1)),), (("scale", 1.0), ("max_bias", 0.0)), label="plain"),
        OpCase((SrcSpec(F32, (10, 4, 3, 1)), SrcSpec(F32, (10, 4, 1, 1), fill="mask")),
               (("scale", 0.125), ("max_bias", 0.0)), label="mask"),
        OpCase((SrcSpec(F32, (10, 4, 3, 1)), SrcSpec(GGMLType.F16, (10, 6, 1, 1), fill="mask")),
               (("scale", 0.5), ("max_bias", 0.0)), label="padded f16 mask"),
        OpCase((SrcSpec(F32, (37, 4, 3, 1)), SrcSpec(GGMLType.F16, (37, 4, 1, 1), fill="mask")),
               (("scale", 0.25), ("max_bias", 0.0)), label="long rows f16 mask"),
        OpCase((SrcSpec(F32, (50, 3, 2, 1)), SrcSpec(F32, (50, 3, 1, 1), fill="mask")),
               (("scale", 1.0), ("max_bias", 0.0)), label="long rows"),
        # a finite mask (ALiBi models put -|i - j| there): with only 0 and -inf the slopes
        # would not change the result
        OpCase((SrcSpec(F32, (10, 4, 8, 1)), SrcSpec(F32, (10, 4, 1, 1), fill="normal")),
               (("scale", 1.0), ("max_bias", 8.0)), label="alibi"),
        OpCase((SrcSpec(F32, (10, 4, 3, 1)), SrcSpec(F32, (10, 4, 1, 1), fill="mask"), SrcSpec(F32, (3, 1, 1, 1))),
               (("scale", 0.125), ("max_bias", 0.0)), label="sinks"),
        OpCase((SrcSpec(F32, (70, 5, 4, 1)), SrcSpec(GGMLType.F16, (70, 6, 1, 1), fill="mask"),
                SrcSpec(F32, (4, 1, 1, 1))), (("scale", 0.5), ("max_bias", 0.0)), label="long rows sinks"),
    ]


register(OpDef("soft_max", Kind.ROW, _infer, _reference, api={"soft_max_ext": _api,
               "soft_max": lambda b, a: _api(b, a)}, cases=_cases,
               doc="softmax(a * scale + slope * mask) over ne[0] (ggml_soft_max_ext)"))
