"""Row normalisations over ne[0]: rms_norm and norm (mean and variance), as ggml computes them
(sums accumulated in double precision)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.types import GGMLType

F32 = GGMLType.F32


def _infer(srcs: Sequence[Any], params: dict) -> Inferred:
    return Inferred(F32, srcs[0].ne)


def _rms_ref(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    v = x[0].astype(np.float64)
    mean = np.mean(v * v, axis=-1, keepdims=True)
    return (v / np.sqrt(mean + params["eps"])).astype(np.float32)


def _norm_ref(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    v = x[0].astype(np.float64)
    centred = v - v.mean(axis=-1, keepdims=True)
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    return (centred / np.sqrt(var + params["eps"])).astype(np.float32)


def _cases() -> list[OpCase]:
    return [OpCase((SrcSpec(F32, ne),), (("eps", 1e-5),), label=str(ne))
            for ne in [(64, 3, 1, 1), (7, 5, 2, 1), (576, 1, 1, 1), (37, 3, 1, 1)]] + [
        OpCase((SrcSpec(F32, (8, 4, 3, 1), permute=(0, 2, 1, 3)),), (("eps", 1e-6),), label="noncontiguous")]


register(OpDef("rms_norm", Kind.ROW, _infer, _rms_ref,
               api={"rms_norm": lambda b, a, eps: b.make("rms_norm", (a,), {"eps": float(eps)})},
               cases=_cases, inplace=True, doc="x / sqrt(mean(x^2) + eps) per row"))
register(OpDef("norm", Kind.ROW, _infer, _norm_ref,
               api={"norm": lambda b, a, eps: b.make("norm", (a,), {"eps": float(eps)})},
               cases=_cases, inplace=True, doc="(x - mean) / sqrt(var + eps) per row"))
