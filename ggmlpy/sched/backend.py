"""The backend contract: everything the scheduler, a Context and the tools ask of a device.

A backend subclasses `Backend`. Two hooks are required (`supports_op`, `compile`); every
other hook has a default that is right for a backend computing in host memory with nothing
to tune, so a new backend starts small and overrides what it needs. Callers call the hooks
directly: no backend is probed with hasattr. docs/backends.md walks through adding one.

    hook                 default             called by
    name, is_host        "", False           everyone / the scheduler (host = graph inputs)
    last_resort          False               scheduler: runs only what no other backend can
    buffer_type          see the property    scheduler, copies: which backends share memory
    supports_op(node)    required            scheduler (assignment and fallbacks), placement
    compile(graph, ns)   required            CompiledGraph, once per split
    pipeline()           ("dce", "cse")      Context: the passes this backend's nodes need
    fusion_rules()       ()                  Context, pipeline: the rules the "fusion" pass marks
    split_groups(g, ns)  (ns, [])            compile, viz, tests: the groups run as one kernel
    offload_op(node)     False               scheduler: take an op whose weight is on the host
    copy_in(c, st, env)  nothing             run_copies: move a split's input into its memory
    set_limits(env)      nothing             Context: largest symbol values (arena sizes)
    set_threads(n)       nothing             Context, per decode (n_threads / n_threads_batch)
    share_model_cache(d) nothing             Context: state shared by a model's contexts
    set_model_file(p)    nothing             Context: the GGUF file (a remote device opens it)
    free_memory()        None                Model.place: tensor_split by free memory
    cache_stats()        {}                  Context.compile_report
    run_stats()          {}                  bench.device_stats
    native_seconds       0.0                 bench.run_bench: time inside native code
    close()              nothing             whoever owns the backend, when done with it
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Mapping, Protocol

import numpy as np

from ggmlpy.ir.graph import Graph
from ggmlpy.ir.tensor import Tensor

if TYPE_CHECKING:
    from ggmlpy.passes.fusion import ResolvedGroup, Rule
    from ggmlpy.sched.copies import Copy

Bindings = Mapping[str, np.ndarray]  # leaf name -> data (weights, KV cache layers, inputs)

HOST_MEMORY = "cpu"  # the buffer type every host backend shares (the TensorStore's arrays)
REFERENCE_PIPELINE = ("dce", "cse")  # passes.pipeline.PIPELINES["ref"]: safe for any backend


class CompiledSplit(Protocol):
    def run(self, store: "TensorStoreLike", env: Mapping[str, int]) -> None:
        """Compute this split's nodes; symbol values (n_tokens, n_kv, n_outputs) in `env`."""


class TensorStoreLike(Protocol):
    def array(self, t: Tensor, env: Mapping[str, int]) -> np.ndarray: ...


class Backend(ABC):
    """A device's code generator and runtime, as the scheduler sees it.

    Class attributes a subclass sets: `name` (unique among a context's backends; a device
    backend is renamed to its device, "cpu:1") and `is_host` (it computes in host memory,
    where graph inputs are set; the scheduler's host is the first such backend).
    `last_resort` marks a context's slow fallback (the numpy reference backend, as the
    registry makes it): the scheduler gives it only the nodes no other backend can run, and
    never spreads it to their neighbours."""

    name: str = ""
    is_host: bool = False
    last_resort: bool = False
    native_seconds: float = 0.0  # seconds spent in native graph code, summed over runs
    _buffer_type: str | None = None

    # memory -----------------------------------------------------------------------------------
    @property
    def buffer_type(self) -> str:
        """The memory this backend computes in: backends with the same buffer type read each
        other's tensors without copies. Default: host memory for host backends, else the
        backend's name. A device backend is given its device name (a second CPU "cpu:1"
        then behaves as a separate device)."""
        if self._buffer_type:
            return self._buffer_type
        return HOST_MEMORY if self.is_host else self.name

    @buffer_type.setter
    def buffer_type(self, memory: str) -> None:
        self._buffer_type = memory

    # required -----------------------------------------------------------------------------------
    @abstractmethod
    def supports_op(self, node: Tensor) -> bool:
        """Whether this backend can compute `node` (the scheduler's fallback decision)."""

    @abstractmethod
    def compile(self, graph: Graph, nodes: list[Tensor]) -> CompiledSplit:
        """Prepare `nodes` (a split of `graph`, in order) for repeated runs."""

    # passes and scheduling ----------------------------------------------------------------------
    def pipeline(self) -> tuple[str, ...]:
        """The pass names (ggmlpy.passes.pipeline.PASSES, then optionally "buffers") this
        backend's splits need, in order. The default is the reference pipeline: passes that
        change no result and need no lowering. See passes.pipeline.context_passes."""
        return REFERENCE_PIPELINE

    def fusion_rules(self) -> "tuple[Rule, ...]":
        """Optional. The fusion rules (passes/fusion.py) the graph pass "fusion" marks groups
        with when this backend's pipeline runs it: its rule set, composed of the named
        patterns of passes/patterns.py and its kernel predicates. Default: none (a backend
        that groups its own splits, as CUDA does, applies its rules in split_groups)."""
        return ()

    def split_groups(self, graph: Graph, nodes: list[Tensor]) -> "tuple[list[Tensor], list[ResolvedGroup]]":
        """Optional. How this backend runs the split `nodes` of `graph`: the nodes in the order
        they run (each group consecutive) and the fusion groups it computes with one kernel
        each (their `pattern`: a kind of passes/patterns.FUSED_KINDS). The one way a backend
        receives its groups, whether marked by the "fusion" pass (CPU) or formed here from
        the split (CUDA). Default: the nodes as they are, no groups."""
        return list(nodes), []

    def offload_op(self, node: Tensor) -> bool:
        """Whether to take `node` although its weight lives in host memory (ggml's op
        offload: a GPU backend does for large batches). Asked only of higher-priority
        backends that support the op."""
        return False

    def copy_in(self, copy: "Copy", store: "TensorStoreLike", env: Mapping[str, int]) -> None:
        """Bring `copy.tensor` into this backend's memory before its split runs. Host
        backends read the store's arrays directly, so the default moves nothing."""

    # context set-up -----------------------------------------------------------------------------
    def set_limits(self, worst_env: Mapping[str, int]) -> None:
        """The largest symbol values a run may use (n_ubatch, KV size), for sizing memory."""

    def set_threads(self, n: int) -> None:
        """Threads for the next runs (a Context switches between n_threads and n_threads_batch)."""

    def share_model_cache(self, cache: dict) -> None:
        """`cache` lives with the model (Model.backend_cache): keep state every context of the
        model can share there (repacked or uploaded weights), under a key of your own."""

    def set_model_file(self, path: "os.PathLike[str] | str") -> None:
        """The GGUF file the context's model was loaded from. A backend computing on another
        machine (a `ray:` device) opens it there and binds the weights from it, so weights
        never travel per step; a local backend has them bound already and ignores it."""

    def free_memory(self) -> int | None:
        """Free bytes on the device, for splitting layers by free memory; None: cannot say."""
        return None

    # reports ------------------------------------------------------------------------------------
    def cache_stats(self) -> dict[str, int]:
        """Counters of compiled-code caches (Context.compile_report prefixes the backend name)."""
        return {}

    def run_stats(self) -> dict[str, object]:
        """What a device reports about its runs (bench.device_stats prefixes the name)."""
        return {}

    def close(self) -> None:
        """Release threads and device memory (also done when the backend is collected)."""
