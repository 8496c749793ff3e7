"""Block layouts: sizes and field offsets as in ggml-common.h."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ggmlpy.ir.types import GGMLType, block_size, type_size
from ggmlpy.quants import block_dtype, supported_types

LAYOUT_TYPES = list(GGMLType)   # every type ggml numbers has a layout

# (field, byte offset, bytes) read off the C structs in ggml-common.h
EXPECTED_FIELDS = {
    GGMLType.Q4_0: [("d", 0, 2), ("qs", 2, 16)],
    GGMLType.Q4_1: [("d", 0, 2), ("m", 2, 2), ("qs", 4, 16)],
    GGMLType.Q5_0: [("d", 0, 2), ("qh", 2, 4), ("qs", 6, 16)],
    GGMLType.Q5_1: [("d", 0, 2), ("m", 2, 2), ("qh", 4, 4), ("qs", 8, 16)],
    GGMLType.Q8_0: [("d", 0, 2), ("qs", 2, 32)],
    GGMLType.Q8_1: [("d", 0, 2), ("s", 2, 2), ("qs", 4, 32)],
    GGMLType.Q2_K: [("scales", 0, 16), ("qs", 16, 64), ("d", 80, 2), ("dmin", 82, 2)],
    GGMLType.Q3_K: [("hmask", 0, 32), ("qs", 32, 64), ("scales", 96, 12), ("d", 108, 2)],
    GGMLType.Q4_K: [("d", 0, 2), ("dmin", 2, 2), ("scales", 4, 12), ("qs", 16, 128)],
    GGMLType.Q5_K: [("d", 0, 2), ("dmin", 2, 2), ("scales", 4, 12), ("qh", 16, 32),
                    ("qs", 48, 128)],
    GGMLType.Q6_K: [("ql", 0, 128), ("qh", 128, 64), ("scales", 192, 16), ("d", 208, 2)],
    GGMLType.Q8_K: [("d", 0, 4), ("qs", 4, 256), ("bsums", 260, 32)],
    GGMLType.MXFP4: [("e", 0, 1), ("qs", 1, 16)],
    GGMLType.IQ2_XXS: [("d", 0, 2), ("qs", 2, 64)],
    GGMLType.IQ2_XS: [("d", 0, 2), ("qs", 2, 64), ("scales", 66, 8)],
    GGMLType.IQ2_S: [("d", 0, 2), ("qs", 2, 64), ("qh", 66, 8), ("scales", 74, 8)],
    GGMLType.IQ3_XXS: [("d", 0, 2), ("qs", 2, 96)],
    GGMLType.IQ3_S: [("d", 0, 2), ("qs", 2, 64), ("qh", 66, 8), ("signs", 74, 32), ("scales", 106, 4)],
    GGMLType.IQ1_S: [("d", 0, 2), ("qs", 2, 32), ("qh", 34, 16)],
    GGMLType.IQ1_M: [("qs", 0, 32), ("qh", 32, 16), ("scales", 48, 8)],
    GGMLType.IQ4_NL: [("d", 0, 2), ("qs", 2, 16)],
    GGMLType.IQ4_XS: [("d", 0, 2), ("scales_h", 2, 2), ("scales_l", 4, 4), ("qs", 8, 128)],
    GGMLType.TQ1_0: [("qs", 0, 48), ("qh", 48, 4), ("d", 52, 2)],
    GGMLType.TQ2_0: [("qs", 0, 64), ("d", 64, 2)],
    GGMLType.NVFP4: [("d", 0, 4), ("qs", 4, 32)],
    GGMLType.Q1_0: [("d", 0, 2), ("qs", 2, 16)],
    GGMLType.Q2_0: [("d", 0, 2), ("qs", 2, 16)],
}


@pytest.mark.parametrize("t", LAYOUT_TYPES, ids=lambda t: t.name)
def test_itemsize_is_ggml_type_size(t):
    assert block_dtype(t).itemsize == type_size(t)
    assert block_dtype(int(t)) == block_dtype(t)


@pytest.mark.parametrize("t", list(EXPECTED_FIELDS), ids=lambda t: t.name)
def test_field_offsets(t):
    dt = block_dtype(t)
    got = [(name, dt.fields[name][1], dt.fields[name][0].itemsize) for name in dt.names]
    assert got == EXPECTED_FIELDS[t]


def test_scales_are_little_endian_halves_or_floats():
    assert block_dtype(GGMLType.Q4_K)["d"] == np.dtype("<f2")
    assert block_dtype(GGMLType.Q8_K)["d"] == np.dtype("<f4")
    assert block_dtype(GGMLType.Q6_K)["scales"].base == np.dtype("i1")  # signed in ggml


def test_supported_types_cover_the_required_formats():
    assert set(LAYOUT_TYPES) == set(supported_types())


def test_trait_sizes_agree_with_the_gguf_package():
    # gguf gives Q8_1 40 bytes (float d and s); ggml-common.h's block_q8_1 has halves: 36
    for t in GGMLType:
        if t.name in GGMLQuantizationType.__members__ and t != GGMLType.Q8_1:
            assert (block_size(t), type_size(t)) == GGML_QUANT_SIZES[GGMLQuantizationType[t.name]], t.name


@pytest.mark.parametrize("t, name", [(4, r"Q4_2 \(removed from ggml\)"), (36, r"IQ4_NL_4_4 \(removed"),
                                     (43, "unknown type 43")])
def test_no_layout_for_removed_or_unknown_ids(t, name):
    with pytest.raises(NotImplementedError, match=name):
        block_dtype(t)
