"""A mixture-of-experts router's row kernels on the CPU backend (kernels/sort.py) against
the numpy reference: argsort at router sizes, with ties (index order) and NaNs (last), and
sum_rows."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.testing.ops import make_inputs, run_case

F32 = GGMLType.F32


@pytest.mark.parametrize("order", [0, 1], ids=["ascending", "descending"])
@pytest.mark.parametrize("n_expert, n_tokens", [(128, 20), (8, 3), (256, 1)])
def test_argsort_at_router_sizes(order, n_expert, n_tokens):
    case = OpCase((SrcSpec(F32, (n_expert, n_tokens, 1, 1)),), (("order", order),))
    inputs = make_inputs(case, np.random.default_rng(n_expert))
    ours, _ = run_case("argsort", case, CpuBackend(n_threads=2), inputs=inputs)
    expected, _ = run_case("argsort", case, RefBackend(), inputs=inputs)
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("order", [0, 1], ids=["ascending", "descending"])
def test_argsort_ties_keep_index_order_and_nans_go_last(order):
    x = np.array([[1, np.nan, 3, 3, -1, np.nan, 0, 2, 3], [0] * 9], np.float32)
    case = OpCase((SrcSpec(F32, (9, 2, 1, 1)),), (("order", order),))
    ours, _ = run_case("argsort", case, CpuBackend(n_threads=2), inputs={"src0": x})
    expected = [[4, 6, 0, 7, 2, 3, 8, 1, 5], list(range(9))] if order == 0 else \
        [[2, 3, 8, 7, 0, 6, 4, 1, 5], list(range(9))]
    assert ours.reshape(2, 9).tolist() == expected


def test_sum_rows_in_double_precision():
    """A row whose float32 running sum would lose the small values."""
    x = np.array([[1e8] + [1.0] * 99 + [-1e8]], np.float32)
    case = OpCase((SrcSpec(F32, (101, 1, 1, 1)),))
    ours, _ = run_case("sum_rows", case, CpuBackend(n_threads=2), inputs={"src0": x})
    assert ours.reshape(-1).tolist() == [99.0]


def test_gating_functions_across_their_range():
    """sigmoid and softplus (sqrt-softplus gating; its ln is a polynomial in the CPU kernel,
    no libm) against float64 math from -30 to 30 and at the edges: the 20 where softplus
    turns into x, infinities and NaN."""
    x = np.concatenate([np.linspace(-30, 30, 1199), [19.999, 20.0, 20.001, -np.inf, np.inf, np.nan, 0.0]])
    x = x.astype(np.float32).reshape(1, -1)
    case = OpCase((SrcSpec(F32, (x.shape[1], 1, 1, 1)),))
    x64 = x.astype(np.float64)
    # ggml's softplus takes the log of 1 + exp(x) rounded to float32 (0 below about -16)
    exact = {"sigmoid": (1.0 / (1.0 + np.exp(-x64)), 1e-30),
             "softplus": (np.where(x > 20, x64, np.log((1.0 + np.exp(x64)).astype(np.float32).astype(np.float64))), 3e-7)}
    for op, (want, atol) in exact.items():
        ours, _ = run_case(op, case, CpuBackend(n_threads=2), inputs={"src0": x})
        ours = ours.reshape(want.shape)
        finite = np.isfinite(want)
        np.testing.assert_allclose(ours[finite], want[finite], rtol=2e-6, atol=atol)
        assert np.array_equal(ours[np.isinf(want)], want[np.isinf(want)]) and np.isnan(ours[0, -2])
