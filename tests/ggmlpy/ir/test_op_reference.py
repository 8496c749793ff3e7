"""Every op of the registry, through the reference backend, against a naive oracle.

Cases come from the registry (as ggml's test-backend-ops generates its cases) plus a sweep of
odd sizes, 1 and 7 tokens and permuted (non-contiguous) inputs defined here. Each case is a
one-op graph built by ggmlpy.testing.ops, run by RefBackend and compared by ggml's
normalised mean squared error against tests/ggmlpy/ir/oracles.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.ir.ops import OPS, Kind, OpCase, SrcSpec
from ggmlpy.testing.ops import (
    build_case_graph, case_id, iter_cases, make_inputs, normalized_error, run_case, source_values,
)
from ggmlpy.ir.tensor import Flag
from ggmlpy.ir.types import GGMLType, row_size
from ggmlpy.sched.ref_backend import RefBackend

from .oracles import ORACLES, run_oracle

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16
I32, I64 = GGMLType.I32, GGMLType.I64

# The reference computes in float32, the oracles in float64: float32 rounding alone gives an
# NMSE up to ~4e-15 and the worst case here (mul_mat) is ~2e-14. The bar sits well above that
# and well below what a small mistake costs (eps doubled: ~3e-11, see the test further down).
MAX_NMSE = 1e-12

COMPUTING_OPS = sorted(name for name, op in OPS.items() if op.reference or op.write)


def _spec(t, ne, fill="normal", permute=None) -> SrcSpec:
    return SrcSpec(t, ne, fill, permute)


P0213, P1023 = (0, 2, 1, 3), (1, 0, 2, 3)


def _binary_extra(op: str) -> list[OpCase]:
    shapes = [((1, 1, 1, 1), None, (1, 1, 1, 1), None),
              ((13, 7, 1, 1), None, (13, 1, 1, 1), None),
              ((5, 7, 3, 2), None, (1, 7, 1, 2), None),
              ((3, 5, 7, 1), P0213, (7, 3, 5, 1), P1023),
              ((6, 4, 1, 1), P1023, (4, 1, 1, 1), None)]
    return [OpCase((_spec(F32, a, permute=pa), _spec(F32, b, permute=pb)), label=f"extra {a}x{b}")
            for a, pa, b, pb in shapes]


def _unary_extra(op: str) -> list[OpCase]:
    fill = OPS[op].cases()[0].srcs[0].fill  # sqrt needs positive inputs
    return [OpCase((_spec(F32, (13, 7, 1, 1), fill),), label="extra odd"),
            OpCase((_spec(F32, (5, 3, 2, 2), fill, (2, 0, 1, 3)),), label="extra permuted"),
            OpCase((_spec(F32, (7, 5, 1, 1), fill, P1023),), label="extra transposed")]


def _rope_params(n_dims, mode, **over):
    p = {"n_dims": n_dims, "mode": mode, "n_ctx_orig": 2048, "freq_base": 10000.0, "freq_scale": 1.0,
         "ext_factor": 0.0, "attn_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}
    p.update(over)
    return tuple(p.items())


def _pos(n):
    return _spec(I32, (n,), "pos")


EXTRA: dict[str, list[OpCase]] = {
    **{op: _binary_extra(op) for op in ("add", "sub", "mul", "div")},
    **{op: _unary_extra(op) for op in ("silu", "gelu", "gelu_erf", "tanh", "relu", "sqr", "sqrt", "abs", "sigmoid", "softplus")},
    "scale": [OpCase((_spec(F32, (13, 7, 1, 1)),), (("s", 0.3), ("b", -1.5))),
              OpCase((_spec(F32, (5, 3, 4, 1), permute=P0213),), (("s", 2.0), ("b", 0.0)))],
    "swiglu": [OpCase((_spec(F32, (13, 1, 1, 1)), _spec(F32, (13, 1, 1, 1)))),
               OpCase((_spec(F32, (5, 3, 4, 1), permute=P0213), _spec(F32, (5, 3, 4, 1), permute=P0213)))],
    "geglu": [OpCase((_spec(F32, (13, 7, 1, 1)), _spec(F32, (13, 7, 1, 1)))),
              OpCase((_spec(F32, (7, 5, 1, 1), permute=P1023), _spec(F32, (5, 7, 1, 1))))],
    "swiglu_oai": [OpCase((_spec(F32, (13, 7, 1, 1)), _spec(F32, (13, 7, 1, 1))), (("alpha", 1.702), ("limit", 1.0))),
                   OpCase((_spec(F32, (5, 3, 4, 1), permute=P0213), _spec(F32, (5, 3, 4, 1), permute=P0213)),
                          (("alpha", 0.5), ("limit", 7.0)))],
    "clamp": [OpCase((_spec(F32, (13, 7, 1, 1)),), (("min", -0.3), ("max", 0.4))),
              OpCase((_spec(F32, (5, 3, 4, 1), permute=P0213),), (("min", 0.0), ("max", 1.0)))],
    "sum_rows": [OpCase((_spec(F32, (13, 7, 1, 1)),)), OpCase((_spec(F32, (6, 4, 3, 1), permute=P0213),))],
    # inputs stored (time, sequence, channel), read as (time, channel, sequence)
    "ssm_conv": [OpCase((_spec(F32, (7, 3, 5, 1), permute=P0213), _spec(F32, (4, 5, 1, 1))),
                        label="permuted inputs, odd sizes")],
    # q, k, v stored (dim, token, head), read as (dim, head, token): views with a row stride
    "gated_delta_net": [
        OpCase((_spec(F32, (7, 5, 1, 1), "l2norm", P0213), _spec(F32, (7, 5, 1, 1), "l2norm", P0213),
                _spec(F32, (7, 5, 3, 1), permute=P0213), _spec(F32, (1, 3, 5, 1), "negative"),
                _spec(F32, (1, 3, 5, 1), "unit"), _spec(F32, (7, 7, 3, 1))), (("K", 2),),
               label="permuted q k v, odd sizes, 2 snapshots"),
        OpCase((_spec(F32, (5, 3, 1, 1), "l2norm", P0213), _spec(F32, (5, 1, 3, 1), "l2norm"),
                _spec(F32, (5, 2, 3, 3)), _spec(F32, (5, 2, 3, 3), "negative"), _spec(F32, (1, 2, 3, 3), "unit"),
                _spec(F32, (5, 5, 2, 3))), (("K", 5),), label="KDA gate, q k shared by 3 sequences, 5 snapshots"),
    ],
    "argsort": [OpCase((_spec(F32, (33, 7, 1, 1)),), (("order", 1),)),
                OpCase((_spec(F32, (7, 5, 1, 1), permute=P1023),), (("order", 0),))],
    "mul_mat_id": [OpCase((_spec(F32, (13, 5, 3, 1)), _spec(F32, (13, 1, 7, 1)), _spec(I32, (3, 7), "unique_rows:3")),
                          label="odd k, every expert"),
                   OpCase((_spec(F32, (16, 3, 4, 1)), _spec(F32, (16, 5, 2, 1), permute=P0213),
                           _spec(I32, (2, 5), "unique_rows:4")), label="permuted input, one per expert slot")],
    "add_id": [OpCase((_spec(F32, (13, 3, 5, 1)), _spec(F32, (13, 7, 1, 1)), _spec(I32, (3, 5), "unique_rows:7"))),
               OpCase((_spec(F32, (4, 6, 3, 1), permute=P0213), _spec(F32, (4, 3, 1, 1)),
                       _spec(I32, (3, 6), "unique_rows:3")))],
    "cont": [OpCase((_spec(F32, (7, 5, 3, 2), permute=(2, 0, 1, 3)),)),
             OpCase((_spec(F16, (6, 5, 1, 1), permute=P1023),)),
             OpCase((_spec(F32, (7, 5, 3, 2), permute=P0213),), (("ne", (35, 6)),))],
    "cpy": [OpCase((_spec(F16, (5, 7, 1, 1)), _spec(F32, (7, 5, 1, 1), permute=P1023)), label="transposed"),
            OpCase((_spec(F32, (39, 1, 1, 1)), _spec(F16, (13, 3, 1, 1))), label="f16 to f32"),
            OpCase((_spec(BF16, (9, 2, 1, 1)), _spec(F32, (9, 2, 1, 1))), label="bf16"),
            OpCase((_spec(F32, (5, 7, 1, 1), permute=P1023), _spec(F32, (7, 5, 1, 1))), label="into view")],
    "concat": [OpCase((_spec(F32, (4, 3, 2, 1)), _spec(F32, (4, 3, 5, 1))), (("dim", 2),)),
               OpCase((_spec(F32, (3, 2, 2, 1)), _spec(F32, (3, 2, 2, 3))), (("dim", 3),)),
               OpCase((_spec(F32, (7, 1, 1, 1), permute=P1023), _spec(F32, (5, 7, 1, 1))), (("dim", 0),))],
    "out_prod": [
        OpCase((_spec(F32, (13, 7, 1, 1)), _spec(F32, (5, 7, 1, 1))), label="odd"),
        OpCase((_spec(F32, (5, 13, 2, 1), permute=P1023), _spec(F32, (3, 5, 4, 1))), label="transposed a r2=2"),
        OpCase((_spec(GGMLType.Q4_1, (32, 9, 1, 1)), _spec(F32, (9, 3, 2, 1), permute=P1023)),
               label="q4_1 weights transposed"),
    ],
    "mul_mat": [
        OpCase((_spec(F32, (13, 5, 1, 1)), _spec(F32, (13, 1, 1, 1))), label="odd k n=1"),
        OpCase((_spec(F32, (13, 5, 1, 1)), _spec(F32, (13, 7, 1, 1))), label="odd k n=7"),
        OpCase((_spec(F32, (5, 13, 1, 1), permute=P1023), _spec(F32, (13, 7, 1, 1))), label="transposed a"),
        OpCase((_spec(F32, (16, 5, 4, 1)), _spec(F32, (16, 4, 3, 1), permute=P0213)), label="permuted b"),
        OpCase((_spec(F32, (8, 3, 2, 1)), _spec(F32, (8, 4, 4, 3))), label="broadcast r2=2 r3=3"),
        OpCase((_spec(F16, (13, 3, 1, 1)), _spec(F32, (13, 7, 1, 1))), label="f16 odd k"),
        OpCase((_spec(GGMLType.Q8_0, (32, 3, 1, 1)), _spec(F32, (32, 2, 3, 1), permute=P0213)),
               label="q8_0 permuted b"),
        OpCase((_spec(GGMLType.Q5_1, (32, 3, 2, 1)), _spec(F32, (32, 7, 2, 1))), label="q5_1 batched"),
        OpCase((_spec(GGMLType.Q2_K, (256, 3, 1, 1)), _spec(F32, (256, 5, 1, 1))), label="q2_k"),
        OpCase((_spec(GGMLType.Q3_K, (512, 3, 1, 1)), _spec(F32, (512, 2, 1, 1))), label="q3_k"),
    ],
    "rms_norm": [OpCase((_spec(F32, ne, permute=pm),), (("eps", 1e-6),))
                 for ne, pm in [((13, 1, 1, 1), None), ((13, 7, 1, 1), None), ((1, 7, 1, 1), None),
                                ((5, 7, 3, 1), (2, 0, 1, 3))]],
    "norm": [OpCase((_spec(F32, ne, permute=pm),), (("eps", 1e-6),))
             for ne, pm in [((13, 1, 1, 1), None), ((13, 7, 1, 1), None), ((5, 7, 3, 1), (2, 0, 1, 3))]],
    "rope": [
        OpCase((_spec(F32, (64, 3, 1, 1)), _pos(1)), _rope_params(64, 0), label="1 token"),
        OpCase((_spec(F32, (32, 2, 7, 1)), _pos(7)), _rope_params(32, 2), label="7 tokens neox"),
        OpCase((_spec(F32, (16, 7, 3, 1), permute=P0213), _pos(7)), _rope_params(16, 0), label="permuted"),
        OpCase((_spec(F32, (10, 3, 2, 1)), _pos(2)), _rope_params(6, 0), label="partial norm"),
        OpCase((_spec(F32, (8, 2, 3, 2)), _pos(3)), _rope_params(8, 2, freq_base=500000.0), label="ne3=2"),
        OpCase((_spec(F32, (16, 2, 7, 1)), _pos(7), _spec(F32, (8,), "positive")),
               _rope_params(16, 2, freq_scale=0.5, ext_factor=1.0, attn_factor=0.8), label="yarn ff"),
        # multi-section: 4 positions per token; stored (head, token, head index), read as 7 tokens
        OpCase((_spec(F32, (10, 7, 3, 1), permute=P0213), _pos(28)), _rope_params(8, 8, sections=(1, 1, 0, 1)),
               label="mrope permuted partial"),
        OpCase((_spec(F32, (10, 3, 3, 2)), _pos(12)), _rope_params(10, 40, sections=(2, 1, 1, 1)),
               label="imrope ne3=2"),
        OpCase((_spec(F32, (14, 3, 1, 1)), _pos(4), _spec(F32, (7,), "positive")),
               _rope_params(14, 40, sections=(3, 2, 2, 0), freq_scale=0.5, ext_factor=1.0),
               label="imrope 1 token yarn"),
    ],
    "soft_max": [
        OpCase((_spec(F32, (10, 1, 4, 1)), _spec(F32, (10, 1, 1, 1), "mask")),
               (("scale", 0.25), ("max_bias", 0.0)), label="1 token"),
        OpCase((_spec(F32, (13, 7, 2, 1)), _spec(F16, (13, 8, 1, 1), "mask")),
               (("scale", 0.5), ("max_bias", 0.0)), label="7 tokens padded"),
        OpCase((_spec(F32, (1, 5, 1, 1)),), (("scale", 1.0), ("max_bias", 0.0)), label="one column"),
        OpCase((_spec(F32, (9, 4, 3, 1), permute=P0213), _spec(F32, (9, 3, 1, 1), "mask")),
               (("scale", 1.0), ("max_bias", 0.0)), label="permuted"),
        OpCase((_spec(F32, (6, 2, 2, 3)), _spec(F32, (6, 2, 2, 1), "mask")),
               (("scale", 1.0), ("max_bias", 0.0)), label="mask over ne3"),
        OpCase((_spec(F32, (8, 3, 6, 1)), _spec(F32, (8, 3, 1, 1))),
               (("scale", 1.0), ("max_bias", 8.0)), label="alibi 6 heads"),
        OpCase((_spec(F32, (8, 3, 4, 1)), _spec(F16, (8, 3, 1, 1), "mask")),
               (("scale", 0.5), ("max_bias", 4.0)), label="alibi masked"),
    ],
    "get_rows": [
        OpCase((_spec(F32, (7, 11, 1, 1)), _spec(I32, (1,), "rows:11")), label="1 row odd"),
        OpCase((_spec(F16, (5, 9, 1, 1)), _spec(I64, (7,), "rows:9")), label="f16 i64 7 rows"),
        OpCase((_spec(I32, (4, 6, 1, 1), "rows:100"), _spec(I32, (3,), "rows:6")), label="i32 table"),
        OpCase((_spec(F32, (5, 6, 2, 3)), _spec(I32, (4, 2, 3), "rows:6")), label="batched ne3"),
        OpCase((_spec(GGMLType.Q8_0, (32, 10, 1, 1)), _spec(I32, (7,), "rows:10")), label="q8_0 7 rows"),
        OpCase((_spec(GGMLType.Q4_1, (64, 5, 1, 1)), _spec(I32, (3,), "rows:5")), label="q4_1"),
        OpCase((_spec(GGMLType.Q5_0, (32, 4, 2, 1)), _spec(I32, (3, 2), "rows:4")), label="q5_0 batched"),
        OpCase((_spec(GGMLType.Q5_1, (64, 6, 1, 1)), _spec(I32, (4,), "rows:6")), label="q5_1"),
        OpCase((_spec(F32, (5, 7, 1, 1), permute=P1023), _spec(I32, (4,), "rows:5")), label="transposed"),
    ],
    "set_rows": [
        OpCase((_spec(F32, (7, 12, 1, 1)), _spec(F32, (7, 1, 1, 1)), _spec(I32, (1,), "unique_rows:12")),
               label="1 row"),
        OpCase((_spec(F16, (7, 12, 1, 1)), _spec(F32, (7, 7, 1, 1)), _spec(I64, (7,), "unique_rows:12")),
               label="f16 7 rows"),
        OpCase((_spec(F32, (5, 10, 2, 1)), _spec(F32, (5, 3, 2, 1)), _spec(I64, (3, 2), "unique_rows:10")),
               label="batched"),
        OpCase((_spec(F32, (5, 10, 2, 1)), _spec(F32, (5, 3, 2, 1)), _spec(I64, (3, 1), "unique_rows:10")),
               label="broadcast indices"),
        OpCase((_spec(F32, (5, 8, 1, 1)), _spec(F32, (3, 5, 1, 1), permute=P1023),
                _spec(I64, (3,), "unique_rows:8")), label="permuted src"),
        OpCase((_spec(BF16, (6, 8, 1, 1)), _spec(F32, (6, 3, 1, 1)), _spec(I64, (3,), "unique_rows:8")),
               label="bf16"),
    ],
}

REGISTRY_CASES = [pytest.param(op, case, id=case_id(op, i, case))
                  for op, i, case in iter_cases(COMPUTING_OPS)]
EXTRA_CASES = [pytest.param(op, case, id=case_id(op, i, case) + "-extra")
               for op in sorted(EXTRA) for i, case in enumerate(EXTRA[op])]


@pytest.fixture(scope="module")
def backend() -> RefBackend:
    return RefBackend()


def check(op: str, case: OpCase, backend: RefBackend, seed: int) -> float:
    inputs = make_inputs(case, np.random.default_rng(seed))
    result, used = run_case(op, case, backend, inputs=inputs)
    expected = run_oracle(op, source_values(case, used), case.param_dict(), case)
    assert result.shape == expected.shape, f"{op}: shape {result.shape}, oracle {expected.shape}"
    if result.dtype.kind in "iu":
        np.testing.assert_array_equal(result, expected)
        return 0.0
    err = normalized_error(result, expected)
    assert err <= MAX_NMSE, f"{op} {case.label}: NMSE {err:.3g} > {MAX_NMSE}"
    return err


@pytest.mark.parametrize("op, case", REGISTRY_CASES)
def test_registry_case_matches_oracle(op: str, case: OpCase, backend: RefBackend) -> None:
    check(op, case, backend, seed=1)


@pytest.mark.parametrize("op, case", EXTRA_CASES)
def test_extra_case_matches_oracle(op: str, case: OpCase, backend: RefBackend) -> None:
    check(op, case, backend, seed=2)


# coverage ------------------------------------------------------------------------------------
def test_every_computing_op_has_an_oracle_and_cases() -> None:
    """Adding an op without an independent oracle (or without registry cases) fails here."""
    missing = [name for name in COMPUTING_OPS if name not in ORACLES]
    assert not missing, f"ops without an oracle in tests/ggmlpy/ir/oracles.py: {missing}"
    no_cases = [name for name in COMPUTING_OPS if OPS[name].cases is None or not list(OPS[name].cases())]
    assert not no_cases, f"ops without registry test cases: {no_cases}"
    assert not set(ORACLES) - set(OPS), f"oracles for unknown ops: {set(ORACLES) - set(OPS)}"


def test_ops_without_reference_are_views() -> None:
    """The reference backend can run every op: only views (pure ne/nb changes) lack a reference."""
    bare = [name for name, op in OPS.items() if not (op.reference or op.write) and op.kind != Kind.VIEW]
    assert not bare, f"ops the reference backend cannot compute: {bare}"
    assert {"view", "reshape", "permute"} <= {n for n, op in OPS.items() if op.kind == Kind.VIEW}


def test_sweep_covers_odd_sizes_and_permutes() -> None:
    """The extra sweep gives every computing op an odd-sized and a non-contiguous case."""
    for name in COMPUTING_OPS:
        cases = EXTRA.get(name, [])
        assert any(any(n % 2 for n in s.ne[:2]) for c in cases for s in c.srcs), f"{name}: no odd size"
        assert any(s.permute for c in cases for s in c.srcs), f"{name}: no permuted input"


# the comparison must be able to fail --------------------------------------------------------
def _case(op: str, label: str) -> OpCase:
    return next(c for _, _, c in iter_cases([op]) if c.label == label)


@pytest.mark.parametrize("op, label, param, factor", [
    ("rms_norm", "(7, 5, 2, 1)", "eps", 2.0),
    ("norm", "(7, 5, 2, 1)", "eps", 2.0),
    ("rope", "neox", "freq_base", 1.001),
    ("rope", "yarn", "freq_scale", 1.001),
    ("rope", "yarn", "beta_fast", 2.0),
    ("soft_max", "alibi", "max_bias", 1.001),
    ("scale", "", "s", 1.0001),
])
def test_oracle_detects_small_parameter_errors(op, label, param, factor, backend) -> None:
    """MAX_NMSE is tight enough that a slightly wrong parameter is caught."""
    case = _case(op, label)
    inputs = make_inputs(case, np.random.default_rng(3))
    result, _ = run_case(op, case, backend, inputs=inputs)
    params = case.param_dict()
    params[param] = params[param] * factor
    wrong = run_oracle(op, source_values(case, inputs), params, case)
    assert normalized_error(result, wrong) > MAX_NMSE


@pytest.mark.parametrize("label, change", [
    ("mrope", {"mode": 40}), ("imrope", {"mode": 8}), ("imrope", {"sections": (2, 2, 2, 0)}),
    ("mrope", {"sections": (2, 1, 2, 1)}),
])
def test_oracle_detects_wrong_rope_sections(label, change, backend) -> None:
    """Which position a pair takes is decided by mode and sections: another choice fails the bar."""
    case = _case("rope", label)
    inputs = make_inputs(case, np.random.default_rng(3))
    result, _ = run_case("rope", case, backend, inputs=inputs)
    wrong = run_oracle("rope", source_values(case, inputs), case.param_dict() | change, case)
    assert normalized_error(result, wrong) > MAX_NMSE


@pytest.mark.parametrize("mode", [8, 40])
def test_multi_rope_with_equal_positions_is_neox(mode) -> None:
    """With t = h = w = e every pair sees the token's one position: multi rope is NeoX rope."""
    from ggmlpy.ir.ops.rope import rope_cos_sin

    rng = np.random.default_rng(5)
    pos = rng.integers(0, 512, size=6)
    neox = dict(_rope_params(16, 2, freq_scale=0.5, ext_factor=1.0))
    multi = neox | {"mode": mode, "sections": (2, 3, 1, 1)}
    for got, want in zip(rope_cos_sin(np.tile(pos, 4), multi), rope_cos_sin(pos, neox)):
        np.testing.assert_array_equal(got, want)
    a = rng.standard_normal((1, 6, 2, 16)).astype(np.float32)
    np.testing.assert_array_equal(OPS["rope"].reference([a, np.tile(pos, 4)], multi),
                                  OPS["rope"].reference([a, pos], neox))


@pytest.mark.parametrize("mode, n_pos, params, message", [
    (24, 12, {"sections": (2, 2, 0, 0)}, "GGML_ROPE_TYPE_VISION"),
    (8, 3, {"sections": (2, 2, 0, 0)}, "4 positions per token"),
    (40, 12, {}, "needs the `sections` param"),
    (8, 12, {"sections": [2, 2, 0, 0]}, "tuple of 4"),
    (8, 12, {"sections": (0, 0, 0, 4)}, "give t, h and w no pair"),
    (8, 12, {"sections": (8, 4, 4, 1)}, "more than the head dimension"),
    (2, 3, {"sections": (2, 2, 0, 0)}, "only apply to modes 8 and 40"),
])
def test_rope_refuses_bad_multi_section_params(mode, n_pos, params, message) -> None:
    from ggmlpy.ir.builder import GraphBuilder
    from ggmlpy.ir.ops.common import ShapeError

    b = GraphBuilder()
    a, pos = b.input("a", F32, (16, 2, 3)), b.input("pos", I32, (n_pos,))
    with pytest.raises(ShapeError, match=message):
        b.make("rope", (a, pos), dict(_rope_params(16, mode)) | params)


def test_rope_multi_api_takes_ggmls_argument_order() -> None:
    from ggmlpy.ir.builder import GraphBuilder
    from ggmlpy.ir.ops.common import ShapeError

    b = GraphBuilder()
    a, pos = b.input("a", F32, (16, 2, 3)), b.input("pos", I32, (12,))
    t = b.rope_multi(a, pos, None, 16, [4, 2, 2, 0], 40, 4096, 5e6, 1.0, 0.0, 1.0, 32.0, 1.0)
    assert t.params["sections"] == (4, 2, 2, 0) and t.params["mode"] == 40 and t.params["freq_base"] == 5e6
    with pytest.raises(ShapeError, match="modes 8 and 40"):
        b.rope_multi(a, pos, None, 16, (4, 2, 2, 0), 2)


def test_mul_mat_broadcast_repeats_rather_than_tiles(backend) -> None:
    """ggml maps b's matrix i2 to a's matrix i2 // r2 (grouped-query attention), not i2 % ne02."""
    case = _case("mul_mat", "gqa broadcast")
    inputs = make_inputs(case, np.random.default_rng(4))
    result, _ = run_case("mul_mat", case, backend, inputs=inputs)
    values = source_values(case, inputs)
    tiled = run_oracle("mul_mat", values, {}, case, tile=True)
    assert normalized_error(result, tiled) > 0.1
    assert normalized_error(result, run_oracle("mul_mat", values, {}, case)) <= MAX_NMSE


class ScaleWithoutBias:
    """A stand-in for a CPU/CUDA backend: runs `scale` with its own code, bias forgotten."""

    name = "scale-without-bias"

    def supports_op(self, node) -> bool:
        return node.op == "scale"

    def compile(self, graph, nodes):
        self.nodes = [n for n in nodes if n.op == "scale"]
        return self

    def run(self, store, env) -> None:
        for node in self.nodes:
            store.set_result(node, store.array(node.src[0], env) * node.params["s"], env)


def test_testing_module_drives_any_backend(backend) -> None:
    """compare_backends feeds the same inputs to two backends: the forgotten bias shows up on
    the case that has one and not on the case without."""
    from ggmlpy.testing.ops import compare_backends

    no_bias, with_bias = list(OPS["scale"].cases())[:2]
    assert dict(no_bias.params)["b"] == 0 and dict(with_bias.params)["b"] != 0
    assert compare_backends("scale", no_bias, ScaleWithoutBias(), backend, np.random.default_rng(0)) < 1e-14
    assert compare_backends("scale", with_bias, ScaleWithoutBias(), backend, np.random.default_rng(0)) > 1e-3
    assert compare_backends("scale", with_bias, RefBackend(), backend, np.random.default_rng(0)) == 0.0


def test_write_ops_leave_the_callers_inputs_untouched(backend) -> None:
    case = _case("set_rows", "F32")
    inputs = make_inputs(case, np.random.default_rng(5))
    before = inputs["src0"].copy()
    result, _ = run_case("set_rows", case, backend, inputs=inputs)
    np.testing.assert_array_equal(inputs["src0"], before)
    graph, _ = build_case_graph("set_rows", case)
    assert [leaf.flags for leaf in graph.leafs] == [Flag.CACHE, Flag.INPUT, Flag.INPUT]
    assert np.count_nonzero(result.reshape(12, 16).any(axis=1)) == 5  # five rows written


# input fills and the error measure -----------------------------------------------------------
def _inputs(*specs: SrcSpec, seed: int = 0) -> list[np.ndarray]:
    inputs = make_inputs(OpCase(tuple(specs)), np.random.default_rng(seed))
    return [inputs[f"src{i}"] for i in range(len(specs))]


def test_fill_rules_give_what_they_promise() -> None:
    normal, positive, zeros = _inputs(_spec(F32, (64, 64)), _spec(F32, (50, 3), "positive"),
                                      _spec(F16, (5, 3), "zeros"))
    assert normal.dtype == np.float32 and normal.shape == (1, 1, 64, 64)
    assert abs(normal.mean()) < 0.1 and 0.9 < normal.std() < 1.1
    assert positive.min() >= 0.5 and positive.max() <= 2.0
    assert zeros.dtype == np.float16 and not zeros.any()
    rows, unique, pos = _inputs(_spec(I32, (40,), "rows:6"), _spec(I64, (10, 4), "unique_rows:10"),
                                _spec(I32, (30,), "pos"))
    assert rows.dtype == np.int32 and set(rows.ravel()) == set(range(6))
    assert unique.dtype == np.int64 and all(sorted(r) == list(range(10)) for r in unique.reshape(4, 10))
    assert pos.dtype == np.int32 and 0 <= pos.min() and pos.max() < 512 and len(set(pos.ravel())) > 1


@pytest.mark.parametrize("ttype", [F32, F16])
def test_mask_fill_is_zero_or_minus_inf_with_a_zero_per_row(ttype) -> None:
    (mask,) = _inputs(_spec(ttype, (9, 200), "mask"))
    rows = mask.reshape(200, 9).astype(np.float32)
    assert set(np.unique(rows)) == {-np.inf, 0.0}
    assert (rows == 0).any(axis=1).all()
    assert 0.1 < np.isinf(rows).mean() < 0.5


@pytest.mark.parametrize("fill", ["gaussian", "rows", "rows:x", "unique_rows:0", "zeros:3"])
def test_unknown_fill_rules_are_refused(fill) -> None:
    with pytest.raises(ValueError, match="fill"):
        _inputs(_spec(I32, (4,), fill))


def test_unique_rows_needs_enough_rows() -> None:
    with pytest.raises(ValueError, match="distinct"):
        _inputs(_spec(I64, (5,), "unique_rows:3"))


@pytest.mark.parametrize("ttype, bound", [
    (F16, 1e-6), (BF16, 3e-5), (GGMLType.Q8_0, 1e-4), (GGMLType.Q5_0, 0.01), (GGMLType.Q4_0, 0.02),
    (GGMLType.Q4_1, 0.02), (GGMLType.Q5_1, 0.01), (GGMLType.Q4_K, 0.02), (GGMLType.Q6_K, 0.002), (GGMLType.MXFP4, 0.05),
])
def test_typed_fills_encode_the_same_normal_draw(ttype, bound) -> None:
    """One seed, one draw: a quantised source holds the F32 source's values, quantised."""
    case_f, case_q = OpCase((_spec(F32, (256, 8)),)), OpCase((_spec(ttype, (256, 8)),))
    exact = source_values(case_f, make_inputs(case_f, np.random.default_rng(7)))[0]
    stored = make_inputs(case_q, np.random.default_rng(7))["src0"]
    if ttype not in (F16, BF16):
        assert stored.dtype == np.uint8 and stored.shape == (1, 1, 8, row_size(ttype, 256))
    values = source_values(case_q, {"src0": stored})[0]
    assert 0 < normalized_error(values, exact) < bound


def test_random_blocks_decode_to_finite_values() -> None:
    from ggmlpy.testing.ops import decode, random_blocks

    for ttype in (GGMLType.Q4_K, GGMLType.Q2_K, GGMLType.Q5_1):
        raw = random_blocks(ttype, (3, 256), np.random.default_rng(0))
        assert raw.shape == (3, row_size(ttype, 256)) and raw.dtype == np.uint8
        values = decode(raw, ttype, (256, 3))
        assert np.isfinite(values).all() and values.std() > 0


def test_source_values_apply_ggml_permute() -> None:
    case = OpCase((_spec(F32, (6, 4, 3), permute=P0213),))
    inputs = make_inputs(case, np.random.default_rng(0))
    stored, (seen,) = inputs["src0"], source_values(case, inputs)
    assert seen.shape == (1, 4, 3, 6)                    # ggml ne (6, 3, 4)
    for i0, i1, i2 in [(0, 0, 0), (5, 2, 1), (3, 1, 3)]:  # seen[i0, i1, i2] = stored[i0, i2, i1]
        assert seen[0, i2, i1, i0] == stored[0, i1, i2, i0]


def test_normalized_error_is_ggml_nmse() -> None:
    assert normalized_error(np.array([1.0, 2.0]), np.array([1.0, 1.0])) == pytest.approx(0.5)
    assert normalized_error(np.zeros(3), np.zeros(3)) == 0.0
    assert normalized_error(np.ones(3), np.zeros(3)) == float("inf")
    assert normalized_error(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])) == float("inf")
    assert normalized_error(np.array([-np.inf, 2.0]), np.array([-np.inf, 1.0])) == pytest.approx(1.0)
    assert normalized_error(np.array([np.inf, 1.0]), np.array([-np.inf, 1.0])) == float("inf")
    assert normalized_error(np.array([5.0, 1.0]), np.array([np.inf, 1.0])) == float("inf")
    with pytest.raises(ValueError, match="shapes"):
        normalized_error(np.zeros(3), np.zeros(4))
