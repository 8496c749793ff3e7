"""What a backend package declares so that the registry can find it by module path.

Each backend package has a small `reg` module holding one `BACKEND = BackendEntry(...)`:
the name, priority and factory of its host backend (if it has one) and the device kinds it
offers. That module imports only light modules (a factory imports its code generator when
it is called) and never the registry: the registry lists the modules and imports them on
first use (sched/registry.py), so importing a backend package registers nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

from ggmlpy.options import Options

if TYPE_CHECKING:
    from ggmlpy.sched.backend import Backend


class PlacementError(ValueError):
    """Bad devices, tensor_split or n_gpu_layers (also: a named device that is not available)."""


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

    @classmethod
    def of(cls, pattern: str, make: Callable[[str, Options], Backend], usage: str,
           aliases: Mapping[str, str] | None = None, reserved: Mapping[str, str] | None = None,
           preview: Callable[[str], Backend | None] | None = None,
           discover: Callable[[], list[str]] | None = None) -> DeviceKind:
        """A kind from a pattern string and plain dicts (the form declarations are written in)."""
        return cls(re.compile(pattern), make, usage, tuple((aliases or {}).items()),
                   tuple((reserved or {}).items()), preview, discover)


@dataclass(frozen=True)
class BackendEntry:
    """One backend package's declaration.

    `make(options)` is the host backend called `name` (a Context's `backend=`); None when
    the package offers devices only (`ray:`). Backends are tried in ascending `priority`
    (0: the default one). `available()` says whether the backend can be made here, as
    (ok, why not); None: always. `devices` are the offload device kinds of the package."""

    name: str
    make: Callable[[Options], Backend] | None = None
    priority: int = 50
    available: Callable[[], tuple[bool, str]] | None = None
    devices: tuple[DeviceKind, ...] = ()

    def usable(self) -> tuple[bool, str]:
        """(True, "") or (False, why not): can a host backend be made from this entry now."""
        if self.make is None:
            return False, f"{self.name} offers devices only"
        return self.available() if self.available is not None else (True, "")
