"""The numpy reference backend's declaration for the registry (sched/registry.py): "ref",
last in priority (it runs only when asked for, or as every context's fallback), and the
devices "ref:N" (the reference backend as a separate device: tests, debugging)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlpy.options import Options
from ggmlpy.sched.backend_entry import BackendEntry, DeviceKind

if TYPE_CHECKING:
    from ggmlpy.sched.ref_backend import RefBackend


def make_ref(options: Options) -> RefBackend:
    """The reference backend as a context's fallback: the last resort, which the scheduler
    gives only the nodes no other backend runs (numpy is far slower than any of them)."""
    from ggmlpy.sched.ref_backend import RefBackend

    be = RefBackend()  # (numpy: no settings of its own)
    be.last_resort = True
    return be


def make_ref_device(name: str, options: Options) -> RefBackend:
    """"ref:N": a RefBackend named after its device."""
    be = make_ref(options)
    be.name = name
    be.is_host = False
    be.last_resort = False  # a device that layers are placed on, not a fallback
    return be


BACKEND = BackendEntry(name="ref", make=make_ref, priority=99,
                       devices=(DeviceKind.of(r"ref:\d+", make_ref_device, "ref:N"),))
