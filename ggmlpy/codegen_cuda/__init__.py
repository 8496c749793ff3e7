"""CUDA code generation (DESIGN.md decision 8): jinja2 templates rendered per kernel variant,
compiled by nvcc (cached on disk), launched through one small driver module.

Importing this package registers the "cuda" backend when a GPU and a CUDA binding are
present, and does nothing (without failing) otherwise; `cuda_available()` says why.
"""
from __future__ import annotations

from ggmlpy.codegen_cuda.driver import CudaUnavailable, cuda_available
from ggmlpy.options import Options

__all__ = ["CudaUnavailable", "cuda_available", "register", "CudaBackend"]

PRIORITY = 1  # after the host CPU backend (the primary one), ahead of the reference backend


def register(priority: int = PRIORITY) -> bool:
    """Register "cuda" with the backend registry if a device is usable; True if it was."""
    ok, reason = cuda_available()
    if not ok:
        return False
    from ggmlpy.sched.registry import available_backends, register_backend

    if "cuda" not in available_backends():
        register_backend("cuda", _factory, priority)
    return True


def _factory(options: Options) -> "CudaBackend":
    from ggmlpy.codegen_cuda.backend import CudaBackend

    return CudaBackend(options=options)


def __getattr__(name: str):
    if name == "CudaBackend":
        from ggmlpy.codegen_cuda.backend import CudaBackend

        return CudaBackend
    raise AttributeError(name)


register()
