"""A Snapshot: everything the compiler decides for one ubatch, gathered for the exporters.

The steps are a Context's (llama/context.py `_compile`): the graph as the model file builds
it, the primary backend's pass pipeline (replayed pass by pass, stages.py), the scheduler over
the optimised graph (assignment with causes, splits, copies), the buffer plan, and each
split's generated code (kernels.py). Nothing is compiled or run. The graph, the backends and
the placement are handed in (ggmlpy/cli/viz_model.py builds them from a model).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ggmlpy.ir.graph import Graph
from ggmlpy.passes.buffers import BufferPlan, plan_buffers
from ggmlpy.passes.pipeline import context_passes, context_rules, pipeline_name
from ggmlpy.sched.backend import Backend
from ggmlpy.sched.scheduler import LeafPlacement, Schedule, schedule
from ggmlpy.viz.kernels import KernelMap, generate_kernels
from ggmlpy.viz.layers import tensor_layers
from ggmlpy.viz.lifetimes import Lifetimes, lifetimes
from ggmlpy.viz.stages import Stage, replay_pipeline

if TYPE_CHECKING:
    from ggmlpy.viz.profile import Profile


@dataclass
class Snapshot:
    title: str
    model: str
    n_tokens: int                 # tokens in the ubatch (1: the one-token decode graph)
    n_ctx: int
    env: dict[str, int]           # the worst case the buffers are planned for
    pipeline: str                 # whose pass pipeline ran ("cpu", "ref")
    stages: list[Stage]
    schedule: Schedule
    plan: BufferPlan
    lifetimes: Lifetimes
    kernels: KernelMap
    layers: dict[int, int | None]  # tensor id -> layer, for the tensors of every stage
    profile: "Profile | None" = None
    notes: list[str] = field(default_factory=list)

    @property
    def graph(self) -> Graph:
        """The optimised graph: what the scheduler split and the backends compile."""
        return self.stages[-1].graph


def pipeline_of(backends: list[Backend]) -> str:
    """The passes a Context with these backends runs (every backend's), by name ("cpu")."""
    return pipeline_name(context_passes(backends))


def worst_env(n_tokens: int, n_ctx: int) -> dict[str, int]:
    """The symbol values the buffers are sized for, as a Context with n_ubatch = n_tokens."""
    return {"n_tokens": n_tokens, "n_kv": n_ctx, "n_outputs": n_tokens, "n_kv_swa": n_ctx}


def take_snapshot(model_name: str, graph: Graph, n_tokens: int, n_ctx: int, backends: list[Backend],
                  placement: LeafPlacement | None, code: bool = True, title: str = "") -> Snapshot:
    """The snapshot of `graph` (one ubatch of n_tokens of the model file `model_name`)
    scheduled over `backends` (priority order) with `placement` (where weights and KV cache
    layers live). `code=False` skips the generated code (it is most of the time and size for
    a large model)."""
    env = worst_env(n_tokens, n_ctx)
    pipeline = pipeline_of(backends)
    stages = replay_pipeline(graph, context_passes(backends), env, context_rules(backends))
    final = stages[-1].graph
    notes = []
    plan = stages[-1].plan
    if plan is None:
        plan = plan_buffers(final, env)
        notes.append(f"the {pipeline} pipeline plans no buffers; the plan shown is ggml-alloc's "
                     "over its graph")
    sched = schedule(final, backends, placement)
    kernels = generate_kernels(final, sched.splits, env) if code else KernelMap()
    layers: dict[int, int | None] = {}
    for st in stages:
        for tid, layer in tensor_layers(st.graph).items():
            layers.setdefault(tid, layer)
    return Snapshot(title or model_name, model_name, n_tokens, n_ctx, env, pipeline, stages,
                    sched, plan, lifetimes(final, plan), kernels, layers, notes=notes)

