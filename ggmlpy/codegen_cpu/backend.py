"""The CPU backend: LLVM code generation for the host, one native entry function per split,
run by a pool of native-spinning threads (docs/architecture.md, decision 7)."""
from __future__ import annotations

import concurrent.futures
import functools
import heapq
import itertools
import logging
import os
import threading
import time
from typing import Callable, Mapping

import numpy as np

from ggmlpy.codegen_cpu.object_cache import ObjectCache
from ggmlpy.disk_cache import cache_dir
from ggmlpy.options import Options
from ggmlpy.codegen_cpu.irgen import BARRIER_BYTES, SYMBOLS
from ggmlpy.codegen_cpu.lowering import LOWERINGS
from ggmlpy.codegen_cpu.mapped_rows import MappedRowLookups
from ggmlpy.codegen_cpu.repack import WeightLayouts
from ggmlpy.codegen_cpu.program import (
    N_SYM_WORDS, ROW_WORDS, TABLE_HEADER, TABLE_WORD, CompileUnit, ProgramBuilder, ir_hash,
)
from ggmlpy.codegen_cpu.compile_worker import inprocess_requested
from ggmlpy.codegen_cpu.elf_loader import NativeObject
from ggmlpy.codegen_cpu import runtime
from ggmlpy.codegen_cpu.runtime import JitModule, ThreadPool
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Flag, Tensor, memory_root
from ggmlpy.passes.buffers import tensor_nbytes
from ggmlpy.codegen_cpu.fusion import CPU_RULES, split_groups
from ggmlpy.passes.fusion import ResolvedGroup, Rule
from ggmlpy.passes.pipeline import PIPELINES
from ggmlpy.sched.backend import Backend
from ggmlpy.sched.store import TensorStore

log = logging.getLogger("ggmlpy.codegen_cpu")

# A run that moves less than this (its results, plus the matrices its products read) stays on
# the calling thread: waking a sleeping worker costs tens of microseconds, more than such a run
# takes alone. The embedding lookup in front of a GPU decode (2 KiB) is the case in point.
SMALL_RUN_BYTES = 64 << 10


def run_bytes(nodes: list[Tensor], env: Mapping[str, int], stop_at: int | None = None) -> int:
    """About the memory a run of `nodes` touches: every result, and the whole first operand
    of each product (a weight or a KV cache view). Other ops read about what they write;
    get_rows reads only the rows it returns. With `stop_at`, counting stops once the total
    reaches it: a whole model's graph passes any small threshold at its first weight, and
    counting all its ~8,000 tensors took 30 ms, paid again each time n_kv moved."""
    total = 0
    for node in nodes:
        if OPS[node.op].kind == Kind.VIEW:
            continue
        total += tensor_nbytes(node, env)
        if node.op == "mul_mat":
            total += tensor_nbytes(node.src[0], env)
        if stop_at is not None and total >= stop_at:
            break
    return total


class CpuBackend(Backend):
    name = "cpu"
    is_host = True

    def __init__(self, n_threads: int = 2, worst_env: Mapping[str, int] | None = None,
                 profile: bool | None = None, options: Options | None = None):
        """options: the GGMLPY_* settings (None: Options.from_env(), read now); `profile`,
        when given, wins over options.profile."""
        options = options if options is not None else Options.from_env()
        self.settings = options
        self.n_threads = n_threads
        # profiled graphs time every node (CpuSplit.profile); Options.profile (GGMLPY_PROFILE=1) turns it on
        self.profile = options.profile if profile is None else profile
        self.qdot = options.cpu_qdot  # the quantised dot flavour; None: the host's best
        self.worst_env = dict(worst_env or {"n_tokens": 512, "n_kv": 4096, "n_outputs": 512, "n_kv_swa": 4096})
        self._pool: ThreadPool | None = None
        self.compile_seconds = 0.0  # of the last compile
        self.native_seconds = 0.0   # inside native graph code, summed over runs (for benchmarks)
        self.object_cache = ObjectCache(cache_dir("cpu", options.cache_dir))
        self.ir_builds = 0  # modules whose IR text had to be generated (a warm start: none)
        self.weight_layouts = WeightLayouts()  # repacked weights; shared per model, see share_model_cache
        self._compiles: concurrent.futures.ThreadPoolExecutor | None = None  # LLVM runs, see compile
        # every compile unit (kernel, entry) this backend has, by name (its qdot and profile
        # settings are fixed): (IR sha256, module) futures shared by its splits
        self._units: dict[str, concurrent.futures.Future] = {}
        self._count_lock = threading.Lock()
        # units waiting for a compile thread, costliest first: (-cost, arrival, unit, future)
        self._waiting: list[tuple[float, int, CompileUnit, concurrent.futures.Future]] = []
        self._waiting_lock = threading.Lock()
        self._arrivals = itertools.count()

    def share_model_cache(self, cache: dict) -> None:
        """Keep repacked weights in a cache that lives with the model (Model.backend_cache),
        so every context of a model shares one copy, as ggml's repack buffers."""
        self.weight_layouts = cache.setdefault("cpu.repacked", self.weight_layouts)

    @property
    def pool(self) -> ThreadPool:
        if self._pool is None or self._pool.n_threads != self.n_threads:
            if self._pool is not None:
                self._pool.close()
            self._pool = ThreadPool(self.n_threads)
        return self._pool

    def close(self) -> None:
        """Stop the worker threads (they also stop when the backend is garbage-collected)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._compiles is not None:
            self._compiles.shutdown(wait=False)
            self._compiles = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def set_threads(self, n: int) -> None:
        self.n_threads = n

    def pipeline(self) -> tuple[str, ...]:
        """Every pass: view folding, and the fusion groups its kernels run as one (fusion.py)."""
        return PIPELINES["cpu"]

    def fusion_rules(self) -> tuple[Rule, ...]:
        """The CPU rule set (fusion.py), which the "fusion" pass marks over the graph."""
        return CPU_RULES

    def split_groups(self, graph: Graph, nodes: list[Tensor]) -> tuple[list[Tensor], list[ResolvedGroup]]:
        """The marked groups of this split that a CPU kernel runs as one (fusion.py)."""
        return split_groups(graph, nodes)

    def cache_stats(self) -> dict[str, int]:
        return {"object_cache_hits": self.object_cache.hits, "object_cache_misses": self.object_cache.misses}

    def set_limits(self, worst_env: Mapping[str, int]) -> None:
        """The largest symbol values a run may use (n_ubatch, KV size): arenas are sized so."""
        self.worst_env = dict(worst_env)

    def supports_op(self, node: Tensor) -> bool:
        if OPS[node.op].kind == Kind.VIEW:
            return True
        low = LOWERINGS.get(node.op)
        return low is not None and low.supports(node)

    def compile(self, graph: Graph, nodes: list[Tensor]) -> "CpuSplit":
        t0 = time.perf_counter()
        own = {n.id for n in nodes}
        produced_elsewhere = {t.id for t in graph.tensors if not t.is_leaf and t.id not in own}
        builder = ProgramBuilder(graph, nodes, self.worst_env, produced_elsewhere, self.profile, self.qdot)
        plan = builder.plan_key()
        units = builder.units()
        cached = self.object_cache.load_plan(plan)
        if cached is not None and [name for name, _, _ in cached] == [u.name for u in units]:
            # warm start: no IR text generated at all
            modules = {name: self._loaded_unit(name, sha, data) for name, sha, data in cached}
        else:
            modules = {u.name: self._compiled_unit(u) for u in units}
            remember_when_compiled(modules, functools.partial(self.object_cache.remember_plan, plan))
        split = CpuSplit(self, graph, nodes, builder, modules)
        self.compile_seconds = time.perf_counter() - t0
        pending = sum(not f.done() for f in modules.values())
        log.info("prepared %d nodes (%d compile units) in %.2f s%s", len(builder.nodes), len(units),
                 self.compile_seconds, f" ({pending} compiling in workers)" if pending else "")
        return split

    def _loaded_unit(self, name: str, ir_sha256: str, data: bytes) -> concurrent.futures.Future:
        """A unit found on disk, loaded once per backend (another split may hold it already)."""
        if name not in self._units:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result((ir_sha256, runtime.load_object(data)))
            self._units[name] = done
        return self._units[name]

    def _compiled_unit(self, unit: CompileUnit) -> concurrent.futures.Future:
        """A unit's (IR sha256, loaded module), built at most once per backend and name: the
        kernels a context's graphs share compile once. Off GGMLPY_COMPILE_INPROCESS, the IR is
        built and LLVM runs in worker threads, one compile worker process each, so the units
        compile on every core while this thread goes on (weights are repacked meanwhile)."""
        if unit.name in self._units:
            return self._units[unit.name]
        future: concurrent.futures.Future = concurrent.futures.Future()
        if inprocess_requested():  # LLVM in this process: one unit at a time, now
            future.set_result(self._compile_unit(unit))
        else:
            if self._compiles is None:
                self._compiles = concurrent.futures.ThreadPoolExecutor(
                    compile_threads(), thread_name_prefix="ggmlpy-compile")
            with self._waiting_lock:
                heapq.heappush(self._waiting, (-unit.cost, next(self._arrivals), unit, future))
            self._compiles.submit(self._compile_next)
        self._units[unit.name] = future
        return future

    def _compile_next(self) -> None:
        """Compile the most expensive unit waiting (earliest first among equals): one task is
        submitted per unit, so each runs once, but a costly kernel of the next graph starts
        before the small ones queued ahead of it (the cold start ends with the last unit)."""
        with self._waiting_lock:
            _, _, unit, future = heapq.heappop(self._waiting)
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(self._compile_unit(unit))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits for the unit
            future.set_exception(e)

    def _compile_unit(self, unit: CompileUnit) -> tuple[str, NativeObject | JitModule]:
        ir_text = unit.build_ir()
        with self._count_lock:
            self.ir_builds += 1
        return ir_hash(ir_text), runtime.compile_module(ir_text, self.object_cache)


def remember_when_compiled(units: dict[str, concurrent.futures.Future],
                           remember: Callable[[list[tuple[str, str]]], None]) -> None:
    """Call remember with the units' (name, IR sha256) once every one has compiled (none
    failing): the plan is indexed for the next start even if this process never runs the
    graph (a one-token prompt runs only the decode graph)."""
    left = [len(units)]
    lock = threading.Lock()

    def one_done(_: concurrent.futures.Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        if all(f.exception() is None for f in units.values()):
            remember([(name, f.result()[0]) for name, f in units.items()])

    for future in units.values():
        future.add_done_callback(one_done)


def compile_threads() -> int:
    """How many units compile at once: one per core (a compile worker process each), at
    least 2 so that a unit's IR is built while another's LLVM runs, at most 8."""
    return max(2, min(8, os.cpu_count() or 2))


class CpuSplit:
    def __init__(self, backend: CpuBackend, graph: Graph, nodes: list[Tensor], builder: ProgramBuilder,
                 units: dict[str, concurrent.futures.Future]):
        """`units`: per compile unit, a future of (IR sha256, module); those still compiling
        are waited for at the first run, after binding (and repacking) its weights, so a
        context's graphs compile side by side and beside the first decode's weight
        repacking."""
        self.backend = backend
        self.layout = lay = builder.layout
        self._kernel_names = builder.kernel_names
        self.arena = np.zeros(lay.arena_bytes + 64, dtype=np.uint8)
        self.scratch = np.zeros(max(lay.scratch_bytes, 64) + 64, dtype=np.uint8)
        self.barrier = np.zeros(BARRIER_BYTES // 4, dtype=np.int32)
        self.ctx = np.zeros(lay.ctx_words, dtype=np.int64)
        self.ctx[lay.arena_slot] = self.arena.ctypes.data
        n = len(builder.nodes)
        self.nodes = builder.nodes
        # per thread and node: cycles in the kernel and at the barrier (profiled builds only)
        self.cycles = np.zeros((64, n, 2) if backend.profile else (0, n, 2), dtype=np.int64)
        self.table = np.zeros(TABLE_HEADER + ROW_WORDS * n, dtype=np.int64)
        self.table[:TABLE_HEADER] = (n, self.scratch.ctypes.data, self.barrier.ctypes.data,
                                     self.cycles.ctypes.data)
        self.rows = self.table[TABLE_HEADER:].reshape(n, ROW_WORDS)
        # the symbol values each node's kernel reads, in its order (ProgramBuilder.symbol_plan)
        self._symbol_names, block_starts = builder.symbol_plan()
        self.symbol_values = np.zeros(len(self._symbol_names) + 1, dtype=np.int64)
        self.rows[:, ROW_WORDS - 1] = self.symbol_values.ctypes.data + 8 * block_starts
        self._entry_name = builder.entry_name
        self.modules: dict[str, NativeObject | JitModule] | None = None
        self._compiling: dict[str, concurrent.futures.Future] | None = units
        if all(f.done() for f in units.values()):
            self.wait_compiled()
        self.ctx[TABLE_WORD] = self.table.ctypes.data
        slots, self.offsets, self.dynamic = builder.pointer_plan()
        self.used = slots >= 0
        self._weight_slots: list | None = None   # bound on the first run (_bind_externals)
        self._row_lookups = MappedRowLookups({})  # the same
        self._other_slots: list = []
        self._bound_sources: list = []
        self._ctx_addr = self.ctx.ctypes.data
        # what the symbol words, exported views and pointer table were last computed for
        self._env_key: tuple | None = None
        self._env_limits: dict | None = None
        self._rows_key: tuple | None = None
        self._exported: list = []
        self._n_threads: int | None = None  # per env: 1 for a small run (SMALL_RUN_BYTES)
        self._work_nodes = list(nodes)
        self.slots = np.where(self.used, slots, 0)
        own = {n.id for n in nodes}
        # (by memory root: a view this split holds may be read by another split, which then
        # reads the memory behind it)
        consumers_outside = {memory_root(s).id for t in graph.tensors if t.id not in own for s in t.src}
        consumers_outside |= {memory_root(o).id for o in graph.outputs}
        self.exports = [(t, lay.arena_offsets[t.id]) for t in graph.tensors
                        if t.id in lay.arena_offsets and (t.id in consumers_outside or t.flags & Flag.OUTPUT)]

    def wait_compiled(self) -> None:
        """Block until every unit is loaded (re-raising a compile's error, if any), then
        point the node table at the kernels."""
        if self._compiling is None:
            return
        done = {name: f.result() for name, f in self._compiling.items()}
        self._compiling = None
        self.modules = {name: module for name, (_, module) in done.items()}
        self.fn_addr = self.modules[self._entry_name].address(self._entry_name)
        self.rows[:, 0] = [self.modules[name].address(name) for name in self._kernel_names]

    def profile(self) -> list[tuple[Tensor, np.ndarray]]:
        """Per node, cycles (summed over runs since the last reset) per thread: an array
        [n_threads, 2] of time in the kernel and time waiting at the barrier after it (empty
        unless the backend was created with profile=True, or Options.profile: GGMLPY_PROFILE=1)."""
        nth = self.backend.n_threads
        return [(node, self.cycles[:nth, i]) for i, node in enumerate(self.nodes)]

    def reset_profile(self) -> None:
        self.cycles[:] = 0

    def _bind_externals(self, store: TensorStore) -> bool:
        """Point the ctx slots at the store's buffers. Weights and KV cache layers never move
        (a compiled graph belongs to one context), so their addresses are looked up once;
        inputs and other splits' results every run, but a slot is rewritten only when its
        array is not the one bound last time (the context keeps its input arrays). Returns
        whether a slot changed; a change also drops the pointer table computed by `run`."""
        ctx = self.ctx
        if self._weight_slots is None:
            weight_slots, other_slots, tables = [], [], {}
            self.backend.weight_layouts.prepare(
                [(root, store.buffer(root)) for root, packed in self.layout.externals if packed],
                self.backend.n_threads)
            for i, (root, packed) in enumerate(self.layout.externals):
                if root.flags & (Flag.WEIGHT | Flag.CACHE):
                    data = store.buffer(root)
                    if packed:  # the CPU backend's own layout of this weight (repack.py)
                        data = self.backend.weight_layouts.get(root, data)
                    else:
                        tables[root.id] = data
                    weight_slots.append((N_SYM_WORDS + i, data))  # keep the array alive
                    ctx[N_SYM_WORDS + i] = data.ctypes.data
                else:
                    other_slots.append((N_SYM_WORDS + i, root))
            # per other slot, the array bound last (held, so its memory cannot be reused)
            self._bound_sources = [None] * len(other_slots)
            self._weight_slots, self._other_slots = weight_slots, other_slots
            # get_rows' file-mapped tables are read from private copies of their rows
            self._row_lookups = lookups = MappedRowLookups.of(self.nodes, tables)
            for i, (root, packed) in enumerate(self.layout.externals):
                if root.id in lookups.tables and not packed:
                    ctx[N_SYM_WORDS + i] = lookups.tables[root.id].address
        sources = self._bound_sources
        changed = False
        for k, (slot, root) in enumerate(self._other_slots):
            src = store.source(root)
            if src is None or src is not sources[k]:
                ctx[slot] = store.buffer(root).ctypes.data  # raises if nothing is bound
                sources[k] = src
                self._rows_key = None
                changed = True
        return changed

    def run(self, store: TensorStore, env: Mapping[str, int]) -> None:
        # The symbol words, the node pointers and the exported views depend only on env and
        # the bound buffers: from one decode step to the next usually neither changes, so
        # they are recomputed only when env (or a buffer) differs from the last run's.
        env_key = tuple(env.items())
        limits = self.backend.worst_env
        ctx = self.ctx
        if env_key != self._env_key or limits != self._env_limits:
            for name in SYMBOLS:
                limit = limits.get(name)
                value = env.get(name, 0)
                if limit is not None and value > limit:
                    raise ValueError(f"{name} = {value} exceeds the compiled limit {limit}")
            self.symbol_values[:len(self._symbol_names)] = [env.get(name, 0) for name in self._symbol_names]
            self._exported = [(t.id, self.arena[offset:offset + tensor_nbytes(t, env)])
                              for t, offset in self.exports]
            small = run_bytes(self._work_nodes, env, stop_at=SMALL_RUN_BYTES) < SMALL_RUN_BYTES
            self._n_threads = 1 if small else None
            self._env_key, self._env_limits = env_key, dict(limits)
        if self._bind_externals(store) or self._rows_key != env_key:
            ptrs = np.where(self.used, ctx[self.slots] + self.offsets, 0)
            for i, j, offs in self.dynamic:
                ptrs[i, j] += evaluate(offs, env)
            self.rows[:, 1:ROW_WORDS - 1] = ptrs
            self._rows_key = env_key
        self.wait_compiled()
        self._row_lookups.fill(store, env)
        t0 = time.perf_counter()
        try:
            self.backend.pool.run(self.fn_addr, self._ctx_addr, self._n_threads)
        finally:
            self._row_lookups.release()
        self.backend.native_seconds += time.perf_counter() - t0
        buffers = store.buffers
        for tid, view in self._exported:
            buffers[tid] = view
