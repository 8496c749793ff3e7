"""The code each node runs: the LLVM IR of its CPU kernel, the CUDA C of its CUDA launch.

The code is generated as the backends generate it, from the same builders, without
compiling or loading anything:
  - CPU splits: `ProgramBuilder` (the backend's own lowering of a split: fused groups become
    one node, views vanish, identical nodes share one kernel by `kernel_key`); each distinct
    kernel is emitted into a module of its own, so the page shows one function at a time;
  - CUDA splits: `lower_split` (the CUDA backend's steps: one launch per step) and each
    step's `KernelSpec.source()`, the rendered template;
  - the reference backend generates no code (numpy).
A `launch` is one call in a split's run: every node that a fused kernel computes shares it,
which is how the page tells a group that really runs as one kernel from one that is marked
but runs node by node.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ggmlpy.ir.graph import Graph
from ggmlpy.passes.fusion import fusion_groups
from ggmlpy.sched.copies import Split


@dataclass
class Kernel:
    """One distinct kernel of one split, and its source."""

    index: int
    name: str
    backend: str
    language: str                 # "llvm" or "cuda"
    code: str
    nodes: list[int] = field(default_factory=list)   # ids of the tensors it computes (all launches)


@dataclass
class KernelMap:
    kernels: list[Kernel] = field(default_factory=list)
    kernel_of: dict[int, int] = field(default_factory=dict)           # tensor id -> kernel index
    launch_of: dict[int, tuple[int, int]] = field(default_factory=dict)  # tensor id -> (split, launch)


def generate_kernels(graph: Graph, splits: list[Split], worst_env: Mapping[str, int]) -> KernelMap:
    """Kernels of every split whose backend generates code (CPU: LLVM IR, CUDA: CUDA C)."""
    from ggmlpy.codegen_cpu.backend import CpuBackend
    from ggmlpy.codegen_cuda.backend import CudaBackend

    out = KernelMap()
    for split in splits:
        if isinstance(split.backend, CpuBackend):
            _cpu_split(graph, split, worst_env, out)
        elif isinstance(split.backend, CudaBackend):
            _cuda_split(graph, split, out)
    return out


def _add(out: KernelMap, by_key: dict, key: object, name: str, backend: str, language: str,
         make_code) -> Kernel:
    if key not in by_key:
        kernel = Kernel(len(out.kernels), name, backend, language, make_code())
        out.kernels.append(kernel)
        by_key[key] = kernel
    return by_key[key]


def _cpu_split(graph: Graph, split: Split, worst_env: Mapping[str, int], out: KernelMap) -> None:
    from ggmlpy.codegen_cpu.fusion import CpuFusion
    from ggmlpy.codegen_cpu.program import ProgramBuilder

    own = {n.id for n in split.nodes}
    elsewhere = {t.id for t in graph.tensors if not t.is_leaf and t.id not in own}
    qdot = split.backend.qdot  # the backend's dot flavour (its Options.cpu_qdot), as it builds
    builder = ProgramBuilder(graph, split.nodes, worst_env, elsewhere, qdot=qdot)
    builder.plan_key()  # fills kernel_names (one per launch) as the backend's compile does
    members: dict[int, list[int]] = {n.id: [n.id] for n in builder.nodes}
    fusion = CpuFusion(graph, split.nodes)
    for group in fusion_groups(graph):
        if fusion.runs_fused(group):
            head = next(t.id for t in group.nodes if t.id in members)
            members[head] = [t.id for t in group.nodes]
    by_key: dict[str, Kernel] = {}
    for i, (node, key, name) in enumerate(zip(builder.nodes, builder.kernel_keys, builder.kernel_names)):
        kernel = _add(out, by_key, key, f"{name} (split {split.index})", split.backend.name, "llvm",
                      lambda node=node, name=name: cpu_kernel_ir(node, name, qdot))
        for tid in members[node.id]:
            kernel.nodes.append(tid)
            out.kernel_of[tid] = kernel.index
            out.launch_of[tid] = (split.index, i)


def cpu_kernel_ir(node, name: str, qdot: str | None = None) -> str:
    """The LLVM module holding node's kernel alone, the compile unit the CPU backend builds
    (qdot: the dot flavour, as KernelBuilder takes it)."""
    from ggmlpy.codegen_cpu.lowering import kernel_signature
    from ggmlpy.codegen_cpu.program import kernel_module_ir

    return kernel_module_ir(node, name, qdot, kernel_signature(node)[1])


def _cuda_split(graph: Graph, split: Split, out: KernelMap) -> None:
    from ggmlpy.codegen_cuda.fusion import lower_split

    by_key: dict[tuple[str, ...], Kernel] = {}
    for i, step in enumerate(lower_split(graph, split.nodes, split.backend.options)):
        specs = step.specs()
        key = tuple(s.name for s in specs)
        kernel = _add(out, by_key, key, " + ".join(key), split.backend.name, "cuda",
                      lambda specs=specs: "\n".join(s.source() for s in specs))
        for t in step.nodes:
            kernel.nodes.append(t.id)
            out.kernel_of[t.id] = kernel.index
            out.launch_of[t.id] = (split.index, i)
