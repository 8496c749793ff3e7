"""The remote backend's declaration for the registry (sched/registry.py): devices
"ray:<node id | IP | resource>[/cuda]", layers on a Ray actor on that node (docs/distributed.md).
No backend by name: a Context's own backend always computes in this process."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ggmlpy.distributed.ray_target import DEVICE_PATTERN, DEVICE_USAGE, import_ray
from ggmlpy.options import Options
from ggmlpy.sched.backend_entry import BackendEntry, DeviceKind

if TYPE_CHECKING:
    from ggmlpy.distributed.remote_backend import RemoteBackend


def make_ray_device(name: str, options: Options) -> RemoteBackend:
    """A device on a Ray node. Ray is the optional extra `ggmlpy[ray]`: imported here, when
    such a device is made, never when ggmlpy is imported."""
    import_ray(name)  # a PlacementError saying how to install it
    from ggmlpy.distributed.remote_backend import make_ray_device as make

    return make(name, options)


BACKEND = BackendEntry(name="ray", devices=(DeviceKind.of(DEVICE_PATTERN, make_ray_device, DEVICE_USAGE),))
