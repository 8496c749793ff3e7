"""One graph through each backend's passes and compiled code: the CPU backend's against the
reference backend's, as the fusion tests compare them."""
from __future__ import annotations

import numpy as np

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.passes.pipeline import run_pipeline
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.sched.store import TensorStore

PLAN_ENV = {"n_tokens": 512, "n_kv": 512, "n_outputs": 512}   # the sizes the passes plan for


def run_cpu_and_ref(graph, inputs: dict[str, np.ndarray], env: dict[str, int] | None = None) -> list:
    """[(outputs, compiled)] for the CPU backend, then the reference backend: every output
    of the graph after that backend's passes, computed with the symbol values `env`."""
    env = env or {}
    results = []
    for backend in (CpuBackend(n_threads=2), RefBackend()):
        g = run_pipeline(graph, backend.name, env=PLAN_ENV, rules=backend.fusion_rules()).graph
        store = TensorStore({k: np.array(v, copy=True) for k, v in inputs.items()})
        compiled = backend.compile(g, g.nodes)
        compiled.run(store, env)
        results.append(([np.array(store.array(o, env), copy=True) for o in g.outputs], compiled))
    return results
