"""The pass pipeline replayed step by step: the graph after every pass and what each changed.

`run_pipeline` keeps only the last graph; the page shows all of them. The replay runs the
same pass functions in the same order (PASSES, pipeline_for) and records the same StepRecord
per step, so a test can hold it against run_pipeline's own records.

Passes share unchanged tensors between input and output and give every changed tensor a
fresh id (passes/common.py), so a diff is a comparison of ids: `added` are tensors new in the
pass's output, `removed` those it dropped. A removed tensor and an added one are a rewrite
when the added one took its place: it has the same non-empty name (a node whose sources
changed is copied under its name), or both are unnamed, of the same shape, and feed a
consumer of the same name.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.tensor import Tensor
from ggmlpy.passes.buffers import BufferPlan, plan_buffers
from ggmlpy.passes.common import check_graph, consumers
from ggmlpy.passes.fusion import Rule
from ggmlpy.passes.pipeline import BUFFERS, PASSES, StepRecord, pipeline_for

BUILT = "built"  # the name of stage 0: the graph as the model file built it


@dataclass
class Stage:
    """The graph after one step (stage 0: as built) and what the step changed."""

    name: str
    graph: Graph
    record: StepRecord | None = None           # None for stage 0
    doc: str = ""
    added: list[Tensor] = field(default_factory=list)
    removed: list[Tensor] = field(default_factory=list)
    rewritten: list[tuple[Tensor, Tensor]] = field(default_factory=list)  # (old, new)
    plan: BufferPlan | None = None             # the buffers step's plan


def replay_pipeline(graph: Graph, pipeline: str | Sequence[str], env: Mapping[str, int],
                    rules: Sequence[Rule] | None = None) -> list[Stage]:
    """Stage 0 (graph) and one stage per step of `pipeline` (a name, "cpu", "ref", or the
    pass names), in order; `rules`: the fusion pass's (pipeline.context_rules)."""
    stages = [Stage(BUILT, graph, doc="the graph as the model file built it")]
    for name in (pipeline_for(pipeline) if isinstance(pipeline, str) else pipeline):
        before = stages[-1].graph
        start = time.perf_counter()
        plan = None
        if name == BUFFERS:
            plan, after, doc = plan_buffers(before, env), before, "plan arena offsets (ggml-alloc)"
        else:
            after, doc = PASSES[name].apply(before, rules), PASSES[name].doc
            check_graph(after)
        record = StepRecord(name, len(before.nodes), len(after.nodes), time.perf_counter() - start)
        added, removed = diff(before, after)
        stages.append(Stage(name, after, record, doc, added, removed, rewrites(before, after, added, removed), plan))
    return stages


def diff(before: Graph, after: Graph) -> tuple[list[Tensor], list[Tensor]]:
    """(tensors of after that before lacks, tensors of before that after lacks), in order."""
    old = {t.id for t in before.tensors}
    new = {t.id for t in after.tensors}
    return [t for t in after.tensors if t.id not in old], [t for t in before.tensors if t.id not in new]


def rewrites(before: Graph, after: Graph, added: list[Tensor], removed: list[Tensor]) -> list[tuple[Tensor, Tensor]]:
    """Pairs (removed, added) where the added tensor took the removed one's place."""
    old_users, new_users = consumers(before.tensors), consumers(after.tensors)

    def key(t: Tensor, users: dict[int, list[Tensor]]) -> tuple:
        if t.name:
            return ("name", t.name)
        readers = sorted({u.name for u in users.get(t.id, []) if u.name})
        return ("unnamed", tuple(map(str, t.ne)), readers[0] if readers else None)

    free: dict[tuple, list[Tensor]] = {}
    for t in added:
        free.setdefault(key(t, new_users), []).append(t)
    pairs = []
    for t in removed:
        k = key(t, old_users)
        if k[-1] is not None and free.get(k):
            pairs.append((t, free[k].pop(0)))
    return pairs
