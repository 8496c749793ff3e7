"""Elementwise, norm and softmax kernels of the CPU backend: nanoseconds per element; prints JSON.

For each op and shape (ne0 x rows) the bench compiles two graphs with the CPU backend: one
node, and a chain of `n` such nodes (each consuming the previous result), and times both.
The per-node time is (t_n - t_one) / (n - 1), which removes Python's fixed cost of a run
(binding pointers, waking the threads) and leaves what a node costs inside a model graph:
its kernel and the barrier after it. Times are the best of --reps runs, since other
processes on the machine only ever slow a run down.

Ops, as a model graph uses them:
- swiglu, geglu: act(y) * g, g a second input of the same shape (all ones);
- add: y + r, same shapes (the residual add);
- mul: y * w, w one row broadcast over the rows (a norm weight);
- rms_norm: eps 1e-5;
- soft_max: soft_max_ext(y, mask, scale 0.125), an f32 causal-style mask (0 / -inf).

Run: python bench/bench_cpu_elementwise.py [--threads 1 2] [--reps 9] [--ops swiglu add]
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

OPS = ("swiglu", "geglu", "add", "mul", "rms_norm", "soft_max")
SHAPES = ((1536, 1), (1536, 512), (2048, 512), (576, 512))
TARGET_ELEMENTS = 8_000_000  # elements the n-node graph processes (decides n)


def _graph(op: str, ne0: int, rows: int, n_nodes: int):
    """A chain of n_nodes `op` nodes from an input y (ne0, rows), the last one the output.

    A chain rather than independent nodes: every graph output costs Python time per run,
    which is not the kernels' cost."""
    from ggmlpy.ir.builder import GraphBuilder
    from ggmlpy.ir.types import GGMLType

    f32 = GGMLType.F32
    b = GraphBuilder()
    y = b.input("y", f32, (ne0, rows, 1, 1))
    if op in ("swiglu", "geglu", "add"):
        other = b.input("other", f32, (ne0, rows, 1, 1))
    elif op == "mul":
        other = b.input("other", f32, (ne0, 1, 1, 1))
    elif op == "soft_max":
        other = b.input("other", f32, (ne0, rows, 1, 1))
    for _ in range(n_nodes):
        if op == "rms_norm":
            y = b.make("rms_norm", (y,), {"eps": 1e-5})
        elif op == "soft_max":
            y = b.make("soft_max", (y, other), {"scale": 0.125, "max_bias": 0.0})
        else:
            y = b.make(op, (y, other))
    return b.build([y])


def _inputs(op: str, ne0: int, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Input arrays in numpy order (ne reversed), chosen so a chain of 64 nodes stays finite
    and clear of subnormals (these would time something else): the GLUs' gate is 1, and
    near 0 silu(y) and gelu(y) are about y / 2, so 64 nodes shrink a value by about 2^-64."""
    out = {"y": rng.standard_normal((rows, ne0)).astype(np.float32)}
    if op in ("swiglu", "geglu"):
        out["other"] = np.ones((rows, ne0), dtype=np.float32)
    elif op == "add":
        out["other"] = (0.01 * rng.standard_normal((rows, ne0))).astype(np.float32)
    elif op == "mul":
        out["other"] = rng.uniform(0.9, 1.1, (1, ne0)).astype(np.float32)
    elif op == "soft_max":
        mask = np.where(rng.random((rows, ne0)) < 0.3, -np.inf, 0.0).astype(np.float32)
        mask[:, 0] = 0.0  # no row entirely masked
        out["other"] = mask
    return out


def _best_run_seconds(backend, graph, inputs: dict[str, np.ndarray], reps: int) -> float:
    from ggmlpy.sched.store import TensorStore

    split = backend.compile(graph, graph.nodes)
    store = TensorStore({k: v.copy() for k, v in inputs.items()})
    inner = 1 if graph.nodes[0].ne[1] > 1 else 20
    split.run(store, {})
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            split.run(store, {})
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def measure(op: str, ne0: int, rows: int, threads: int, reps: int) -> dict:
    """ns per element of one `op` node of shape (ne0, rows) with `threads` threads."""
    from ggmlpy.codegen_cpu.backend import CpuBackend

    n_elems = ne0 * rows
    n_nodes = int(min(64, max(4, TARGET_ELEMENTS // n_elems)))
    backend = CpuBackend(n_threads=threads, worst_env={"n_tokens": rows, "n_kv": 1, "n_outputs": rows})
    try:
        inputs = _inputs(op, ne0, rows, np.random.default_rng(0))
        t_one = _best_run_seconds(backend, _graph(op, ne0, rows, 1), inputs, reps)
        t_many = _best_run_seconds(backend, _graph(op, ne0, rows, n_nodes), inputs, reps)
    finally:
        backend.close()
    per_node = max(0.0, (t_many - t_one) / (n_nodes - 1))
    return {"op": op, "ne0": ne0, "rows": rows, "threads": threads, "n_nodes": n_nodes,
            "us_per_node": per_node * 1e6, "ns_per_element": per_node * 1e9 / n_elems}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    args = ap.parse_args()
    rows = [measure(op, ne0, nrows, threads, args.reps)
            for op in args.ops for ne0, nrows in SHAPES for threads in args.threads]
    print(json.dumps({"machine": platform.processor() or platform.machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
