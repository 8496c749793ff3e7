"""Backends by name, and offload devices by name pattern.

Backends are found, not imported: BACKEND_MODULES lists one small declaration module per
backend package (`BACKEND = BackendEntry(...)`, see sched/backend_entry.py), imported the
first time a backend or device is looked up. Importing the registry, or a backend package,
registers nothing. The declarations give two views:
- backends: a name ("cpu", "cuda", "ref") -> factory, in priority order, those usable here;
  a Context's `backend=` picks one, `None` the best available (docs/architecture.md, decision 9: the
  numpy reference backend runs only when asked for, or when nothing better is available);
- devices: a name pattern ("cpu:N", "cuda:N") -> factory of a fresh backend computing in that
  device's memory; `Model.load(devices=[...])` names them. This is the one place that knows
  device names: placement and the scheduler ask it, they never compare names. Tests and
  extensions add a device kind explicitly with `register_device`.
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable

from ggmlpy.options import Options
from ggmlpy.sched.backend import Backend
from ggmlpy.sched.backend_entry import BackendEntry, DeviceKind, PlacementError

__all__ = ["BACKEND_MODULES", "FALLBACK", "BackendEntry", "DeviceKind", "PlacementError",
           "available_backends", "backend_entries", "create_backend", "create_device",
           "default_devices", "device_kind", "host_backends", "normalize_device",
           "preview_device", "register_device", "unregister_device"]

# each holds `BACKEND = BackendEntry(...)`; the order is the devices' (errors list them in it)
BACKEND_MODULES = (
    "ggmlpy.codegen_cpu.reg",
    "ggmlpy.codegen_cuda.reg",
    "ggmlpy.sched.ref_reg",
    "ggmlpy.distributed.reg",
)


@functools.cache
def backend_entries() -> tuple[BackendEntry, ...]:
    """The declarations of BACKEND_MODULES, in that order (imported once, on first use)."""
    return tuple(importlib.import_module(module).BACKEND for module in BACKEND_MODULES)


def _named() -> list[BackendEntry]:
    """The entries with a backend by name, in priority order (usable here or not)."""
    return sorted((e for e in backend_entries() if e.make is not None), key=lambda e: e.priority)


def available_backends() -> list[str]:
    """The names of the backends usable here, best first."""
    return [e.name for e in _named() if e.usable()[0]]


def create_backend(name: str | None = None, options: Options | None = None) -> Backend:
    """A fresh backend `name` (None: the best available) made with `options` (None:
    Options.from_env(), read now: the environment is read when a backend is made)."""
    options = options if options is not None else Options.from_env()
    if name is None:
        entry = next(e for e in _named() if e.usable()[0])
    else:
        entry = next((e for e in _named() if e.name == name), None)
        if entry is None:
            raise ValueError(f"unknown backend {name!r} (available: {', '.join(available_backends())})")
        ok, why = entry.usable()
        if not ok:
            raise ValueError(f"backend {name!r} is not available: {why}")
    return entry.make(options)


FALLBACK = "ref"  # the last resort of every context: it runs every op (docs/architecture.md, decision 9)


def host_backends(name: str | None = None, options: Options | None = None) -> list[Backend]:
    """A context's own backends, in priority order: `name`'s (None: the best available),
    then the reference fallback for ops without a lowering, unless `name` is that one; all
    made with `options` (None: Options.from_env())."""
    options = options if options is not None else Options.from_env()
    primary = create_backend(name, options)
    return [primary] if primary.name == FALLBACK else [primary, create_backend(FALLBACK, options)]


# devices ------------------------------------------------------------------------------------
_ADDED: list[DeviceKind] = []  # register_device's kinds, in the order they were added


def _device_kinds() -> list[DeviceKind]:
    """Every device kind in registration order: the declared ones, then the added ones."""
    return [kind for entry in backend_entries() for kind in entry.devices] + _ADDED


def register_device(pattern: str, make: Callable[[str, Options], Backend], usage: str,
                    aliases: dict[str, str] | None = None, reserved: dict[str, str] | None = None,
                    preview: Callable[[str], Backend | None] | None = None,
                    discover: Callable[[], list[str]] | None = None) -> None:
    """Make devices matching `pattern` available to placements (later registrations win)."""
    _ADDED.append(DeviceKind.of(pattern, make, usage, aliases, reserved, preview, discover))


def unregister_device(pattern: str) -> None:
    """Forget a pattern added with register_device (tests add their own and clean up)."""
    _ADDED[:] = [k for k in _ADDED if k.pattern.pattern != pattern]


def device_kind(name: str) -> DeviceKind:
    kinds = _device_kinds()
    for kind in reversed(kinds):
        if kind.pattern.fullmatch(name):
            return kind
    known = ", ".join(k.usage for k in kinds)
    raise PlacementError(f"unknown device {name!r}: expected one of {known}")


def normalize_device(name: str) -> str:
    """A device's full name ("cuda" -> "cuda:0"), checked against the registered patterns."""
    kinds = _device_kinds()[::-1]
    for kind in kinds:
        name = dict(kind.aliases).get(name, name)
    for kind in kinds:
        why = dict(kind.reserved).get(name)
        if why is not None:
            raise PlacementError(why)
    device_kind(name)
    return name


def default_devices() -> list[str]:
    """The devices `-ngl N` offloads to when none are named: every discoverable one (GPUs),
    in registration order."""
    return [name for kind in _device_kinds() if kind.discover is not None for name in kind.discover()]


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
