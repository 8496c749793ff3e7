"""Every op case of the registry on the CPU backend against the numpy reference, by ggml's
normalised error (test-backend-ops style), plus symbolic sizes and threads."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.lowering import LOWERINGS
from ggmlpy.ir.ops import OPS, Kind, OpCase, SrcSpec
from ggmlpy.testing.ops import build_case_graph, case_id, compare_backends, iter_cases
from ggmlpy.ir.types import GGMLType, is_quantized
from ggmlpy.sched.ref_backend import RefBackend

# the registry's cases, and products of the weight types the CPU backend computes but the
# CUDA backend (which runs every registry case) does not
CPU_ONLY = [OpCase((SrcSpec(t, (256, 9, 1, 1)), SrcSpec(GGMLType.F32, (256, n, 1, 1))), label=f"{t.name} n={n}")
            for t in (GGMLType.Q2_K, GGMLType.Q3_K) for n in (1, 7)]
CASES = list(iter_cases()) + [("mul_mat", 100 + i, case) for i, case in enumerate(CPU_ONLY)]

# ops the CPU backend leaves to the reference backend (documented in the README)
NOT_LOWERED: set[str] = set()


@pytest.fixture(scope="module")
def backends():
    return CpuBackend(n_threads=2), RefBackend()


def max_error(op: str, case) -> float:
    """ggml's bars: quantised matrix products see 8-bit activations, the rest is f32 math."""
    if op in ("mul_mat", "mul_mat_id") and is_quantized(case.srcs[0].type):
        return 5e-4
    return 1e-6


@pytest.mark.parametrize("op,i,case", CASES, ids=[case_id(*c) for c in CASES])
def test_case_matches_reference(backends, op, i, case):
    cpu, ref = backends
    graph, _ = build_case_graph(op, case)
    if not all(cpu.supports_op(n) for n in graph.nodes):
        pytest.skip(f"{op}: this variant falls back to the reference backend")
    err = compare_backends(op, case, cpu, ref, np.random.default_rng(i))
    assert err <= max_error(op, case), err


def test_every_op_has_a_cpu_lowering():
    missing = {name for name, op in OPS.items() if op.kind != Kind.VIEW and name not in LOWERINGS}
    assert missing == NOT_LOWERED


def test_threads_give_identical_results():
    """Rows are split across threads; results must not depend on the split."""
    op, i, case = next(c for c in CASES if c[0] == "mul_mat" and "Q4_1" in c[2].label and "n=7" in c[2].label)
    ref = RefBackend()
    errs = [compare_backends(op, case, CpuBackend(n_threads=n), ref, np.random.default_rng(3)) for n in (1, 2, 3)]
    assert errs[0] == errs[1] == errs[2]
