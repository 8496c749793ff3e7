"""The CPU backend's declaration for the registry (sched/registry.py): "cpu", the default
backend, and the devices "cpu:N" (N >= 1: a second CPU standing in for a GPU)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlpy.options import Options
from ggmlpy.sched.backend_entry import BackendEntry, DeviceKind

if TYPE_CHECKING:
    from ggmlpy.codegen_cpu.backend import CpuBackend

HOST_CPU = "the host CPU (cpu, cpu:0) is always present; name a second CPU device as cpu:1"


def make_cpu(options: Options) -> CpuBackend:
    from ggmlpy.codegen_cpu.backend import CpuBackend

    return CpuBackend(options=options)


def make_cpu_device(name: str, options: Options) -> CpuBackend:
    """"cpu:N": a CpuBackend of its own (own thread pool), standing in for a GPU."""
    be = make_cpu(options)
    be.name = name
    be.is_host = False
    return be


BACKEND = BackendEntry(
    name="cpu", make=make_cpu, priority=0,
    devices=(DeviceKind.of(r"cpu:\d+", make_cpu_device, "cpu:N with N >= 1", aliases={"cpu": "cpu:0"},
                           reserved={"cpu:0": HOST_CPU}),))
