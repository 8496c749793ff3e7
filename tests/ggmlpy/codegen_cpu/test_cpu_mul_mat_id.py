"""mul_mat_id on the CPU backend (kernels/matmul_id.py) beyond the registry's small cases:
prompt-sized token counts, many experts, the K-quants, and two exact checks: each (token,
slot) result is bit for bit the plain mul_mat of that token with its expert's matrix, and
the thread count does not change a bit."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.testing.ops import make_inputs, normalized_error, run_case

G = GGMLType
GGML_BAR = 5e-4   # test-backend-ops' bar for quantised products (8-bit activations)

# (weight type, K, M, n_expert, n_used, n_b, n_tokens)
CASES = [(G.Q4_0, 128, 40, 8, 2, 1, 33), (G.Q8_0, 64, 17, 6, 3, 3, 9), (G.Q4_K, 256, 24, 16, 4, 1, 20),
         (G.Q6_K, 512, 8, 5, 2, 2, 7), (G.Q5_K, 256, 12, 4, 1, 1, 3), (G.Q2_K, 256, 10, 3, 2, 1, 4),
         (G.MXFP4, 96, 24, 8, 4, 1, 7), (G.MXFP4, 160, 9, 4, 2, 2, 33), (G.IQ4_NL, 96, 24, 8, 4, 1, 7),
         (G.IQ4_XS, 256, 12, 4, 2, 1, 5),
         # the grid I-quants and ternary types (kernels/qgrid.py, qternary.py)
         (G.IQ3_S, 256, 24, 8, 2, 1, 33), (G.IQ3_XXS, 256, 12, 4, 2, 1, 5), (G.IQ2_S, 512, 9, 4, 2, 2, 7),
         (G.IQ2_XS, 256, 16, 6, 3, 1, 9), (G.IQ2_XXS, 256, 12, 4, 2, 1, 5), (G.IQ1_S, 256, 12, 4, 2, 1, 5),
         (G.IQ1_M, 512, 10, 3, 2, 1, 4), (G.TQ2_0, 256, 12, 4, 2, 1, 5), (G.TQ1_0, 256, 12, 4, 1, 1, 3)]


# model weights whose rows come in groups of 16: kept repacked (qrepacked's tiles, the pairs
# grouped by expert); the last three give experts many pairs each (whole tiles of 4 and a rest)
REPACKED = [(G.Q4_0, 128, 48, 8, 2, 1, 9), (G.Q8_0, 64, 32, 6, 3, 3, 5), (G.Q4_K, 256, 32, 16, 4, 1, 6),
            (G.Q6_K, 512, 16, 5, 2, 2, 3), (G.Q5_K, 256, 16, 4, 1, 1, 2), (G.Q3_K, 256, 32, 3, 2, 1, 4),
            (G.MXFP4, 96, 32, 8, 4, 1, 5), (G.MXFP4, 576, 16, 4, 2, 2, 3),
            (G.Q4_K, 256, 32, 4, 2, 1, 37), (G.Q8_0, 64, 32, 2, 2, 2, 11), (G.MXFP4, 64, 48, 3, 2, 1, 30),
            (G.IQ4_NL, 96, 32, 8, 4, 1, 5), (G.IQ4_NL, 64, 48, 3, 2, 1, 30)]


def _case(t, k, m, n_expert, n_used, n_b, n_tok, weight: bool = False) -> OpCase:
    return OpCase((SrcSpec(t, (k, m, n_expert, 1), weight=weight), SrcSpec(G.F32, (k, n_b, n_tok, 1)),
                   SrcSpec(G.I32, (n_used, n_tok), fill=f"unique_rows:{n_expert}")),
                  label=f"{t.name} k={k} m={m} experts={n_used}/{n_expert} n_b={n_b} tokens={n_tok}")


@pytest.mark.parametrize("shape", CASES, ids=lambda c: _case(*c).label)
def test_against_the_reference(shape):
    case = _case(*shape)
    inputs = make_inputs(case, np.random.default_rng(1))
    ours, _ = run_case("mul_mat_id", case, CpuBackend(n_threads=2), inputs=inputs)
    expected, _ = run_case("mul_mat_id", case, RefBackend(), inputs=inputs)
    assert normalized_error(ours, expected) <= GGML_BAR


@pytest.mark.parametrize("shape", REPACKED, ids=lambda c: _case(*c).label)
def test_repacked_experts_against_the_reference(shape):
    from ggmlpy.codegen_cpu import repack
    from ggmlpy.testing.ops import build_case_graph

    case = _case(*shape, weight=True)
    graph, node = build_case_graph("mul_mat_id", case)
    assert repack.operand_repacked(node, 0)
    inputs = make_inputs(case, np.random.default_rng(4))
    ours, _ = run_case("mul_mat_id", case, CpuBackend(n_threads=3), inputs=inputs)
    expected, _ = run_case("mul_mat_id", case, RefBackend(), inputs=inputs)
    assert normalized_error(ours, expected) <= GGML_BAR
    direct, _ = run_case("mul_mat_id", _case(*shape), CpuBackend(n_threads=2), inputs=inputs)
    assert normalized_error(ours, direct) <= 1e-9   # the same 8-bit scheme, summed in another order


@pytest.mark.parametrize("shape", CASES[:3], ids=lambda c: _case(*c).label)
def test_each_pair_is_the_plain_product_with_its_expert(shape):
    """mul_mat of one token against the expert's matrix as a plain (not repacked) operand
    takes the same one-token tiles: the same bits."""
    t, k, m, n_expert, n_used, n_b, n_tok = shape
    case = _case(*shape)
    inputs = make_inputs(case, np.random.default_rng(2))
    ours, _ = run_case("mul_mat_id", case, CpuBackend(n_threads=2), inputs=inputs)   # [1, n_tok, n_used, m]
    ids = inputs["src2"].reshape(n_tok, n_used)
    weights = inputs["src0"].reshape(n_expert, m, -1)
    x = inputs["src1"].reshape(n_tok, n_b, k)
    plain_case = OpCase((SrcSpec(t, (k, m, 1, 1)), SrcSpec(G.F32, (k, 1, 1, 1))))
    cpu = CpuBackend(n_threads=2)
    for tok in range(n_tok):
        for u in range(n_used):
            plain, _ = run_case("mul_mat", plain_case, cpu,
                                inputs={"src0": weights[ids[tok, u]], "src1": x[tok, u % n_b][None]})
            np.testing.assert_array_equal(ours[0, tok, u], plain.reshape(-1))


def test_threads_give_identical_results():
    case = _case(*CASES[2])
    inputs = make_inputs(case, np.random.default_rng(3))
    results = [run_case("mul_mat_id", case, CpuBackend(n_threads=n), inputs=inputs)[0] for n in (1, 2, 3)]
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


def test_the_cpu_runs_quantised_expert_products():
    from ggmlpy.testing.ops import build_case_graph

    graph, _ = build_case_graph("mul_mat_id", _case(*CASES[0]))
    assert all(CpuBackend(n_threads=2).supports_op(n) for n in graph.nodes)
