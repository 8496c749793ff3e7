"""The model side of `ggmlpy viz`: what ggmlpy.viz is handed, made from a llama Model.

ggmlpy.viz renders a graph, a schedule and a profile; it never sees the runtime. This
module builds them: the graph a Context builds for one ubatch (`build_graph`), the
placement and backends of a schedule that is only looked at (`place`), and the per-node
times of a profiled Context run (`profile_context`).

A Context needs its devices (`Model.place` probes each one); a visualisation of a CUDA
placement should work on a machine without a GPU too. So a CUDA device without a GPU is
probed and scheduled through a CUDA backend on the dry-run driver (no memory, no launches,
nothing compiled): its ops and lowering are the real backend's, so the splits, copies and
CUDA C are what a GPU would get. With a GPU, or for `cpu:N` devices, the real backends are used.
"""
from __future__ import annotations

import time

from ggmlpy.cli.graph_cmd import build_ubatch_graph
from ggmlpy.ir.graph import Graph
from ggmlpy.sched.backend import Backend
from ggmlpy.sched.placement import make_device_backend
from ggmlpy.sched.registry import host_backends, preview_device
from ggmlpy.viz.profile import NodeTime, Profile, tsc_ghz
from llama.batch import Batch
from llama.context import Context
from llama.graph_inputs import GraphParams
from llama.model import Model
from llama.placement import Placement


def build_graph(model: Model, n_tokens: int, n_ctx: int) -> tuple[Graph, int]:
    """The graph decode builds for a ubatch of n_tokens (as `ggmlpy graph`), and n_ctx as
    the Context rounds it."""
    return build_ubatch_graph(model, n_tokens, n_ctx)


def device_backend(device: str) -> Backend:
    """The backend for one offload device; its registered preview where the device is absent
    (CUDA without a GPU: the dry-run driver), else the real one."""
    be = preview_device(device)
    return be if be is not None else make_device_backend(device)


def place(model: Model, devices: list[str] | None, n_gpu_layers: int = 0,
          tensor_split: list[float] | None = None,
          override_tensor: list[str] | None = None) -> tuple[Placement, list[Backend]]:
    """Model.place's decisions (layers to devices, weights a device cannot run back to the
    CPU) and the backends in the scheduler's priority order: devices, host CPU, reference."""
    placement, probes = model.place_with_probes(devices, n_gpu_layers, tensor_split,
                                                make_backend=device_backend,
                                                override_tensor=override_tensor)
    return placement, list(probes.values()) + host_backends("cpu")


def prompt_tokens(n_vocab: int, n: int) -> list[int]:
    """A deterministic spread of token ids away from the special ones at both ends."""
    span = max(1, n_vocab - 200)
    return [100 + (i * 7919) % span for i in range(n)]


def profile_context(ctx: Context, n_tokens: int, steps: int = 16) -> tuple[Graph, Profile]:
    """Run ctx (its CPU backends profiling, Options.profile) and time the graph of a ubatch
    of n_tokens: a decode (`n_tokens` = 1: a short prompt, one warm-up step, then `steps`
    one-token steps) or one prompt ubatch. Returns that graph as built (for the snapshot)
    and the profile, whose times are by position in the compiled graph."""
    from ggmlpy.codegen_cpu.backend import CpuSplit

    params = GraphParams("single" if n_tokens == 1 else "multi", False, ctx.n_ctx)
    built = ctx.build_graph(params).graph
    compiled = ctx.graph_cache.entries.get(built.signature())
    if compiled is None:
        raise ValueError(f"the context compiled no graph for a ubatch of {n_tokens} tokens "
                         f"(n_ubatch is {ctx.n_ubatch})")
    cpu = [c for c in compiled.compiled if isinstance(c, CpuSplit)]
    if not any(c.backend.profile for c in cpu):
        raise ValueError("the context's CPU backends do not profile: create it with "
                         "backend_options=Options(profile=True) (or GGMLPY_PROFILE=1)")
    toks = prompt_tokens(ctx.n_vocab, max(n_tokens, 9))
    if n_tokens == 1:
        ctx.decode(Batch.from_tokens(toks[:8]))
        ctx.decode(Batch.from_tokens(toks[8:9]))   # warm-up: weights repacked, pages touched
        run = [Batch.from_tokens([toks[(9 + i) % len(toks)]]) for i in range(steps)]
        mode = "decode"
    else:
        ctx.decode(Batch.from_tokens(toks[:n_tokens]))
        ctx.memory.clear()
        steps, run, mode = 1, [Batch.from_tokens(toks[:n_tokens])], "prompt"
    for c in cpu:
        c.reset_profile()
    t0 = time.perf_counter()
    for batch in run:
        rc = ctx.decode(batch)
        if rc != 0:
            raise RuntimeError(f"decode returned {rc} while profiling")
    step_us = (time.perf_counter() - t0) / steps * 1e6
    ghz = tsc_ghz()
    position = {t.id: i for i, t in enumerate(compiled.graph.tensors)}
    prof = Profile(mode, steps, max(c.backend.n_threads for c in cpu), ghz, step_us, compiled.signature)
    for c in cpu:
        for node, cycles in c.profile():
            us = (cycles / ghz / 1e3 / steps).tolist()   # [thread][kernel, barrier]
            prof.times[position[node.id]] = NodeTime([k for k, _ in us], [b for _, b in us])
    return built, prof
