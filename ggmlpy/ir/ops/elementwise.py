"""Elementwise ops: binary arithmetic with ggml broadcasting, scale, activations, GLUs.

Their arithmetic is `formulas.FORMULAS` (one copy for every backend); the references here
evaluate those formulas with numpy."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ggmlpy.ir.ops.common import can_repeat, repeat_to, require
from ggmlpy.ir.ops.formulas import FORMULAS, evaluate
from ggmlpy.ir.ops.registry import Inferred, Kind, OpCase, OpDef, SrcSpec, register
from ggmlpy.ir.types import GGMLType

F32 = GGMLType.F32


def _binary_infer(op: str):
    def infer(srcs: Sequence[Any], params: dict) -> Inferred:
        a, b = srcs
        require(can_repeat(b.ne, a.ne), op, lambda: f"cannot broadcast {b.shape_str()} to {a.shape_str()}")
        return Inferred(F32, a.ne)
    return infer


def _binary_cases() -> list[OpCase]:
    shapes = [((7, 3, 2, 1), (7, 3, 2, 1)), ((7, 3, 2, 1), (7, 1, 1, 1)),
              ((16, 4, 3, 2), (16, 2, 3, 1)), ((5, 1, 1, 1), (1, 1, 1, 1)), ((33, 5, 1, 1), (33, 5, 1, 1)),
              ((37, 5, 2, 1), (1, 5, 1, 1)), ((40, 3, 1, 1), (20, 3, 1, 1))]
    cases = [OpCase((SrcSpec(F32, a), SrcSpec(F32, b)), label=f"{a}x{b}") for a, b in shapes]
    cases.append(OpCase((SrcSpec(F32, (6, 4, 3, 1), permute=(0, 2, 1, 3)), SrcSpec(F32, (6, 1, 1, 1))),
                        label="noncontiguous"))
    return cases


def _binary(name: str) -> OpDef:
    def reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
        return evaluate(FORMULAS[name], [x[0], repeat_to(x[1], x[0].shape)], params)

    def api(b, x, y):
        return b.make(name, (x, y))

    return OpDef(name, Kind.ELEMENTWISE, _binary_infer(name), reference, api={name: api},
                 cases=_binary_cases, inplace=True, doc=f"ggml_{name}(a, b) with b broadcast to a")


for _name in ("add", "sub", "mul", "div"):
    register(_binary(_name))


def _unary(name: str, doc: str, fill: str = "normal") -> OpDef:
    def infer(srcs: Sequence[Any], params: dict) -> Inferred:
        return Inferred(F32, srcs[0].ne)

    def reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
        return evaluate(FORMULAS[name], [x[0]], params)

    def api(b, x):
        return b.make(name, (x,))

    def cases() -> list[OpCase]:
        return [OpCase((SrcSpec(F32, ne, fill),), label=str(ne)) for ne in
                [(7, 3, 1, 1), (64, 5, 2, 1), (1, 1, 1, 1), (37, 3, 1, 1)]] + [
            OpCase((SrcSpec(F32, (6, 4, 3, 1), fill, permute=(0, 2, 1, 3)),), label="noncontiguous")]

    return OpDef(name, Kind.ELEMENTWISE, infer, reference, api={name: api}, cases=cases,
                 inplace=True, doc=doc)


register(_unary("silu", "x * sigmoid(x)"))
register(_unary("gelu", "GELU, tanh approximation through ggml's f16 table (ggml_gelu)"))
register(_unary("gelu_erf", "exact GELU (ggml_gelu_erf)"))
register(_unary("tanh", "tanh"))
register(_unary("relu", "max(x, 0)"))
register(_unary("sigmoid", "1 / (1 + exp(-x)) (ggml_sigmoid; a mixture-of-experts router's gate)"))
register(_unary("softplus", "x > 20 ? x : ln(1 + exp(x)) (ggml_softplus)"))
register(_unary("sqr", "x * x"))
register(_unary("sqrt", "square root", fill="positive"))
register(_unary("abs", "|x| (ggml_abs)"))


def _scale_infer(srcs: Sequence[Any], params: dict) -> Inferred:
    return Inferred(F32, srcs[0].ne)


def _scale_ref(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
    return evaluate(FORMULAS["scale"], [x[0]], params)


def _scale_api(b, x, s: float):
    return b.make("scale", (x,), {"s": float(s), "b": 0.0})


def _scale_bias_api(b, x, s: float, bias: float):
    return b.make("scale", (x,), {"s": float(s), "b": float(bias)})


register(OpDef("scale", Kind.ELEMENTWISE, _scale_infer, _scale_ref,
               api={"scale": _scale_api, "scale_bias": _scale_bias_api},
               cases=lambda: [OpCase((SrcSpec(F32, (9, 4, 1, 1)),), (("s", 0.125), ("b", 0.0))),
                              OpCase((SrcSpec(F32, (9, 4, 2, 1)),), (("s", -2.0), ("b", 0.5)))],
               inplace=True, doc="x * s + b (ggml_scale / ggml_scale_bias)"))


def _clamp_api(b, x, lo: float, hi: float):
    require(lo <= hi, "clamp", lambda: f"min {lo} is above max {hi}")
    return b.make("clamp", (x,), {"min": float(lo), "max": float(hi)})


register(OpDef("clamp", Kind.ELEMENTWISE, _scale_infer, lambda x, p: evaluate(FORMULAS["clamp"], [x[0]], p),
               api={"clamp": _clamp_api},
               cases=lambda: [OpCase((SrcSpec(F32, (9, 4, 1, 1)),), (("min", -0.5), ("max", 0.75))),
                              OpCase((SrcSpec(F32, (37, 3, 2, 1)),), (("min", 0.1), ("max", 3.0e38)))],
               inplace=True, doc="x limited to [min, max] (ggml_clamp)"))


def _glu(name: str, doc: str, params: tuple[str, ...] = (),
         cases_params: tuple[tuple[tuple[str, float], ...], ...] = ((),)) -> OpDef:
    """ggml's split GLUs: act(a) * b, both halves given as separate tensors; `params` the
    float parameters the builder function takes after them, `cases_params` their test values."""

    def infer(srcs: Sequence[Any], params: dict) -> Inferred:
        a, g = srcs
        require(tuple(a.ne) == tuple(g.ne), name, lambda: f"halves differ: {a.shape_str()} vs {g.shape_str()}")
        return Inferred(F32, a.ne)

    def reference(x: Sequence[np.ndarray], params: dict) -> np.ndarray:
        return evaluate(FORMULAS[name], x, params)

    def api(b, a, g, *values: float):
        require(len(values) == len(params), name, lambda: f"takes {len(params)} parameters {params}, got {values}")
        return b.make(name, (a, g), {p: float(v) for p, v in zip(params, values)})

    def cases() -> list[OpCase]:
        return [OpCase((SrcSpec(F32, ne), SrcSpec(F32, ne)), ps, label=f"{ne} {dict(ps)}" if ps else str(ne))
                for ne in [(7, 3, 1, 1), (96, 5, 1, 1), (53, 4, 1, 1)] for ps in cases_params]

    return OpDef(name, Kind.ELEMENTWISE, infer, reference, api={name: api}, cases=cases,
                 inplace=True, doc=doc)


register(_glu("swiglu", "silu(a) * b (ggml_swiglu_split)"))
register(_glu("geglu", "gelu(a) * b (ggml_geglu_split)"))
register(_glu("swiglu_oai", "gpt-oss's clamped SwiGLU, alpha and limit (ggml_swiglu_oai)", ("alpha", "limit"),
              ((("alpha", 1.702), ("limit", 7.0)), (("alpha", 1.702), ("limit", 0.5)))))
