"""argsort: the indices that sort each row (ggml_argsort), and the top k of a row as the
first k columns of its descending argsort (ggml_argsort_top_k, how a mixture-of-experts
layer picks its experts)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import require
from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.types import GGMLType

F32 = GGMLType.F32
ASC, DESC = 0, 1   # ggml_sort_order


def _infer(srcs: Sequence[Any], params: dict) -> Inferred:
    (a,) = srcs
    require(a.type == F32, "argsort", lambda: f"values must be F32, got {a.type.name}")
    require(params.get("order", ASC) in (ASC, DESC), "argsort", lambda: f"order {params.get('order')} is not 0 or 1")
    return Inferred(GGMLType.I32, a.ne)


def _reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    """Ties keep their index order (ggml's std::sort leaves them unspecified); NaNs go last."""
    a = np.asarray(x[0], np.float32)
    keys = -a if params.get("order", ASC) == DESC else a     # numpy sorts NaN last
    return np.argsort(keys, axis=-1, kind="stable").astype(np.int32)


def _argsort_api(b, a, order: int = ASC):
    return b.make("argsort", (a,), {"order": int(order)})


def _argsort_top_k_api(b, a, k: int):
    """The indices of each row's k largest values, largest first: a view of the first k
    columns of the descending argsort, as ggml_argsort_top_k."""
    require(isinstance(k, int) and 0 < k and (not isinstance(a.ne[0], int) or k <= a.ne[0]), "argsort_top_k",
            lambda: f"k = {k} for rows of {a.ne[0]}")
    s = _argsort_api(b, a, DESC)
    return b.view(s, (k, s.ne[1], s.ne[2], s.ne[3]), (s.nb[1], s.nb[2], s.nb[3]))


def _cases() -> list[OpCase]:
    return [OpCase((SrcSpec(F32, (8, 5, 1, 1)),), (("order", DESC),), label="desc 8"),
            OpCase((SrcSpec(F32, (128, 3, 2, 1)),), (("order", DESC),), label="desc 128 experts"),
            OpCase((SrcSpec(F32, (13, 4, 1, 1)),), (("order", ASC),), label="asc 13"),
            OpCase((SrcSpec(F32, (6, 4, 3, 1), permute=(0, 2, 1, 3)),), (("order", ASC),), label="noncontiguous")]


register(OpDef("argsort", Kind.ROW, _infer, _reference,
               api={"argsort": _argsort_api, "argsort_top_k": _argsort_top_k_api}, cases=_cases,
               doc="the indices that sort each row, ascending (order 0) or descending (1) (ggml_argsort)"))
