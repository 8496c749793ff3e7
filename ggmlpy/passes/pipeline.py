"""The pass pipeline: an ordered list of passes per backend, and a dump after any of them.

    result = run_pipeline(graph, backend="cpu", env={"n_tokens": 512, "n_kv": 4096,
                                                     "n_outputs": 512})
    result.graph   # what the backend compiles
    result.plan    # the BufferPlan, when the pipeline ends with "buffers"

Every pass is a pure function Graph -> Graph (docs/architecture.md, decision 4); "buffers" is the one
step that reads the graph and returns a plan instead. The reference backend runs the graph
nearly as built (it is the oracle), the CPU backend gets every pass. `dump_after="fusion"`
renders the graph right after that pass (`ggmlpy graph --dump-after PASS` calls this).

A backend names its pipeline (Backend.pipeline()); a Context runs `context_passes(backends)`
over its graph before the scheduler splits it, so every split gets its own backend's passes:
the rewrites (dce, cse, views) change no result, so one graph rewritten for any backend is
right for all of them (and the scheduler needs one graph to split); the marking passes
(fusion) only annotate, and each backend reads the annotations for its own split's nodes
(codegen_cpu/fusion.py keeps the groups that lie inside its split; others ignore them). The
CUDA backend groups its own splits with its rules after scheduling (codegen_cuda/fusion.py).
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ggmlpy.ir import dump as ir_dump
from ggmlpy.ir.graph import Graph
from ggmlpy.passes.buffers import WORST_CASE, BufferPlan, plan_buffers
from ggmlpy.passes.common import FUSION_HINT, PassError, check_graph
from ggmlpy.passes.cse import eliminate_common_subexpressions
from ggmlpy.passes.dce import eliminate_dead_code
from ggmlpy.passes.fusion import Rule, describe_groups, mark_fusion_groups
from ggmlpy.passes.views import fold_views
from ggmlpy.sched.backend import REFERENCE_PIPELINE, Backend

log = logging.getLogger("ggmlpy.passes")


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[..., Graph]
    doc: str = ""
    takes_rules: bool = False  # run(graph, rules): the backends' fusion rules

    def apply(self, graph: Graph, rules: Sequence[Rule] | None) -> Graph:
        """run(graph), with the fusion rules when the pass takes them (then they must be given)."""
        if not self.takes_rules:
            return self.run(graph)
        if rules is None:
            raise ValueError(f"pass {self.name!r} needs the backends' fusion rules "
                             "(rules=backend.fusion_rules(), or context_rules(backends))")
        return self.run(graph, tuple(rules))


PASSES: dict[str, Pass] = {p.name: p for p in (
    Pass("dce", eliminate_dead_code, "drop what no output and no write needs"),
    Pass("cse", eliminate_common_subexpressions, "merge nodes that compute the same thing"),
    Pass("views", fold_views, "fold view chains into one strided view; drop needless conts"),
    Pass("fusion", mark_fusion_groups, "mark groups of nodes one kernel computes", takes_rules=True),
)}
BUFFERS = "buffers"  # the planning step: it must come last, and leaves the graph as it is

PIPELINES: dict[str, tuple[str, ...]] = {
    "ref": REFERENCE_PIPELINE,
    "cpu": ("dce", "cse", "views", "fusion", BUFFERS),
}


@dataclass
class StepRecord:
    name: str
    nodes_before: int
    nodes_after: int
    seconds: float


@dataclass
class PipelineResult:
    graph: Graph
    plan: BufferPlan | None = None
    steps: list[StepRecord] = field(default_factory=list)


def pipeline_for(backend: str) -> tuple[str, ...]:
    """The pass names a backend runs, in order."""
    try:
        return PIPELINES[backend]
    except KeyError:
        raise ValueError(f"no pass pipeline for backend {backend!r} "
                         f"(known: {', '.join(sorted(PIPELINES))})") from None


def context_passes(backends: Sequence[Backend]) -> tuple[str, ...]:
    """The passes a context with these backends runs over its graph: every pass one of their
    pipelines names, in PASSES order, then "buffers" if one plans buffers (see the module
    docstring for why the union is right). An unknown pass name is an error naming it."""
    wanted: set[str] = set()
    for be in backends:
        names = tuple(be.pipeline())
        unknown = [n for n in names if n not in PASSES and n != BUFFERS]
        if unknown:
            raise ValueError(f"backend {be.name!r} asks for unknown passes {unknown} "
                             f"(known: {', '.join([*PASSES, BUFFERS])})")
        wanted.update(names)
    return tuple(n for n in (*PASSES, BUFFERS) if n in wanted)


def context_rules(backends: Sequence[Backend]) -> tuple[Rule, ...]:
    """The fusion rules the "fusion" pass of a context with these backends marks with: the
    rules of every backend whose pipeline runs the pass, in backend order, each rule once
    (two CPU backends hand the same set)."""
    out: list[Rule] = []
    for be in backends:
        if "fusion" in be.pipeline():
            out += [r for r in be.fusion_rules() if r not in out]
    return tuple(out)


def pipeline_name(names: Sequence[str]) -> str:
    """A label for a pass list: the pipeline it equals ("cpu", "ref"), else the names."""
    for label, known in PIPELINES.items():
        if tuple(names) == known:
            return label
    return "+".join(names) or "none"


def pass_names() -> list[str]:
    """Every step name any pipeline runs, in pipeline order (choices for --dump-after)."""
    return list(dict.fromkeys(n for names in PIPELINES.values() for n in names))


def render_text(graph: Graph, plan: BufferPlan | None = None) -> str:
    """The text dump of a graph, with its fusion groups and buffer plan when it has them."""
    text = ir_dump.to_text(graph)
    if graph.hints.get(FUSION_HINT):
        text += "\n" + describe_groups(graph)
    if plan is not None:
        text += "\n" + plan.describe()
    return text


def run_pipeline(graph: Graph, backend: str = "cpu", dump_after: str | None = None,
                 dump: Callable[[str], object] | None = None, env: Mapping[str, int] | None = None,
                 render: Callable[[Graph], str] | None = None,
                 passes: Sequence[str] | None = None, rules: Sequence[Rule] | None = None) -> PipelineResult:
    """Run the backend's passes over graph (which is left untouched).

    passes: the pass names to run instead of PIPELINES[backend] (a Context passes
    context_passes(backends); `backend` then only labels dumps and errors).

    dump_after: a pass name of this pipeline; the graph after it goes to `dump` (default:
    stdout) as `render(graph)` (default: render_text, which also lists fusion groups and the
    buffer plan). env: the worst-case symbol values the buffer plan is sized for (default
    buffers.WORST_CASE). rules: the fusion rules of the "fusion" pass (Backend.fusion_rules,
    context_rules); required when the pipeline runs it."""
    names = tuple(passes) if passes is not None else pipeline_for(backend)
    if dump_after is not None and dump_after not in names:
        raise ValueError(f"--dump-after {dump_after!r}: backend {backend!r} runs the passes "
                         f"{', '.join(names)}")
    if BUFFERS in names[:-1]:
        raise PassError(f"pipeline {backend!r}: {BUFFERS} must be the last step")
    dump = dump or sys.stdout.write
    result = PipelineResult(graph)
    for name in names:
        before = len(graph.nodes)
        start = time.perf_counter()
        if name == BUFFERS:
            result.plan = plan_buffers(graph, WORST_CASE if env is None else env)
        else:
            graph = _run_pass(PASSES[name], graph, rules)
        seconds = time.perf_counter() - start
        result.steps.append(StepRecord(name, before, len(graph.nodes), seconds))
        log.debug("pass %s: %d -> %d nodes in %.1f ms", name, before, len(graph.nodes), seconds * 1e3)
        if name == dump_after:
            text = render(graph) if render is not None else render_text(graph, result.plan)
            dump(f"# after {name} ({backend} pipeline)\n{text}")
    result.graph = graph
    return result


def _run_pass(p: Pass, graph: Graph, rules: Sequence[Rule] | None) -> Graph:
    out = p.apply(graph, rules)
    check_graph(out)
    if len(out.outputs) != len(graph.outputs):
        raise PassError(f"pass {p.name} changed the number of outputs")
    return out
