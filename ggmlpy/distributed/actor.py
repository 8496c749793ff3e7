"""The Ray actor behind a `ray:` device: one context's remote layers, on one node.

`SplitWorker` is a plain class; remote_backend.py turns it into a Ray actor pinned to the
device's node (this module imports no Ray, so it can be tested and read without it). The
actor holds, for the lifetime of one `llama.Context`:

- the weights: the GGUF file opened (memory-mapped) from the same path on its own node and
  bound by tensor name, as the host binds its own; no weight ever travels per step;
- the KV cache of its layers: allocated here (zeros) when a split that reads it is
  compiled, and the truth from then on, as a GPU's copy is for the CUDA backend (the host's
  arrays for these layers are never read or written);
- its local backend (cpu, or cuda on a GPU node), which compiles and runs the splits the
  host sends, with the graph's own fusion marks and the model's repacked weights;
- per input, staging memory for the activations a hop's message brings (hops.py): copied into
  arrays that persist across steps, so a compiled split sees the same input memory every run (the CPU
  backend then keeps its pointer table, and nothing depends on how Ray aligned a message).
"""
from __future__ import annotations

import os
import time
from collections import ChainMap
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ggmlpy.ir.serial import load_graph
from ggmlpy.distributed.hops import RESULT_HEAD, message, read_call_head, unpack
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.options import Options
from ggmlpy.passes.buffers import tensor_nbytes
from ggmlpy.sched.backend import Backend
from ggmlpy.sched.store import TensorStore


@dataclass
class _Split:
    compiled: Any
    inputs: dict[int, str | None]   # root id of each input -> its name if it is a graph input
    exports: list[Tensor]           # the results the host reads back (roots), in order


def make_local_backend(kind: str, options: Options) -> Backend:
    """The backend that computes on this node: "cpu", or "cuda" (which needs a GPU here)."""
    from ggmlpy.sched.registry import available_backends, create_backend

    if kind == "cuda":
        from ggmlpy.codegen_cuda import cuda_available

        ok, reason = cuda_available()
        if not ok or "cuda" not in available_backends():
            raise RuntimeError(f"no usable GPU on this node ({os.uname().nodename}): {reason}")
    return create_backend(kind, options)


class SplitWorker:
    """Compiles and runs one context's splits on this node (see the module docstring)."""

    def __init__(self, model_path: str, kind: str):
        from ggmlpy.gguf import GGUFFile

        if not os.path.isfile(model_path):
            raise FileNotFoundError(f"model file {model_path} not found on node {os.uname().nodename}: "
                                    "every node of a split needs the GGUF file at the same path")
        self.gguf = GGUFFile(model_path)
        self.weights = {name: info.data for name, info in self.gguf.tensors.items()}
        self.backend = make_local_backend(kind, Options.from_env())
        self.model_cache: dict = {}
        self.backend.share_model_cache(self.model_cache)
        self.caches: dict[str, np.ndarray] = {}
        self.graph_inputs: dict[str, np.ndarray] = {}
        self.bindings = ChainMap(self.graph_inputs, self.caches, self.weights)
        self.buffers: dict[int, np.ndarray] = {}   # every split's results, and staged inputs
        self.graphs: dict[int, tuple[Graph, dict[int, Tensor]]] = {}
        self.splits: dict[int, _Split] = {}
        self._staging: dict[int, np.ndarray] = {}  # root id -> persistent input memory
        self._views: dict[tuple[int, int], np.ndarray] = {}

    def describe(self) -> dict[str, Any]:
        """Where this actor runs (the device's identity in errors and benchmarks)."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "host": os.uname().nodename, "pid": os.getpid(),
                "backend": self.backend.name}

    def compile(self, sid: int, gid: int, blob: bytes | None, node_ids: list[int],
                export_ids: list[int], input_ids: list[int], caches: Mapping[str, int],
                limits: Mapping[str, int]) -> float:
        """Compile split `sid` (nodes `node_ids` of graph `gid`; `blob` the graph the first
        time it is named), allocating the KV cache layers it touches (name -> bytes)."""
        t0 = time.perf_counter()
        if blob is not None:
            self.graphs[gid] = load_graph(blob)
        graph, by_id = self.graphs[gid]
        for name, nbytes in caches.items():
            if name not in self.caches:
                self.caches[name] = np.zeros(int(nbytes), np.uint8)
        self.backend.set_limits(limits)
        compiled = self.backend.compile(graph, [by_id[i] for i in node_ids])
        inputs = {i: (by_id[i].name if by_id[i].flags & Flag.INPUT else None) for i in input_ids}
        self.splits[sid] = _Split(compiled, inputs, [by_id[i] for i in export_ids])
        return time.perf_counter() - t0

    def run(self, *pieces: bytes) -> Any:
        """Run a split on this hop's message (hops.py): its head names the split, the env,
        the threads and whose bytes are where in the payload (root id, bytes, in order).
        Returns the results the host reads back the same way: one message, its head the
        seconds in native code and in this call (RESULT_HEAD), its payload every export
        in order; as pieces."""
        t0 = time.perf_counter()
        head, payload = unpack(pieces)
        sid, env, n_threads, layout = read_call_head(head)
        split = self.splits[sid]
        at = 0
        for rid, nbytes in layout:
            staged = self._stage(rid, payload[at:at + nbytes])
            at += nbytes
            name = split.inputs.get(rid)
            if name:
                self.graph_inputs[name] = staged
            self.buffers[rid] = staged
        store = TensorStore(self.bindings)
        store.buffers = self.buffers
        self.backend.set_threads(n_threads)
        before = self.backend.native_seconds
        split.compiled.run(store, env)
        native = self.backend.native_seconds - before
        results = [self.buffers[t.id].reshape(-1).view(np.uint8)[:tensor_nbytes(t, env)] for t in split.exports]
        out = message(RESULT_HEAD.pack(native, time.perf_counter() - t0), results)
        return tuple(out) if len(out) > 1 else out[0]

    def _stage(self, rid: int, data: np.ndarray) -> np.ndarray:
        """`data` copied into this input's persistent memory (grown when a run needs more):
        the same array object for the same size, run after run."""
        n = data.nbytes
        view = self._views.get((rid, n))
        if view is None:
            buf = self._staging.get(rid)
            if buf is None or buf.nbytes < n:
                buf = self._staging[rid] = np.zeros(max(n, 64), np.uint8)
                self._views = {k: v for k, v in self._views.items() if k[0] != rid}
            view = self._views[(rid, n)] = buf[:n]
        view[:] = data
        return view

    def close(self) -> None:
        self.backend.close()
        self.gguf.close()
