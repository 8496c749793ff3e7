"""Byte layouts of ggml's block formats as numpy structured dtypes.

A tensor of a quantised type is an array of fixed-size blocks. Viewing its bytes through the
block's structured dtype gives named, zero-copy access to every field (`blocks["d"]`), which
is what both the dequantisers and the quantisers work on. The field order and sizes are those
of the C structs in ggml-common.h; the structs are packed (2-byte halves, no padding), so the
dtypes are built unaligned and their itemsize equals ggml's `type_size`.
"""
from __future__ import annotations

import numpy as np

from ggmlpy.ir.types import GGMLType, type_name

QK_K = 256  # elements in a K-quant super-block
K_SCALE_SIZE = 12  # bytes of packed 6-bit scales and mins in Q4_K / Q5_K

_F16 = "<f2"

_LAYOUTS: dict[GGMLType, list[tuple]] = {
    GGMLType.F32: [("v", "<f4")],
    GGMLType.F16: [("v", _F16)],
    GGMLType.BF16: [("v", "<u2")],  # numpy has no bfloat16: the raw 16 bits
    GGMLType.F64: [("v", "<f8")],
    GGMLType.I8: [("v", "i1")],
    GGMLType.I16: [("v", "<i2")],
    GGMLType.I32: [("v", "<i4")],
    GGMLType.I64: [("v", "<i8")],
    GGMLType.Q4_0: [("d", _F16), ("qs", "u1", (16,))],
    GGMLType.Q4_1: [("d", _F16), ("m", _F16), ("qs", "u1", (16,))],
    GGMLType.Q5_0: [("d", _F16), ("qh", "u1", (4,)), ("qs", "u1", (16,))],
    GGMLType.Q5_1: [("d", _F16), ("m", _F16), ("qh", "u1", (4,)), ("qs", "u1", (16,))],
    GGMLType.Q8_0: [("d", _F16), ("qs", "i1", (32,))],
    GGMLType.Q8_1: [("d", _F16), ("s", _F16), ("qs", "i1", (32,))],
    GGMLType.Q2_K: [("scales", "u1", (QK_K // 16,)), ("qs", "u1", (QK_K // 4,)),
                    ("d", _F16), ("dmin", _F16)],
    GGMLType.Q3_K: [("hmask", "u1", (QK_K // 8,)), ("qs", "u1", (QK_K // 4,)),
                    ("scales", "u1", (12,)), ("d", _F16)],
    GGMLType.Q4_K: [("d", _F16), ("dmin", _F16), ("scales", "u1", (K_SCALE_SIZE,)),
                    ("qs", "u1", (QK_K // 2,))],
    GGMLType.Q5_K: [("d", _F16), ("dmin", _F16), ("scales", "u1", (K_SCALE_SIZE,)),
                    ("qh", "u1", (QK_K // 8,)), ("qs", "u1", (QK_K // 2,))],
    GGMLType.Q6_K: [("ql", "u1", (QK_K // 2,)), ("qh", "u1", (QK_K // 4,)),
                    ("scales", "i1", (QK_K // 16,)), ("d", _F16)],
    GGMLType.Q8_K: [("d", "<f4"), ("qs", "i1", (QK_K,)), ("bsums", "<i2", (QK_K // 16,))],
    # e: the block's power-of-two scale as an E8M0 exponent (no sign, no mantissa), which no
    # f16 can hold; qs: 4-bit E2M1 codes, element j in the low nibble of byte j, j + 16 high
    GGMLType.MXFP4: [("e", "u1"), ("qs", "u1", (16,))],
}

_DTYPES: dict[GGMLType, np.dtype] = {t: np.dtype(fields) for t, fields in _LAYOUTS.items()}


def block_dtype(t: GGMLType | int) -> np.dtype:
    """The structured dtype of one block of `t` (one element for the plain types)."""
    try:
        return _DTYPES[GGMLType(t)]
    except (ValueError, KeyError):
        raise NotImplementedError(f"no block layout for ggml type {type_name(int(t))}") from None


def supported_types() -> tuple[GGMLType, ...]:
    """Every type with a layout here, in ggml id order."""
    return tuple(sorted(_DTYPES))
