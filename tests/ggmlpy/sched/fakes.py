"""Fake devices for scheduler tests: numpy compute (the reference backend's), restricted to
some ops, with their own memory, and a ledger that fails a run reading data not in it.

The ledger is the independent check of copy insertion: it knows where every tensor was
produced (a split's device memory) or placed (leaves), and a fake split refuses to read a
tensor that is neither in its memory nor copied in before it ran."""
from __future__ import annotations

from typing import Iterable, Mapping

from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.tensor import Tensor, memory_root
from ggmlpy.sched.ref_backend import RefBackend, RefSplit


class Ledger:
    """Which memory holds each tensor's data (by root id), and what each device got copied."""

    def __init__(self, homes: Mapping[int, str] | None = None):
        self.home: dict[int, str] = dict(homes or {})
        self.copied: dict[str, set[int]] = {}
        self.reads: list[tuple[str, int]] = []  # (memory, tensor id) per checked read

    def check_read(self, memory: str, src: Tensor) -> None:
        self.reads.append((memory, src.id))
        if self.home.get(memory_root(src).id) == memory or src.id in self.copied.get(memory, set()):
            return
        raise AssertionError(f"{memory} reads {src!r}, which lives in {self.home.get(memory_root(src).id)} "
                             f"and was not copied in")


class FakeDevice(RefBackend):
    """A device backend: runs `ops` (all when None) with numpy, in `memory`."""

    def __init__(self, name: str, ops: Iterable[str] | None = None, memory: str | None = None,
                 ledger: Ledger | None = None):
        super().__init__()
        self.name = name
        self.ops = set(ops) if ops is not None else None
        self.memory = memory or ("cpu" if name in ("cpu", "ref") else name)
        self.buffer_type = self.memory
        self.ledger = ledger
        self.compiled_nodes: list[list[Tensor]] = []

    def supports_op(self, node: Tensor) -> bool:
        if OPS[node.op].kind == Kind.VIEW:
            return True
        return (self.ops is None or node.op in self.ops) and super().supports_op(node)

    def compile(self, graph, nodes):
        self.compiled_nodes.append(list(nodes))
        return CheckedSplit(self, nodes)

    def copy_in(self, copy, store, env) -> None:
        if self.ledger is not None:
            self.ledger.copied.setdefault(self.memory, set()).add(copy.tensor.id)


class CheckedSplit(RefSplit):
    def run(self, store, env) -> None:
        ledger = self.backend.ledger
        if ledger is not None:
            for node in self.nodes:
                if OPS[node.op].kind == Kind.VIEW:
                    continue
                for src in node.src:
                    ledger.check_read(self.backend.memory, src)
                ledger.home.setdefault(memory_root(node).id, self.backend.memory)
        super().run(store, env)
