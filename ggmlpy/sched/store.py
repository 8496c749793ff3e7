"""Host memory for one graph run: bound leaves, op results, and ggml-style strided views."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import BOUND, BOUND_BITS, Tensor
from ggmlpy.ir.types import GGMLType, block_size, is_quantized, type_size

NUMPY_DTYPES = {
    GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.BF16: np.uint16,
    GGMLType.F64: np.float64, GGMLType.I8: np.int8, GGMLType.I16: np.int16,
    GGMLType.I32: np.int32, GGMLType.I64: np.int64,
}




class BindingError(ValueError):
    """A graph leaf has no data, or data of the wrong size."""


class TensorStore:
    """Maps every buffer-owning tensor to a flat byte buffer; views are strided windows.

    Leaves flagged INPUT/WEIGHT/CACHE are bound by name; other tensors get their buffer when
    an op produces them. `array(t)` returns t's elements as ggml lays them out: a numpy array
    of shape ne reversed over t's bytes, with t's byte strides (quantised types: raw rows).
    """

    def __init__(self, bindings: Mapping[str, np.ndarray]):
        self.bindings = bindings
        self.buffers: dict[int, np.ndarray] = {}

    def buffer(self, t: Tensor) -> np.ndarray:
        root = t.view_src if t.view_src is not None else t
        buf = self.buffers.get(root.id)
        if buf is None:
            if not root.flags & BOUND:
                raise BindingError(f"tensor {root!r} has not been computed")
            if root.name not in self.bindings:
                raise BindingError(f"no data bound for {root.name!r}")
            data = self.bindings[root.name]
            buf = data.reshape(-1).view(np.uint8) if data.flags.c_contiguous else None
            if buf is None:
                raise BindingError(f"data bound for {root.name!r} is not contiguous")
            self.buffers[root.id] = buf
        return buf

    def source(self, t: Tensor) -> np.ndarray | None:
        """The array behind t's buffer, without checks: the result stored for t's root, else
        the array bound to it (None: neither yet). The same object means the same memory,
        so a compiled graph that bound it in an earlier run may keep its pointer."""
        root = t.view_src if t.view_src is not None else t
        buf = self.buffers.get(root.id)
        if buf is not None or not root.flags._value_ & BOUND_BITS:
            return buf
        try:
            return self.bindings[root.name]
        except KeyError:
            return None

    def array(self, t: Tensor, env: Mapping[str, int]) -> np.ndarray:
        ne = [evaluate(d, env) for d in t.ne]
        nb = [evaluate(d, env) for d in t.nb]
        offset = evaluate(t.view_offs, env) if t.view_src is not None else 0
        buf = self.buffer(t)
        if is_quantized(t.type):
            shape = (ne[3], ne[2], ne[1], ne[0] // block_size(t.type) * type_size(t.type))
            strides = (nb[3], nb[2], nb[1], 1)
            dtype = np.uint8
        else:
            shape = (ne[3], ne[2], ne[1], ne[0])
            strides = (nb[3], nb[2], nb[1], nb[0])
            dtype = NUMPY_DTYPES[t.type]
        extent = offset + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0) + np.dtype(dtype).itemsize
        if min(shape) > 0 and extent > buf.nbytes:
            raise BindingError(f"{t!r} reaches byte {extent} of a {buf.nbytes}-byte buffer")
        return np.ndarray(shape, dtype=dtype, buffer=buf, offset=offset, strides=strides)

    def set_result(self, t: Tensor, values: np.ndarray, env: Mapping[str, int]) -> None:
        """Store an op's result (contiguous, in t's type)."""
        dtype = NUMPY_DTYPES[t.type]
        shape = tuple(evaluate(d, env) for d in reversed(t.ne))
        out = np.ascontiguousarray(values, dtype=dtype).reshape(shape)
        self.buffers[t.id] = out.reshape(-1).view(np.uint8)
