"""`Graph`: the tensors reachable from the outputs, in topological order, and its signature."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ggmlpy.ir.symbolic import dim_str
from ggmlpy.ir.tensor import BOUND_BITS, Flag, Tensor
from ggmlpy.ir.types import GGMLType


def tensor_deps(t: Tensor) -> list[Tensor]:
    """What t needs before it exists: its sources and, for views, its memory owner."""
    return list(t.src) + ([t.view_src] if t.view_src is not None else [])


def append_post_order(root: Tensor, seen: set[int], order: list[Tensor],
                      deps: Callable[[Tensor], list[Tensor]] = tensor_deps) -> None:
    """Append to `order` root and what it needs (`deps`) that is not in `seen` yet,
    dependencies first, marking each seen: a depth-first post-order with sources in order
    (as ggml_build_forward), on an explicit stack so deep graphs do not hit the recursion
    limit."""
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        t, expanded = stack.pop()
        if t.id in seen:
            continue
        if expanded:
            seen.add(t.id)
            order.append(t)
            continue
        stack.append((t, True))
        for s in reversed(deps(t)):
            if s.id not in seen:
                stack.append((s, False))


def topological_order(outputs: Iterable[Tensor]) -> list[Tensor]:
    """Depth-first post-order from the outputs, sources in order (as ggml_build_forward)."""
    order: list[Tensor] = []
    seen: set[int] = set()
    for out in outputs:
        append_post_order(out, seen, order)
    return order


@dataclass
class Graph:
    """A computation: `leafs` (no op) and `nodes` (ops) in an order that respects data flow."""

    outputs: list[Tensor]
    tensors: list[Tensor] = field(default_factory=list)
    # what the builder knows beyond the tensors and wants backends to specialise on, e.g.
    # {"tokens": "single"} for one-token decode graphs; part of the signature
    hints: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_outputs(outputs: Iterable[Tensor], first: Iterable[Tensor] = ()) -> "Graph":
        """The graph of `outputs`; the nodes `first` needs are ordered before the rest (as an
        early ggml_build_forward_expand), without becoming outputs."""
        outs = list(outputs)
        for o in outs:
            o.flags |= Flag.OUTPUT
        return Graph(outs, topological_order([*first, *outs]))

    @property
    def leafs(self) -> list[Tensor]:
        return [t for t in self.tensors if t.is_leaf]

    @property
    def nodes(self) -> list[Tensor]:
        return [t for t in self.tensors if not t.is_leaf]

    def find(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r} in the graph")

    def consumers(self) -> dict[int, list[Tensor]]:
        users: dict[int, list[Tensor]] = {t.id: [] for t in self.tensors}
        for t in self.tensors:
            for s in t.src:
                users[s.id].append(t)
        return users

    def describe(self) -> list[tuple[Any, ...]]:
        """A canonical, id-free description of every tensor: what the signature hashes.
        (Written for speed: a warm start hashes two graphs of 2,000 tensors.)"""
        index = {t.id: i for i, t in enumerate(self.tensors)}
        type_names = {t: t.name for t in GGMLType}
        rows = []
        for t in self.tensors:
            bound = t.flags._value_ & BOUND_BITS
            params = t.params
            rows.append((
                t.op, type_names[t.type], tuple(map(dim_str, t.ne)), tuple(map(dim_str, t.nb)),
                tuple(sorted((k, _canonical(v)) for k, v in params.items())) if params else (),
                tuple([index[s.id] for s in t.src]),
                index[t.view_src.id] if t.view_src is not None else None, dim_str(t.view_offs),
                t.flags._value_, t.name if bound else "",
            ))
        rows.append(("outputs", tuple(index[o.id] for o in self.outputs)))
        rows.append(("hints", tuple(sorted(self.hints.items()))))
        return rows

    def signature(self) -> str:
        """Stable hash of structure, types, static shapes, params and roles; never of data
        or of symbol values, so every ubatch size shares one signature."""
        return hashlib.sha256(repr(self.describe()).encode()).hexdigest()[:24]


def _canonical(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_canonical(x) for x in v)
    if isinstance(v, float):
        return repr(v)
    if hasattr(v, "terms"):
        return dim_str(v)
    return v
