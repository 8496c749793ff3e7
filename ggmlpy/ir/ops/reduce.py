"""Row reductions: sum_rows (ggml_sum_rows), each row's sum accumulated in double precision
as ggml's CPU backend does, into a row of one value (a mixture-of-experts layer's sum of its
selected experts' weights)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import require
from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.types import GGMLType

F32 = GGMLType.F32


def _infer(srcs: Sequence[Any], params: dict) -> Inferred:
    (a,) = srcs
    require(a.type == F32, "sum_rows", lambda: f"values must be F32, got {a.type.name}")
    return Inferred(F32, (1, *a.ne[1:]))


def _reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    return x[0].astype(np.float64).sum(axis=-1, keepdims=True).astype(np.float32)


def _cases() -> list[OpCase]:
    return [OpCase((SrcSpec(F32, ne),), label=str(ne)) for ne in [(8, 5, 1, 1), (129, 3, 2, 1), (1, 4, 1, 1)]]


register(OpDef("sum_rows", Kind.ROW, _infer, _reference,
               api={"sum_rows": lambda b, a: b.make("sum_rows", (a,))}, cases=_cases,
               doc="each row's sum, a row of one value (ggml_sum_rows)"))
