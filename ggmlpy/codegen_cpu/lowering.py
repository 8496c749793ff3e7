"""The CPU backend's lowering table: op name -> kernel emitter (docs/architecture.md, decision 2: backends
register lowerings by op name; a coverage test lists ops without one).

An emitter fills a `KernelBuilder` for one node. `kernel_key(node)` is what makes two nodes
share a kernel: op, parameters, and the types, shapes and strides of the node and its
sources (pointers are arguments), so the 30 identical layers of a model share one kernel.
Symbols are named in the key by their order of appearance ($0, $1 ...), not by name: the
last layer, which runs on n_outputs rows where the others run on n_tokens, and a sliding-
window layer (n_kv_swa where the others read n_kv) share the kernels of the other layers;
each node passes its own symbols' values in that order (`kernel_signature`, program.py).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

from ggmlpy.ir.symbolic import SymExpr
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


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.lru_cache(maxsize=4096)
def _pieces(text: str) -> tuple[tuple[str, bool], ...]:
    """A dim's text split into (piece, whether it is a symbol name): a graph's kernels
    format the same few dims thousands of times."""
    out, at = [], 0
    for m in _NAME.finditer(text):
        if m.start() > at:
            out.append((text[at:m.start()], False))
        out.append((m.group(0), True))
        at = m.end()
    if at < len(text):
        out.append((text[at:], False))
    return tuple(out)


class _SymbolNames:
    """Renames the symbols of the dims it formats by their first appearance: $0, $1 ..."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self._slots: dict[str, str] = {}

    def _slot(self, name: str) -> str:
        slot = self._slots.get(name)
        if slot is None:
            slot = self._slots[name] = f"${len(self.order)}"
            self.order.append(name)
        return slot

    def dim(self, d) -> str:
        if isinstance(d, int):
            return str(d)
        return "".join(self._slot(piece) if is_name else piece for piece, is_name in _pieces(repr(d)))

    def value(self, v):
        if isinstance(v, (list, tuple)):
            return tuple(self.value(x) for x in v)
        if isinstance(v, SymExpr):
            return self.dim(v)
        return v

    def layout(self, t: Tensor) -> tuple:
        return (t.type.name, tuple(self.dim(d) for d in t.ne), tuple(self.dim(d) for d in t.nb))


def kernel_signature(node: Tensor) -> tuple[str, tuple[str, ...]]:
    """(key, symbols): the kernel key, and the node's symbols in the order the key numbers
    them, which is the order the kernel reads their values in (KernelBuilder's `symbols`)."""
    names = _SymbolNames()
    params = tuple((k, names.value(v)) for k, v in sorted(node.params.items(), key=lambda kv: kv[0]))
    dst = names.layout(node)
    srcs = tuple(names.layout(s) + (operand_repacked(node, j),) for j, s in enumerate(node.src))
    return repr((node.op, params, dst, srcs)), tuple(names.order)


def kernel_signatures(nodes: list[Tensor]) -> list[tuple[str, tuple[str, ...]]]:
    """kernel_signature of every node, formatted once per set of nodes alike in all it reads
    (op, params, types, shapes, strides, repacked operands): a model's layers repeat the same
    few dozen kernels, and formatting keys was a tenth of a warm start."""
    memo: dict[tuple, tuple[str, tuple[str, ...]]] = {}
    out = []
    for node in nodes:
        alike = (node.op, repr(sorted(node.params.items())), node.type, node.ne, node.nb,
                 tuple((s.type, s.ne, s.nb, operand_repacked(node, j)) for j, s in enumerate(node.src)))
        signature = memo.get(alike)
        if signature is None:
            signature = memo[alike] = kernel_signature(node)
        out.append(signature)
    return out


def kernel_key(node: Tensor) -> str:
    return kernel_signature(node)[0]
