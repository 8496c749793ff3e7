"""Multi-section rope (ggml_rope_multi, modes 8 and 40) through the CPU backend's fused path:
Q and K of one layer, rotated by one rope_pair kernel (codegen_cpu/fusion.py's rope_qk), must
take each pair's position component as the single-rope kernel and the reference do. The
single-rope kernel itself runs the registry's cases (test_cpu_ops.py)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.ops.rope import ROPE_TYPE_IMROPE, ROPE_TYPE_MROPE
from ggmlpy.ir.symbolic import N_TOKENS
from ggmlpy.ir.types import GGMLType
from ggmlpy.testing.ops import normalized_error
from tests.ggmlpy.codegen_cpu.pipeline_runs import run_cpu_and_ref

F32, I32 = GGMLType.F32, GGMLType.I32


def qk_graph(mode: int, sections: tuple[int, ...], head: int = 16, n_dims: int = 16):
    """q and k projections of one activation, each rotated by rope_multi (the rope_qk pattern),
    over a symbolic token count (the position of component c is at token + c * n_tokens)."""
    b = GraphBuilder()
    x = b.input("x", F32, (32, N_TOKENS))
    pos = b.input("pos", I32, (4 * N_TOKENS,))
    q = b.reshape(b.mul_mat(b.input("wq", F32, (32, head * 3)), x), head, 3, N_TOKENS)
    k = b.reshape(b.mul_mat(b.input("wk", F32, (32, head * 2)), x), head, 2, N_TOKENS)
    rope = dict(n_ctx_orig=4096, freq_base=5e6)
    return b.build([b.rope_multi(q, pos, None, n_dims, sections, mode, **rope),
                    b.rope_multi(k, pos, None, n_dims, sections, mode, **rope)])


@pytest.mark.parametrize("mode, sections, n_dims", [(ROPE_TYPE_MROPE, (2, 1, 1, 2), 16),
                                                    (ROPE_TYPE_IMROPE, (2, 2, 1, 1), 16),
                                                    (ROPE_TYPE_IMROPE, (2, 1, 1, 0), 10)])
@pytest.mark.parametrize("n_tokens", [1, 5])
def test_fused_multi_rope_pair_matches_reference(mode, sections, n_dims, n_tokens):
    graph = qk_graph(mode, sections, n_dims=n_dims)
    rng = np.random.default_rng(n_tokens + mode)
    inputs = {"x": rng.standard_normal((n_tokens, 32)).astype(np.float32),
              "wq": rng.standard_normal((48, 32)).astype(np.float32),
              "wk": rng.standard_normal((32, 32)).astype(np.float32),
              "pos": rng.integers(0, 512, size=4 * n_tokens).astype(np.int32)}
    (ours, cpu), (refs, _) = run_cpu_and_ref(graph, inputs, {"n_tokens": n_tokens})
    assert [n.op for n in cpu.nodes].count("rope_pair") == 1
    for o, r in zip(ours, refs):
        assert normalized_error(o, r) <= 1e-6
