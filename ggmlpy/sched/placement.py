"""The model-independent side of placement: offload device names and their backends.

Which weights go where is the runtime's decision (llama/placement.py knows llama.cpp's
tensor names and n_gpu_layers); the scheduler only asks a `LeafPlacement`
(sched/scheduler.py) for the device of each leaf. What every placement shares is here:
devices are named explicitly ("cuda:0", or a second CPU "cpu:1" that stands in for a GPU on
machines without one), the host CPU ("cpu", HOST) is always there, and each offload device
gets a backend of its own from the device registry.
"""
from __future__ import annotations

from typing import Sequence

from ggmlpy.options import Options
from ggmlpy.sched.backend import HOST_MEMORY, Backend
from ggmlpy.sched.registry import PlacementError, create_device, normalize_device

HOST = HOST_MEMORY  # the device of everything not offloaded: host memory

__all__ = ["HOST", "PlacementError", "make_device_backend", "parse_devices"]


def parse_devices(devices: Sequence[str] | None) -> tuple[str, ...]:
    """Offload device names, validated against the device registry (sched/registry.py:
    "cuda:N", "cpu:N" with N >= 1, ...; short names such as "cuda" = "cuda:0")."""
    if devices is None:
        return ()
    if isinstance(devices, str):
        raise PlacementError(f"devices must be a list of names, got the string {devices!r}")
    out: list[str] = []
    for name in devices:
        name = normalize_device(str(name))
        if name in out:
            raise PlacementError(f"device {name!r} is named twice")
        out.append(name)
    return tuple(out)


def make_device_backend(device: str, options: Options | None = None) -> Backend:
    """A fresh backend for an offload device, computing in that device's memory (the device
    registry's factory: "cpu:N" a CpuBackend of its own named "cpu:N", "cuda:0" the CUDA
    backend), made with `options` (None: Options.from_env())."""
    return create_device(device, options)
