"""Elementwise maps and copies, alone or as fused chains.

An op's arithmetic is its shared formula (ggmlpy.ir.ops.formulas); `CODE_FOR_OP` renders
each primitive as a CUDA C expression (tinygrad's code_for_op), so adding an elementwise op
to the CUDA backend needs no line here. Operands are the floats `x<j>` (values read from
outside) and `y<i>` (earlier stages); a parameter of stage i is the kernel field
`k<i>_<name>` (f64).

A chain is a run of "map" ops where each result is read only by the next, all of the
output's shape, e.g. Gemma 2's soft-capping scale -> tanh -> scale: one kernel computes every
stage in registers (`stages`), reading each outside operand once and writing only the last
result. Intermediate results are float32 tensors, so the chain computes what the separate
kernels would, bit for bit.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ggmlpy.codegen_cuda.kernels import KernelSpec, tensor_fields
from ggmlpy.codegen_cuda.lowering import lowering
from ggmlpy.codegen_cuda.steps import (
    FLOAT_TYPES, Addr, Env, Launch, Step, grid_stride_blocks, nb_of, ne_of, sfx, tensor_values,
)
from ggmlpy.ir.ops.formulas import FORMULAS, Expr, params, primitives, render
from ggmlpy.ir.tensor import Tensor

CODE_FOR_OP: dict[str, Callable[..., str]] = {
    "add": lambda a, b: f"({a} + {b})", "sub": lambda a, b: f"({a} - {b})",
    "mul": lambda a, b: f"({a} * {b})", "div": lambda a, b: f"({a} / {b})",
    "div_fast": lambda a, b: f"({a} / {b})", "neg": lambda a: f"(-{a})",
    "abs": lambda a: f"fabsf({a})", "sqrt": lambda a: f"sqrtf({a})", "exp": lambda a: f"expf({a})",
    "log": lambda a: f"logf({a})",
    "tanh": lambda a: f"tanhf({a})", "erf": lambda a: f"erff({a})", "max": lambda a, b: f"fmaxf({a}, {b})",
    "ge": lambda a, b: f"({a} >= {b})", "le": lambda a, b: f"({a} <= {b})",
    "select": lambda c, a, b: f"({c} ? {a} : {b})",
    "round_f16": lambda a: f"f16_to_f32(f32_to_f16({a}))",
}
LINEAR_OPS = ("cont", "cpy")  # read the source in its own element order
MAP_OPS = tuple(op for op, e in FORMULAS.items() if primitives(e) <= set(CODE_FOR_OP))  # may chain
ELEMENTWISE_OPS = MAP_OPS + LINEAR_OPS + ("concat",)


def c_float(v: float) -> str:
    """A float32 constant as a C literal that parses back to the same value."""
    return f"({v!r}f)" if v < 0 else f"{v!r}f"


def c_expr(op: str, operands: Sequence[str], param: Callable[[str], str] | None = None) -> str:
    """op's formula as a C expression over `operands`; `param(name)` names a parameter's
    field (cast to float where it is used)."""
    def leaf(n: Expr) -> str:
        if n.op == "operand":
            return operands[n.arg]
        if n.op == "const":
            return c_float(n.arg)
        if param is None:
            raise ValueError(f"{op}: formula reads parameter {n.arg[0]}")
        return f"(float){param(n.arg[0])}"
    return render(FORMULAS[op], CODE_FOR_OP, leaf)


def param_field(stage: int, name: str) -> str:
    return f"k{stage}_{name}"


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
            fields += [(param_field(i, name), "f64") for name, _ in _stage_params(node.op)]
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
            for name, default in _stage_params(node.op):
                vals[param_field(i, name)] = node.params[name] if default is None else node.params.get(name, default)
        n = ne[0] * ne[1] * ne[2] * ne[3]
        return [Launch(self.spec, (grid_stride_blocks(n), 1, 1), (256, 1, 1), 0, self.spec.pack(vals))]


def _stage_expr(op: str, operands: list[str], stage: int) -> str:
    """The stage's value: a copy's source, or op's formula over the stage's operands (x<j>
    outside values, y<i> earlier stages) with its parameters in the stage's fields."""
    if op not in FORMULAS:
        return operands[0]
    return c_expr(op, operands, lambda name: "p." + param_field(stage, name))


def _stage_params(op: str) -> list[tuple[str, float | None]]:
    return params(FORMULAS[op]) if op in FORMULAS else []


def _float_data(node: Tensor) -> bool:
    data = node.src[1:] if node.op == "cpy" else node.src
    return all(s.type in FLOAT_TYPES for s in data) and node.type in FLOAT_TYPES


def _supported(node: Tensor) -> bool:
    """Float data, or a quantised KV cache's rows copied for its K-shift (lower_out_prod.py)."""
    from ggmlpy.codegen_cuda.lower_out_prod import kv_rows_ok

    return _float_data(node) or kv_rows_ok(node)


@lowering(*ELEMENTWISE_OPS, supports=_supported)
def _elementwise(node: Tensor, opts) -> Step:
    if not _float_data(node):
        from ggmlpy.codegen_cuda.lower_out_prod import KvRowsStep

        return KvRowsStep(node)
    return ElementwiseStep([node])
