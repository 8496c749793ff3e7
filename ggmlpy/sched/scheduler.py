"""Assign graph nodes to backends, cut the graph into per-backend splits, compile each.

Follows ggml_backend_sched's shape (DESIGN.md decision 6): every node gets a backend and a
printable cause, splits are maximal runs on one backend. With one host backend there is one
split; placement by weights and copies between devices arrive with the multi-backend work.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Sequence

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.tensor import Tensor
from ggmlpy.sched.backend import Backend, CompiledSplit
from ggmlpy.sched.store import TensorStore

log = logging.getLogger("ggmlpy.sched")


class SchedulerError(RuntimeError):
    """No backend can run some node of the graph."""


@dataclass(frozen=True)
class Assignment:
    backend: str
    cause: str


@dataclass
class Split:
    backend: Backend
    nodes: list[Tensor]


def assign(graph: Graph, backends: Sequence[Backend]) -> dict[int, Assignment]:
    """Each node goes to the first backend (in priority order) that supports it; a view goes
    where its source went, since it computes nothing."""
    out: dict[int, Assignment] = {}
    for node in graph.nodes:
        if OPS[node.op].kind == Kind.VIEW and node.src and node.src[0].id in out:
            out[node.id] = Assignment(out[node.src[0].id].backend, "view of its source")
            continue
        for rank, be in enumerate(backends):
            if be.supports_op(node):
                cause = "first backend that supports the op" if rank == 0 else \
                    f"fallback: {', '.join(b.name for b in backends[:rank])} cannot run {node.op}"
                if rank:
                    log.warning("node %s (%s) falls back to backend %s", node.name or node.id, node.op, be.name)
                out[node.id] = Assignment(be.name, cause)
                break
        else:
            raise SchedulerError(f"no backend supports op {node.op} ({node!r})")
    return out


def split_graph(graph: Graph, assignment: Mapping[int, Assignment],
                backends: Sequence[Backend]) -> list[Split]:
    by_name = {b.name: b for b in backends}
    splits: list[Split] = []
    for node in graph.nodes:
        be = by_name[assignment[node.id].backend]
        if not splits or splits[-1].backend is not be:
            splits.append(Split(be, []))
        splits[-1].nodes.append(node)
    return splits


class CompiledGraph:
    """A graph ready to run: its splits, each compiled by its backend."""

    def __init__(self, graph: Graph, backends: Sequence[Backend]):
        self.graph = graph
        self.signature = graph.signature()
        self.assignment = assign(graph, backends)
        self.splits = split_graph(graph, self.assignment, backends)
        self.compiled: list[CompiledSplit] = [s.backend.compile(graph, s.nodes) for s in self.splits]

    @property
    def fallbacks(self) -> list[Tensor]:
        return [n for n in self.graph.nodes if self.assignment[n.id].cause.startswith("fallback")]

    def run(self, store: TensorStore, env: Mapping[str, int]) -> None:
        for split in self.compiled:
            split.run(store, env)

    def describe(self) -> str:
        lines = []
        for i, s in enumerate(self.splits):
            lines.append(f"split {i}: backend {s.backend.name}, {len(s.nodes)} nodes")
        return "\n".join(lines)
