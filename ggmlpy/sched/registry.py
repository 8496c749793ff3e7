"""Backends by name, and offload devices by name pattern.

Two tables, both filled by the backends' registration (the built-in ones at the bottom):
- backends: a name ("cpu", "ref", "cuda") -> factory, in priority order; a Context's
  `backend=` picks one, `None` the best available (DESIGN.md decision 9: the numpy reference
  backend runs only when asked for, or when nothing better is available);
- devices: a name pattern ("cpu:N", "cuda:N") -> factory of a fresh backend computing in that
  device's memory; `Model.load(devices=[...])` names them. This is the one place that knows
  device names: placement and the scheduler ask it, they never compare names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ggmlpy.options import Options
from ggmlpy.sched.backend import Backend

# a factory gets the GGMLPY_* settings its backend is made with (Options, ggmlpy/options.py)
_FACTORIES: dict[str, Callable[[Options], Backend]] = {}
_PRIORITY: list[str] = []


class PlacementError(ValueError):
    """Bad devices, tensor_split or n_gpu_layers."""


def register_backend(name: str, factory: Callable[[Options], Backend], priority: int) -> None:
    _FACTORIES[name] = factory
    _PRIORITY.insert(min(priority, len(_PRIORITY)), name)


def available_backends() -> list[str]:
    return list(_PRIORITY)


def create_backend(name: str | None = None, options: Options | None = None) -> Backend:
    """A fresh backend `name` (None: the best available) made with `options` (None:
    Options.from_env(), read now: the environment is read when a backend is made)."""
    options = options if options is not None else Options.from_env()
    if name is None:
        name = _PRIORITY[0]
    if name not in _FACTORIES:
        raise ValueError(f"unknown backend {name!r} (available: {', '.join(_PRIORITY)})")
    return _FACTORIES[name](options)


FALLBACK = "ref"  # the last resort of every context: it runs every op (DESIGN.md decision 9)


def host_backends(name: str | None = None, options: Options | None = None) -> list[Backend]:
    """A context's own backends, in priority order: `name`'s (None: the best available),
    then the reference fallback for ops without a lowering, unless `name` is that one; all
    made with `options` (None: Options.from_env())."""
    options = options if options is not None else Options.from_env()
    primary = create_backend(name, options)
    return [primary] if primary.name == FALLBACK else [primary, create_backend(FALLBACK, options)]


# devices ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceKind:
    """Devices whose names match `pattern` (a full match); `make(name)` returns a fresh
    backend named `name` with buffer type `name`, given the GGMLPY_* settings `options`.
    `usage` is shown in errors ("cuda:N")."""

    pattern: re.Pattern
    make: Callable[[str, Options], Backend]
    usage: str
    aliases: tuple[tuple[str, str], ...] = ()       # short name -> full name ("cuda" -> "cuda:0")
    reserved: tuple[tuple[str, str], ...] = ()      # name -> why it cannot be an offload device
    # a backend for schedules that are only looked at (ggmlpy viz), where the device may be
    # absent: the same ops and code generation, nothing runs; None: use `make`
    preview: Callable[[str], Backend | None] | None = None
    # the devices of this kind present now, offloaded to by default with -ngl (GPUs)
    discover: Callable[[], list[str]] | None = None


_DEVICES: list[DeviceKind] = []


def register_device(pattern: str, make: Callable[[str, Options], Backend], usage: str,
                    aliases: dict[str, str] | None = None, reserved: dict[str, str] | None = None,
                    preview: Callable[[str], Backend | None] | None = None,
                    discover: Callable[[], list[str]] | None = None) -> None:
    """Make devices matching `pattern` available to placements (later registrations win)."""
    _DEVICES.insert(0, DeviceKind(re.compile(pattern), make, usage, tuple((aliases or {}).items()),
                                  tuple((reserved or {}).items()), preview, discover))


def unregister_device(pattern: str) -> None:
    """Forget a pattern (tests register their own and clean up)."""
    _DEVICES[:] = [k for k in _DEVICES if k.pattern.pattern != pattern]


def device_kind(name: str) -> DeviceKind:
    for kind in _DEVICES:
        if kind.pattern.fullmatch(name):
            return kind
    known = ", ".join(k.usage for k in reversed(_DEVICES))
    raise PlacementError(f"unknown device {name!r}: expected one of {known}")


def normalize_device(name: str) -> str:
    """A device's full name ("cuda" -> "cuda:0"), checked against the registered patterns."""
    for kind in _DEVICES:
        name = dict(kind.aliases).get(name, name)
    for kind in _DEVICES:
        why = dict(kind.reserved).get(name)
        if why is not None:
            raise PlacementError(why)
    device_kind(name)
    return name


def default_devices() -> list[str]:
    """The devices `-ngl N` offloads to when none are named: every discoverable one (GPUs),
    in registration order."""
    return [name for kind in reversed(_DEVICES) if kind.discover is not None for name in kind.discover()]


def create_device(name: str, options: Options | None = None) -> Backend:
    """A fresh backend for offload device `name`, computing in that device's memory, made
    with `options` (None: Options.from_env())."""
    name = normalize_device(name)
    be = device_kind(name).make(name, options if options is not None else Options.from_env())
    be.buffer_type = name
    return be


def preview_device(name: str) -> Backend | None:
    """A backend for looking at a schedule on `name` where the device may be absent (see
    DeviceKind.preview); None: the device's kind has none, make the real one."""
    name = normalize_device(name)
    preview = device_kind(name).preview
    be = preview(name) if preview is not None else None
    if be is not None:
        be.buffer_type = name
    return be


# the built-in backends ----------------------------------------------------------------------
def _ref(options: Options) -> Backend:
    from ggmlpy.sched.ref_backend import RefBackend

    return RefBackend()  # (numpy: no settings of its own)


def _cpu(options: Options) -> Backend:
    from ggmlpy.codegen_cpu.backend import CpuBackend

    return CpuBackend(options=options)


def _cpu_device(name: str, options: Options) -> Backend:
    """"cpu:N": a CpuBackend of its own (own thread pool), standing in for a GPU."""
    be = _cpu(options)
    be.name = name
    be.is_host = False
    return be


def _cuda_device(name: str, options: Options) -> Backend:
    """"cuda:0": the CUDA backend; it keeps its name "cuda" (reports know it by that name)."""
    if name != "cuda:0":
        raise PlacementError(f"device {name}: only cuda:0 is supported")
    from ggmlpy.codegen_cuda import cuda_available

    ok, reason = cuda_available()
    if not ok:
        raise PlacementError(f"device {name} is not available: {reason}")
    return create_backend("cuda", options)


def _cuda_devices() -> list[str]:
    """The CUDA devices this process can use (the backend drives one: cuda:0)."""
    from ggmlpy.codegen_cuda import cuda_available

    return ["cuda:0"] if cuda_available()[0] else []


def _cuda_preview(name: str) -> Backend | None:
    """Without a usable GPU, the CUDA backend on the dry-run driver (no memory, no launches)."""
    from ggmlpy.codegen_cuda import cuda_available

    if cuda_available()[0]:
        return None
    from ggmlpy.codegen_cuda.backend import CudaBackend
    from ggmlpy.codegen_cuda.driver import DryRunDriver

    return CudaBackend(driver=DryRunDriver(compile=False))


def _ref_device(name: str, options: Options) -> Backend:
    """"ref:N": the numpy reference backend as a separate device (tests, debugging)."""
    be = _ref(options)
    be.name = name
    be.is_host = False
    return be


def _ray_device(name: str, options: Options) -> Backend:
    """"ray:<node id | IP | resource>[/cuda]": layers on a Ray actor on that node
    (ggmlpy/distributed, docs/distributed.md). Ray is the optional extra `ggmlpy[ray]`:
    imported here, when such a device is made, never when ggmlpy is imported."""
    from ggmlpy.distributed.ray_target import import_ray

    import_ray(name)  # a PlacementError saying how to install it
    from ggmlpy.distributed.remote_backend import make_ray_device

    return make_ray_device(name, options)


register_backend("ref", _ref, priority=99)
register_backend("cpu", _cpu, priority=0)
_HOST_CPU = "the host CPU (cpu, cpu:0) is always present; name a second CPU device as cpu:1"
register_device(r"cpu:\d+", _cpu_device, "cpu:N with N >= 1", aliases={"cpu": "cpu:0"},
                reserved={"cpu:0": _HOST_CPU})
register_device(r"cuda:\d+", _cuda_device, "cuda:N", aliases={"cuda": "cuda:0"},
                preview=_cuda_preview, discover=_cuda_devices)
register_device(r"ref:\d+", _ref_device, "ref:N")
# (the same pattern as ggmlpy.distributed.ray_target.DEVICE_PATTERN, not imported: see _ray_device)
register_device(r"ray:[A-Za-z0-9_.\-]+(?:/(?:cpu|cuda))?", _ray_device,
                "ray:<node id | node IP | resource>[/cuda]")
