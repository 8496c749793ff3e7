"""Block layouts: sizes and field offsets as in ggml-common.h."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.ir.types import GGMLType, type_size
from ggmlpy.quants import block_dtype, supported_types

LAYOUT_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1,
                GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q2_K,
                GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_K,
                GGMLType.MXFP4]

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
    assert set(LAYOUT_TYPES) <= set(supported_types())


@pytest.mark.parametrize("t", [GGMLType.IQ2_XXS, GGMLType.IQ4_NL, GGMLType.TQ1_0, GGMLType.IQ2_XS])
def test_no_layout_for_unsupported_formats(t):
    with pytest.raises(NotImplementedError, match=t.name):
        block_dtype(t)
