"""The CPU backend's lowering table: op name -> kernel emitter (DESIGN.md decision 2: backends
register lowerings by op name; a coverage test lists ops without one).

An emitter fills a `KernelBuilder` for one node. `kernel_key(node)` is what makes two nodes
share a kernel: op, parameters, and the types, shapes and strides of the node and its
sources (pointers are arguments), so the 30 identical layers of a model share one kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ggmlpy.ir.symbolic import dim_str
from ggmlpy.ir.tensor import Tensor
from ggmlpy.codegen_cpu.irgen import KernelBuilder
from ggmlpy.codegen_cpu.repack import operand_repacked


@dataclass(frozen=True)
class Lowering:
    emit: Callable[[KernelBuilder, Tensor], None]
    supports: Callable[[Tensor], bool] = lambda node: True
    scratch_bytes: Callable[[Tensor, dict], int] = lambda node, env: 0  # per-node scratch


LOWERINGS: dict[str, Lowering] = {}


def lowering(*ops: str, supports: Callable[[Tensor], bool] | None = None,
             scratch_bytes: Callable[[Tensor, dict], int] | None = None):
    def deco(fn: Callable[[KernelBuilder, Tensor], None]):
        for op in ops:
            LOWERINGS[op] = Lowering(fn, supports or (lambda node: True),
                                     scratch_bytes or (lambda node, env: 0))
        return fn
    return deco


def _canon(v):
    if isinstance(v, (list, tuple)):
        return tuple(_canon(x) for x in v)
    if hasattr(v, "terms"):
        return dim_str(v)
    return v


def _layout(t: Tensor) -> tuple:
    return (t.type.name, tuple(dim_str(d) for d in t.ne), tuple(dim_str(d) for d in t.nb))


def kernel_key(node: Tensor) -> str:
    params = tuple(sorted((k, _canon(v)) for k, v in node.params.items()))
    srcs = tuple(_layout(s) + (operand_repacked(node, j),) for j, s in enumerate(node.src))
    return repr((node.op, params, _layout(node), srcs))
