"""The CPU backend: LLVM code generation for the host, one native entry function per split,
run by a pool of native-spinning threads (DESIGN.md decision 7)."""
from __future__ import annotations

import logging
import time
from typing import Mapping

import numpy as np

from ggmlpy.codegen_cpu.disk_cache import ObjectCache
from ggmlpy.codegen_cpu.irgen import SYMBOLS
from ggmlpy.codegen_cpu.lowering import LOWERINGS
from ggmlpy.codegen_cpu.program import N_SYM_WORDS, TABLE_WORD, ProgramBuilder, root_of
from ggmlpy.codegen_cpu.runtime import JitModule, ThreadPool
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Flag, Tensor
from ggmlpy.passes.buffers import tensor_nbytes
from ggmlpy.sched.store import TensorStore

log = logging.getLogger("ggmlpy.codegen_cpu")



class CpuBackend:
    name = "cpu"

    def __init__(self, n_threads: int = 2, worst_env: Mapping[str, int] | None = None):
        self.n_threads = n_threads
        self.worst_env = dict(worst_env or {"n_tokens": 512, "n_kv": 4096, "n_outputs": 512, "n_kv_swa": 4096})
        self._pool: ThreadPool | None = None
        self.compile_seconds = 0.0  # of the last compile
        self.native_seconds = 0.0   # inside native graph code, summed over runs (for benchmarks)
        self.object_cache = ObjectCache()

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

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def set_threads(self, n: int) -> None:
        self.n_threads = n

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
        builder = ProgramBuilder(graph, nodes, self.worst_env, produced_elsewhere)
        ir_text = builder.build_ir()
        cached = self.object_cache.load(ir_text)
        module = JitModule(ir_text, object_code=cached)
        if cached is None:
            self.object_cache.store(ir_text, module.object_code)
        split = CpuSplit(self, graph, nodes, builder, module)
        self.compile_seconds = time.perf_counter() - t0
        log.info("compiled %d nodes in %.2f s", len(builder.nodes), self.compile_seconds)
        return split


class CpuSplit:
    def __init__(self, backend: CpuBackend, graph: Graph, nodes: list[Tensor], builder: ProgramBuilder,
                 module: JitModule):
        self.backend = backend
        self.layout = lay = builder.layout
        self.module = module
        self.fn_addr = module.address("graph")
        self.arena = np.zeros(lay.arena_bytes + 64, dtype=np.uint8)
        self.scratch = np.zeros(max(lay.scratch_bytes, 64) + 64, dtype=np.uint8)
        self.barrier = np.zeros(16, dtype=np.int32)
        self.ctx = np.zeros(lay.ctx_words, dtype=np.int64)
        self.ctx[lay.arena_slot] = self.arena.ctypes.data
        n = len(builder.nodes)
        self.table = np.zeros(3 + 6 * n, dtype=np.int64)
        self.table[:3] = (n, self.scratch.ctypes.data, self.barrier.ctypes.data)
        self.rows = self.table[3:].reshape(n, 6)
        self.rows[:, 0] = [module.address(name) for name in builder.kernel_names]
        self.ctx[TABLE_WORD] = self.table.ctypes.data
        slots, self.offsets, self.dynamic = builder.pointer_plan()
        self.used = slots >= 0
        self._weight_slots: list | None = None
        self._other_slots: list = []
        self.slots = np.where(self.used, slots, 0)
        own = {n.id for n in nodes}
        consumers_outside = {s.id for t in graph.tensors if t.id not in own for s in t.src}
        consumers_outside |= {root_of(o).id for o in graph.outputs}
        self.exports = [(t, lay.arena_offsets[t.id]) for t in graph.tensors
                        if t.id in lay.arena_offsets and (t.id in consumers_outside or t.flags & Flag.OUTPUT)]

    def _bind_externals(self, store: TensorStore) -> None:
        """Point the ctx slots at the store's buffers. Weights and KV cache layers never move
        (a compiled graph belongs to one context), so their addresses are looked up once;
        inputs and other splits' results every run."""
        ctx = self.ctx
        if self._weight_slots is None:
            self._weight_slots = []
            self._other_slots = []
            for i, root in enumerate(self.layout.externals):
                if root.flags & (Flag.WEIGHT | Flag.CACHE):
                    data = store.buffer(root)
                    self._weight_slots.append((N_SYM_WORDS + i, data))  # keep the array alive
                    ctx[N_SYM_WORDS + i] = data.ctypes.data
                else:
                    self._other_slots.append((N_SYM_WORDS + i, root))
        for slot, root in self._other_slots:
            ctx[slot] = store.buffer(root).ctypes.data

    def run(self, store: TensorStore, env: Mapping[str, int]) -> None:
        for name in SYMBOLS:
            limit = self.backend.worst_env.get(name)
            value = env.get(name, 0)
            if limit is not None and value > limit:
                raise ValueError(f"{name} = {value} exceeds the compiled limit {limit}")
        ctx = self.ctx
        for i, name in enumerate(SYMBOLS):
            ctx[i] = env.get(name, 0)
        self._bind_externals(store)
        ptrs = np.where(self.used, ctx[self.slots] + self.offsets, 0)
        for i, j, offs in self.dynamic:
            ptrs[i, j] += evaluate(offs, env)
        self.rows[:, 1:] = ptrs
        t0 = time.perf_counter()
        self.backend.pool.run(self.fn_addr, ctx.ctypes.data)
        self.backend.native_seconds += time.perf_counter() - t0
        for t, offset in self.exports:
            store.buffers[t.id] = self.arena[offset:offset + tensor_nbytes(t, env)]
