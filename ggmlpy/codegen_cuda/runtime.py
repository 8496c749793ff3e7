"""Running a compiled split: device memory layout, packed launches, CUDA graphs.

Layout. With limits (Context calls `set_limits` with n_ubatch and n_ctx), the arena and the
input staging buffer are planned once for the worst case, so every device address stays put
whatever the run size. Without limits they are planned for the sizes seen so far.

Launches. Each step's launches depend on a few symbols only (a Q/K/V product on n_tokens,
attention also on n_kv); they are packed once per value of those symbols and reused, so a
new n_kv re-packs the attention launches and nothing else.

Plans and graphs. A RunPlan is the launch list for one env (symbol values). One-token decode
graphs (graph.hints["tokens"] == "single") are captured as a CUDA graph the first time an
env is seen and replayed after. Plans live in an LRU of MAX_PLANS.

Device counts. In a decode graph the cache lengths (n_kv, and n_kv_swa with a sliding-window
cache) change every 32 tokens, and only the fused attention launches depend on them. Those
launches then read the length from device memory (4 bytes each at the start of the input
buffer, uploaded with the inputs) and size their shared memory for the limit, so one plan
and one captured graph serve a whole generation: no re-capture (about 1.2 ms on an H200)
every 32 tokens. Inputs sized by a count (the mask) are uploaded at each run's size.
"""
from __future__ import annotations

import operator
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ggmlpy.codegen_cuda.bound import binding_maps, bound_array, host_bytes
from ggmlpy.codegen_cuda.driver import PreparedLaunch
from ggmlpy.codegen_cuda.fusion import SINGLE_TOKEN_SYMBOLS, lower_split
from ggmlpy.codegen_cuda.lower_attention import AttentionStep
from ggmlpy.codegen_cuda.planner import ALIGN, ArenaPlan, align, nbytes, plan_arena
from ggmlpy.codegen_cuda.steps import Step
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.symbolic import SymExpr, evaluate
from ggmlpy.ir.tensor import Flag, Tensor, memory_root
from ggmlpy.sched.store import BindingError, TensorStore

if TYPE_CHECKING:
    from ggmlpy.codegen_cuda.backend import CudaBackend

MAX_PLANS = 64
GROWTH = 1.25
BOUND = Flag.INPUT | Flag.WEIGHT | Flag.CACHE
RESIDENT = Flag.WEIGHT | Flag.CACHE


@dataclass
class Layout:
    key: tuple                              # the planning env it was made for
    arena: ArenaPlan
    inputs: list[tuple[Tensor, int, bool]]  # (root, offset in the input buffer, is an INPUT leaf)
    bases: dict[int, int]                   # root id -> device address


@dataclass
class RunPlan:
    env_key: tuple
    inputs: list[tuple[Tensor, int, int, bool]]   # (root, offset, bytes this run, INPUT leaf)
    outputs: list[tuple[Tensor, int, int, bool]]  # (root, device address, bytes, bound leaf)
    launches: list[PreparedLaunch] = field(default_factory=list)
    graph: Any = None


def _symbols(x: Any, out: set[str]) -> None:
    if isinstance(x, SymExpr):
        out |= x.symbols
    elif isinstance(x, (tuple, list)):
        for v in x:
            _symbols(v, out)
    elif isinstance(x, dict):
        for v in x.values():
            _symbols(v, out)


def _mentions(t: Tensor, names: Any) -> bool:
    """Whether t's shape or strides depend on any of the symbols `names`."""
    found: set[str] = set()
    _symbols((t.ne, t.nb), found)
    return not found.isdisjoint(names)


def step_symbols(step: Step) -> tuple[str, ...]:
    """The symbols a step's launches can depend on: in the shapes, strides, offsets and
    parameters of every tensor it touches."""
    out: set[str] = set()
    for t in list(step.nodes) + list(step.reads) + list(step.writes):
        for part in (t.ne, t.nb, t.view_offs, t.params):
            _symbols(part, out)
    return tuple(sorted(out))


class CudaSplit:
    def __init__(self, backend: "CudaBackend", graph: Graph, nodes: list[Tensor]):
        self.backend = backend
        self.graph = graph
        self.nodes = nodes
        self.steps: list[Step] = lower_split(graph, nodes, backend.options)
        backend.ensure_kernels(s for step in self.steps for s in step.specs())
        self._step_symbols = [step_symbols(s) for s in self.steps]
        written: dict[int, Tensor] = {}
        touched: dict[int, Tensor] = {}
        for step in self.steps:
            for t in step.writes:
                r = memory_root(t)
                written[r.id] = touched[r.id] = r
            for t in step.reads:
                r = memory_root(t)
                touched[r.id] = r
        self.weight_leaves = [r for r in touched.values() if r.flags & Flag.WEIGHT]
        self.cache_leaves = [r for r in touched.values() if r.flags & Flag.CACHE and not r.flags & Flag.WEIGHT]
        # inputs of a fixed size first: a run uploads its input buffer up to the end of the
        # last input's bytes, so sizes that grow (the mask with n_kv) are best at the end
        inputs = [r for rid, r in touched.items() if rid not in written and not r.flags & RESIDENT]
        self.input_roots = sorted(inputs, key=lambda r: not all(isinstance(d, int) for d in r.ne))
        self.arena_ids = {rid for rid, r in written.items() if not r.flags & BOUND}
        in_split = {n.id for n in nodes}
        users = graph.consumers()
        outs: dict[int, Tensor] = {}
        for t in list(graph.outputs) + [n for n in nodes if any(u.id not in in_split for u in users.get(n.id, []))]:
            r = memory_root(t)
            if r.id in written:
                outs[r.id] = r
        self.output_roots = list(outs.values())
        self.single = graph.hints.get("tokens") == "single"
        self.counts = self._device_counts()
        self._count_index = {c: i for i, c in enumerate(self.counts)}
        self._count_sized = {r.id for r in self.input_roots if _mentions(r, self.counts)}
        self._sized_memo: dict[tuple, int] = {}
        self._plans: OrderedDict[tuple, RunPlan] = OrderedDict()
        self._layout: Layout | None = None
        self._step_launches: list[dict[tuple, list[PreparedLaunch]]] = [{} for _ in self.steps]
        self._arena = (0, 0)     # (device address, capacity)
        self._inbuf = (0, 0)
        self._scratch = 0        # device address of the steps' own memory (_place_scratch)
        self._staging = np.zeros(0, dtype=np.uint8)   # page-locked once planned
        self._out_host: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # root id -> (buffer, this size's view)
        self._weight_ptrs: dict[int, int] | None = None  # leaf id -> device address
        self._cache_ptrs: dict[int, int] = {}
        self._cache_names = [leaf.name for leaf in self.cache_leaves]
        self._cache_name_set = frozenset(self._cache_names)
        self._cache_seen: tuple[Any, list] | None = None  # (mapping, arrays) of the last bind

    # running -----------------------------------------------------------------------------------
    def run(self, store: TensorStore, env: Mapping[str, int]) -> None:
        drv, be = self.backend.driver, self.backend
        if self.counts:  # a count's value is uploaded; the plan only depends on its capacity
            key = tuple(sorted((k, self._count_capacity(k, v) if k in self._count_index else int(v))
                               for k, v in env.items()))
        else:
            key = tuple(sorted((k, int(v)) for k, v in env.items()))
        self._bind_resident(store)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._prepare(env, key)
        else:
            self._plans.move_to_end(key)
        self._upload_inputs(plan, store, env)
        if plan.graph is not None:
            drv.graph_launch(plan.graph)
            be.stats.graph_replays += 1
        elif self.single and be.use_graphs and plan.launches:
            t0 = time.perf_counter()
            drv.begin_capture(pdl=be.settings.cuda_pdl)
            try:
                for pl in plan.launches:
                    drv.launch(pl)
            finally:
                plan.graph = drv.end_capture()
            be.stats.graph_captures += 1
            be.stats.capture_s += time.perf_counter() - t0
            drv.graph_launch(plan.graph)
        else:
            for pl in plan.launches:
                drv.launch(pl)
            be.stats.launches += len(plan.launches)
        for root, ptr, n, bound in plan.outputs:
            if bound:
                host = host_bytes(bound_array(store.bindings, root.name), root.name)
                if host.nbytes < n:
                    raise BindingError(f"{root.name!r} has {host.nbytes} bytes bound, the graph writes {n}")
            else:
                host = self._output_buffer(root, n)
                store.buffers[root.id] = host
            if n:
                drv.dtoh(host, ptr, n)
        drv.synchronize()

    def _output_buffer(self, root: Tensor, n: int) -> np.ndarray:
        """Where an output lands on the host: one page-locked buffer per output, reused by
        every run (its readers copy what they keep, as llama's logits are), and the same
        array object while the size stays."""
        held = self._out_host.get(root.id)
        if held is None or held[0].nbytes < n:
            if held is not None:
                self.backend.free_host_buffer(held[0])
            buf = self.backend.host_buffer(n)
            held = self._out_host[root.id] = (buf, buf[:n])
        elif held[1].nbytes != n:
            held = self._out_host[root.id] = (held[0], held[0][:n])
        return held[1]

    def _bind_resident(self, store: TensorStore) -> None:
        """Weights are bound on the first run; caches every run (by identity of the bound
        array): a cache bound to a new array is uploaded and invalidates what points at the
        old copy."""
        be = self.backend
        if self._weight_ptrs is None:
            self._weight_ptrs = {w.id: be.bind_resident(w, bound_array(store.bindings, w.name))
                                 for w in self.weight_leaves}
        if not self.cache_leaves or self._caches_unchanged(store.bindings):
            return
        changed = False
        hosts = []
        for leaf in self.cache_leaves:
            host = bound_array(store.bindings, leaf.name)
            hosts.append(host)
            entry = be.resident.get(leaf.name)
            ptr = entry.ptr if entry is not None and entry.host is host else be.bind_resident(leaf, host)
            if self._cache_ptrs.get(leaf.id) != ptr:
                self._cache_ptrs[leaf.id] = ptr
                changed = True
        if changed:
            self._invalidate()
        maps = getattr(store.bindings, "maps", [store.bindings])
        holder = next((m for m in maps if self.cache_leaves[0].name in m), None)
        same = holder is not None and all(holder.get(n) is h for n, h in zip(self._cache_names, hosts))
        self._cache_seen = (holder, hosts) if same else None

    def _caches_unchanged(self, bindings: Any) -> bool:
        """The fast path of _bind_resident (per token it would look up every layer's K and V):
        the same mapping still holds the same arrays under every cache name, and no mapping
        in front of it (a ChainMap's earlier maps) shadows one of them."""
        seen = self._cache_seen
        if seen is None:
            return False
        holder, hosts = seen
        for m in binding_maps(bindings):
            if m is holder:  # (map and operator.is_ keep the loop over 2 * n_layer names in C)
                return all(map(operator.is_, map(holder.get, self._cache_names), hosts))
            if not m.keys().isdisjoint(self._cache_name_set):
                return False
        return False

    def _sized_bytes(self, root: Tensor, env: Mapping[str, int]) -> int:
        """nbytes(root, env) for an input sized by a device count, remembered per length."""
        key = (root.id, *(env[c] for c in self.counts))
        n = self._sized_memo.get(key)
        if n is None:
            if len(self._sized_memo) > 4096:
                self._sized_memo.clear()
            n = self._sized_memo[key] = nbytes(root, env)
        return n

    def _upload_inputs(self, plan: RunPlan, store: TensorStore, env: Mapping[str, int]) -> None:
        total = 0
        if self.counts:
            counts = self._staging[:4 * len(self.counts)].view(np.int32)
            for i, c in enumerate(self.counts):
                counts[i] = env[c]
            total = counts.nbytes
        for root, off, n, is_input in plan.inputs:
            if root.id in self._count_sized:
                n = self._sized_bytes(root, env)
            if not n:
                continue
            if is_input:
                host = host_bytes(bound_array(store.bindings, root.name), root.name)
            else:  # computed by another split
                host = store.buffer(root)
            if host.nbytes < n:
                raise BindingError(f"{root.name or root!r}: {host.nbytes} bytes given, {n} needed for this run")
            self._staging[off:off + n] = host[:n]
            total = max(total, off + n)
        if total:
            self.backend.driver.htod(self._inbuf[0], self._staging, total)

    # planning ----------------------------------------------------------------------------------
    def _planning_env(self, env: Mapping[str, int]) -> dict[str, int]:
        """The sizes memory is planned for: each symbol's limit, except the token counts of a
        one-token graph (planned for n_ubatch tokens, its input buffer spread its few bytes
        over megabytes, all uploaded every token: 0.15 ms per token on an H200)."""
        limits = self.backend.limits
        pinned = SINGLE_TOKEN_SYMBOLS if self.single else {}
        return {k: int(v) if k in pinned else max(int(v), limits.get(k, 0)) for k, v in env.items()}

    def _ensure_layout(self, env: Mapping[str, int]) -> Layout:
        penv = self._planning_env(env)
        key = tuple(sorted(penv.items()))
        lay = self._layout
        if lay is not None and all(penv[k] <= v for k, v in lay.key):
            return lay
        if lay is not None:  # a run beyond the sizes planned for: plan for the larger ones
            penv = {k: max(v, dict(lay.key).get(k, 0)) for k, v in penv.items()}
            key = tuple(sorted(penv.items()))
        arena = plan_arena(self.steps, penv, self.arena_ids, keep=[r.id for r in self.output_roots])
        inputs, off = [], align(4 * len(self.counts)) if self.counts else 0
        for r in self.input_roots:
            inputs.append((r, off, bool(r.flags & Flag.INPUT)))
            off = align(off + nbytes(r, penv))
        self._invalidate()
        self._grow("_arena", arena.size)
        self._grow("_inbuf", off)
        if self._staging.nbytes < self._inbuf[1]:
            self.backend.free_host_buffer(self._staging)
            self._staging = self.backend.host_buffer(self._inbuf[1])
        bases = {**(self._weight_ptrs or {}), **self._cache_ptrs}
        for rid, o in arena.offsets.items():
            bases[rid] = self._arena[0] + o
        for r, o, _ in inputs:
            bases[r.id] = self._inbuf[0] + o
        for step in self.steps:
            if isinstance(step, AttentionStep) and step.count_symbol in self._count_index:
                step.count_at = self._inbuf[0] + 4 * self._count_index[step.count_symbol]
        self._place_scratch()
        self._layout = Layout(key, arena, inputs, bases)
        return self._layout

    def _prepare(self, env: Mapping[str, int], key: tuple) -> RunPlan:
        be = self.backend
        if self.counts:  # launches (shared memory) for the capacity; the kernels read the value
            env = {k: self._count_capacity(k, v) if k in self._count_index else v for k, v in env.items()}
        lay = self._ensure_layout(env)
        bases = lay.bases
        memo: dict[Any, int] = {}

        def addr(t: Tensor) -> int:
            r = memory_root(t)
            try:
                base = bases[r.id]
            except KeyError:
                raise BindingError(f"{r!r} has no device memory in this split") from None
            if t.view_src is None:
                return base
            offs = t.view_offs
            if isinstance(offs, int):
                return base + offs
            if offs not in memo:
                memo[offs] = evaluate(offs, env)
            return base + memo[offs]

        inputs = [(r, o, nbytes(r, env), is_input) for r, o, is_input in lay.inputs]
        outputs = [(r, addr(r), nbytes(r, env), bool(r.flags & BOUND)) for r in self.output_roots]
        plan = RunPlan(key, inputs, outputs)
        for i, step in enumerate(self.steps):
            skey = tuple(env[s] for s in self._step_symbols[i])
            cached = self._step_launches[i].get(skey)
            if cached is None:
                cached = [be.prepare(ln.spec, ln.grid, ln.block, ln.shmem, ln.params)
                          for ln in step.launches(env, addr) if 0 not in ln.grid]
                self._step_launches[i][skey] = cached
            plan.launches.extend(cached)
        self._plans[key] = plan
        be.stats.plans_built += 1
        while len(self._plans) > MAX_PLANS:
            _, old = self._plans.popitem(last=False)
            self._destroy(old)
        return plan

    def _place_scratch(self) -> None:
        """Device memory steps keep for themselves across runs (a fused output projection's
        rows per head and its counter), zeroed once; the steps reset what they count."""
        users = [s for s in self.steps if getattr(s, "scratch_bytes", 0)]
        if not users or self._scratch:
            return
        offsets, total = [], 0
        for step in users:
            offsets.append(total)
            total = align(total + step.scratch_bytes)
        self._scratch = self.backend.alloc(total)
        self.backend.driver.memset(self._scratch, 0, total)
        for step, off in zip(users, offsets):
            step.scratch_at = self._scratch + off

    def _device_counts(self) -> tuple[str, ...]:
        """The symbols this split reads from device memory (see the module docstring): in a
        one-token graph with limits, the cache lengths when nothing but fused attention
        steps depends on them and no output's size does."""
        limits = self.backend.limits
        if not self.single:
            return ()
        found: set[str] = set()
        for step, syms in zip(self.steps, self._step_symbols):
            varying = set(syms) - SINGLE_TOKEN_SYMBOLS.keys()
            if not varying:
                continue
            if not isinstance(step, AttentionStep) or varying != {step.count_symbol} or varying - limits.keys():
                return ()
            if step.smem_bytes(limits, step.max_threads) > self.backend.driver.max_shared:
                return ()  # scores for the longest cache would not fit: size per length instead
            found |= varying
        if any(_mentions(r, found) for r in self.output_roots):
            return ()
        return tuple(sorted(found))

    def _count_capacity(self, name: str, value: int) -> int:
        """What launches reading count `name` are sized for: its limit, or the value past it."""
        return max(int(value), self.backend.limits.get(name, 0))

    def _grow(self, attr: str, need: int) -> None:
        ptr, cap = getattr(self, attr)
        if need <= cap and ptr:
            return
        if ptr:
            self.backend.free(ptr)
        new_cap = max(ALIGN, align(int(need * GROWTH)))
        setattr(self, attr, (self.backend.alloc(new_cap), new_cap))

    def _invalidate(self) -> None:
        """Forget everything that holds device addresses (plans, graphs, packed launches)."""
        for plan in self._plans.values():
            self._destroy(plan)
        self._plans.clear()
        for cache in self._step_launches:
            cache.clear()
        self._layout = None

    def _destroy(self, plan: RunPlan) -> None:
        if plan.graph is not None:
            self.backend.driver.graph_destroy(plan.graph)
            plan.graph = None

    def describe(self) -> str:
        return "\n".join(f"{i:4d} {s.label}: {', '.join(k.name for k in s.specs())}"
                         for i, s in enumerate(self.steps))
