"""Steps: what a compiled split runs, one kernel launch each.

Lowering turns graph nodes into `Step`s (a fused group of nodes is one step). A step knows
its kernel specs statically; `launches(env, addr)` evaluates the symbolic sizes for one run
(n_tokens, n_kv, n_outputs) and packs the parameter structs with device addresses. So the
kernels are compiled once per graph signature and serve every ubatch size.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ggmlpy.codegen_cuda.kernels import KernelSpec
from ggmlpy.ir.symbolic import Dim, evaluate
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType

Addr = Callable[[Tensor], int]  # device address of a tensor's first byte, for this run
Env = Mapping[str, int]

MAX_GRID_YZ = 65535

# ggml type -> the suffix of the load/store/dequantise helpers in common.cu.j2
TYPE_SUFFIX = {
    GGMLType.F32: "f32", GGMLType.F16: "f16", GGMLType.BF16: "bf16", GGMLType.I32: "i32",
    GGMLType.I64: "i64", GGMLType.Q4_0: "q4_0", GGMLType.Q4_1: "q4_1", GGMLType.Q5_0: "q5_0",
    GGMLType.Q5_1: "q5_1", GGMLType.Q8_0: "q8_0", GGMLType.Q1_0: "q1_0", GGMLType.Q2_0: "q2_0",
    GGMLType.Q2_K: "q2_k", GGMLType.Q3_K: "q3_k", GGMLType.Q4_K: "q4_k", GGMLType.Q5_K: "q5_k",
    GGMLType.Q6_K: "q6_k", GGMLType.TQ1_0: "tq1_0", GGMLType.TQ2_0: "tq2_0", GGMLType.MXFP4: "mxfp4",
    GGMLType.NVFP4: "nvfp4", GGMLType.IQ4_NL: "iq4_nl", GGMLType.IQ4_XS: "iq4_xs",
    GGMLType.IQ2_XXS: "iq2_xxs", GGMLType.IQ2_XS: "iq2_xs", GGMLType.IQ2_S: "iq2_s",
    GGMLType.IQ3_XXS: "iq3_xxs", GGMLType.IQ3_S: "iq3_s", GGMLType.IQ1_S: "iq1_s", GGMLType.IQ1_M: "iq1_m",
}
FLOAT_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
INDEX_TYPES = (GGMLType.I32, GGMLType.I64)
# the quantised KV cache types: set_rows writes them, the attention reads them (_kv_quant.cu.j2)
KV_QUANT_TYPES = (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.IQ4_NL, GGMLType.Q5_0, GGMLType.Q5_1)
# types with a dq8_<type> decoder (8 values at a time): weights of mul_mat and get_rows
DQ8_TYPES = FLOAT_TYPES + (
    GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q1_0, GGMLType.Q2_0,
    GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.TQ1_0, GGMLType.TQ2_0,
    GGMLType.MXFP4, GGMLType.NVFP4, GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.IQ2_XXS, GGMLType.IQ2_XS,
    GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ1_S, GGMLType.IQ1_M,
)


class LoweringError(ValueError):
    """A node this backend claimed to support cannot be lowered (a bug, or bad input)."""


def sfx(t: GGMLType) -> str:
    try:
        return TYPE_SUFFIX[GGMLType(t)]
    except KeyError:
        raise LoweringError(f"the CUDA backend has no kernels for type {GGMLType(t).name}") from None


@dataclass
class Launch:
    spec: KernelSpec
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shmem: int
    params: bytes


@dataclass
class Step:
    """One launch computing `nodes` (in graph order; the result is `nodes[-1]` unless the
    step says otherwise). `reads` and `writes` are the tensors whose memory it touches."""

    nodes: list[Tensor]
    reads: list[Tensor] = field(default_factory=list)
    writes: list[Tensor] = field(default_factory=list)

    def specs(self) -> list[KernelSpec]:
        raise NotImplementedError

    def launches(self, env: Env, addr: Addr) -> list[Launch]:
        raise NotImplementedError

    @property
    def label(self) -> str:
        names = [n.name or f"#{n.id}" for n in self.nodes]
        return f"{type(self).__name__}({', '.join(names)})"


# helpers ------------------------------------------------------------------------------------
def ev(d: Dim, env: Env) -> int:
    return evaluate(d, env)


def ne_of(t: Tensor, env: Env) -> list[int]:
    return [evaluate(d, env) for d in t.ne]


def nb_of(t: Tensor, env: Env) -> list[int]:
    return [evaluate(d, env) for d in t.nb]


def tensor_values(prefix: str, t: Tensor, env: Env, addr: Addr | None, ne: bool = True,
                  nb: bool = True) -> dict[str, int]:
    """Values for `kernels.tensor_fields(prefix, ...)`."""
    out: dict[str, int] = {}
    if addr is not None:
        out[prefix] = addr(t)
    if ne:
        out.update({f"{prefix}ne{i}": v for i, v in enumerate(ne_of(t, env))})
    if nb:
        out.update({f"{prefix}nb{i}": v for i, v in enumerate(nb_of(t, env))})
    return out


def check_grid(grid: tuple[int, int, int], what: str) -> tuple[int, int, int]:
    """The grid as ints; a zero dimension means "nothing to do" (the launch is skipped)."""
    if grid[1] > MAX_GRID_YZ or grid[2] > MAX_GRID_YZ:
        raise LoweringError(f"{what}: grid {grid} exceeds CUDA's limit of {MAX_GRID_YZ} in y/z")
    return tuple(max(0, int(g)) for g in grid)  # type: ignore[return-value]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def row_threads(n: int, cap: int = 256) -> int:
    """Threads for a one-row-per-block kernel: a multiple of 32, about one per element."""
    return max(32, min(cap, ceil_div(n, 32) * 32))


def grid_stride_blocks(n: int, threads: int = 256, cap: int = 1 << 20) -> int:
    return max(0, min(cap, ceil_div(n, threads)))


def same_shape(a: Tensor, b: Tensor) -> bool:
    return tuple(a.ne) == tuple(b.ne)


def static_int(d: Dim) -> int | None:
    return d if isinstance(d, int) else None


def single(xs: Sequence[Tensor]) -> Tensor | None:
    return xs[0] if len(xs) == 1 else None
