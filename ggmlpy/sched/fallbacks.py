"""One warning for the nodes that fall back to a lower-priority backend, not one per node.

A model whose weights have a type the host backend does not compile (Q8_1 or Q8_K weights
on the CPU backend), or an op variant it lacks (rope with YaRN, soft_max with ALiBi), runs
those nodes on the numpy reference backend: correct, but slow, and worth
saying once. The scheduler marks each such node (Assignment.fallback); `FallbackReport`
gathers them over the graphs a context compiles and says, in one line, which ops on which
types fall back, to which backend, and on how many nodes. Kinds already told are not told
again, so a later graph (a LoRA variant, the K-shift) only adds what is new.
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Sequence

from ggmlpy.ir.tensor import Tensor
from ggmlpy.sched.backend import Backend
from ggmlpy.sched.scheduler import CompiledGraph

log = logging.getLogger("ggmlpy.sched")


def fallback_kind(node: Tensor) -> str:
    """The op and its input types, which decide whether a backend runs it: mul_mat(Q5_1, F32)."""
    return f"{node.op}({', '.join(s.type.name for s in node.src)})"


class FallbackReport:
    """Fallback nodes of the graphs `note`d since the last `flush`, by (backend taking them,
    backends refusing them, kind)."""

    def __init__(self, backends: Sequence[Backend]):
        self.backends = list(backends)
        self.told: set[tuple[str, str, str]] = set()
        self.pending: Counter[tuple[str, str, str]] = Counter()
        self.n_graphs = 0

    def note(self, compiled: CompiledGraph) -> None:
        """Count the fallback nodes of one compiled graph (nothing is logged yet)."""
        rank = {b.name: i for i, b in enumerate(self.backends)}
        found = False
        for node in compiled.fallbacks:
            taker = compiled.assignment[node.id].backend
            refused = ", ".join(b.name for b in self.backends[:rank.get(taker, len(self.backends))]
                                if not b.supports_op(node))
            key = (taker, refused, fallback_kind(node))
            if key not in self.told:
                self.pending[key] += 1
                found = True
        self.n_graphs += found

    def flush(self) -> str | None:
        """Log the pending fallbacks as one warning line (and return it); None if none."""
        if not self.pending:
            return None
        by_route: dict[tuple[str, str], list[str]] = {}
        for (taker, refused, kind), n in sorted(self.pending.items(), key=lambda kv: -kv[1]):
            by_route.setdefault((taker, refused), []).append(f"{kind} x{n}")
        total = sum(self.pending.values())
        routes = "; ".join(f"{taker} runs what {refused or 'no other backend'} cannot: {', '.join(kinds)}"
                           for (taker, refused), kinds in by_route.items())
        graphs = f"{self.n_graphs} graph{'s' if self.n_graphs != 1 else ''}"
        line = f"{total} nodes in {graphs} fall back to a slower backend; {routes}"
        log.warning("%s", line)
        self.told.update(self.pending)
        self.pending.clear()
        self.n_graphs = 0
        return line
