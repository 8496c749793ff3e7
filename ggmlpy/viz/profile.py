"""Time per node from a profiled run (Options.profile, GGMLPY_PROFILE=1: the CPU backend's entry function
reads the cycle counter around every kernel and around the barrier after it).

A `Profile` is what the run measured: the cycles per node and thread as microseconds per
step, for a decode or one prompt ubatch. Nodes are recorded by position in the compiled
graph (whose signature is kept), so the times attach to a snapshot of the same graph. A
fused kernel's time belongs to the node it replaced (its group's output); splits on other
backends (reference, CUDA) have no per-node times. The run itself is the command's
(ggmlpy/cli/viz_model.py `profile_context`): it needs the runtime, which this package does
not import.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field


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
