"""The `ray:` devices: a range of layers computed by a Ray actor on another node.

`RemoteBackend` follows the backend contract (docs/backends.md) like a GPU does: its buffer
type is its device name, so the scheduler gives it the layers the placement puts there
(their weights and KV cache "live" on it) and inserts copies at its borders. What it does
with the contract's hooks:

- `compile(graph, nodes)` sends the split to the device's actor (`actor.SplitWorker`),
  which compiles it with the node's own backend (cpu, or cuda for `ray:<node>/cuda`). The
  graph's IR travels once per graph (ggmlpy/ir/serial.py), not per split or step; the compile
  call is not waited for, so the node's LLVM runs beside the host's, and the first run
  waits for it. `supports_op` and `pipeline` are answered on the host by a local instance
  of the same backend (no round trip per node).
- `copy_in(copy, store, env)`, called by the scheduler before the split for every input
  that lives elsewhere, only collects the array: `run` then hands all of them to the actor
  with the run call, and gets the results other splits read back as its return value.
  One actor call per remote split per ubatch; with the usual placement (the last layers
  on the device) that is one round trip per token, two hops.
- weights are never sent: the actor opens the GGUF file at the model's path on its node
  (`set_model_file`); a weight a remote split reads from the host (one the placement kept
  there) is bound from that file too. The KV cache of the device's layers lives on the
  actor (allocated there, the truth from then on, as CUDA's device copy); the host keeps
  the cell metadata, so seq_rm/seq_cp/... work unchanged and K-shift runs as a graph
  whose remote part runs on the actor. What reads the cache arrays on the host (state
  save/load, slot files) does not see the remote layers' rows: not supported.

Hops carry activations as one message of `bytes` pieces, direct actor-call arguments and
return values that Ray inlines into the call's own messages, never as numpy arguments (Ray's
own serialisation of those cost about 1 ms more per round trip) or `ray.put` object refs (an
object-store round trip per hop, ten times an inlined call on loopback); hops.py has the
measurements. Activations between two remote devices pass
through the host.

Failure: every wait on the actor has a timeout (GGMLPY_RAY_TIMEOUT seconds, default 300),
and a dead actor (killed, node lost) raises `RemoteDeviceError` naming the device; a
Context turns it into decode's fatal return code. The device then stays failed (its KV
cache is gone): build a new Context, whose backend starts a fresh actor.
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ggmlpy.ir.serial import dump_graph
from ggmlpy.distributed.hops import RESULT_HEAD, call_head, message, message_size, piece_count, unpack
from ggmlpy.distributed.ray_target import RayTarget, import_ray, resolve
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.tensor import BOUND, Flag, Tensor, memory_root
from ggmlpy.options import Options
from ggmlpy.passes.buffers import tensor_nbytes
from ggmlpy.passes.fusion import Rule
from ggmlpy.sched.backend import Backend
from ggmlpy.sched.backend_entry import PlacementError
from ggmlpy.sched.copies import Copy
from ggmlpy.sched.store import TensorStore

DEFAULT_TIMEOUT_S = 300.0
_graph_ids = itertools.count(1)


class RemoteDeviceError(RuntimeError):
    """A `ray:` device failed: its actor died, did not answer in time, or raised."""


@dataclass
class RemoteStats:
    """What the device's hops and calls cost, summed over runs (run_stats)."""

    runs: int = 0
    bytes_sent: int = 0        # activations to the actor
    bytes_received: int = 0    # results back
    call_seconds: float = 0.0  # host time from submitting a run to having its results
    actor_seconds: float = 0.0   # of that, inside the actor's run method
    remote_seconds: float = 0.0  # of that, in native code on the actor


def make_ray_device(name: str, options: Options) -> "RemoteBackend":
    """The registry's factory for "ray:..." (the target is checked against the cluster now)."""
    return RemoteBackend(name, resolve(name), options, options.ray_timeout_s)


def _op_oracle(kind: str, options: Options) -> Backend:
    """A host-side instance of the node's backend kind, for `supports_op` and `pipeline`
    (CUDA on the dry-run driver: the same op support, no GPU needed on the host)."""
    if kind == "cuda":
        from ggmlpy.codegen_cuda.backend import CudaBackend
        from ggmlpy.codegen_cuda.driver import DryRunDriver

        return CudaBackend(driver=DryRunDriver(compile=False), options=options)
    from ggmlpy.codegen_cpu.backend import CpuBackend

    return CpuBackend(options=options)


class RemoteBackend(Backend):
    """A `ray:` device (see the module docstring); one actor per backend, so per context."""

    is_host = False

    def __init__(self, name: str, target: RayTarget, options: Options, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.name = name
        self.target = target
        self.timeout_s = timeout_s
        self.oracle = _op_oracle(target.kind, options)
        self.limits: dict[str, int] = {}
        self.n_threads = 1
        self.model_path: str | None = None
        self.stats = RemoteStats()
        self.native_seconds = 0.0
        self._actor: Any = None
        self._failed: str | None = None
        self._pending: dict[int, np.ndarray] = {}
        self._graphs: dict[int, tuple[int, Graph]] = {}  # id(graph) -> (wire id, graph, held)
        self._compiling: list[tuple[Any, str]] = []
        self._sids = itertools.count()
        self._run_methods: dict[int, Any] = {}

    # the contract ------------------------------------------------------------------------------
    def supports_op(self, node: Tensor) -> bool:
        return self.oracle.supports_op(node)

    def pipeline(self) -> tuple[str, ...]:
        """The node's backend's passes (the CPU's fusion marks travel with the graph)."""
        return self.oracle.pipeline()

    def fusion_rules(self) -> tuple[Rule, ...]:
        """The node's backend's fusion rules (the marks it runs fused travel with the graph)."""
        return self.oracle.fusion_rules()

    def set_limits(self, worst_env: Mapping[str, int]) -> None:
        self.limits = {k: int(v) for k, v in worst_env.items()}

    def set_threads(self, n: int) -> None:
        """Threads of the node's backend for the next runs (sent with each run call)."""
        self.n_threads = int(n)

    def set_model_file(self, path: os.PathLike | str) -> None:
        """The GGUF file the actor opens on its node (the same path on every node)."""
        self.model_path = str(path)

    def compile(self, graph: Graph, nodes: list[Tensor]) -> "RemoteSplit":
        own = {n.id for n in nodes}
        exports, inputs, caches = _split_io(graph, nodes, own)
        gid, blob = self._graph_on_wire(graph)
        sid = next(self._sids)
        actor = self.actor
        ref = actor.compile.remote(sid, gid, blob, [n.id for n in nodes], exports, inputs, caches, self.limits)
        self._compiling.append((ref, f"compiling split {sid} ({len(nodes)} nodes)"))
        by_id = {t.id: t for t in graph.tensors}
        return RemoteSplit(self, sid, len(nodes), [by_id[i] for i in exports])

    def copy_in(self, copy: Copy, store: TensorStore, env: Mapping[str, int]) -> None:
        """Collect an input for the next run call (a weight: none, the actor has the file)."""
        root = memory_root(copy.tensor)
        if root.flags & Flag.WEIGHT:
            return
        if root.flags & Flag.CACHE:
            raise RemoteDeviceError(f"device {self.name}: a split reads KV cache {root.name!r}, which "
                                    f"lives on {copy.src_backend}: not supported on a ray: device")
        self._pending[root.id] = store.buffer(root).reshape(-1).view(np.uint8)

    def run_stats(self) -> dict[str, object]:
        s = self.stats
        return {"node": self.target.description, "runs": s.runs, "bytes_sent": s.bytes_sent,
                "bytes_received": s.bytes_received, "call_ms": round(s.call_seconds * 1e3, 3),
                "actor_ms": round(s.actor_seconds * 1e3, 3), "remote_native_ms": round(s.remote_seconds * 1e3, 3)}

    def close(self) -> None:
        """Stop the actor (its KV cache and compiled splits go with it)."""
        actor, self._actor = self._actor, None
        self._run_methods.clear()
        if actor is None:
            return
        try:
            import ray

            if ray.is_initialized():
                ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead, or Ray shut down
            pass

    def __del__(self) -> None:
        self.close()

    # the actor ---------------------------------------------------------------------------------
    @property
    def actor(self) -> Any:
        """The device's actor, started on first use (a backend made only to probe a device,
        as Model.load does, starts none)."""
        if self._failed is not None:
            raise RemoteDeviceError(self._failed)
        if self._actor is None:
            if self.model_path is None:
                raise RemoteDeviceError(f"device {self.name}: no model file to open on the node "
                                        "(set_model_file was not called; llama.Context calls it)")
            ray = import_ray(self.name)
            from ggmlpy.distributed.actor import SplitWorker

            cls = ray.remote(SplitWorker)
            self._actor = cls.options(num_cpus=0, max_restarts=0, max_task_retries=0,
                                      **self.target.actor_options).remote(self.model_path, self.target.kind)
        return self._actor

    def wait(self, ref: Any, what: str) -> Any:
        """ray.get with the device's timeout; any failure a RemoteDeviceError naming the device."""
        import ray
        from ray import exceptions as rex

        where = f"device {self.name} ({self.target.description})"
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except rex.GetTimeoutError:
            self._fail(f"{where}: no answer from its Ray actor within {self.timeout_s:g} s while {what} "
                       "(GGMLPY_RAY_TIMEOUT); the device is given up: build a new context")
        except rex.RayActorError as e:
            self._fail(f"{where}: its Ray actor died while {what}: {_first_line(e)}; "
                       "build a new context (it starts a fresh actor)")
        except rex.RayTaskError as e:
            raise RemoteDeviceError(f"{where}: {what} failed on the node: {_first_line(e, last=True)}") from e
        except rex.RayError as e:
            self._fail(f"{where}: Ray failed while {what}: {_first_line(e)}")

    def _fail(self, message: str) -> None:
        self._failed = message
        self.close()
        raise RemoteDeviceError(message)

    def wait_compiled(self) -> None:
        while self._compiling:
            ref, what = self._compiling[0]
            self.wait(ref, what)
            self._compiling.pop(0)

    def _graph_on_wire(self, graph: Graph) -> tuple[int, bytes | None]:
        """The graph's wire id, and its bytes the first time (the actor keeps it)."""
        known = self._graphs.get(id(graph))
        if known is not None and known[1] is graph:
            return known[0], None
        gid = next(_graph_ids)
        self._graphs[id(graph)] = (gid, graph)
        return gid, dump_graph(graph)

    def run_method(self, n_returns: int) -> Any:
        """The actor's run method returning `n_returns` values (one per piece of the results)."""
        actor = self.actor  # (raises once the device has failed)
        method = self._run_methods.get(n_returns)
        if method is None:
            run = actor.run
            method = self._run_methods[n_returns] = run.options(num_returns=n_returns) if n_returns > 1 else run
        return method

    def take_inputs(self) -> dict[int, np.ndarray]:
        pending, self._pending = self._pending, {}
        return pending


class RemoteSplit:
    """A split compiled on the device's actor; `run` is one actor call (hops.py: how the
    activations travel)."""

    def __init__(self, backend: RemoteBackend, sid: int, n_nodes: int, exports: list[Tensor]):
        self.backend = backend
        self.sid = sid
        self.n_nodes = n_nodes
        self.exports = exports
        self._sizes: dict[tuple, tuple[list[int], int]] = {}  # env -> (bytes per export, pieces)

    def run(self, store: TensorStore, env: Mapping[str, int]) -> None:
        be = self.backend
        be.wait_compiled()
        inputs = be.take_inputs()
        sizes, n_pieces = self._export_sizes(env)
        layout = [(rid, data.nbytes) for rid, data in inputs.items()]
        pieces = message(call_head((self.sid, dict(env), be.n_threads, layout)), list(inputs.values()))
        t0 = time.perf_counter()
        refs = be.run_method(n_pieces).remote(*pieces)
        got = be.wait(refs, f"running split {self.sid}")
        head, data = unpack(got if n_pieces > 1 else [got])
        native, on_actor = RESULT_HEAD.unpack(head)
        s = be.stats
        s.call_seconds += time.perf_counter() - t0
        s.actor_seconds += on_actor
        s.remote_seconds += native
        be.native_seconds += native
        s.runs += 1
        s.bytes_sent += sum(n for _, n in layout)
        s.bytes_received += data.nbytes
        buffers = store.buffers
        at = 0
        for t, n in zip(self.exports, sizes):
            buffers[t.id] = data[at:at + n]
            at += n

    def _export_sizes(self, env: Mapping[str, int]) -> tuple[list[int], int]:
        """Bytes of each result at `env`, and the pieces they travel as (both sides agree)."""
        key = tuple(env.items())
        known = self._sizes.get(key)
        if known is None:
            if len(self._sizes) > 256:
                self._sizes.clear()
            sizes = [tensor_nbytes(t, env) for t in self.exports]
            known = self._sizes[key] = (sizes, piece_count(message_size(RESULT_HEAD.size, sum(sizes))))
        return known


def _split_io(graph: Graph, nodes: list[Tensor], own: set[int]) -> tuple[list[int], list[int], dict[str, int]]:
    """A split's results read elsewhere (root ids), its inputs from elsewhere (root ids,
    weights and KV cache excluded) and the KV cache layers it touches (name -> bytes)."""
    exports: dict[int, None] = {}
    for t in graph.tensors:
        if t.id in own:
            continue
        for s in t.src:
            if s.id in own:
                exports[memory_root(s).id] = None
    for o in graph.outputs:
        if o.id in own:
            exports[memory_root(o).id] = None
    by_id = {t.id: t for t in graph.tensors}
    exports_ids = [rid for rid in exports if rid in own and not by_id[rid].flags & BOUND]
    inputs: dict[int, None] = {}
    caches: dict[str, int] = {}
    for n in nodes:
        for s in list(n.src) + ([n.view_src] if n.view_src is not None else []):
            root = memory_root(s)
            if root.flags & Flag.CACHE:
                caches[root.name] = tensor_nbytes(root, {})
            elif not root.flags & Flag.WEIGHT and root.id not in own:
                inputs[root.id] = None
    return exports_ids, list(inputs), caches


def _first_line(e: BaseException, last: bool = False) -> str:
    """One line of a Ray error: its first (what happened), or its last (a remote
    exception's own message, after the traceback)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    return lines[-1] if last else lines[0]
