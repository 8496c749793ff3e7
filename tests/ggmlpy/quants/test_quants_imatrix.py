"""Quantisation with an importance matrix: byte for byte against ggml_quantize_chunk given the
same matrix (stored by make_ggml_quant_cases.py: the rows of every kind in `q_x`, four
matrices from log-normal to 40 orders of magnitude apart, some with zeros), for every type
whose quantiser weighs by one; and the errors of a matrix that does not fit."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ggmlpy.ir.types import GGMLType
from ggmlpy.quants import dequantize, quantize

T = GGMLType
CASES = np.load(Path(__file__).with_name("data") / "ggml_quant_cases.npz")
IMATRIX_TYPES = sorted((T[k[len("q_im_"):]] for k in CASES.files if k.startswith("q_im_")), key=int)


def test_every_weighing_type_is_covered():
    assert len(IMATRIX_TYPES) == 18
    assert {T.IQ2_XXS, T.IQ2_XS, T.IQ1_S, T.IQ1_M, T.Q4_K, T.Q4_0} <= set(IMATRIX_TYPES)


@pytest.mark.parametrize("t", IMATRIX_TYPES, ids=lambda t: t.name)
def test_equals_ggml_with_an_importance_matrix(t):
    x = CASES["q_x"]
    for i, imatrix in enumerate(CASES["q_imatrix"]):
        ours = quantize(x, t, imatrix=imatrix).reshape(-1)
        np.testing.assert_array_equal(ours, CASES[f"q_im_{t.name}"][i], err_msg=f"imatrix {i}")


@pytest.mark.parametrize("t", [T.Q4_K, T.Q4_0, T.IQ4_XS], ids=lambda t: t.name)
def test_the_matrix_changes_the_bytes_where_it_weighs(t):
    """A control: the weighted bytes differ from the reference ones, and a column the matrix
    calls important is reproduced better than with a matrix that ignores it."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 1024)).astype(np.float32)
    assert not np.array_equal(quantize(x, t), quantize(x, t, imatrix=CASES["q_imatrix"][0]))
    hot = np.ones(1024, np.float32)
    hot[::16] = 1e4
    err_hot = np.abs(dequantize(quantize(x, t, imatrix=hot), t, (1024, 8)) - x)[:, ::16].mean()
    err_flat = np.abs(dequantize(quantize(x, t, imatrix=np.ones(1024, np.float32)), t, (1024, 8)) - x)[:, ::16].mean()
    assert err_hot < 0.8 * err_flat


def test_iq1_m_without_a_matrix():
    """ggml quantises IQ1_M without one too, weighing by x*x."""
    np.testing.assert_array_equal(quantize(CASES["q_x"], T.IQ1_M).reshape(-1), CASES["q_chunk_IQ1_M"])


def test_types_that_ignore_a_matrix_write_the_same_bytes():
    x = CASES["q_x"]
    for t in (T.Q8_0, T.MXFP4, T.TQ2_0, T.F16):
        with np.errstate(over="ignore"):   # F16 of the 1e8 rows
            np.testing.assert_array_equal(quantize(x, t, imatrix=CASES["q_imatrix"][0]), quantize(x, t))


def test_a_matrix_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="one value per column"):
        quantize(np.zeros((2, 512), np.float32), T.Q4_K, imatrix=np.ones(256, np.float32))


def test_types_that_need_a_matrix_refuse_without():
    for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ1_S):
        with pytest.raises(ValueError, match="needs an importance matrix"):
            quantize(np.zeros((1, 256), np.float32), t)
