"""gated_delta_net's rules beyond the registry sweep (test_op_reference.py compares its cases
with the oracle): the shapes ggml asserts are refused with a message naming the source,
the q/k heads are tiled over the value heads (not interleaved: the oracle tells the two
apart), and the result's layout is ggml's."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.ir import N_TOKENS
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.ops.common import ShapeError
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.testing.ops import iter_cases, make_inputs, normalized_error, run_case, source_values

from .oracles import run_oracle

F32 = GGMLType.F32


def _srcs(b: GraphBuilder, S=8, H_k=2, H_v=4, T=3, n_s=2, **over):
    ne = {"q": (S, H_k, T, n_s), "k": (S, H_k, T, n_s), "v": (S, H_v, T, n_s), "g": (1, H_v, T, n_s),
          "beta": (1, H_v, T, n_s), "state": (S, S, H_v, n_s)} | over
    return [b.input(name, F32, ne[name]) for name in ("q", "k", "v", "g", "beta", "state")]


def test_result_shape_packs_outputs_then_snapshots():
    b = GraphBuilder()
    out = b.gated_delta_net(*_srcs(b), K=3)
    assert out.type == F32 and out.ne == (8 * 4, 3 * 2 + 3 * 8 * 2, 1, 1) and out.params == {"K": 3}
    b = GraphBuilder()
    sym = b.gated_delta_net(*_srcs(b, T=N_TOKENS, n_s=1))
    assert sym.ne[1] == N_TOKENS + 8


@pytest.mark.parametrize("over, message", [
    ({"q": (8, 3, 3, 2)}, "q .* heads and sequences must divide"),
    ({"k": (4, 2, 3, 2)}, "k .* must be \\[S_v, H_k, n_tokens, n_seqs\\]"),
    ({"g": (4, 4, 3, 2)}, "gate .* must be \\[1 or S_v"),
    ({"beta": (8, 4, 3, 2)}, "beta .* must be \\[1, H_v"),
    ({"state": (8, 8, 4, 1)}, "state .* must be \\[S_v, S_v, H_v, n_seqs\\]"),
])
def test_bad_shapes_are_refused(over, message):
    b = GraphBuilder()
    with pytest.raises(ShapeError, match=f"gated_delta_net: {message}"):
        b.gated_delta_net(*_srcs(b, **over))


def test_bad_types_layouts_and_K_are_refused():
    b = GraphBuilder()
    q, k, v, g, beta, state = _srcs(b)
    with pytest.raises(ShapeError, match="K .* must be an int >= 1"):
        b.gated_delta_net(q, k, v, g, beta, state, K=0)
    with pytest.raises(ShapeError, match="must be F32"):
        b.gated_delta_net(q, k, v, g, beta, b.input("s16", GGMLType.F16, state.ne))
    with pytest.raises(ShapeError, match="v .* needs contiguous rows"):
        b.gated_delta_net(q, k, b.permute(b.input("vt", F32, (4, 8, 3, 2)), 1, 0, 2, 3), g, beta, state)
    with pytest.raises(ShapeError, match="state .* must be contiguous"):
        b.gated_delta_net(q, k, v, g, beta, b.permute(b.input("st", F32, (8, 8, 2, 4)), 0, 1, 3, 2))


def test_q_and_k_heads_are_tiled_not_interleaved():
    """Value head h reads q/k head h % H_k, as ggml's kernels (TAG_GGML_GDN_BCAST)."""
    case = next(c for _, _, c in iter_cases(["gated_delta_net"]) if "4 v-heads" in c.label)
    inputs = make_inputs(case, np.random.default_rng(4))
    result, _ = run_case("gated_delta_net", case, RefBackend(), inputs=inputs)
    values = source_values(case, inputs)
    interleaved = run_oracle("gated_delta_net", values, case.param_dict(), case, interleaved=True)
    assert normalized_error(result, interleaved) > 1e-3
    assert normalized_error(result, run_oracle("gated_delta_net", values, case.param_dict(), case)) <= 1e-12


def test_the_fills_its_cases_use():
    """negative: exp of it a decay in (0, 1); unit: in (0, 1); l2norm: rows of length 1."""
    from ggmlpy.ir.ops.registry import OpCase, SrcSpec

    case = OpCase((SrcSpec(F32, (1, 200), "negative"), SrcSpec(F32, (1, 200), "unit"),
                   SrcSpec(F32, (12, 30), "l2norm")))
    neg, unit, rows = (a.reshape(-1, a.shape[-1]) for a in make_inputs(case, np.random.default_rng(0)).values())
    assert -1.0 <= neg.min() and neg.max() < 0 and neg.std() > 0.2
    assert 0 < unit.min() and unit.max() < 1 and unit.std() > 0.2
    assert rows.shape == (30, 12) and np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-6)
