"""Every op case (the registry's and tests/ggmlpy/codegen_cuda/cases.py's) on the CUDA backend against the
numpy reference backend, by ggml's normalised error, on each device the session has: the
host emulator always, the GPU when present (else skipped with the reason).

Three option sets: default (matrix-vector kernel for few columns), tiled (every product on
the tensor-core kernel, whose operands are rounded to half) and unfused.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cuda.lower_matmul import MatMulOptions
from ggmlpy.testing.ops import build_case_graph, make_inputs, normalized_error, run_case
from ggmlpy.sched.ref_backend import RefBackend

from .cases import OPTION_SETS, all_cases

CASES = list(all_cases())
EXACT = 1e-9   # float32 arithmetic in another order
HALF = 5e-5    # products with operands rounded to half (ggml test-backend-ops allows 5e-4)


def bar(op: str, case, options: str) -> float:
    """HALF where the product runs on the tiled kernel: always with "tiled", and with more
    columns than the matrix-vector kernel takes otherwise."""
    if op != "mul_mat":
        return EXACT
    _, node = build_case_graph(op, case)
    return HALF if options == "tiled" or node.src[1].ne[1] > MatMulOptions().max_cols else EXACT


@pytest.mark.parametrize("options", list(OPTION_SETS))
@pytest.mark.parametrize("case_id,op,case", CASES, ids=[c[0] for c in CASES])
def test_op_matches_reference(warm_backends, options, case_id, op, case):
    kind, backends = warm_backends
    inputs = make_inputs(case, np.random.default_rng(7))
    ref, _ = run_case(op, case, RefBackend(), inputs)
    ours, _ = run_case(op, case, backends[options], inputs)
    assert ours.shape == ref.shape
    err = normalized_error(ours, ref)
    assert err <= bar(op, case, options), f"{kind}: NMSE {err:.3g} for {case_id} ({options})"


def test_a_wrong_kernel_would_fail(warm_backends):
    """The bar is tight enough to catch a small mistake: a scale off by 1e-3 fails it."""
    kind, backends = warm_backends
    op, case = next((o, c) for _, o, c in CASES if o == "scale")
    inputs = make_inputs(case, np.random.default_rng(7))
    ours, _ = run_case(op, case, backends["default"], inputs)
    ref, _ = run_case(op, case, RefBackend(), inputs)
    assert normalized_error(ours * 1.001, ref) > EXACT
