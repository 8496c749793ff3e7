"""Backends by name. `None` asks for the best available one (DESIGN.md decision 9: the numpy
reference backend runs only when asked for, or when nothing better is available yet)."""
from __future__ import annotations

from typing import Callable

from ggmlpy.sched.backend import Backend

# name -> factory; later backends (cpu, cuda) are added here in priority order
_FACTORIES: dict[str, Callable[[], Backend]] = {}
_PRIORITY: list[str] = []


def register_backend(name: str, factory: Callable[[], Backend], priority: int) -> None:
    _FACTORIES[name] = factory
    _PRIORITY.insert(min(priority, len(_PRIORITY)), name)


def available_backends() -> list[str]:
    return list(_PRIORITY)


def create_backend(name: str | None = None) -> Backend:
    if name is None:
        name = _PRIORITY[0]
    if name not in _FACTORIES:
        raise ValueError(f"unknown backend {name!r} (available: {', '.join(_PRIORITY)})")
    return _FACTORIES[name]()


def _ref() -> Backend:
    from ggmlpy.sched.ref_backend import RefBackend

    return RefBackend()


def _cpu() -> Backend:
    from ggmlpy.codegen_cpu.backend import CpuBackend

    return CpuBackend()


register_backend("ref", _ref, priority=99)
register_backend("cpu", _cpu, priority=0)
