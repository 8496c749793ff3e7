"""CUDA code generation (docs/architecture.md, decision 8): jinja2 templates rendered per kernel variant,
compiled by nvcc (cached on disk), launched through one small driver module.

Importing this package registers nothing: the registry finds the "cuda" backend and the
"cuda:0" device through `reg.py`, and lists it when a GPU and a CUDA binding are present;
`cuda_available()` says why not otherwise.
"""
from __future__ import annotations

from ggmlpy.codegen_cuda.driver import CudaUnavailable, cuda_available

__all__ = ["CudaUnavailable", "cuda_available", "CudaBackend"]


def __getattr__(name: str):
    if name == "CudaBackend":
        from ggmlpy.codegen_cuda.backend import CudaBackend

        return CudaBackend
    raise AttributeError(name)
