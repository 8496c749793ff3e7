"""A host "device" that runs the CUDA kernels on the CPU, for tests without a GPU.

The module source is the same CUDA C the GPU gets, compiled as C++ by g++ after
`emu_runtime.cu.j2`, which provides threadIdx/blockIdx, __syncthreads (the threads of a
block are fibers on one OS thread, switched at each barrier), warp shuffles, half precision
and WMMA. Device
memory is host memory; CUDA graphs are recorded launch lists. Slow, exact about indexing, so small graphs check kernels before a GPU is
at hand. Same interface as the drivers in driver.py.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ggmlpy.codegen_cuda.driver import Module, PreparedLaunch
from ggmlpy.codegen_cuda.kernels import KernelSpec, module_source
from ggmlpy.codegen_cuda.nvcc import CompileError, numbered_errors
from ggmlpy.codegen_cuda.render import render
from ggmlpy.disk_cache import DiskCache, cache_key

log = logging.getLogger("ggmlpy.codegen_cuda.emulator")

CXX_FLAGS = ("-O1", "-std=c++17", "-shared", "-fPIC", "-w", "-x", "c++")
ALIGN = 256


def find_cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")


@functools.lru_cache(maxsize=None)
def _cxx_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]


def emulator_source(specs: Sequence[KernelSpec]) -> str:
    entries = [f"EMU_KERNEL_ENTRY({s.name}, {'true' if s.cooperative else 'false'})"
               for s in {s.name: s for s in specs}.values()]
    return "\n".join([render("emu_runtime.cu.j2"), module_source(specs), *entries, ""])


class EmuDriver:
    name = "emulator"
    binary = "so"
    device_name = "host emulator"
    arch = "emu"
    max_shared = 227 * 1024

    def __init__(self, cxx: str | None = None):
        self.cxx = cxx or find_cxx()
        if self.cxx is None:
            raise CompileError("the emulator needs a C++ compiler (g++)")
        self._mem: dict[int, np.ndarray] = {}
        self._libs: list[Any] = []
        self._capture: list[PreparedLaunch] | None = None
        self.stream = "stream0"
        self.launch_count = 0

    # memory
    def alloc(self, nbytes: int) -> int:
        raw = np.zeros(max(int(nbytes), 1) + ALIGN, dtype=np.uint8)
        off = (-raw.ctypes.data) % ALIGN
        ptr = raw.ctypes.data + off
        self._mem[ptr] = raw
        return ptr

    def free(self, ptr: int) -> None:
        del self._mem[ptr]

    def host_alloc(self, nbytes: int) -> np.ndarray:
        return np.zeros(int(nbytes), dtype=np.uint8)

    def host_free(self, arr: np.ndarray) -> None:
        pass

    def htod(self, dst: int, src: np.ndarray, nbytes: int, stream: Any = None) -> None:
        ctypes.memmove(dst, src.ctypes.data, nbytes)

    def dtoh(self, dst: np.ndarray, src: int, nbytes: int, stream: Any = None) -> None:
        ctypes.memmove(dst.ctypes.data, src, nbytes)

    def memset(self, ptr: int, value: int, nbytes: int, stream: Any = None) -> None:
        ctypes.memset(ptr, value, nbytes)

    # modules and launches
    def load_module(self, specs: Sequence[KernelSpec], cache: DiskCache | None) -> Module:
        source = emulator_source(specs)
        parts = {"source": hashlib.sha256(source.encode()).hexdigest(), "target": "host-emulator",
                 "cxx": _cxx_version(self.cxx), "flags": " ".join(CXX_FLAGS)}
        key = cache_key(parts)
        image = cache.get(parts, ".so") if cache is not None else None
        if image is None:
            image = self._compile(source)
            if cache is not None:
                cache.put(parts, image, ".so")
        # The library stays mapped after its file is removed, so nothing is left in /tmp.
        with tempfile.TemporaryDirectory(prefix="ggmlpy-emu-") as tmp:
            path = Path(tmp) / f"{key[:16]}.so"
            path.write_bytes(image)
            lib = ctypes.CDLL(str(path))
        self._libs.append(lib)
        fns = {}
        for s in specs:
            fn = getattr(lib, f"emu_launch_{s.name}")
            fn.argtypes = [ctypes.c_int] * 7 + [ctypes.c_void_p]
            fn.restype = None
            fns[s.name] = fn
        return Module(lib, fns)

    def _compile(self, source: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="ggmlpy-emu-build-") as tmp:
            src, out = Path(tmp) / "module.cu", Path(tmp) / "module.so"
            src.write_text(source)
            cmd = [self.cxx, *CXX_FLAGS, str(src), "-o", str(out)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise CompileError(f"emulator build failed:\n{numbered_errors(proc.stderr, source)}")
            return out.read_bytes()

    def set_max_shared(self, fn: Any, nbytes: int) -> None:
        pass

    def launch(self, pl: PreparedLaunch, stream: Any = None) -> None:
        if self._capture is not None:
            self._capture.append(pl)
            return
        self.launch_count += 1
        pl.fn(*pl.grid, *pl.block, pl.shmem, ctypes.addressof(pl.params))

    # streams, graphs, events
    def create_stream(self) -> Any:
        return object()

    def synchronize(self, stream: Any = None) -> None:
        pass

    def begin_capture(self, stream: Any = None, pdl: bool = True) -> None:
        self._capture = []

    def end_capture(self, stream: Any = None) -> Any:
        graph, self._capture = self._capture, None
        return graph

    def graph_launch(self, graph: Any, stream: Any = None) -> None:
        for pl in graph:
            self.launch(pl)

    def graph_destroy(self, graph: Any) -> None:
        pass

    def event(self) -> Any:
        return [0.0]

    def record(self, ev: Any, stream: Any = None) -> None:
        ev[0] = time.perf_counter()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return (end[0] - start[0]) * 1e3
