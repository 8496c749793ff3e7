"""The CPU backend: LLVM code generation for the host, one native entry function per split,
run by a pool of native-spinning threads (DESIGN.md decision 7)."""
from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Mapping

import numpy as np

from ggmlpy.codegen_cpu.object_cache import ObjectCache
from ggmlpy.disk_cache import cache_dir
from ggmlpy.options import Options
from ggmlpy.codegen_cpu.irgen import SYMBOLS
from ggmlpy.codegen_cpu.lowering import LOWERINGS
from ggmlpy.codegen_cpu.repack import WeightLayouts
from ggmlpy.codegen_cpu.program import N_SYM_WORDS, TABLE_HEADER, TABLE_WORD, ProgramBuilder
from ggmlpy.codegen_cpu.elf_loader import NativeObject
from ggmlpy.codegen_cpu.runtime import JitModule, ThreadPool
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Flag, Tensor, memory_root
from ggmlpy.passes.buffers import tensor_nbytes
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
        from ggmlpy.codegen_cpu.compile_worker import inprocess_requested
        from ggmlpy.codegen_cpu.runtime import compile_module, load_object  # cache, worker, ELF loader

        plan = builder.plan_key()
        cached = self.object_cache.load_plan(plan)
        if cached is not None:  # warm start: no IR text generated at all
            module = load_object(cached)
        else:
            ir_text = builder.build_ir()
            self.ir_builds += 1

            def compile_and_remember() -> NativeObject | JitModule:
                module = compile_module(ir_text, self.object_cache)
                self.object_cache.remember_plan(plan, ir_text)
                return module

            if inprocess_requested():  # LLVM in this process: one module at a time
                module = compile_and_remember()
            else:  # LLVM runs in a worker process while this one goes on (see CpuSplit)
                if self._compiles is None:
                    self._compiles = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="ggmlpy-compile")
                module = self._compiles.submit(compile_and_remember)
        split = CpuSplit(self, graph, nodes, builder, module)
        self.compile_seconds = time.perf_counter() - t0
        log.info("prepared %d nodes in %.2f s%s", len(builder.nodes), self.compile_seconds,
                 " (LLVM compiling in a worker)" if isinstance(module, concurrent.futures.Future) else "")
        return split


class CpuSplit:
    def __init__(self, backend: CpuBackend, graph: Graph, nodes: list[Tensor], builder: ProgramBuilder,
                 module: NativeObject | JitModule | concurrent.futures.Future):
        """`module` may still be compiling (a Future): the first run waits for it, after
        binding (and repacking) its weights, so a context's graphs compile side by side and
        beside the first decode's weight repacking."""
        self.backend = backend
        self.layout = lay = builder.layout
        self._kernel_names = builder.kernel_names
        self.arena = np.zeros(lay.arena_bytes + 64, dtype=np.uint8)
        self.scratch = np.zeros(max(lay.scratch_bytes, 64) + 64, dtype=np.uint8)
        self.barrier = np.zeros(16, dtype=np.int32)
        self.ctx = np.zeros(lay.ctx_words, dtype=np.int64)
        self.ctx[lay.arena_slot] = self.arena.ctypes.data
        n = len(builder.nodes)
        self.nodes = builder.nodes
        # per thread and node: cycles in the kernel and at the barrier (profiled builds only)
        self.cycles = np.zeros((64, n, 2) if backend.profile else (0, n, 2), dtype=np.int64)
        self.table = np.zeros(TABLE_HEADER + 6 * n, dtype=np.int64)
        self.table[:TABLE_HEADER] = (n, self.scratch.ctypes.data, self.barrier.ctypes.data,
                                     self.cycles.ctypes.data)
        self.rows = self.table[TABLE_HEADER:].reshape(n, 6)
        self.module: NativeObject | JitModule | None = None
        self._compiling: concurrent.futures.Future | None = None
        if isinstance(module, concurrent.futures.Future):
            self._compiling = module
        else:
            self._load(module)
        self.ctx[TABLE_WORD] = self.table.ctypes.data
        slots, self.offsets, self.dynamic = builder.pointer_plan()
        self.used = slots >= 0
        self._weight_slots: list | None = None   # bound on the first run (_bind_externals)
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
        consumers_outside = {s.id for t in graph.tensors if t.id not in own for s in t.src}
        consumers_outside |= {memory_root(o).id for o in graph.outputs}
        self.exports = [(t, lay.arena_offsets[t.id]) for t in graph.tensors
                        if t.id in lay.arena_offsets and (t.id in consumers_outside or t.flags & Flag.OUTPUT)]

    def _load(self, module: NativeObject | JitModule) -> None:
        self.module = module
        self.fn_addr = module.address("graph")
        self.rows[:, 0] = [module.address(name) for name in self._kernel_names]

    def wait_compiled(self) -> None:
        """Block until the module is loaded (re-raising the compile's error, if any)."""
        if self._compiling is not None:
            module = self._compiling.result()
            self._compiling = None
            self._load(module)

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
            weight_slots, other_slots = [], []
            self.backend.weight_layouts.prepare(
                [(root, store.buffer(root)) for root, packed in self.layout.externals if packed],
                self.backend.n_threads)
            for i, (root, packed) in enumerate(self.layout.externals):
                if root.flags & (Flag.WEIGHT | Flag.CACHE):
                    data = store.buffer(root)
                    if packed:  # the CPU backend's own layout of this weight (repack.py)
                        data = self.backend.weight_layouts.get(root, data)
                    weight_slots.append((N_SYM_WORDS + i, data))  # keep the array alive
                    ctx[N_SYM_WORDS + i] = data.ctypes.data
                else:
                    other_slots.append((N_SYM_WORDS + i, root))
            # per other slot, the array bound last (held, so its memory cannot be reused)
            self._bound_sources = [None] * len(other_slots)
            self._weight_slots, self._other_slots = weight_slots, other_slots
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
            for i, name in enumerate(SYMBOLS):
                ctx[i] = env.get(name, 0)
            self._exported = [(t.id, self.arena[offset:offset + tensor_nbytes(t, env)])
                              for t, offset in self.exports]
            small = run_bytes(self._work_nodes, env, stop_at=SMALL_RUN_BYTES) < SMALL_RUN_BYTES
            self._n_threads = 1 if small else None
            self._env_key, self._env_limits = env_key, dict(limits)
        if self._bind_externals(store) or self._rows_key != env_key:
            ptrs = np.where(self.used, ctx[self.slots] + self.offsets, 0)
            for i, j, offs in self.dynamic:
                ptrs[i, j] += evaluate(offs, env)
            self.rows[:, 1:] = ptrs
            self._rows_key = env_key
        self.wait_compiled()
        t0 = time.perf_counter()
        self.backend.pool.run(self.fn_addr, self._ctx_addr, self._n_threads)
        self.backend.native_seconds += time.perf_counter() - t0
        buffers = store.buffers
        for tid, view in self._exported:
            buffers[tid] = view
