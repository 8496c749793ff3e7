"""Assign graph nodes to backends, cut the graph into per-backend splits, compile each.

Follows ggml_backend_sched (docs/architecture.md, decision 6). Backends come in priority order: offload
devices first (cuda:0, or a second CPU "cpu:1"), then the host CPU, then the numpy reference
backend as the last fallback. Every tensor gets a backend and a printable cause, decided by
ggml's passes in order:

1. from pre-allocated memory: weights and KV cache layers sit where the placement put them
   (`1.dst`), graph inputs on the host (`1.inp`; without a placement they follow their
   first reader instead, so a lone device backend runs all it can), a write into the KV
   cache runs where the cache lives (`1.vsrc`), a node reading a weight or a KV cache layer
   runs on its device (`1.wgt<i>`, `1.kv<i>`; rope is skipped: its frequency table is too
   small a weight to decide);
2. expansion: offload backends spread to unassigned neighbours down then up the node order,
   then every backend does (`2.gpu-down`, `2.gpu-up`, `2.down`, `2.up`); a backend that
   cannot run a node leaves it for later, and the last resort (Backend.last_resort: the
   reference backend as a context's fallback) spreads to no neighbour;
3. upgrade to a higher-priority backend that uses the same memory, runs the op and can read
   every input (`3.upg`); a node still unassigned goes to the backend that already holds
   most of its inputs (`3.best`), the last resort only when no other backend runs it;
4. the rest from their neighbours: leaves where their first reader runs (`4.cur`), views
   with the tensor they view (`4.vsrc`).

A node that lands behind a backend that could not run it is a fallback: its cause says which
backend refused it, and `CompiledGraph.fallbacks` lists it (fallbacks.py tells a user about
them in one line). Splits and copies: copies.py.
"""
from __future__ import annotations

import functools

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from ggmlpy.ir.dump import tensor_keys
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.tensor import Flag, Tensor, memory_root
from ggmlpy.sched.backend import HOST_MEMORY, Backend, CompiledSplit
from ggmlpy.sched.copies import (
    Copy, CopyStats, Split, insert_copies, is_view, run_copies, split_graph,
)
from ggmlpy.sched.store import TensorStore

log = logging.getLogger("ggmlpy.sched")

PLACED = Flag.WEIGHT | Flag.CACHE

__all__ = ["Assignment", "CompiledGraph", "Copy", "LeafPlacement", "Schedule", "SchedulerError",
           "Split", "assign", "buffer_type", "schedule", "split_graph"]


class SchedulerError(RuntimeError):
    """No backend can run some node of the graph, or a placement names an unknown device."""


class LeafPlacement(Protocol):
    """Where weights and KV cache layers live (llama.placement.Placement is one)."""

    def device_for(self, leaf: Tensor, user: Tensor | None) -> str | None:
        """The device (a backend buffer type) holding `leaf` as `user` reads it; None: not placed."""

    def devices_of(self, leaf: Tensor) -> tuple[str, ...]:
        """Every device that holds `leaf` (a tied embedding is held by two)."""


class _NoPlacement:
    def device_for(self, leaf: Tensor, user: Tensor | None) -> str | None:
        return None

    def devices_of(self, leaf: Tensor) -> tuple[str, ...]:
        return ()


class _DictPlacement:
    """A plain {leaf name: device} mapping, for tests and hand-made graphs."""

    def __init__(self, devices: Mapping[str, str]):
        self.devices = dict(devices)

    def device_for(self, leaf: Tensor, user: Tensor | None) -> str | None:
        return self.devices.get(leaf.name)

    def devices_of(self, leaf: Tensor) -> tuple[str, ...]:
        dev = self.devices.get(leaf.name)
        return (dev,) if dev is not None else ()


def as_placement(placement: LeafPlacement | Mapping[str, str] | None) -> LeafPlacement:
    if placement is None:
        return _NoPlacement()
    if isinstance(placement, Mapping):
        return _DictPlacement(placement)
    return placement


def buffer_type(backend: Backend) -> str:
    """The memory a backend computes in (Backend.buffer_type): backends with the same buffer
    type read each other's tensors without copies; host backends share host memory."""
    return backend.buffer_type


@dataclass(frozen=True)
class Assignment:
    backend: str
    cause: str             # printable, starting with ggml's pass code: "1.wgt0: reads weight ..."
    fallback: bool = False  # a backend that wanted the node could not run it

    @property
    def code(self) -> str:
        return self.cause.split(":", 1)[0]


class _Assigner:
    """The assignment passes over one graph; state is per tensor id."""

    def __init__(self, graph: Graph, backends: Sequence[Backend], placement: LeafPlacement):
        names = [b.name for b in backends]
        if not backends or len(set(names)) != len(names):
            raise SchedulerError(f"backends must be a non-empty list of distinct names, got {names}")
        self.graph = graph
        self.backends = list(backends)
        self.placement = placement
        self.bufts = [buffer_type(b) for b in backends]
        # graph inputs are set by the first host backend (one that computes in host memory)
        self.host = next((i for i, b in enumerate(backends) if b.is_host and self.bufts[i] == HOST_MEMORY),
                         len(backends) - 1)
        self.keys = tensor_keys(graph)
        self.computing = [n for n in graph.nodes if not is_view(n)]
        self.be: dict[int, int] = {}
        self.cause: dict[int, str] = {}
        self.refused: dict[int, list[str]] = defaultdict(list)
        self._supports: dict[tuple[int, int], bool] = {}

    # helpers ----------------------------------------------------------------------------------
    def label(self, t: Tensor) -> str:
        return t.name or self.keys[t.id]

    def supports(self, i: int, node: Tensor) -> bool:
        key = (i, node.id)
        if key not in self._supports:
            self._supports[key] = bool(self.backends[i].supports_op(node))
        return self._supports[key]

    def set(self, t: Tensor, i: int, cause: str) -> None:
        self.be[t.id] = i
        self.cause[t.id] = cause

    def refuse(self, node: Tensor, i: int) -> None:
        name = self.backends[i].name
        if name not in self.refused[node.id]:
            self.refused[node.id].append(name)

    def set_if_supported(self, node: Tensor, i: int, cause: str) -> bool:
        if self.supports(i, node):
            self.set(node, i, cause)
            return True
        self.refuse(node, i)
        return False

    def backend_for_device(self, device: str, node: Tensor | None) -> int | None:
        """ggml's backend_from_buffer: the first backend using `device` memory that can run
        node (any such backend for a leaf). Those passed over refused node: if a later one
        of the same memory takes it, it falls back."""
        for i, bt in enumerate(self.bufts):
            if bt != device:
                continue
            if node is None or self.supports(i, node):
                return i
            self.refuse(node, i)
        return None

    def memory_of(self, t: Tensor) -> tuple[str, ...]:
        """The devices holding t's data so far (empty while t's root is unassigned)."""
        root = memory_root(t)
        if root.is_leaf and root.flags & PLACED:
            held = self.placement.devices_of(root)
            if held:
                return tuple(held)
        i = self.be.get(t.id, self.be.get(root.id))
        return (self.bufts[i],) if i is not None else ()

    # pass 1 -----------------------------------------------------------------------------------
    def from_buffers(self) -> None:
        """Placed leaves, then graph inputs on the host, then the nodes they pin. Without any
        placement the inputs stay unassigned too, and follow their first reader: a context on
        one device backend (plus the reference fallback) then runs every node it can there."""
        placed = [self.place_leaf(t) for t in self.graph.leafs if t.flags & PLACED]
        if any(placed):
            for t in self.graph.leafs:
                if t.flags & Flag.INPUT and not t.flags & PLACED:
                    self.set(t, self.host, f"1.inp: graph input, set by the host "
                                           f"({self.bufts[self.host]} memory)")
        for node in self.computing:
            self.from_sources(node)

    def place_leaf(self, t: Tensor) -> bool:
        device = self.placement.device_for(t, None)
        if device is None:
            return False
        i = self.backend_for_device(device, None)
        kind = "weight" if t.flags & Flag.WEIGHT else "KV cache"
        if i is None:
            raise SchedulerError(f"{kind} {t.name!r} is placed on device {device!r}, but no backend "
                                 f"computes in {device} memory (backends: "
                                 f"{', '.join(b.name for b in self.backends)})")
        self.set(t, i, f"1.dst: {kind} placed on {device}")
        return True

    def from_sources(self, node: Tensor) -> None:
        root = node.view_src
        if root is not None and root.is_leaf and root.flags & PLACED:
            device = self.placement.device_for(root, node)
            if device is not None:
                i = self.backend_for_device(device, node)
                if i is None:
                    raise SchedulerError(f"{self.label(node)} ({node.op}) writes into {root.name!r} on "
                                         f"{device}, but no backend for {device} can run {node.op}")
                self.set(node, i, f"1.vsrc: writes into {root.name} on {device}")
                return
        if node.op == "rope":
            return  # its frequency table is too small a weight to decide where rope runs
        for j, src in enumerate(node.src):
            root = memory_root(src)
            if not (root.is_leaf and root.flags & PLACED):
                continue
            device = self.placement.device_for(root, node)
            if device is None:
                continue
            kind, code = ("weight", "wgt") if root.flags & Flag.WEIGHT else ("KV cache", "kv")
            i = self.backend_for_device(device, node)
            if i is None:  # the device cannot run it (each refused): later passes decide, with a copy
                return
            if root.flags & Flag.WEIGHT and i >= self.host and self.offload(node, i):
                return
            self.set(node, i, f"1.{code}{j}: reads {kind} {root.name} on {device}")
            return

    def offload(self, node: Tensor, i: int) -> bool:
        """ggml's op offload: a higher-priority backend may take an op whose weight is in host
        memory (a GPU backend does for large batches) if it says so with `offload_op(node)`."""
        for k in range(i):
            if self.supports(k, node) and self.backends[k].offload_op(node):
                self.set(node, k, f"1.off: {self.backends[k].name} takes it from host weights")
                return True
        return False

    # pass 2 -----------------------------------------------------------------------------------
    def expand(self) -> None:
        down, up = self.computing, self.computing[::-1]
        self.spread(down, True, "2.gpu-down")
        self.spread(up, True, "2.gpu-up")
        self.spread(down, False, "2.down")
        self.spread(up, False, "2.up")

    def spread(self, order: list[Tensor], offload_only: bool, code: str) -> None:
        """Carry the last assignment seen along `order` to unassigned nodes. offload_only:
        only offload backends spread (ggml: "expand gpu"), so the host CPU runs nothing but
        what its weights pin there or what no device claims. The last resort never spreads:
        it runs the nodes pinned to it (a weight type only it reads), not their neighbours."""
        cur: int | None = None
        seed: Tensor | None = None
        for node in order:
            i = self.be.get(node.id)
            if i is not None:
                stop = (offload_only and i >= self.host) or self.backends[i].last_resort
                cur, seed = (None, None) if stop else (i, node)
            elif cur is not None and seed is not None:
                if self.set_if_supported(node, cur, f"{code}: next to {self.label(seed)} on "
                                                    f"{self.backends[cur].name}"):
                    seed = node

    # pass 3 -----------------------------------------------------------------------------------
    def upgrade(self) -> None:
        for node in self.computing:
            i = self.be.get(node.id)
            if i is None:
                self.best(node)
                continue
            for k in range(i):
                if self.bufts[k] == self.bufts[i] and self.supports(k, node) and \
                        all(self.bufts[k] in self.memory_of(s) for s in node.src):
                    self.set(node, k, f"3.upg: {self.backends[k].name} shares {self.bufts[k]} memory "
                                      f"with {self.backends[i].name} and runs {node.op}")
                    break

    def best(self, node: Tensor) -> None:
        """The backend that can already read most of node's inputs; the first one on ties.
        A last resort competes only when no other backend runs node: holding node's inputs
        (the output of a product only it could run) does not draw the next nodes to it."""
        found = self.most_inputs(node, lambda i: not self.backends[i].last_resort) or \
            self.most_inputs(node, lambda i: self.backends[i].last_resort)
        if found is None:
            return
        best, best_n = found
        cause = f"3.best: {best_n} of {len(node.src)} inputs in {self.bufts[best]} memory"
        passed = [self.backends[k].name for k, n in self.readable_by_last_resort(node) if n > best_n]
        if passed:
            cause += f" (not {', '.join(passed)}: a last resort, it runs only what no other backend can)"
        self.set(node, best, cause)

    def most_inputs(self, node: Tensor, among: Callable[[int], bool]) -> tuple[int, int] | None:
        """(backend, inputs it can read) for the backend `among` these that runs node and can
        read most of its inputs, the first on ties; None if none runs it."""
        best, best_n = None, -1
        for i in range(len(self.backends)):
            if not among(i):
                continue
            if not self.supports(i, node):
                if best is None:
                    self.refuse(node, i)
                continue
            n = self.n_readable(i, node)
            if n > best_n:
                best, best_n = i, n
        return None if best is None else (best, best_n)

    def n_readable(self, i: int, node: Tensor) -> int:
        return sum(1 for s in node.src if self.bufts[i] in self.memory_of(s))

    def readable_by_last_resort(self, node: Tensor) -> list[tuple[int, int]]:
        return [(k, self.n_readable(k, node)) for k, b in enumerate(self.backends)
                if b.last_resort and self.supports(k, node)]

    # pass 4 -----------------------------------------------------------------------------------
    def rest(self) -> None:
        for node in self.computing:
            if node.id not in self.be:
                tried = ", ".join(b.name for b in self.backends)
                inputs = ", ".join(f"{self.label(s)} {s.type.name}" for s in node.src)
                raise SchedulerError(f"no backend can run {self.label(node)} ({node.op} {node.type.name} "
                                     f"{node.shape_str()}); tried {tried}; its inputs: {inputs}")
        readers = self.first_readers()
        for t in self.graph.leafs:
            if t.id not in self.be:
                reader = readers.get(t.id)
                if reader is None:
                    self.set(t, self.host, "4.host: read by no computing node")
                else:
                    self.set(t, self.be[reader.id], f"4.cur: read first by {self.label(reader)}")
        for node in self.graph.nodes:
            if is_view(node):
                root = memory_root(node)
                self.set(node, self.be[root.id], f"4.vsrc: view of {self.label(root)}")

    def first_readers(self) -> dict[int, Tensor]:
        """Per tensor, the first computing node that reads it, directly or through views."""
        first: dict[int, Tensor] = {}
        for node in self.computing:
            for src in node.src:
                for t in (src, memory_root(src)):
                    first.setdefault(t.id, node)
        return first

    # result -----------------------------------------------------------------------------------
    def run(self) -> dict[int, Assignment]:
        self.from_buffers()
        self.expand()
        self.upgrade()
        self.rest()
        out: dict[int, Assignment] = {}
        for t in self.graph.tensors:
            i = self.be[t.id]
            name = self.backends[i].name
            refused = [r for r in self.refused.get(t.id, []) if r != name]
            fallback = bool(refused) and not t.is_leaf and not is_view(t)
            cause = self.cause[t.id]
            if fallback:
                cause += f" (fallback: {', '.join(refused)} cannot run {t.op})"
                log.debug("node %s (%s) falls back to backend %s", self.label(t), t.op, name)
            out[t.id] = Assignment(name, cause, fallback)
        return out


def assign(graph: Graph, backends: Sequence[Backend],
           placement: LeafPlacement | Mapping[str, str] | None = None) -> dict[int, Assignment]:
    """Every tensor of graph (leaves, views and computing nodes) -> its backend and cause.

    `backends` in priority order; `placement` says where weights and KV cache layers live
    (a LeafPlacement, or a {leaf name: device} dict); without one, every node goes where the
    passes 3 and 4 put it: the first backend that runs it, unless its inputs sit elsewhere."""
    return _Assigner(graph, backends, as_placement(placement)).run()


@dataclass
class Schedule:
    """The scheduler's decisions for one graph: assignments, splits and copies."""

    graph: Graph
    backends: list[Backend]
    assignment: dict[int, Assignment]
    splits: list[Split]
    copies: list[Copy] = field(default_factory=list)

    @property
    def fallbacks(self) -> list[Tensor]:
        return [n for n in self.graph.nodes if self.assignment[n.id].fallback]

    def backend_of(self) -> dict[int, str]:
        return {tid: a.backend for tid, a in self.assignment.items()}

    def describe(self, causes: bool = True) -> str:
        """ggml_backend_sched_print_assignments: splits with their copied inputs, then (with
        causes) every node with its backend and why."""
        keys = tensor_keys(self.graph)
        lines = [f"{len(self.splits)} splits, {len(self.copies)} copies, "
                 f"{len(self.fallbacks)} fallbacks; backends: {', '.join(b.name for b in self.backends)}"]
        for s in self.splits:
            ins = " ".join(f"[{c.tensor.name or keys[c.tensor.id]} from {c.src_backend}]" for c in s.copies)
            lines.append(f"## split #{s.index}: {s.backend.name}, {s.n_compute} nodes, "
                         f"{len(s.copies)} copies{': ' + ins if ins else ''}")
            if not causes:
                continue
            for n in s.nodes:
                if is_view(n):
                    continue
                a = self.assignment[n.id]
                srcs = ", ".join(f"{s_.name or keys[s_.id]} [{self.assignment[s_.id].backend}]" for s_ in n.src)
                lines.append(f"  {keys[n.id]:>5} {n.op:<10} {n.name or '-':<18} [{a.backend}] "
                             f"{a.cause}  <- {srcs}")
        return "\n".join(lines)


def schedule(graph: Graph, backends: Sequence[Backend],
             placement: LeafPlacement | Mapping[str, str] | None = None) -> Schedule:
    """Assign, split and insert copies, without compiling anything (what dumps show)."""
    pl = as_placement(placement)
    assignment = assign(graph, backends, pl)
    backend_of = {tid: a.backend for tid, a in assignment.items()}
    splits = split_graph(graph, backend_of, backends)
    by_name = {b.name: b for b in backends}

    def home_of(t: Tensor) -> tuple[str, ...]:
        root = memory_root(t)
        if root.is_leaf and root.flags & PLACED and pl.devices_of(root):
            return tuple(pl.devices_of(root))
        return (buffer_type(by_name[backend_of[root.id]]),)

    copies = insert_copies(splits, home_of, backend_of, buffer_type)
    return Schedule(graph, list(backends), assignment, splits, copies)


class CompiledGraph:
    """A graph ready to run: its schedule, and each split compiled by its backend."""

    def __init__(self, graph: Graph, backends: Sequence[Backend],
                 placement: LeafPlacement | Mapping[str, str] | None = None):
        self.graph = graph
        self.schedule = schedule(graph, backends, placement)
        self.assignment = self.schedule.assignment
        self.splits = self.schedule.splits
        self.copy_stats = CopyStats()
        self.compiled: list[CompiledSplit] = [s.backend.compile(graph, s.nodes) for s in self.splits]

    @functools.cached_property
    def signature(self) -> str:
        """The optimised graph's signature (computed when asked: hashing a graph costs about
        50 ms, and a start-up compiles two)."""
        return self.graph.signature()

    @property
    def fallbacks(self) -> list[Tensor]:
        return self.schedule.fallbacks

    @property
    def copies(self) -> list[Copy]:
        return self.schedule.copies

    def run(self, store: TensorStore, env: Mapping[str, int]) -> None:
        """Each split in order, after the copies of its inputs."""
        self.copy_stats.runs += 1
        for split, compiled in zip(self.splits, self.compiled):
            if split.copies:
                run_copies(split, store, env, self.copy_stats)
            compiled.run(store, env)

    def describe(self, causes: bool = False) -> str:
        return self.schedule.describe(causes)
