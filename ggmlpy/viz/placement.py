"""Placement and backends for a schedule that is only looked at, never run.

A Context needs its devices (`Model.place` probes each one); a visualisation of a CUDA
placement should work on a machine without a GPU too. So a CUDA device without a GPU is
probed and scheduled through a CUDA backend on the dry-run driver (no memory, no launches,
nothing compiled): its ops and lowering are the real backend's, so the splits, copies and
CUDA C are what a GPU would get. With a GPU, or for `cpu:N` devices, the real backends are used.
"""
from __future__ import annotations

from ggmlpy.sched.backend import Backend
from ggmlpy.sched.placement import Placement, make_device_backend
from ggmlpy.sched.registry import host_backends, preview_device
from llama.model import Model


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
