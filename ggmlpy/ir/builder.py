"""`GraphBuilder`: ggml's op API over the op registry.

Model files call `b.mul_mat(w, x)`, `b.rms_norm(x, eps)` ... exactly as llama.cpp's model
files call ggml. Every such function is defined next to its op (ir/ops/) and found here by
name, so adding an op never touches this file.
"""
from __future__ import annotations

import functools
from typing import Any, Iterable, Sequence

from ggmlpy.ir import ops as _ops  # noqa: F401  (registers every op)
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops.registry import API, get_op
from ggmlpy.ir.symbolic import Dim
from ggmlpy.ir.tensor import Flag, Tensor, contiguous_strides, pad_ne
from ggmlpy.ir.types import GGMLType


class GraphBuilder:
    """Creates tensors; `build(outputs)` returns the graph reachable from them."""

    def __init__(self) -> None:
        self.created: list[Tensor] = []

    # leaves ---------------------------------------------------------------------------------
    def new_tensor(self, ttype: GGMLType, ne: Sequence[Dim], name: str = "",
                   flags: Flag = Flag.NONE) -> Tensor:
        full = pad_ne(tuple(ne))
        t = Tensor(GGMLType(ttype), full, contiguous_strides(GGMLType(ttype), full), name=name, flags=flags)
        self.created.append(t)
        return t

    def input(self, name: str, ttype: GGMLType, ne: Sequence[Dim]) -> Tensor:
        """A graph input, set by the runtime for every ubatch (ggml_set_input)."""
        return self.new_tensor(ttype, ne, name, Flag.INPUT)

    def weight(self, name: str, ttype: GGMLType, ne: Sequence[Dim], file_layout: bool = False) -> Tensor:
        """A model weight, bound by name; `file_layout`: read as the file stores it (Flag.FILE_LAYOUT)."""
        return self.new_tensor(ttype, ne, name, Flag.WEIGHT | Flag.FILE_LAYOUT if file_layout else Flag.WEIGHT)

    def cache(self, name: str, ttype: GGMLType, ne: Sequence[Dim]) -> Tensor:
        """Persistent state (a KV cache layer), bound by name to the context's buffer."""
        return self.new_tensor(ttype, ne, name, Flag.CACHE)

    # ops ------------------------------------------------------------------------------------
    def make(self, op: str, srcs: Sequence[Tensor], params: dict[str, Any] | None = None,
             name: str = "") -> Tensor:
        params = dict(params or {})
        inferred = get_op(op).infer(srcs, params)
        ne = pad_ne(tuple(inferred.ne))
        nb = tuple(inferred.nb) if inferred.nb is not None else contiguous_strides(inferred.type, ne)
        t = Tensor(inferred.type, ne, nb, op=op, src=tuple(srcs), params=params, name=name,
                   view_src=inferred.view_src, view_offs=inferred.view_offs)
        self.created.append(t)
        return t

    def __getattr__(self, api_name: str):
        fn = API.get(api_name)
        if fn is None:
            raise AttributeError(f"GraphBuilder has no op function {api_name!r}")
        return functools.partial(fn, self)

    # naming and output ----------------------------------------------------------------------
    @staticmethod
    def name(t: Tensor, name: str, il: int | None = None) -> Tensor:
        """llama.cpp's cb(cur, name, il): names carry the layer index (attn_norm-3)."""
        t.name = name if il is None or il < 0 else f"{name}-{il}"
        return t

    def build(self, outputs: Iterable[Tensor], first: Iterable[Tensor] = ()) -> Graph:
        return Graph.from_outputs(outputs, first)
