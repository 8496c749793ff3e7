"""Time per node from a profiled run (Options.profile, GGMLPY_PROFILE=1: the CPU backend's entry function
reads the cycle counter around every kernel and around the barrier after it).

`profile_context` runs a Context whose CPU backends were created with profiling on: a
decode (`n_tokens` = 1: a short prompt, one warm-up step, then `steps` one-token steps) or
one prompt ubatch of `n_tokens`, and returns the cycles per node and thread as microseconds
per step. Nodes are recorded by position in the compiled graph (whose signature is kept), so
the times attach to a snapshot of the same graph. A fused kernel's time belongs to the
node it replaced (its group's output); splits on other backends (reference, CUDA) have no
per-node times.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

from ggmlpy.ir.graph import Graph
from llama.batch import Batch
from llama.graph_inputs import GraphParams


@dataclass
class NodeTime:
    kernel_us: list[float]    # per thread, per step
    barrier_us: list[float]   # per thread, per step: waiting for the others after the kernel

    @property
    def total_us(self) -> float:
        """The node's share of the step: kernel plus barrier time, averaged over the threads.
        Every thread leaves a barrier together, so each thread's kernel + barrier is the time
        from one release to the next, up to the skew of its start; the mean keeps one
        descheduled thread from counting twice (summed over nodes it is the threads' average
        time in native code, never more than the step's wall time)."""
        n = len(self.kernel_us)
        return sum(k + b for k, b in zip(self.kernel_us, self.barrier_us)) / n if n else 0.0


@dataclass
class Profile:
    mode: str                 # "decode" or "prompt"
    steps: int
    threads: int
    tsc_ghz: float
    step_us: float            # wall time of one step, Python included
    signature: str            # of the compiled graph the positions refer to
    times: dict[int, NodeTime] = field(default_factory=dict)   # position in graph.tensors -> time

    def native_us(self) -> float:
        return sum(t.total_us for t in self.times.values())


def tsc_ghz(seconds: float = 0.2) -> float:
    """The cycle counter's rate (the TSC: constant, not the core clock), measured against
    the wall clock with a two-instruction native function."""
    from ggmlpy.codegen_cpu.runtime import compile_module

    mod = compile_module("declare i64 @llvm.readcyclecounter()\n"
                         "define i64 @tsc() {\n  %c = call i64 @llvm.readcyclecounter()\n  ret i64 %c\n}\n")
    tsc = ctypes.CFUNCTYPE(ctypes.c_int64)(mod.address("tsc"))
    c0, t0 = tsc(), time.perf_counter()
    time.sleep(seconds)
    return (tsc() - c0) / (time.perf_counter() - t0) / 1e9


def prompt_tokens(n_vocab: int, n: int) -> list[int]:
    """A deterministic spread of token ids away from the special ones at both ends."""
    span = max(1, n_vocab - 200)
    return [100 + (i * 7919) % span for i in range(n)]


def profile_context(ctx, n_tokens: int, steps: int = 16) -> tuple[Graph, Profile]:
    """Run ctx (its CPU backends profiling) and time the graph of a ubatch of n_tokens.
    Returns that graph as built (for the snapshot) and the profile."""
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
