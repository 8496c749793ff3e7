"""The only module that imports a CUDA binding (docs/architecture.md, decision 8).

`get_driver()` returns a process-wide driver over the first GPU: pycuda when installed,
else NVIDIA's cuda-python (`cuda.bindings.driver`). Both expose the same small surface the
backend needs: device name and arch, alloc/free, async copies, module loading, launches,
streams, and CUDA graph capture/replay. `CompileOnlyDriver` compiles for a named arch
without a GPU (to fill the kernel cache ahead of time); the host emulator lives in
emulator.py.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import struct
from typing import Any, Sequence

import numpy as np

from ggmlpy.disk_cache import DiskCache
from ggmlpy.codegen_cuda.kernels import KernelSpec, module_source
from ggmlpy.codegen_cuda.nvcc import compile_cuda

log = logging.getLogger("ggmlpy.codegen_cuda.driver")

DEFAULT_MAX_SHARED = 48 * 1024


class CudaUnavailable(RuntimeError):
    """No usable CUDA binding or device."""


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


class PreparedLaunch:
    """A launch with its parameter buffer, ready to issue (again and again)."""

    __slots__ = ("fn", "grid", "block", "shmem", "params", "kernel_params", "name", "config")

    def __init__(self, fn: Any, grid: Sequence[int], block: Sequence[int], shmem: int, params: bytes, name: str):
        self.fn, self.grid, self.block, self.shmem, self.name = fn, tuple(grid), tuple(block), int(shmem), name
        self.params = ctypes.create_string_buffer(params, len(params))
        self.kernel_params = (ctypes.c_void_p * 1)(ctypes.addressof(self.params))
        self.config: Any = None  # the driver's launch configuration, built on first use


# a kernel that waits on its predecessor and counts its runs: the PDL probe
PDL_PROBE_SOURCE = r"""
extern "C" __global__ void gg_pdl_probe(int* counter) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
    if (threadIdx.x == 0) counter[0] += 1;
}
"""


class Module:
    def __init__(self, handle: Any, functions: dict[str, Any]):
        self.handle = handle
        self.functions = functions


# cuda-python ------------------------------------------------------------------------------------
class CudaPythonDriver:
    name = "cuda-python"
    binary = "cubin"

    def __init__(self, ordinal: int = 0):
        from cuda.bindings import driver as cu  # noqa: the one import of the binding

        self.cu = cu
        self._call(cu.cuInit, 0)
        (count,) = self._call(cu.cuDeviceGetCount)
        if count < 1:
            raise CudaUnavailable("the CUDA driver reports no device")
        (self.device,) = self._call(cu.cuDeviceGet, ordinal)
        (self.ctx,) = self._call(cu.cuDevicePrimaryCtxRetain, self.device)
        self._call(cu.cuCtxSetCurrent, self.ctx)
        (raw,) = self._call(cu.cuDeviceGetName, 256, self.device)
        self.device_name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
        attr = cu.CUdevice_attribute
        (major,) = self._call(cu.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device)
        (minor,) = self._call(cu.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device)
        self.arch = f"sm_{major}{minor}"
        (self.max_shared,) = self._call(cu.cuDeviceGetAttribute,
                                        attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self.device)
        self.stream = self.create_stream()
        self._images: list[np.ndarray] = []
        # programmatic dependent launch (sm_90+) in captured graphs: decided by a probe before
        # the first capture
        self.pdl: bool | None = None if major >= 9 else False
        self._capturing = False
        self._capture_pdl = False  # this capture's launches use PDL (begin_capture's pdl, if it works)

    def _call(self, fn, *args) -> tuple:
        out = fn(*args)
        err = out[0]
        if err != self.cu.CUresult.CUDA_SUCCESS:
            name = self.cu.cuGetErrorName(err)[1]
            raise CudaError(f"{fn.__name__} failed: {name.decode() if isinstance(name, bytes) else name}")
        return tuple(out[1:])

    # memory
    def alloc(self, nbytes: int) -> int:
        (ptr,) = self._call(self.cu.cuMemAlloc, max(int(nbytes), 1))
        return int(ptr)

    def free(self, ptr: int) -> None:
        self._call(self.cu.cuMemFree, ptr)

    def host_alloc(self, nbytes: int) -> np.ndarray:
        """Page-locked host memory (a uint8 array): copies to and from it are plain DMA,
        without the driver's staging through its own pinned buffer."""
        (ptr,) = self._call(self.cu.cuMemHostAlloc, max(int(nbytes), 1), 0)
        return np.ctypeslib.as_array((ctypes.c_uint8 * max(int(nbytes), 1)).from_address(int(ptr)))[:nbytes]

    def host_free(self, arr: np.ndarray) -> None:
        self._call(self.cu.cuMemFreeHost, arr.ctypes.data)

    def htod(self, dst: int, src: np.ndarray, nbytes: int, stream: Any = None) -> None:
        self._call(self.cu.cuMemcpyHtoDAsync, dst, src.ctypes.data, nbytes, stream or self.stream)

    def dtoh(self, dst: np.ndarray, src: int, nbytes: int, stream: Any = None) -> None:
        self._call(self.cu.cuMemcpyDtoHAsync, dst.ctypes.data, src, nbytes, stream or self.stream)

    def memset(self, ptr: int, value: int, nbytes: int, stream: Any = None) -> None:
        self._call(self.cu.cuMemsetD8Async, ptr, value, nbytes, stream or self.stream)

    # modules and launches
    def load_module(self, specs: Sequence[KernelSpec], cache: DiskCache | None) -> Module:
        image = compile_cuda(module_source(specs), self.arch, "cubin", cache)
        buf = np.frombuffer(image + b"\0", dtype=np.uint8)
        self._images.append(buf)
        (handle,) = self._call(self.cu.cuModuleLoadData, buf.ctypes.data)
        fns = {s.name: self._call(self.cu.cuModuleGetFunction, handle, s.name.encode())[0] for s in specs}
        return Module(handle, fns)

    def set_max_shared(self, fn: Any, nbytes: int) -> None:
        attr = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._call(self.cu.cuFuncSetAttribute, fn, attr, int(nbytes))

    def launch(self, pl: PreparedLaunch, stream: Any = None) -> None:
        # PDL only into captured graphs (decode): launched one by one from Python, as prompts
        # are, cuLaunchKernelEx costs the host more than the overlap saves (measured on an
        # H200: pp512's 395 launches took 17.7 ms of GPU time with it, 13.7 ms without)
        if self._capturing and self._capture_pdl:
            cfg = pl.config
            if cfg is None:
                cfg = pl.config = self._pdl_config(pl)
            cfg.hStream = stream or self.stream
            self._call(self.cu.cuLaunchKernelEx, cfg, pl.fn, ctypes.addressof(pl.kernel_params), 0)
            return
        gx, gy, gz = pl.grid
        bx, by, bz = pl.block
        self._call(self.cu.cuLaunchKernel, pl.fn, gx, gy, gz, bx, by, bz, pl.shmem, stream or self.stream,
                   ctypes.addressof(pl.kernel_params), 0)

    def _pdl_config(self, pl: PreparedLaunch) -> Any:
        """A launch configuration with programmatic stream serialisation: the kernel may start
        before the previous one ends, and waits for it at gg_pdl_wait (common.cu.j2)."""
        cu = self.cu
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = pl.grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = pl.block
        cfg.sharedMemBytes = pl.shmem
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        return cfg

    def _probe_pdl(self) -> bool:
        """Whether PDL launches work here, on a stream and captured in a graph: four runs of
        a counting kernel must count 4. Any failure turns PDL off (with a log line)."""
        if self._capturing:
            return False  # a probe cannot run inside someone's capture; plain launches then
        ptr = 0
        try:
            image = compile_cuda(PDL_PROBE_SOURCE, self.arch, "cubin", DiskCache("cuda"))
            buf = np.frombuffer(image + b"\0", dtype=np.uint8)
            self._images.append(buf)
            (handle,) = self._call(self.cu.cuModuleLoadData, buf.ctypes.data)
            (fn,) = self._call(self.cu.cuModuleGetFunction, handle, b"gg_pdl_probe")
            ptr = self.alloc(4)
            self.memset(ptr, 0, 4)
            pl = PreparedLaunch(fn, (1, 1, 1), (32, 1, 1), 0, struct.pack("<Q", ptr), "gg_pdl_probe")
            cfg = self._pdl_config(pl)
            cfg.hStream = self.stream
            args = ctypes.addressof(pl.kernel_params)
            for _ in range(2):
                self._call(self.cu.cuLaunchKernelEx, cfg, fn, args, 0)
            self._call(self.cu.cuStreamBeginCapture, self.stream,
                       self.cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
            try:
                for _ in range(2):
                    self._call(self.cu.cuLaunchKernelEx, cfg, fn, args, 0)
            finally:
                (graph,) = self._call(self.cu.cuStreamEndCapture, self.stream)
            (exe,) = self._call(self.cu.cuGraphInstantiate, graph, 0)
            self._call(self.cu.cuGraphDestroy, graph)
            self._call(self.cu.cuGraphLaunch, exe, self.stream)
            out = np.zeros(1, dtype=np.int32)
            self.dtoh(out, ptr, 4)
            self.synchronize()
            self._call(self.cu.cuGraphExecDestroy, exe)
            ok = int(out[0]) == 4
            if not ok:
                log.warning("PDL probe counted %d of 4 runs: programmatic launches off", int(out[0]))
            return ok
        except Exception as e:  # an old driver or binding, no such attribute ...
            log.warning("programmatic dependent launch unavailable (%s): plain launches", e)
            return False
        finally:
            if ptr:
                self.free(ptr)

    # streams, graphs, events
    def create_stream(self) -> Any:
        (s,) = self._call(self.cu.cuStreamCreate, 1)  # CU_STREAM_NON_BLOCKING
        return s

    def synchronize(self, stream: Any = None) -> None:
        self._call(self.cu.cuStreamSynchronize, stream or self.stream)

    def begin_capture(self, stream: Any = None, pdl: bool = True) -> None:
        """pdl: the backend wants programmatic dependent launch in this graph
        (Options.cuda_pdl); used only where the probe says it works. The driver is shared
        by every backend of the process, so the choice is per capture, not the driver's."""
        if pdl and self.pdl is None:
            self.pdl = self._probe_pdl()
        self._capture_pdl = pdl and bool(self.pdl)
        mode = self.cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        self._call(self.cu.cuStreamBeginCapture, stream or self.stream, mode)
        self._capturing = True

    def end_capture(self, stream: Any = None) -> Any:
        self._capturing = False
        (graph,) = self._call(self.cu.cuStreamEndCapture, stream or self.stream)
        try:
            (exe,) = self._call(self.cu.cuGraphInstantiate, graph, 0)
        finally:
            self._call(self.cu.cuGraphDestroy, graph)
        return exe

    def graph_launch(self, exe: Any, stream: Any = None) -> None:
        self._call(self.cu.cuGraphLaunch, exe, stream or self.stream)

    def graph_destroy(self, exe: Any) -> None:
        self._call(self.cu.cuGraphExecDestroy, exe)

    def event(self) -> Any:
        (ev,) = self._call(self.cu.cuEventCreate, 0)
        return ev

    def record(self, ev: Any, stream: Any = None) -> None:
        self._call(self.cu.cuEventRecord, ev, stream or self.stream)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        self._call(self.cu.cuEventSynchronize, end)
        (ms,) = self._call(self.cu.cuEventElapsedTime, start, end)
        return float(ms)


# pycuda (preferred when installed; not available on the machines this was written on) ----------
class PyCudaDriver:
    name = "pycuda"
    binary = "cubin"

    def __init__(self, ordinal: int = 0):
        import pycuda.driver as drv  # noqa: the one import of the binding

        self.drv = drv
        drv.init()
        self.dev = drv.Device(ordinal)
        self.ctx = self.dev.retain_primary_context()
        self.ctx.push()
        self.device_name = self.dev.name()
        major, minor = self.dev.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.max_shared = self.dev.get_attribute(drv.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.stream = drv.Stream()
        self._allocs: dict[int, Any] = {}

    def alloc(self, nbytes: int) -> int:
        a = self.drv.mem_alloc(max(int(nbytes), 1))
        self._allocs[int(a)] = a
        return int(a)

    def free(self, ptr: int) -> None:
        self._allocs.pop(ptr).free()

    def host_alloc(self, nbytes: int) -> np.ndarray:
        return self.drv.pagelocked_empty(int(nbytes), np.uint8)

    def host_free(self, arr: np.ndarray) -> None:
        pass  # pycuda frees page-locked arrays with them

    def htod(self, dst: int, src: np.ndarray, nbytes: int, stream: Any = None) -> None:
        self.drv.memcpy_htod_async(dst, src.reshape(-1).view(np.uint8)[:nbytes], stream or self.stream)

    def dtoh(self, dst: np.ndarray, src: int, nbytes: int, stream: Any = None) -> None:
        self.drv.memcpy_dtoh_async(dst.reshape(-1).view(np.uint8)[:nbytes], src, stream or self.stream)

    def memset(self, ptr: int, value: int, nbytes: int, stream: Any = None) -> None:
        self.drv.memset_d8_async(ptr, value, nbytes, stream or self.stream)

    def load_module(self, specs: Sequence[KernelSpec], cache: DiskCache | None) -> Module:
        image = compile_cuda(module_source(specs), self.arch, "cubin", cache)
        mod = self.drv.module_from_buffer(image)
        return Module(mod, {s.name: mod.get_function(s.name) for s in specs})

    def set_max_shared(self, fn: Any, nbytes: int) -> None:
        fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(nbytes))

    def launch(self, pl: PreparedLaunch, stream: Any = None) -> None:
        pl.fn._launch_kernel(pl.grid, pl.block, bytes(pl.params.raw), pl.shmem, stream or self.stream)

    def create_stream(self) -> Any:
        return self.drv.Stream()

    def synchronize(self, stream: Any = None) -> None:
        (stream or self.stream).synchronize()

    def begin_capture(self, stream: Any = None, pdl: bool = True) -> None:
        raise CudaError("CUDA graphs are not wired up for pycuda here")

    def event(self) -> Any:
        return self.drv.Event()

    def record(self, ev: Any, stream: Any = None) -> None:
        ev.record(stream or self.stream)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        end.synchronize()
        return float(start.time_till(end))


class CompileOnlyDriver:
    """Compiles modules for `arch` (filling the kernel cache) without a GPU; no memory."""

    name = "compile-only"
    binary = "cubin"
    device_name = "none (compile only)"
    max_shared = 227 * 1024

    def __init__(self, arch: str = "sm_90"):
        self.arch = arch
        self.stream = None

    def load_module(self, specs: Sequence[KernelSpec], cache: DiskCache | None) -> Module:
        compile_cuda(module_source(specs), self.arch, "cubin", cache)
        return Module(None, {s.name: s.name for s in specs})

    def host_alloc(self, nbytes: int) -> np.ndarray:
        return np.zeros(int(nbytes), dtype=np.uint8)

    def host_free(self, arr: np.ndarray) -> None:
        pass

    def __getattr__(self, name: str):
        raise CudaUnavailable(f"the compile-only driver cannot {name}: there is no GPU")


class DryRunDriver(CompileOnlyDriver):
    """Compiles like CompileOnlyDriver and accepts every other call without doing anything:
    memory is made-up addresses, launches and copies are no-ops. Whole models then lower,
    plan and "run" on a machine without a GPU, which fills the kernel cache for a GPU
    session (bench_cuda.py --prebuild) and measures the host's own cost per token."""

    name = "dry-run"

    def __init__(self, arch: str = "sm_90", compile: bool = True):
        super().__init__(arch)
        self.compile = compile
        self._next = 1 << 32

    def load_module(self, specs: Sequence[KernelSpec], cache: DiskCache | None) -> Module:
        if self.compile:
            return super().load_module(specs, cache)
        return Module(None, {s.name: s.name for s in specs})

    def alloc(self, nbytes: int) -> int:
        ptr = self._next
        self._next += -(-max(int(nbytes), 1) // 4096) * 4096
        return ptr

    def end_capture(self, stream: Any = None) -> Any:
        return object()

    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        return None

    free = htod = dtoh = memset = set_max_shared = launch = synchronize = _nothing
    begin_capture = graph_launch = graph_destroy = _nothing


# selection ----------------------------------------------------------------------------------------
def _candidates():
    try:
        import pycuda.driver  # noqa: F401
        yield PyCudaDriver
    except Exception:
        pass
    try:
        from cuda.bindings import driver  # noqa: F401
        yield CudaPythonDriver
    except Exception:
        pass


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[Any, str]:
    reasons = []
    for cls in _candidates():
        try:
            return cls(), ""
        except Exception as e:  # no libcuda, no device, driver too old ...
            reasons.append(f"{cls.name}: {type(e).__name__}: {e}")
    if not reasons:
        reasons.append("neither pycuda nor cuda-python (cuda.bindings) is installed")
    return None, "; ".join(reasons)


def get_driver():
    """The process-wide driver for GPU 0; CudaUnavailable (with the reasons) if there is none."""
    drv, reason = _probe()
    if drv is None:
        raise CudaUnavailable(f"no CUDA device: {reason}")
    return drv


def cuda_available() -> tuple[bool, str]:
    """(True, device name) or (False, why not). Cheap after the first call."""
    drv, reason = _probe()
    return (True, f"{drv.device_name} ({drv.arch}, {drv.name})") if drv is not None else (False, reason)
