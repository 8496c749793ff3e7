"""Elementwise op semantics, written once over a small set of primitives.

Each elementwise op is one expression tree (`FORMULAS`) over its operands `x0`, `x1`, its
parameters and float32 constants. Every backend renders the same tree from its own table
of primitives (tinygrad's `code_for_op`): the numpy reference (`NUMPY` below), LLVM IR
through codegen_cpu's KernelBuilder, CUDA C expression strings in codegen_cuda. So an op's
meaning lives in one place and the backends cannot drift apart (docs/architecture.md, decision 2).

Primitives (all float32; a backend that lacks one does not lower the ops using it):
  add sub mul div       IEEE arithmetic in the order written
  div_fast              a quotient a backend may compute approximately (the CPU's fast-math
                        vector code uses a reciprocal estimate; kept so CPU results stay
                        bit-identical to what they were)
  neg abs sqrt exp log tanh erf max
  ge le                 ordered comparisons (false with a NaN), only as select's condition
  select                cond ? a : b
  round_f16             round to half precision and back, where ggml's CPU backend computes
                        through f16 (its GELU table)
  leaves: operand i, const (a float32 value), param (an op parameter, with a default)

The semantics are llama.cpp's CPU backend's: `gelu` goes through ggml's f16 table
(GGML_GELU_FP16), `gelu_erf` is ggml_vec_gelu_erf_f32, 0.5f*x*(1 + erff(x*SQRT_2_INV)).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, TypeVar, Union

import numpy as np

Number = Union[int, float]
T = TypeVar("T")

LEAVES = ("operand", "const", "param")
PRIMITIVES = ("add", "sub", "mul", "div", "div_fast", "neg", "abs", "sqrt", "exp", "log", "tanh", "erf",
              "max", "ge", "le", "select", "round_f16")


@dataclass(frozen=True)
class Expr:
    """One node of a formula: a primitive over `args`, or a leaf (`arg` is the operand
    index, the constant, or the parameter's (name, default))."""
    op: str
    args: tuple["Expr", ...] = ()
    arg: object = None

    def __add__(self, o: "Expr | Number") -> "Expr":
        return Expr("add", (self, _e(o)))

    def __radd__(self, o: Number) -> "Expr":
        return Expr("add", (_e(o), self))

    def __sub__(self, o: "Expr | Number") -> "Expr":
        return Expr("sub", (self, _e(o)))

    def __rsub__(self, o: Number) -> "Expr":
        return Expr("sub", (_e(o), self))

    def __mul__(self, o: "Expr | Number") -> "Expr":
        return Expr("mul", (self, _e(o)))

    def __rmul__(self, o: Number) -> "Expr":
        return Expr("mul", (_e(o), self))

    def __truediv__(self, o: "Expr | Number") -> "Expr":
        return Expr("div", (self, _e(o)))

    def __rtruediv__(self, o: Number) -> "Expr":
        return Expr("div", (_e(o), self))

    def __neg__(self) -> "Expr":
        return Expr("neg", (self,))


def _e(v: "Expr | Number") -> Expr:
    return v if isinstance(v, Expr) else const(v)


def operand(i: int) -> Expr:
    return Expr("operand", arg=i)


def const(v: Number) -> Expr:
    return Expr("const", arg=float(np.float32(v)))


def param(name: str, default: float | None = None) -> Expr:
    """An op parameter (node.params[name]); `default` when the node may omit it."""
    return Expr("param", arg=(name, default))


def _prim(op: str) -> Callable[..., Expr]:
    def make(*args: "Expr | Number") -> Expr:
        return Expr(op, tuple(_e(a) for a in args))
    make.__name__ = op
    return make


div_fast = _prim("div_fast")
exp = _prim("exp")
log = _prim("log")
tanh = _prim("tanh")
erf = _prim("erf")
sqrt = _prim("sqrt")
vmax = _prim("max")  # v-prefixed: max and abs are Python builtins
vabs = _prim("abs")
ge = _prim("ge")
le = _prim("le")
select = _prim("select")
round_f16 = _prim("round_f16")

x0, x1 = operand(0), operand(1)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
SQRT_2_INV = 0.70710678118654752440084436210484


def silu(x: Expr) -> Expr:
    return div_fast(x, 1.0 + exp(-x))


def gelu_tanh(x: Expr) -> Expr:
    inner = (SQRT_2_OVER_PI * x) * (1.0 + 0.044715 * (x * x))
    return (0.5 * x) * (1.0 + tanh(inner))


def gelu(x: Expr) -> Expr:
    """ggml's CPU GELU (GGML_GELU_FP16, also inside geglu): between -10 and 10 its 64K-entry
    f16 table, i.e. the tanh formula at x rounded to f16, rounded to f16; 0 from -10 down, x
    from 10 up. With it Gemma 3's logits sit closer to llama.cpp's (mean |d log-softmax|
    0.130 -> 0.106 together with the f16 attention operands)."""
    y = round_f16(gelu_tanh(round_f16(x)))
    return select(le(x, -10.0), 0.0, select(ge(x, 10.0), x, y))


def gelu_erf(x: Expr) -> Expr:
    return (0.5 * x) * (1.0 + erf(x * SQRT_2_INV))


def swiglu_oai(a: Expr, g: Expr) -> Expr:
    """gpt-oss's clamped SwiGLU (ggml_swiglu_oai): min(a, limit) * sigmoid(alpha * that),
    times clamp(g, -limit, limit) + 1, divided as ggml's scalar loop divides."""
    limit, alpha = param("limit"), param("alpha")
    x = select(le(a, limit), a, limit)
    y = select(ge(g, -limit), select(le(g, limit), g, limit), -limit)
    return (x / (1.0 + exp(alpha * -x))) * (y + 1.0)


FORMULAS: dict[str, Expr] = {
    "add": x0 + x1,
    "sub": x0 - x1,
    "mul": x0 * x1,
    "div": x0 / x1,
    "scale": x0 * param("s") + param("b", 0.0),
    "silu": silu(x0),
    "gelu": gelu(x0),
    "gelu_erf": gelu_erf(x0),
    "tanh": tanh(x0),
    "relu": vmax(x0, 0.0),
    "sigmoid": 1.0 / (1.0 + exp(-x0)),
    # ggml's x > 20 ? x : logf(1 + expf(x)) (a NaN stays NaN)
    "softplus": select(le(x0, 20.0), log(1.0 + exp(x0)), x0),
    "sqr": x0 * x0,
    "sqrt": sqrt(x0),
    "abs": vabs(x0),
    "swiglu": silu(x0) * x1,
    "geglu": gelu(x0) * x1,
    "swiglu_oai": swiglu_oai(x0, x1),
    # ggml's MAX(MIN(x, max), min): a NaN becomes max, as there
    "clamp": select(ge(select(le(x0, param("max")), x0, param("max")), param("min")),
                    select(le(x0, param("max")), x0, param("max")), param("min")),
}


def primitives(e: Expr) -> set[str]:
    """The primitives a formula uses: a backend lowers the op when it renders them all."""
    out = {e.op} if e.op not in LEAVES else set()
    for a in e.args:
        out |= primitives(a)
    return out


def params(e: Expr) -> list[tuple[str, float | None]]:
    """The (name, default) of every parameter the formula reads, in order of first use."""
    found: list[tuple[str, float | None]] = []

    def walk(n: Expr) -> None:
        if n.op == "param" and n.arg not in found:
            found.append(n.arg)
        for a in n.args:
            walk(a)
    walk(e)
    return found


def render(e: Expr, table: Mapping[str, Callable[..., T]], leaf: Callable[[Expr], T]) -> T:
    """Fold the tree bottom-up: `leaf` gives the value of an operand, constant or
    parameter, `table[op](*args)` combines rendered arguments. Equal subtrees render once."""
    memo: dict[Expr, T] = {}

    def go(n: Expr) -> T:
        if n not in memo:
            memo[n] = leaf(n) if n.op in LEAVES else table[n.op](*(go(a) for a in n.args))
        return memo[n]
    return go(e)


def _erf_f32(a: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(a).astype(np.float32)


def _round_f16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


NUMPY: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "div_fast": np.divide,
    "neg": np.negative, "abs": np.abs, "sqrt": np.sqrt, "exp": np.exp, "log": np.log, "tanh": np.tanh,
    "erf": _erf_f32,
    "max": np.fmax,  # NaN-ignoring, as llvm.maxnum and fmaxf
    "ge": np.greater_equal, "le": np.less_equal, "select": np.where, "round_f16": _round_f16,
}


def evaluate(e: Expr, operands: Sequence[np.ndarray], op_params: Mapping[str, object]) -> np.ndarray:
    """The numpy reference of a formula: float32 arithmetic on float32 operands."""
    def leaf(n: Expr) -> np.ndarray:
        if n.op == "operand":
            return np.asarray(operands[n.arg], np.float32)
        if n.op == "const":
            return np.float32(n.arg)
        name, default = n.arg
        return np.float32(op_params[name] if default is None else op_params.get(name, default))

    with np.errstate(all="ignore"):
        return np.asarray(render(e, NUMPY, leaf), np.float32)
