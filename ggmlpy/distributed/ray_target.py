"""Which Ray node a `ray:` device names, and the connection to the cluster.

Device names (docs/distributed.md):

    ray:<target>          the node's CPU backend runs the device's layers
    ray:<target>/cuda     the node's GPU (CUDA backend) runs them

where <target> is, tried in this order:
- a node id (hex, as `ray status -v` / `ray list nodes` print it), in full or a unique
  prefix of at least 8 digits: the actor is pinned to that node (hard node affinity);
- a node's IP address (its NodeManagerAddress), when exactly one live node has it;
- a custom resource name, as a node was started with `ray start --resources='{"node-b": 1}'`:
  the actor asks for a thousandth of it, so it runs on a node that has it and many
  contexts can share the node. The most portable form: names chosen by the operator.

The process connects to Ray when a `ray:` device is first made: a program (or a test)
that called `ray.init(...)` itself is used as it is; otherwise `ray.init(address="auto")`,
which joins the cluster named by RAY_ADDRESS or the one `ray start` left on this machine,
and never starts a new one (a device on a cluster that does not exist is an error, not a
silent single-node Ray).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ggmlpy.sched.backend_entry import PlacementError

DEVICE_PATTERN = r"ray:[A-Za-z0-9_.\-]+(?:/(?:cpu|cuda))?"
DEVICE_USAGE = "ray:<node id | node IP | resource>[/cuda]"
INSTALL_HINT = "pip install 'ggmlpy[ray]'"
_HEX = re.compile(r"[0-9a-f]{8,}")
_IP = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
RESOURCE_SHARE = 0.001  # of a custom resource per actor: pins the node, leaves room for many


@dataclass(frozen=True)
class RayTarget:
    """A resolved device: where its actor goes (`actor_options` for `.options(...)`)."""

    device: str
    kind: str                      # "cpu" or "cuda": the backend on the node
    description: str               # for errors: "node 1a2b3c4d (10.0.0.2)"
    actor_options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def import_ray(device: str) -> Any:
    """The ray module, or the PlacementError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise PlacementError(f"device {device} needs Ray, which is not installed ({e}): "
                             f"{INSTALL_HINT}") from None
    return ray


def connect(device: str) -> Any:
    """Ray, connected to a cluster (see the module docstring)."""
    ray = import_ray(device)
    if not ray.is_initialized():
        try:
            ray.init(address="auto", log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise PlacementError(f"device {device}: no Ray cluster to connect to ({e}); start one with "
                                 "`ray start --head` (docs/distributed.md) or set RAY_ADDRESS") from None
    return ray


def resolve(device: str) -> RayTarget:
    """The live node (or resource) `device` names, checked against the cluster now: an
    unknown one would leave its actor pending forever."""
    body = device[len("ray:"):]
    target, _, kind = body.partition("/")
    kind = kind or "cpu"
    ray = connect(device)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    resources = "GPU" if kind == "cuda" else None
    gpu_options = {"num_gpus": RESOURCE_SHARE} if kind == "cuda" else {}
    if _HEX.fullmatch(target.lower()):
        found = [n for n in nodes if n["NodeID"].startswith(target.lower())]
        if len(found) == 1:
            node = found[0]
            _check_gpu(device, node, resources)
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
            return RayTarget(device, kind, _describe(node),
                             {"scheduling_strategy": strategy, **gpu_options})
        if len(found) > 1:
            raise PlacementError(f"device {device}: {len(found)} live nodes have ids starting with "
                                 f"{target}; give more digits")
    if _IP.fullmatch(target):
        found = [n for n in nodes if n.get("NodeManagerAddress") == target]
        if len(found) == 1:
            node = found[0]
            _check_gpu(device, node, resources)
            return RayTarget(device, kind, _describe(node),
                             {"resources": {f"node:{target}": RESOURCE_SHARE}, **gpu_options})
        if len(found) > 1:
            raise PlacementError(f"device {device}: {len(found)} live nodes have IP {target} "
                                 "(several nodes on one machine): name a node id or a custom resource")
    holders = [n for n in nodes if target in n.get("Resources", {}) and target not in _BUILTIN_RESOURCES]
    if holders:
        if resources and not any(n["Resources"].get(resources) for n in holders):
            raise PlacementError(f"device {device}: no node with resource {target!r} has a GPU")
        return RayTarget(device, kind, f"resource {target!r} ({len(holders)} node(s))",
                         {"resources": {target: RESOURCE_SHARE}, **gpu_options})
    known = "; ".join(_describe(n) for n in nodes) or "none"
    raise PlacementError(f"device {device}: no live Ray node has id, IP or custom resource {target!r} "
                         f"(live nodes: {known})")


def _check_gpu(device: str, node: dict, resource: str | None) -> None:
    if resource and not node.get("Resources", {}).get(resource):
        raise PlacementError(f"device {device}: {_describe(node)} has no GPU")


def _describe(node: dict) -> str:
    custom = sorted(k for k in node.get("Resources", {})
                    if k not in _BUILTIN_RESOURCES and not k.startswith("node:")
                    and not k.startswith("accelerator_type:"))
    extra = f", resources {', '.join(custom)}" if custom else ""
    return f"node {node['NodeID'][:8]} ({node.get('NodeManagerAddress', '?')}{extra})"
