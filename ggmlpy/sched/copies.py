"""Splits and the copies between them (the second half of ggml_backend_sched_split_graph).

A split is a maximal run of graph nodes on one backend. A node that reads a tensor whose
memory lives on another device needs that tensor copied into its own backend's memory first;
the copy is recorded on the first split that needs it and reused by later splits on the same
backend, as ggml does (one copy per tensor and destination backend).

For backends that share host memory the copy moves no bytes: the TensorStore holds one
buffer per tensor that every host backend reads. It is still listed and counted, so dumps show
where data crosses devices and a device backend implements the transfer in its
`copy_in(copy, store, env)` hook (Backend's default moves nothing), which `run_copies` calls.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Tensor, memory_root
from ggmlpy.ir.types import row_size
from ggmlpy.sched.backend import Backend


def is_view(t: Tensor) -> bool:
    return not t.is_leaf and OPS[t.op].kind == Kind.VIEW


@dataclass(frozen=True)
class Copy:
    """`tensor` (as the consumer reads it, possibly a view) copied from its home backend's
    memory into `dst_backend`'s before split `split` runs."""

    tensor: Tensor
    src_backend: str
    dst_backend: str
    split: int
    consumer: Tensor  # the first node that reads the copy

    @property
    def name(self) -> str:
        """ggml's name for the copy tensor: `<backend>#<tensor>`."""
        return f"{self.dst_backend}#{self.tensor.name or '#' + str(self.tensor.id)}"

    def nbytes(self, env: Mapping[str, int]) -> int:
        ne = [evaluate(d, env) for d in self.tensor.ne]
        n = row_size(self.tensor.type, ne[0]) if ne[0] else 0
        for d in ne[1:]:
            n *= d
        return n


@dataclass
class Split:
    backend: Backend
    nodes: list[Tensor]
    index: int = 0
    copies: list[Copy] = field(default_factory=list)  # inputs copied in before it runs
    copy_bytes: dict[tuple, list[int]] = field(default_factory=dict, repr=False)  # per env: each copy's bytes

    @property
    def n_compute(self) -> int:
        """Nodes that compute something (views only re-describe memory)."""
        return sum(1 for n in self.nodes if not is_view(n))


def split_graph(graph: Graph, backend_of: Mapping[int, str], backends: Sequence[Backend]) -> list[Split]:
    """Maximal runs of nodes on one backend, in graph order.

    Views never start a split: they compute nothing, so a view joins the split of the next
    computing node (usually the one that reads it), and trailing views the last split. A view
    may still be read by a later split (a weight moved to another device between a product
    and the rope reading its reshape): the copy is then of the view, and the split that
    computed the memory behind it exports that memory (by root, as every backend does)."""
    by_name = {b.name: b for b in backends}
    splits: list[Split] = []
    pending: list[Tensor] = []
    for node in graph.nodes:
        if is_view(node):
            pending.append(node)
            continue
        be = by_name[backend_of[node.id]]
        if not splits or splits[-1].backend is not be:
            splits.append(Split(be, [], len(splits)))
        splits[-1].nodes += pending
        splits[-1].nodes.append(node)
        pending = []
    if pending:
        if not splits:
            splits.append(Split(by_name[backend_of[pending[0].id]], [], 0))
        splits[-1].nodes += pending
    return splits


def insert_copies(splits: list[Split], home_of: Callable[[Tensor], tuple[str, ...]],
                  backend_of: Mapping[int, str], buffer_type: Callable[[Backend], str]) -> list[Copy]:
    """Record a copy wherever a computing node reads a tensor whose memory (its root's) is not
    in its backend's memory. `home_of(t)` gives the devices holding t's root (a tied weight
    is held twice); one copy per (tensor, destination backend), on the first split needing it."""
    made: set[tuple[int, str]] = set()
    copies: list[Copy] = []
    for split in splits:
        dst = split.backend
        memory = buffer_type(dst)
        for node in split.nodes:
            if is_view(node):
                continue
            for src in node.src:
                if memory in home_of(src) or (src.id, dst.name) in made:
                    continue
                made.add((src.id, dst.name))
                copy = Copy(src, backend_of[memory_root(src).id], dst.name, split.index, node)
                split.copies.append(copy)
                copies.append(copy)
    return copies


@dataclass
class CopyStats:
    """What the copies of a compiled graph moved, summed over runs."""

    runs: int = 0
    copies: int = 0
    bytes: int = 0
    by_pair: dict[tuple[str, str], int] = field(default_factory=dict)  # (from, to) -> bytes


def run_copies(split: Split, store, env: Mapping[str, int], stats: CopyStats) -> None:
    """Bring a split's inputs into its backend's memory. Host backends share the store's
    buffers, so for them this only counts; a device backend's `copy_in` moves the data."""
    copy_in = split.backend.copy_in
    key = tuple(env.items())
    sizes = split.copy_bytes.get(key)
    if sizes is None:  # (a decode step would otherwise evaluate every shape again)
        if len(split.copy_bytes) > 256:
            split.copy_bytes.clear()
        sizes = split.copy_bytes[key] = [c.nbytes(env) for c in split.copies]
    for c, n in zip(split.copies, sizes):
        copy_in(c, store, env)
        stats.copies += 1
        stats.bytes += n
        pair = (c.src_backend, c.dst_backend)
        stats.by_pair[pair] = stats.by_pair.get(pair, 0) + n
