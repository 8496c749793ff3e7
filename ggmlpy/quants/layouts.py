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
    # qs: 4-bit indices into kvalues_iq4nl (iq_grids.py), nibbles laid out as Q4_0's
    GGMLType.IQ4_NL: [("d", _F16), ("qs", "u1", (16,))],
    # eight sub-blocks of 32 with 6-bit scales stored + 32: the low four bits in nibble s % 2 of
    # scales_l[s // 2], the top two at bits 2s of scales_h; each sub-block's qs as IQ4_NL's
    GGMLType.IQ4_XS: [("d", _F16), ("scales_h", "<u2"), ("scales_l", "u1", (QK_K // 64,)),
                      ("qs", "u1", (QK_K // 2,))],
    # The grid I-quants (dequant_iq.py gives each one's element order): groups of 8 (or 4)
    # elements are one grid index (iq_grids.py) and one sign byte, scaled per 16 or 32.
    # qs: per 32 elements, 4 bytes of grid indices then a word of 4 x 7 sign bits + a 4-bit scale
    GGMLType.IQ2_XXS: [("d", _F16), ("qs", "<u2", (QK_K // 8,))],
    # qs: a 9-bit grid index and 7 sign bits per 8 elements; scales: two 4-bit scales per 32
    GGMLType.IQ2_XS: [("d", _F16), ("qs", "<u2", (QK_K // 8,)), ("scales", "u1", (QK_K // 32,))],
    # qs: 32 grid index bytes (bits 8-9 in qh), then 32 full sign bytes
    GGMLType.IQ2_S: [("d", _F16), ("qs", "u1", (QK_K // 4,)), ("qh", "u1", (QK_K // 32,)),
                     ("scales", "u1", (QK_K // 32,))],
    # qs: 64 indices of 4-element grid points, then 8 words of 4 x 7 sign bits + a 4-bit scale
    GGMLType.IQ3_XXS: [("d", _F16), ("qs", "u1", (3 * QK_K // 8,))],
    GGMLType.IQ3_S: [("d", _F16), ("qs", "u1", (QK_K // 4,)), ("qh", "u1", (QK_K // 32,)),
                     ("signs", "u1", (QK_K // 8,)), ("scales", "u1", (QK_K // 64,))],
    # qh: per 32 elements, four 3-bit index tops, a 3-bit scale and the sign of the shift
    GGMLType.IQ1_S: [("d", _F16), ("qs", "u1", (QK_K // 8,)), ("qh", "<u2", (QK_K // 32,))],
    # no d field: the f16 super-block scale is the top nibbles of the four scale words
    GGMLType.IQ1_M: [("qs", "u1", (QK_K // 8,)), ("qh", "u1", (QK_K // 16,)),
                     ("scales", "u1", (QK_K // 32,))],
    # ternary: qs packs 5 trits per byte (as a fixed-point fraction of 3^5), qh 4 trits
    GGMLType.TQ1_0: [("qs", "u1", ((QK_K - 4 * QK_K // 64) // 5,)), ("qh", "u1", (QK_K // 64,)),
                     ("d", _F16)],
    GGMLType.TQ2_0: [("qs", "u1", (QK_K // 4,)), ("d", _F16)],
    # d: one unsigned E4M3 scale per 16 elements; qs: E2M1 codes, MXFP4's layout per 16
    GGMLType.NVFP4: [("d", "u1", (4,)), ("qs", "u1", (32,))],
    # qs: one sign bit per element (bit j % 8 of byte j // 8): +d or -d
    GGMLType.Q1_0: [("d", _F16), ("qs", "u1", (16,))],
    # qs: 2-bit codes, element j at bits 2 * (j % 4) of byte j // 4: (code - 1) * d
    GGMLType.Q2_0: [("d", _F16), ("qs", "u1", (16,))],
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
