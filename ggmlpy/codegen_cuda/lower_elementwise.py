"""Elementwise maps and copies, alone or as fused chains.

`EXPRS` is the renderer table keyed by op (tinygrad's code_for_op): adding an elementwise
op to the CUDA backend is one line here. An expression combines its operands `x0`, `x1`
(floats) and may use parameters `p.s`, `p.b` (scale's).

A chain is a run of "map" ops where each result is read only by the next, all of the
output's shape, e.g. Gemma 2's soft-capping scale -> tanh -> scale: one kernel computes every
stage in registers (`stages`), reading each outside operand once and writing only the last
result. Intermediate results are float32 tensors, so the chain computes what the separate
kernels would, bit for bit.
"""
from __future__ import annotations

import re

from ggmlpy.codegen_cuda.kernels import KernelSpec, tensor_fields
from ggmlpy.codegen_cuda.steps import (
    Addr, Env, Launch, Step, grid_stride_blocks, nb_of, ne_of, sfx, tensor_values,
)
from ggmlpy.ir.tensor import Tensor

EXPRS = {
    "add": "x0 + x1", "sub": "x0 - x1", "mul": "x0 * x1", "div": "x0 / x1",
    "silu": "gg_silu(x0)", "gelu": "gg_gelu(x0)",
    "gelu_erf": "0.5f * x0 * (1.0f + erff(x0 * 0.70710678118654752f))",
    "tanh": "tanhf(x0)", "relu": "fmaxf(x0, 0.0f)", "sqr": "x0 * x0", "sqrt": "sqrtf(x0)",
    "abs": "fabsf(x0)",
    "scale": "x0 * (float)p.s + (float)p.b",
    "swiglu": "gg_silu(x0) * x1", "geglu": "gg_gelu(x0) * x1",
    "cont": "x0", "cpy": "x0", "concat": "x0",
}
ELEMENTWISE_OPS = tuple(EXPRS)
LINEAR_OPS = ("cont", "cpy")  # read the source in its own element order
MAP_OPS = tuple(op for op in EXPRS if op not in LINEAR_OPS + ("concat",))  # may chain
# per-op parameters: (name in the expression and in node.params, default, field prefix);
# stage i's field is <prefix><i> (f64)
PARAMS = {"scale": (("s", None, "sc"), ("b", 0.0, "bi"))}

_OPERAND = re.compile(r"\bx([01])\b")


class ElementwiseStep(Step):
    """One kernel for `nodes`: a single elementwise op, or a chain of map ops (each node
    reading the previous one)."""

    def __init__(self, nodes: list[Tensor]):
        last = nodes[-1]
        outside: list[Tensor] = []   # operands from outside the chain, each read once
        stages: list[str] = []
        for i, node in enumerate(nodes):
            srcs = list(node.src[1:]) if node.op == "cpy" else list(node.src)
            names = []
            for s in srcs:
                if i and s is nodes[i - 1]:
                    names.append(f"y{i - 1}")
                    continue
                if not any(s is t for t in outside):
                    outside.append(s)
                names.append(f"x{next(j for j, t in enumerate(outside) if t is s)}")
            stages.append(_stage_expr(node.op, names, i))
        super().__init__(list(nodes), reads=outside, writes=[last])
        self.srcs = outside
        mode = "linear" if last.op in LINEAR_OPS else "concat" if last.op == "concat" else "map"
        fields = [("d", "ptr")] + [(f"ne{i}", "i64") for i in range(4)] + [(f"nbd{i}", "i64") for i in range(4)]
        for i in range(len(outside)):
            fields += tensor_fields(f"s{i}")
        for i, node in enumerate(nodes):
            fields += [(f"{prefix}{i}", "f64") for _, _, prefix in PARAMS.get(node.op, ())]
        variant = dict(mode=mode, stages=stages, srcs=[sfx(s.type) for s in outside], dst=sfx(last.type))
        if mode == "concat":
            variant["concat_dim"] = int(last.params["dim"])
        self.spec = KernelSpec.make("elementwise", fields, cooperative=False, **variant)

    def specs(self) -> list[KernelSpec]:
        return [self.spec]

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        last = self.nodes[-1]
        ne = ne_of(last, env)
        vals: dict[str, int | float] = {"d": addr(last), **{f"ne{i}": v for i, v in enumerate(ne)}}
        vals.update({f"nbd{i}": v for i, v in enumerate(nb_of(last, env))})
        for i, s in enumerate(self.srcs):
            vals.update(tensor_values(f"s{i}", s, env, addr))
        for i, node in enumerate(self.nodes):
            for name, default, prefix in PARAMS.get(node.op, ()):
                vals[f"{prefix}{i}"] = node.params[name] if default is None else node.params.get(name, default)
        n = ne[0] * ne[1] * ne[2] * ne[3]
        return [Launch(self.spec, (grid_stride_blocks(n), 1, 1), (256, 1, 1), 0, self.spec.pack(vals))]


def _stage_expr(op: str, operands: list[str], stage: int) -> str:
    """EXPRS[op] over the stage's operands (x<j> outside values, y<i> earlier stages), its
    parameters renamed to the stage's fields."""
    expr = _OPERAND.sub(lambda m: operands[int(m.group(1))], EXPRS[op])
    for name, _, prefix in PARAMS.get(op, ()):
        expr = re.sub(rf"\bp\.{name}\b", f"p.{prefix}{stage}", expr)
    return expr
