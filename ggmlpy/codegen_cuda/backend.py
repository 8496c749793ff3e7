"""The CUDA backend: lowers a split to kernel launches and runs it on the device.

Memory, as llama.cpp keeps it on a GPU:
- WEIGHT leaves are uploaded on first use and stay on the device, keyed by leaf name, in a
  `DeviceWeights` that lives with the model (`share_model_cache`): every context of a model
  (each has its own backend) uses one copy, as llama.cpp's model buffers;
- CACHE leaves (the KV cache) are device-resident too: the host array is uploaded on first
  use and the device copy is the truth afterwards (the host copy is NOT updated, except
  where a cache tensor is a graph output, as in the K-shift graph). A cache bound to a
  different host array (another object) is uploaded afresh;
- INPUT leaves (and tensors other splits computed) are packed into one staging buffer and
  uploaded with a single copy per run;
- everything the split computes lives in an arena (planner.py); outputs are downloaded
  into the host TensorStore after the run.
Running a split (plans, CUDA graphs): runtime.py.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from ggmlpy.disk_cache import DiskCache, cache_dir as disk_cache_dir
from ggmlpy.codegen_cuda.bound import host_bytes
from ggmlpy.codegen_cuda.driver import DEFAULT_MAX_SHARED, PreparedLaunch, get_driver
from ggmlpy.codegen_cuda.fusion import LowerOptions, split_groups
from ggmlpy.codegen_cuda.kernels import KernelSpec
from ggmlpy.codegen_cuda.lower_matmul import MatMulOptions, supports_mul_mat
from ggmlpy.codegen_cuda.lower_simple import supports_simple
from ggmlpy.codegen_cuda.runtime import CudaSplit
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.options import Options
from ggmlpy.passes.fusion import ResolvedGroup
from ggmlpy.sched.backend import Backend

log = logging.getLogger("ggmlpy.codegen_cuda")


@dataclass
class Resident:
    ptr: int
    nbytes: int
    host: Any  # the bound host array (held, so its identity cannot be reused)


class DeviceWeights:
    """A model's weights on one device, by name; freed when the last holder lets go (the
    model's backend cache, or a backend that never shared one)."""

    def __init__(self, driver: Any):
        self.driver = driver
        self.entries: dict[str, Resident] = {}

    def get(self, name: str) -> Resident | None:
        return self.entries.get(name)

    def upload(self, name: str, raw: np.ndarray) -> Resident:
        ptr = self.driver.alloc(raw.nbytes)
        self.driver.htod(ptr, raw, raw.nbytes)
        entry = self.entries[name] = Resident(ptr, raw.nbytes, None)
        return entry

    def __del__(self):
        with contextlib.suppress(Exception):  # interpreter shutdown: the driver may be gone first
            for entry in self.entries.values():
                self.driver.free(entry.ptr)
        self.entries = {}


@dataclass
class Stats:
    launches: int = 0
    graph_captures: int = 0
    capture_s: float = 0.0      # host seconds spent capturing and instantiating graphs
    graph_replays: int = 0
    bytes_uploaded: int = 0
    plans_built: int = 0


class CudaBackend(Backend):
    """docs/architecture.md, decision 8. `driver` defaults to the GPU (driver.get_driver()); tests pass
    the host emulator or a compile-only driver."""

    name = "cuda"

    def __init__(self, driver: Any = None, cache_dir: str | None = None, fuse: bool = True,
                 graphs: bool = True, matvec_max_cols: int = 8, tiled: bool = True,
                 matvec_rows: int | None = None, fuse_rope: bool = True, fuse_oproj: bool | None = None,
                 options: Options | None = None):
        """options: the GGMLPY_* settings (None: Options.from_env(), read now): the cache
        root, attention threads, PDL; matvec_rows and fuse_oproj, when given, win over theirs."""
        settings = options if options is not None else Options.from_env()
        self.settings = settings
        self.driver = driver if driver is not None else get_driver()
        self.cache = DiskCache("cuda", cache_dir if cache_dir is not None else disk_cache_dir("cuda", settings.cache_dir))
        if matvec_rows is None:  # 0: by matrix size; the option lets a benchmark compare
            matvec_rows = settings.cuda_matvec_rows
        if matvec_rows not in (0, 1, 2, 4):
            raise ValueError(f"matvec_rows must be 0 (automatic), 1, 2 or 4, not {matvec_rows}")
        if fuse_oproj is None:  # off until measured on a GPU; the option lets a benchmark compare
            fuse_oproj = settings.cuda_fuse_oproj
        self.options = LowerOptions(fuse, MatMulOptions(matvec_max_cols, tiled, matvec_rows, fuse_rope), fuse_oproj,
                                    settings.cuda_attn_threads)
        self.use_graphs = graphs and self.driver.name != "pycuda"
        self.functions: dict[str, Any] = {}
        self.modules: list[Any] = []
        self.resident: dict[str, Resident] = {}      # caches (this context's own)
        self.weights = DeviceWeights(self.driver)    # replaced by the model's (share_model_cache)
        self.stats = Stats()
        self._shared_set: dict[str, int] = {}
        self.limits: dict[str, int] = {}
        self._allocs: set[int] = set()
        self._host_buffers: list[np.ndarray] = []

    # scheduler protocol ------------------------------------------------------------------------
    def supports_op(self, node: Tensor) -> bool:
        op = OPS.get(node.op)
        if op is None:
            return False
        if op.kind == Kind.VIEW:
            return True
        if node.op == "mul_mat":
            return supports_mul_mat(node)
        return supports_simple(node)

    def compile(self, graph: Graph, nodes: list[Tensor]) -> CudaSplit:
        return CudaSplit(self, graph, nodes)

    def split_groups(self, graph: Graph, nodes: list[Tensor]) -> tuple[list[Tensor], list[ResolvedGroup]]:
        """The split's nodes in launch order and the groups its rules form (fusion.py, as
        lower_split does when compiling)."""
        return split_groups(graph, nodes, self.options)

    def share_model_cache(self, cache: dict) -> None:
        """Keep uploaded weights with the model (Model.backend_cache), one copy per driver,
        so a second context of the model uploads none."""
        per_driver = cache.setdefault("cuda.weights", {})
        held = per_driver.get(id(self.driver))
        if held is None or held.driver is not self.driver:
            held = per_driver[id(self.driver)] = self.weights
        self.weights = held

    def set_limits(self, worst_env: Mapping[str, int]) -> None:
        """Upper bounds of the symbols (n_tokens <= n_ubatch, n_kv <= n_ctx ...): memory is
        then planned once for the worst case, so device addresses stay put across run sizes
        and only the launches whose sizes changed are re-packed (see runtime.py)."""
        self.limits = {k: int(v) for k, v in worst_env.items()}

    def run_stats(self) -> dict[str, object]:
        """Launches, CUDA graph captures and replays, uploads; and the device's name."""
        stats = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in vars(self.stats).items()}
        return {"stats": stats, "device": self.driver.device_name}

    # kernels -----------------------------------------------------------------------------------
    def ensure_kernels(self, specs: Iterable[KernelSpec]) -> None:
        """Compile (through the disk cache) and load every spec not loaded yet, as one module."""
        missing: dict[str, KernelSpec] = {}
        for s in specs:
            if s.name not in self.functions:
                missing[s.name] = s
        if not missing:
            return
        module = self.driver.load_module(list(missing.values()), self.cache)
        self.modules.append(module)
        self.functions.update(module.functions)

    def prepare(self, spec: KernelSpec, grid, block, shmem: int, params: bytes) -> PreparedLaunch:
        fn = self.functions[spec.name]
        if shmem > DEFAULT_MAX_SHARED and self._shared_set.get(spec.name, 0) < shmem:
            if shmem > self.driver.max_shared:
                raise RuntimeError(f"{spec.family} needs {shmem} bytes of shared memory; the device "
                                   f"allows {self.driver.max_shared}")
            self.driver.set_max_shared(fn, self.driver.max_shared)
            self._shared_set[spec.name] = self.driver.max_shared
        return PreparedLaunch(fn, grid, block, shmem, params, spec.name)

    # memory ------------------------------------------------------------------------------------
    def alloc(self, n: int) -> int:
        ptr = self.driver.alloc(n)
        self._allocs.add(ptr)
        return ptr

    def free(self, ptr: int) -> None:
        if ptr in self._allocs:
            self._allocs.discard(ptr)
            self.driver.free(ptr)

    def host_buffer(self, nbytes: int) -> np.ndarray:
        """A uint8 host array the device copies to and from directly (page-locked where the
        driver can; plain memory, with a log line, where it cannot)."""
        try:
            arr = self.driver.host_alloc(nbytes)
        except Exception as e:  # an old binding, no pinned memory left ...
            log.warning("page-locked host memory unavailable (%s): pageable buffers", e)
            return np.zeros(int(nbytes), dtype=np.uint8)
        self._host_buffers.append(arr)
        return arr

    def free_host_buffer(self, arr: np.ndarray) -> None:
        for i, held in enumerate(self._host_buffers):
            if held is arr:
                del self._host_buffers[i]
                self.driver.host_free(arr)
                return

    def bind_resident(self, leaf: Tensor, host: np.ndarray) -> int:
        """Device address of a weight or cache leaf, uploading `host` when it is new."""
        if leaf.flags & Flag.WEIGHT:  # trusted by name (see the module docstring)
            entry = self.weights.get(leaf.name)
            if entry is None:
                entry = self.weights.upload(leaf.name, host_bytes(host, leaf.name))
                self.stats.bytes_uploaded += entry.nbytes
            return entry.ptr
        entry = self.resident.get(leaf.name)
        if entry is not None and entry.host is host:
            return entry.ptr
        raw = host_bytes(host, leaf.name)
        if entry is not None:
            self.free(entry.ptr)
        ptr = self.alloc(raw.nbytes)
        self.driver.htod(ptr, raw, raw.nbytes)
        self.stats.bytes_uploaded += raw.nbytes
        self.resident[leaf.name] = Resident(ptr, raw.nbytes, host)
        return ptr

    def download_caches(self, bindings: Mapping[str, np.ndarray]) -> None:
        """Copy every device-resident cache back into its host array (for inspection)."""
        for name, entry in self.resident.items():
            if name in bindings and entry.host is bindings[name]:
                raw = host_bytes(entry.host, name)
                self.driver.dtoh(raw, entry.ptr, entry.nbytes)
        self.driver.synchronize()

    def close(self) -> None:
        for ptr in list(self._allocs):
            self.free(ptr)
        for arr in list(self._host_buffers):
            self.free_host_buffer(arr)
        self.resident.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

