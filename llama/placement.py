"""Where a model's weights and KV cache live: llama.cpp's load_tensors placement (docs/architecture.md, step 6).

It knows llama.cpp's tensor names (`blk.N.`, `token_embd.weight`, `cache_k_lN`) and its
n_gpu_layers / tensor_split / override_tensor rules; the scheduler sees only a LeafPlacement
(ggmlpy/sched/scheduler.py), and device names and their backends are ggmlpy.sched.placement's.

Devices are named explicitly ("cuda:0", or a second CPU "cpu:1" that stands in for a GPU on
machines without one); the host CPU ("cpu") is always there and holds the input layer. With
`n_gpu_layers = g` over `n_layer` repeating layers:

    i_gpu_start    = max(n_layer + 1 - g, 0)
    act_gpu_layers = min(g, n_layer + 1)          (0 without devices)
    layer il (il = n_layer is the output layer) stays on the CPU if il < i_gpu_start,
    else goes to devices[upper_bound(splits, (il - i_gpu_start) / act_gpu_layers)]

where `splits` is `tensor_split` (default: each device's free memory; equal for devices
that cannot say, such as CPU devices) normalised to a cumulative distribution. The KV cache
of a layer lives with the layer. `override_tensor` (llama.cpp's `-ot PATTERN=DEVICE`) then
sends every weight whose name matches a pattern to that device, whatever its layer: the
first matching item wins; the KV cache is not affected. A weight whose op its device
cannot run goes to the CPU (llama.cpp's buffer-type fallback). The model ties its output to the token embeddings when
it has no output matrix: the embeddings then live on the CPU for the lookup and have a
second copy on the output device (llama.cpp's TENSOR_DUPLICATED).

The placement does not move bytes: for host-memory backends, a weight "on cpu:1" means the
scheduler assigns its leaf, and the nodes reading it, to the "cpu:1" backend.
"""
from __future__ import annotations

import bisect
import logging
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType
from ggmlpy.options import Options
from ggmlpy.sched.backend import Backend
from ggmlpy.sched.placement import HOST, PlacementError, make_device_backend, parse_devices
from ggmlpy.sched.registry import normalize_device

log = logging.getLogger("ggmlpy.sched")

# llama.cpp's LLM_TENSOR_LAYER_INPUT tensors: looked up with get_rows, kept on the CPU
INPUT_LAYER = frozenset({"token_embd.weight", "position_embd.weight", "token_types.weight",
                         "token_embd_norm.weight", "token_embd_norm.bias", "per_layer_token_embd.weight"})
_LAYER_NAME = re.compile(r"^(?:blk\.(\d+)\.|cache_[kv]_l(\d+)$)")
_LLAMA_CPP_DEVICE = re.compile(r"^([A-Za-z]+)(\d+)$")  # llama.cpp's buffer type names: CUDA0

__all__ = ["EXPERTS_PATTERN", "HOST", "INPUT_LAYER", "Placement", "PlacementError", "cpu_moe_overrides", "with_cpu_moe",
           "layer_devices", "layer_of", "make_device_backend", "parse_devices", "parse_overrides", "probe_node",
           "split_points"]

# llama.cpp's LLM_FFN_EXPS_REGEX: a mixture-of-experts layer's expert weights
EXPERTS_PATTERN = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def cpu_moe_overrides(cpu_moe: bool = False, n_cpu_moe: int = 0) -> list[str]:
    """llama.cpp's `--cpu-moe` (every layer's experts) and `--n-cpu-moe N` (the first N
    layers') as override_tensor items keeping the experts in host memory, so that the rest of
    a mixture-of-experts model fits on a GPU."""
    if isinstance(n_cpu_moe, bool) or not isinstance(n_cpu_moe, int) or n_cpu_moe < 0:
        raise PlacementError(f"n_cpu_moe must be a non-negative integer, got {n_cpu_moe!r}")
    if cpu_moe:
        return [f"{EXPERTS_PATTERN}=cpu"]
    return [rf"blk\.{il}{EXPERTS_PATTERN}=cpu" for il in range(n_cpu_moe)]


def with_cpu_moe(override_tensor: Sequence[str] | None, cpu_moe: bool = False,
                 n_cpu_moe: int = 0) -> list[str] | None:
    """override_tensor's items, then those of cpu_moe_overrides (the first match wins)."""
    moe = cpu_moe_overrides(cpu_moe, n_cpu_moe)
    if not moe:
        return override_tensor  # type: ignore[return-value]  (parse_overrides checks it)
    if isinstance(override_tensor, str):
        raise PlacementError(f"override_tensor must be a list of PATTERN=DEVICE items, "
                             f"got the string {override_tensor!r}")
    return [*(override_tensor or ()), *moe]


def parse_overrides(items: Sequence[str] | None, devices: Sequence[str]) -> tuple[tuple[re.Pattern, str], ...]:
    """llama.cpp's `--override-tensor` items, "PATTERN=DEVICE" each (split at the first "=").

    PATTERN is a regular expression searched anywhere in a weight's name (std::regex_search);
    DEVICE is "cpu" (the host; llama.cpp's "CPU") or one of the offload `devices` (llama.cpp's
    "CUDA0" is accepted for "cuda:0"). llama.cpp can name any buffer type here; ggmlpy makes
    backends only for the named devices, so another device is an error naming the item."""
    if items is None:
        return ()
    if isinstance(items, str):
        raise PlacementError(f"override_tensor must be a list of PATTERN=DEVICE items, got the string {items!r}")
    out = []
    for item in items:
        pattern, sep, device = str(item).partition("=")
        if not sep or not pattern or not device:
            raise PlacementError(f"override_tensor item {item!r}: expected PATTERN=DEVICE")
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise PlacementError(f"override_tensor item {item!r}: bad pattern: {e}") from None
        out.append((compiled, _override_device(item, device, devices)))
    return tuple(out)


def _override_device(item: str, device: str, devices: Sequence[str]) -> str:
    if device.lower() == "cpu":
        return HOST
    named = _LLAMA_CPP_DEVICE.match(device)
    name = f"{named.group(1).lower()}:{named.group(2)}" if named else device
    try:
        name = normalize_device(name)
    except PlacementError:
        pass  # not a device name at all: reported as not one of the devices
    if name in devices:
        return name
    listed = ", ".join(["cpu", *devices])
    raise PlacementError(f"override_tensor item {item!r}: device {device!r} is not one of this "
                         f"placement's devices ({listed}); name it in devices as well")


def split_points(n_devices: int, tensor_split: Sequence[float] | None = None,
                 free_memory: Sequence[float | None] | None = None) -> tuple[float, ...]:
    """The cumulative, normalised split (float32, as llama.cpp computes it).

    tensor_split None or all zeros: by free memory when every device reports it, else equal."""
    if n_devices == 0:
        return ()
    weights: list[float]
    if tensor_split is not None and any(x != 0 for x in tensor_split):
        if len(tensor_split) != n_devices:
            raise PlacementError(f"tensor_split has {len(tensor_split)} entries for {n_devices} devices")
        if any(x < 0 or not np.isfinite(x) for x in tensor_split):
            raise PlacementError(f"tensor_split entries must be finite and >= 0, got {list(tensor_split)}")
        weights = [float(x) for x in tensor_split]
    elif free_memory is not None and all(m for m in free_memory):
        weights = [float(m) for m in free_memory]  # type: ignore[arg-type]
    else:
        weights = [1.0] * n_devices
    cum = np.cumsum(np.asarray(weights, dtype=np.float32), dtype=np.float32)
    return tuple(float(x) for x in (cum / cum[-1]).astype(np.float32))


def layer_devices(n_layer: int, n_gpu_layers: int, devices: Sequence[str],
                  splits: Sequence[float]) -> list[str]:
    """The device of every layer 0 .. n_layer, the last entry being the output layer."""
    if n_gpu_layers < 0:
        n_gpu_layers = n_layer + 1  # llama.cpp: negative means all layers
    i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)
    act_gpu_layers = min(n_gpu_layers, n_layer + 1) if devices else 0
    out = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or il - i_gpu_start >= act_gpu_layers:
            out.append(HOST)
            continue
        x = np.float32(il - i_gpu_start) / np.float32(act_gpu_layers)
        k = bisect.bisect_right([np.float32(s) for s in splits], x)
        out.append(devices[min(k, len(devices) - 1)])
    return out


def _is_cache_name(name: str) -> bool:
    m = _LAYER_NAME.match(name)
    return m is not None and m.group(2) is not None


def layer_of(name: str) -> int | None:
    """The layer index in a weight name (blk.3.attn_q.weight) or KV cache name (cache_k_l3)."""
    m = _LAYER_NAME.match(name)
    if m is None:
        return None
    return int(m.group(1) if m.group(1) is not None else m.group(2))


@dataclass
class Placement:
    """Devices of every layer, plus per-weight exceptions; a LeafPlacement for the scheduler.

    Without devices it places nothing (`device_for` answers None), so a context runs as one
    backend would, whatever that backend is."""

    n_layer: int
    n_gpu_layers: int = 0
    devices: tuple[str, ...] = ()
    splits: tuple[float, ...] = ()
    layers: tuple[str, ...] = ()   # per repeating layer
    output: str = HOST
    tied: frozenset[str] = frozenset()                   # weights also read by the output layer
    moved: dict[str, str] = field(default_factory=dict)  # weight -> why it went to the CPU instead
    overrides: tuple[tuple[re.Pattern, str], ...] = ()    # (pattern, device): llama.cpp's -ot

    @classmethod
    def plan(cls, n_layer: int, devices: Sequence[str] | None = None, n_gpu_layers: int = 0,
             tensor_split: Sequence[float] | None = None, free_memory: Sequence[float | None] | None = None,
             tied: Iterable[str] = (), override_tensor: Sequence[str] | None = None) -> "Placement":
        devs = parse_devices(devices)
        if not isinstance(n_gpu_layers, (int, np.integer)):
            raise PlacementError(f"n_gpu_layers must be an integer, got {n_gpu_layers!r}")
        splits = split_points(len(devs), tensor_split, free_memory)
        per_layer = layer_devices(n_layer, int(n_gpu_layers), devs, splits)
        return cls(n_layer, int(n_gpu_layers), devs, splits, tuple(per_layer[:-1]), per_layer[-1],
                   frozenset(tied), overrides=parse_overrides(override_tensor, devs))

    @property
    def active(self) -> bool:
        return bool(self.devices)

    # where things live ------------------------------------------------------------------------
    def device_of_name(self, name: str) -> str:
        """The device of a weight or KV cache layer by its name."""
        if name in self.moved:
            return HOST
        forced = self.forced_device(name)
        if forced is not None:
            return forced
        if name in INPUT_LAYER:
            return HOST
        il = layer_of(name)
        if il is not None:
            return self.layers[il] if 0 <= il < self.n_layer else HOST
        return self.output  # output_norm, output, and other per-model tensors

    def device_for(self, leaf: Tensor, user: Tensor | None) -> str | None:
        if not self.active:
            return None
        if self._output_copy(leaf.name) and user is not None and user.op != "get_rows":
            return self.output  # the output layer's copy of a tied embedding
        return self.device_of_name(leaf.name)

    def devices_of(self, leaf: Tensor) -> tuple[str, ...]:
        if not self.active:
            return ()
        home = self.device_of_name(leaf.name)
        if self._output_copy(leaf.name) and self.output != home:
            return (home, self.output)
        return (home,)

    def forced_device(self, name: str) -> str | None:
        """The device the first matching override names for weight `name` (None: none
        matches, or `name` is a KV cache layer, which overrides do not move)."""
        if not self.overrides or _is_cache_name(name):
            return None
        return next((device for pattern, device in self.overrides if pattern.search(name)), None)

    def _output_copy(self, name: str) -> bool:
        """Whether the output layer reads its own copy of tied weight `name` (an override
        moves both uses, as llama.cpp's duplicated tensor has the same name)."""
        return name in self.tied and self.forced_device(name) is None

    # the buffer-type check --------------------------------------------------------------------
    def check_weights(self, weights: Iterable[tuple[str, GGMLType, tuple[int, ...]]],
                      backend_for: Callable[[str], Backend]) -> None:
        """Send to the CPU every weight whose device cannot run the op that reads it (llama.cpp
        tries a probe op on the device's buffer type and falls back to the CPU's)."""
        probes: dict[str, Backend] = {}
        for name, ttype, ne in weights:
            device = self.device_of_name(name)
            if device == HOST:
                continue
            node = probe_node(name, ttype, ne)
            if node is None:
                continue
            be = probes.setdefault(device, backend_for(device))
            if not be.supports_op(node):
                self.moved[name] = f"{device} cannot run {node.op} on {GGMLType(ttype).name}"
                log.warning("weight %s: %s, kept on the CPU", name, self.moved[name])

    # backends ---------------------------------------------------------------------------------
    def make_backends(self, options: Options | None = None) -> list[Backend]:
        """One backend per offload device, in priority order (before the host's), made with
        the GGMLPY_* settings `options` (None: Options.from_env()). `make_device_backend` is
        looked up in this module at each call, so tests can replace it."""
        return [make_device_backend(d, options) for d in self.devices]

    def describe(self) -> str:
        """llama.cpp's per-layer log lines, then the exceptions."""
        lines = ["layer input assigned to device cpu"]
        lines += [f"layer {il:3d} assigned to device {d}" for il, d in enumerate(self.layers)]
        lines.append(f"layer output assigned to device {self.output}")
        lines += [f"{name} (tied output) also on {self.output}" for name in sorted(self.tied)
                  if self.output != HOST and self._output_copy(name)]
        lines += [f"tensors matching {pattern.pattern!r} overridden to {device}" for pattern, device in self.overrides]
        lines += [f"{name}: {why}, on cpu" for name, why in sorted(self.moved.items())]
        return "\n".join(lines)


def probe_node(name: str, ttype: GGMLType, ne: Sequence[int]) -> Tensor | None:
    """The op a weight feeds, on a worst-case batch (llama.cpp's weight_buft_supported)."""
    from ggmlpy.ir.builder import GraphBuilder

    b = GraphBuilder()
    n_batch = 512
    full = tuple(ne) + (1,) * (4 - len(ne))
    w = b.weight(name, ttype, full)
    if name in INPUT_LAYER:
        return b.get_rows(w, b.input("probe_ids", GGMLType.I32, (n_batch,)))
    if full[2] > 1 and "_exps." in name:   # a mixture of experts' stacked experts
        return b.mul_mat_id(w, b.input("probe_x", GGMLType.F32, (ne[0], 1, n_batch)),
                            b.input("probe_ids", GGMLType.I32, (1, n_batch)))
    if len(ne) >= 2 and ne[1] > 1:   # per-head stacks (MLA's attn_k_b/attn_v_b): batched over heads
        return b.mul_mat(w, b.input("probe_x", GGMLType.F32, (ne[0], n_batch, full[2], full[3])))
    if name.endswith("norm.weight"):
        return b.mul(b.input("probe_x", GGMLType.F32, (ne[0], n_batch)), w)
    if name.endswith(".bias"):
        return b.add(b.input("probe_x", GGMLType.F32, (ne[0], n_batch)), w)
    return None  # rope frequencies and the like: small tables, not worth a check
