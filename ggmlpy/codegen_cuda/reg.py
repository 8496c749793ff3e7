"""The CUDA backend's declaration for the registry (sched/registry.py): "cuda", listed only
when a GPU and a CUDA binding are present (`cuda_available()` says why not), and the device
"cuda:0" (the one GPU the backend drives)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlpy.codegen_cuda.driver import cuda_available
from ggmlpy.options import Options
from ggmlpy.sched.backend_entry import BackendEntry, DeviceKind, PlacementError

if TYPE_CHECKING:
    from ggmlpy.codegen_cuda.backend import CudaBackend

PRIORITY = 1  # after the host CPU backend (the primary one), ahead of the reference backend


def make_cuda(options: Options) -> CudaBackend:
    from ggmlpy.codegen_cuda.backend import CudaBackend

    return CudaBackend(options=options)


def make_cuda_device(name: str, options: Options) -> CudaBackend:
    """"cuda:0": the CUDA backend; it keeps its name "cuda" (reports know it by that name)."""
    if name != "cuda:0":
        raise PlacementError(f"device {name}: only cuda:0 is supported")
    ok, reason = cuda_available()
    if not ok:
        raise PlacementError(f"device {name} is not available: {reason}")
    return make_cuda(options)


def cuda_devices() -> list[str]:
    """The CUDA devices this process can use (the backend drives one: cuda:0)."""
    return ["cuda:0"] if cuda_available()[0] else []


def preview_cuda(name: str) -> CudaBackend | None:
    """Without a usable GPU, the CUDA backend on the dry-run driver (no memory, no launches)."""
    if cuda_available()[0]:
        return None
    from ggmlpy.codegen_cuda.backend import CudaBackend
    from ggmlpy.codegen_cuda.driver import DryRunDriver

    return CudaBackend(driver=DryRunDriver(compile=False))


BACKEND = BackendEntry(
    name="cuda", make=make_cuda, priority=PRIORITY, available=cuda_available,
    devices=(DeviceKind.of(r"cuda:\d+", make_cuda_device, "cuda:N", aliases={"cuda": "cuda:0"},
                           preview=preview_cuda, discover=cuda_devices),))
