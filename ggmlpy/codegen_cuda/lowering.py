"""The CUDA backend's lowering table: op name -> step builder, as the CPU's
(codegen_cpu/lowering.py; docs/architecture.md, decision 2: backends register lowerings by op name, a
coverage test lists the ops without one).

A lowering turns one node into the `Step` that launches it when no fusion took the node
(fusion.py); `supports` says whether the backend can run the node at all, which is what the
scheduler asks. The lower_* modules register themselves on import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ggmlpy.codegen_cuda.steps import LoweringError, Step
from ggmlpy.ir.tensor import Tensor

if TYPE_CHECKING:
    from ggmlpy.codegen_cuda.fusion import LowerOptions


@dataclass(frozen=True)
class Lowering:
    step: Callable[[Tensor, "LowerOptions"], Step]
    supports: Callable[[Tensor], bool]


LOWERINGS: dict[str, Lowering] = {}


def lowering(*ops: str, supports: Callable[[Tensor], bool] | None = None):
    """Register `fn(node, opts) -> Step` for `ops`."""
    def deco(fn: Callable[[Tensor, "LowerOptions"], Step]):
        for op in ops:
            LOWERINGS[op] = Lowering(fn, supports or (lambda node: True))
        return fn
    return deco


def supports(node: Tensor) -> bool:
    entry = LOWERINGS.get(node.op)
    return entry is not None and entry.supports(node)


def lower(node: Tensor, opts: "LowerOptions") -> Step:
    entry = LOWERINGS.get(node.op)
    if entry is None:
        raise LoweringError(f"no CUDA lowering for op {node.op}")
    return entry.step(node, opts)
