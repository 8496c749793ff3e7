"""ggml element types and their block traits.

One table for every type ggml has ever numbered: the GGUF reader needs to recognise all of
them (and reject the removed ones by name), the quantisation code needs block sizes, and the
IR needs to know which types are quantised.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class GGMLType(enum.IntEnum):
    """Element type ids as ggml numbers them (ggml.h `enum ggml_type`)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42


# Ids ggml once used and removed; files that still carry them cannot be read correctly.
REMOVED_TYPES: dict[int, str] = {
    4: "Q4_2",
    5: "Q4_3",
    31: "Q4_0_4_4",
    32: "Q4_0_4_8",
    33: "Q4_0_8_8",
    36: "IQ4_NL_4_4",
    37: "IQ4_NL_4_8",
    38: "IQ4_NL_8_8",
}


@dataclass(frozen=True)
class TypeTraits:
    """How a row of this type is laid out: `block_size` elements in `type_size` bytes."""

    block_size: int
    type_size: int
    is_quantized: bool


_TRAITS: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20),
    GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q8_1: (32, 36),
    GGMLType.Q2_K: (256, 84),
    GGMLType.Q3_K: (256, 110),
    GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210),
    GGMLType.Q8_K: (256, 292),
    GGMLType.IQ2_XXS: (256, 66),
    GGMLType.IQ2_XS: (256, 74),
    GGMLType.IQ3_XXS: (256, 98),
    GGMLType.IQ1_S: (256, 50),
    GGMLType.IQ4_NL: (32, 18),
    GGMLType.IQ3_S: (256, 110),
    GGMLType.IQ2_S: (256, 82),
    GGMLType.IQ4_XS: (256, 136),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (256, 56),
    GGMLType.BF16: (1, 2),
    GGMLType.TQ1_0: (256, 54),
    GGMLType.TQ2_0: (256, 66),
    GGMLType.MXFP4: (32, 17),
    GGMLType.NVFP4: (64, 36),
    GGMLType.Q1_0: (128, 18),
    GGMLType.Q2_0: (64, 18),
}

_PLAIN = {GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.F64,
          GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64}


def traits(t: GGMLType) -> TypeTraits:
    block, size = _TRAITS[GGMLType(t)]
    return TypeTraits(block, size, GGMLType(t) not in _PLAIN)


def _traits_of(t: GGMLType | int) -> tuple[int, int]:
    """(block, bytes) of t; an IntEnum hashes as its value, so a plain id finds its entry
    without an enum conversion (shapes ask this thousands of times per graph)."""
    entry = _TRAITS.get(t)
    return entry if entry is not None else _TRAITS[GGMLType(t)]   # a bad id: ValueError


def block_size(t: GGMLType) -> int:
    return _traits_of(t)[0]


def type_size(t: GGMLType) -> int:
    return _traits_of(t)[1]


def is_quantized(t: GGMLType) -> bool:
    return GGMLType(t) not in _PLAIN


def row_size(t: GGMLType, n: int) -> int:
    """Bytes of a row of `n` elements; `n` must be a multiple of the block size."""
    block, size = _TRAITS[GGMLType(t)]
    if n % block:
        raise ValueError(f"row of {n} elements is not a multiple of {GGMLType(t).name}'s block size {block}")
    return n // block * size


def type_name(t: int) -> str:
    """A readable name for any id, known, removed or unknown (for error messages)."""
    if t in GGMLType._value2member_map_:
        return GGMLType(t).name
    if t in REMOVED_TYPES:
        return f"{REMOVED_TYPES[t]} (removed from ggml)"
    return f"unknown type {t}"
