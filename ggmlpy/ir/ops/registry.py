"""The op registry: one `OpDef` per op is the single source of truth (docs/architecture.md, decision 2).

An op module defines its shape/type rule, numpy reference, fusion kind, builder functions
(the ggml-like API) and test cases in one place and registers them here; backends register
lowerings by op name elsewhere, and tests walk this registry.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ggmlpy.ir.symbolic import Dim
from ggmlpy.ir.types import GGMLType


class Kind(enum.Enum):
    """How an op may be fused (passes) and scheduled."""

    ELEMENTWISE = "elementwise"  # out[i] depends on in[i] (with broadcasting)
    ROW = "row"                  # independent per row of ne[0] (norms, softmax, rope)
    MATMUL = "matmul"
    VIEW = "view"                # no computation: new ne/nb over the source's memory
    WRITE = "write"              # writes into src[0], its destination (cpy, set_rows); the
                                 # result is that memory; `write(dst, [dst, *other srcs])`; a
                                 # quantised dst is its raw block rows, its type params[DST_TYPE]
    OPAQUE = "opaque"            # anything else (gathers, concat)


@dataclass
class Inferred:
    """What an op's rule decides about its result."""

    type: GGMLType
    ne: tuple[Dim, ...]
    nb: tuple[Dim, ...] | None = None  # None: contiguous
    view_src: Any = None               # a Tensor for views and writes
    view_offs: Dim = 0


@dataclass(frozen=True)
class SrcSpec:
    """A test input: type, ggml shape and how to fill it."""

    type: GGMLType
    ne: tuple[int, ...]
    # normal | positive | negative (-1 .. -0.01) | unit (0.01 .. 0.99) | l2norm (rows of length
    # 1) | zeros | rows:N (row indices < N) | unique_rows:N (distinct per index row) | pos
    # (positions) | mask (0 / -inf, a 0 in every row); see ggmlpy/testing/ops.py
    fill: str = "normal"
    permute: tuple[int, int, int, int] | None = None  # feed as a permuted (non-contiguous) view
    weight: bool = False  # a model weight leaf (backends may keep weights in their own layout)


@dataclass(frozen=True)
class OpCase:
    """One registry-generated test case: inputs and op parameters."""

    srcs: tuple[SrcSpec, ...]
    params: tuple[tuple[str, Any], ...] = ()
    label: str = ""

    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)


DST_TYPE = "_dst_type"   # what a write into a quantised destination is told its type by (RefSplit)

Reference = Callable[[Sequence[np.ndarray], dict[str, Any]], np.ndarray]
WriteReference = Callable[[np.ndarray, Sequence[np.ndarray], dict[str, Any]], None]


@dataclass
class OpDef:
    name: str
    kind: Kind
    infer: Callable[[Sequence[Any], dict[str, Any]], Inferred]
    reference: Reference | None = None        # inputs as float32/int arrays, numpy order, 4-D
    write: WriteReference | None = None       # for WRITE ops: mutate the destination in place
    api: dict[str, Callable[..., Any]] = field(default_factory=dict)  # builder functions
    cases: Callable[[], Iterable[OpCase]] | None = None
    inplace: bool = False                     # result may reuse src[0]'s memory
    doc: str = ""


OPS: dict[str, OpDef] = {}
API: dict[str, Callable[..., Any]] = {}


def register(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise ValueError(f"op {op.name} registered twice")
    OPS[op.name] = op
    for api_name, fn in op.api.items():
        if api_name in API:
            raise ValueError(f"builder function {api_name} registered twice")
        API[api_name] = fn
    return op


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known: {', '.join(sorted(OPS))}") from None
