"""Argument checking shared by dequantize and quantize.

Tensor bytes come from files users downloaded from anywhere, so every mismatch between the
bytes, the type and the shape is reported as a ValueError that names all three, before numpy
gets a chance to fail with a reshape error deep inside a kernel.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ggmlpy.ir.types import GGMLType, block_size, type_name, type_size

GGML_MAX_DIMS = 4

# (elements, bytes) per block; looked up on every call, so kept as one plain dict
_SIZES = {t: (block_size(t), type_size(t)) for t in GGMLType}


def as_type(t: GGMLType | int) -> GGMLType:
    """`t` as a GGMLType; ids that ggml never had or removed are a ValueError."""
    if type(t) is GGMLType:
        return t
    try:
        return GGMLType(int(t))
    except (ValueError, TypeError):
        name = type_name(int(t)) if isinstance(t, (int, np.integer)) else repr(t)
        raise ValueError(f"not a ggml type: {name}") from None


def as_ne(ne: Sequence[int]) -> tuple[int, ...]:
    """ggml shape (ne[0] innermost) as a tuple of non-negative Python ints."""
    try:
        dims = tuple(int(n) for n in ne)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a sequence of integers, got {ne!r}") from None
    if not 1 <= len(dims) <= GGML_MAX_DIMS:
        raise ValueError(f"shape {list(dims)} must have 1 to {GGML_MAX_DIMS} dimensions")
    if any(n < 0 for n in dims):
        raise ValueError(f"shape {list(dims)} has a negative dimension")
    return dims


def row_bytes(t: GGMLType, ne0: int, ne: Sequence[int] | None = None) -> int:
    """Bytes of one row of `ne0` elements, checking the block size."""
    bs, size = _SIZES[t]
    if ne0 % bs:
        shape = list(ne) if ne is not None else [ne0]
        raise ValueError(f"{t.name} tensor of shape {shape}: ne[0] = {ne0} is not a multiple "
                         f"of the block size {bs}")
    return ne0 // bs * size


def nbytes(t: GGMLType, ne: tuple[int, ...]) -> int:
    """Bytes a whole tensor of type `t` and shape `ne` occupies."""
    n_rows = 1
    for n in ne[1:]:
        n_rows *= n
    return row_bytes(t, ne[0], ne) * n_rows


def as_bytes(data: object) -> np.ndarray:
    """The tensor's bytes as a flat, C-contiguous uint8 array (a view where possible)."""
    if type(data) is np.ndarray and data.dtype == np.uint8 and data.ndim == 1 \
            and data.flags.c_contiguous:
        return data
    if isinstance(data, np.ndarray):
        arr = data
    elif isinstance(data, (bytes, bytearray, memoryview)):
        arr = np.frombuffer(data, dtype=np.uint8)
    else:
        raise TypeError(f"tensor data must be a numpy array, bytes or memoryview, "
                        f"not {type(data).__name__}")
    if arr.dtype.hasobject:
        raise TypeError("tensor data must be a numeric numpy array, not an object array")
    arr = np.ascontiguousarray(arr)
    return arr.reshape(-1).view(np.uint8)


def check_length(raw: np.ndarray, t: GGMLType, ne: tuple[int, ...]) -> None:
    expected = nbytes(t, ne)
    if raw.size != expected:
        raise ValueError(f"{t.name} tensor of shape {list(ne)} needs {expected} bytes, "
                         f"got {raw.size}")
