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
from ggmlpy.sched.registry import create_backend
from llama.model import Model


def device_backend(device: str) -> Backend:
    """The backend for one offload device; a dry-run CUDA backend where no GPU is usable."""
    if device.startswith("cuda"):
        from ggmlpy.codegen_cuda import cuda_available

        if not cuda_available()[0]:
            from ggmlpy.codegen_cuda.backend import CudaBackend
            from ggmlpy.codegen_cuda.driver import DryRunDriver

            be = CudaBackend(driver=DryRunDriver(compile=False))
            be.buffer_type = device  # type: ignore[attr-defined]  (as make_device_backend sets it)
            return be
    return make_device_backend(device)


def place(model: Model, devices: list[str] | None, n_gpu_layers: int = 0,
          tensor_split: list[float] | None = None) -> tuple[Placement, list[Backend]]:
    """Model.place's decisions (layers to devices, weights a device cannot run back to the
    CPU) and the backends in the scheduler's priority order: devices, host CPU, reference."""
    placement, probes = model.place_with_probes(devices, n_gpu_layers, tensor_split,
                                                make_backend=device_backend)
    return placement, list(probes.values()) + [create_backend("cpu"), create_backend("ref")]
