"""One compiled split: every node's kernel plus the entry function that runs them in order.

    void graph(ptr ctx, i32 ith, i32 nth)

`ctx` (int64 words) holds the address of the node table, then one pointer per external
buffer (weights, KV cache layers, inputs, tensors computed by another split), then the
arena. The node table (built per run from a static plan: a few numpy operations) gives every
node its kernel address, operand pointers and the block of symbol values its kernel reads
(in the kernel's own order, lowering.kernel_signature), so the module holds only the
distinct kernels and LLVM never sees a 1,000-call function. Intermediate tensors live at fixed offsets in the arena, planned
for the worst case (n_ubatch tokens, a full KV cache), so the same machine code serves
every ubatch.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
from pathlib import Path
from dataclasses import dataclass
from typing import Callable, Mapping

import llvmlite.ir as ir
import numpy as np

from ggmlpy.codegen_cpu import kernels as _kernels  # noqa: F401  (fills the lowering table)
from ggmlpy.codegen_cpu.kernels import extent, softmax
from ggmlpy.codegen_cpu.irgen import KernelBuilder, barrier_ir, declare_barrier
from ggmlpy.codegen_cpu.fusion import CpuFusion
from ggmlpy.codegen_cpu.lowering import LOWERINGS, kernel_signatures
from ggmlpy.codegen_cpu.repack import operand_repacked
from ggmlpy.codegen_cpu.target import host
from ggmlpy.disk_cache import source_digest
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops import OPS, Kind
from ggmlpy.passes.buffers import plan_buffers
from ggmlpy.ir.symbolic import Dim, SymExpr
from ggmlpy.ir.tensor import Tensor, memory_root

log = logging.getLogger("ggmlpy.codegen_cpu")

TABLE_WORD = 0     # ctx's first word: the node table's address
N_SYM_WORDS = 1    # ctx words before the externals (the table's address)
TABLE_HEADER = 4   # node count, scratch, barrier, profile buffer; then ROW_WORDS per node
ROW_WORDS = 9      # kernel, dst, src0..src5 (irgen.MAX_SRC), the node's symbol values
ENTRY_NAMES = {False: "graph", True: "graph_profiled"}   # the entry function, by profile


def _external_key(node: Tensor, j: int, root: Tensor) -> tuple[int, bool]:
    """Operand j of node (0: the node itself): its root and whether it is read repacked, so
    a weight read both ways (a tied embedding) gets two slots."""
    return root.id, j > 0 and operand_repacked(node, j - 1)


# Roughly how long LLVM takes over a kernel of each op, relative (SmolLM2's units on a 2 GHz
# Zen 1: the fused attention 1.1 s, the gated FFN product 1.0 s ... a copy 0.03 s). A cold
# start compiles the most expensive waiting unit first (CpuBackend._compile_next): started
# in graph order, the costliest kernels queued behind many small ones and finished last.
COMPILE_COST: dict[str, float] = {
    "mul_mat_soft_max": 11, "mul_mat_glu": 10, "mul_mat_id_glu": 10, "mul_mat": 6, "mul_mat_id": 6, "mul_mat_add": 5,
    "rope_pair": 3, "get_rows": 3, "rms_norm_mul": 2, "set_rows": 1.5,
}


@dataclass(frozen=True)
class CompileUnit:
    """One module for LLVM: its one exported symbol, how to build its IR text (only on a
    cache miss), and its expected compile cost (COMPILE_COST, 1 by default)."""
    name: str
    build_ir: Callable[[], str]
    cost: float = 1.0


def kernel_name(key: str, op: str) -> str:
    """A kernel's symbol, from its key: the same kernel has the same name, hence the same IR
    text and the same object in the disk cache, in every graph that uses it."""
    return f"k_{hashlib.sha256(key.encode()).hexdigest()[:20]}_{op}"


def kernel_module_ir(node: Tensor, name: str, qdot: str | None, symbols: tuple[str, ...]) -> str:
    """The module holding node's kernel alone, with its own (internal) copy of the barrier."""
    module = ir.Module(name=name)
    module.triple = host().triple
    declare_barrier(module)
    kb = KernelBuilder(module, name, qdot, symbols)
    LOWERINGS[node.op].emit(kb, node)
    kb.finish()
    kb.fn.linkage = "external"
    text = str(module).replace('declare void @"ggmlpy_barrier"(ptr %".1", i32 %".2")', "")
    return text + barrier_ir(module.triple)


def entry_module_ir(profile: bool) -> str:
    """The module of the entry function (ENTRY_IR, or the timed PROFILED_ENTRY_IR), which
    calls the kernels through the node table and so links against none of them."""
    entry = PROFILED_ENTRY_IR if profile else ENTRY_IR
    for name, value in (("TABLE_WORD", TABLE_WORD), ("TABLE_HEADER", TABLE_HEADER), ("ROW_WORDS", ROW_WORDS),
                        ("ENTRY_NAME", ENTRY_NAMES[profile])):
        entry = entry.replace(name, str(value))
    triple = host().triple
    return f'target triple = "{triple}"\n' + barrier_ir(triple) + entry


@dataclass
class ProgramLayout:
    externals: list[tuple[Tensor, bool]]  # roots whose memory comes from the store, by ctx
                                          # slot; True: in the repacked layout (repack.py)
    arena_offsets: dict[int, int]    # root id -> byte offset in the arena
    arena_bytes: int
    scratch_bytes: int

    @property
    def arena_slot(self) -> int:
        return N_SYM_WORDS + len(self.externals)

    @property
    def ctx_words(self) -> int:
        return self.arena_slot + 1


class ProgramBuilder:
    """Lowers `nodes` (one split of a graph) to an LLVM module."""

    def __init__(self, graph: Graph, nodes: list[Tensor], worst_env: Mapping[str, int],
                 produced_elsewhere: set[int], profile: bool = False, qdot: str | None = None):
        """qdot: the quantised dot flavour of every kernel (Options.cpu_qdot); None: the
        default (kernels/qvec.flavour()), fixed here so plan key and IR text agree."""
        from ggmlpy.codegen_cpu.kernels.qvec import flavour

        self.profile = profile
        self.qdot = qdot if qdot is not None else flavour()
        own = {n.id for n in nodes}   # (a fused kernel may write a member it replaced)
        fusion = CpuFusion(graph, nodes)
        nodes = fusion.apply(nodes)
        self.nodes = [n for n in nodes if n.op not in OPS or OPS[n.op].kind != Kind.VIEW]
        signatures = kernel_signatures(self.nodes)
        self.kernel_keys = [key for key, _ in signatures]   # what makes kernels shared
        self.kernel_symbols = [symbols for _, symbols in signatures]  # per node, in its kernel's order
        self.worst_env = dict(worst_env)
        externals: dict[tuple[int, bool], Tensor] = {}
        arena_roots: set[int] = set()
        for n in nodes:
            for j, t in enumerate((n, *n.src)):
                r = memory_root(t)
                if r.is_leaf or r.id in produced_elsewhere or r.id not in own:
                    externals.setdefault(_external_key(n, j, r), r)
                else:
                    arena_roots.add(r.id)
        # the buffer planning pass (ggml-alloc style) places every computed tensor; the groups
        # this backend runs as one kernel (fusion.py) are one step, the rest run node by node
        plan = plan_buffers(graph, self.worst_env, fused=fusion.runs_fused)
        offsets = {rid: plan.offsets[rid] for rid in arena_roots}
        scratch = max([LOWERINGS[n.op].scratch_bytes(n, self.worst_env) for n in self.nodes] + [0])
        self.layout = ProgramLayout([(r, key[1]) for key, r in externals.items()], offsets,
                                    max(plan.arena_size, 64), scratch)

    def _plan_kernels(self) -> dict[str, Tensor]:
        """Each distinct kernel (by kernel_key) with the first node using it, in order; per
        node the name of the kernel it calls (`kernel_names`) and its key (`kernel_keys`)."""
        kernels: dict[str, Tensor] = {}
        names: dict[str, str] = {}
        self.kernel_names: list[str] = []
        self._emit_symbols: dict[str, tuple[str, ...]] = {}   # per key, the emitting node's symbols
        for key, symbols, node in zip(self.kernel_keys, self.kernel_symbols, self.nodes):
            if key not in kernels:
                kernels[key] = node
                names[key] = kernel_name(key, node.op)
                self._emit_symbols[key] = symbols
            self.kernel_names.append(names[key])
        return kernels

    def plan_key(self) -> str:
        """What the module's IR text is a function of, without generating it: the kernel
        keys per node, the entry variant, the host and the code generator's own source. A warm
        start looks the object code up by this key (object_cache.ObjectCache.load_plan), so it
        does not spend a second building IR text only to hash it."""
        self._plan_kernels()
        text = json.dumps([generator_version(), generator_switches(), host().triple, self.qdot, self.profile,
                           TABLE_WORD, TABLE_HEADER, ROW_WORDS, self.kernel_keys])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def units(self) -> list[CompileUnit]:
        """What LLVM compiles, one module each: the entry function, then every distinct kernel
        (each with the symbols its first node reads, in the key's order). Separate modules
        compile side by side on every core, and a kernel two graphs share (named by its key)
        compiles once and is one object in the disk cache."""
        kernels = self._plan_kernels()
        out = [CompileUnit(self.entry_name, functools.partial(entry_module_ir, self.profile))]
        for key, node in kernels.items():
            name = kernel_name(key, node.op)
            out.append(CompileUnit(name, functools.partial(
                kernel_module_ir, node, name, self.qdot, self._emit_symbols[key]), COMPILE_COST.get(node.op, 1.0)))
        return out

    @property
    def entry_name(self) -> str:
        return ENTRY_NAMES[self.profile]

    def symbol_plan(self) -> tuple[list[str], np.ndarray]:
        """The symbol blocks: the names whose values fill them, block after block (one block
        per distinct order a kernel reads them in), and per node the word its block starts at."""
        starts: dict[tuple[str, ...], int] = {}
        names: list[str] = []
        for symbols in self.kernel_symbols:
            if symbols not in starts:
                starts[symbols] = len(names)
                names.extend(symbols)
        return names, np.array([starts[s] for s in self.kernel_symbols], dtype=np.int64)

    def pointer_plan(self) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, Dim]]]:
        """Per node and operand (dst, src0..src5): which base pointer (ctx word) and which
        static byte offset; symbolic view offsets are listed separately, evaluated per run."""
        lay = self.layout
        slot_of = {(r.id, packed): N_SYM_WORDS + i for i, (r, packed) in enumerate(lay.externals)}
        slots = np.full((len(self.nodes), ROW_WORDS - 2), -1, dtype=np.int64)
        offs = np.zeros((len(self.nodes), ROW_WORDS - 2), dtype=np.int64)
        dynamic: list[tuple[int, int, Dim]] = []
        for i, node in enumerate(self.nodes):
            for j, t in enumerate((node, *node.src)):
                r = memory_root(t)
                key = _external_key(node, j, r)
                if key in slot_of:
                    slots[i, j] = slot_of[key]
                else:
                    slots[i, j] = lay.arena_slot
                    offs[i, j] = lay.arena_offsets[r.id]
                if t.view_src is not None:
                    if isinstance(t.view_offs, SymExpr):
                        dynamic.append((i, j, t.view_offs))
                    else:
                        offs[i, j] += t.view_offs
        return slots, offs, dynamic


# The entry function: node i calls table[i].fn(table[i].ptr[0..6], table[i].syms, scratch,
# barrier, ith, nth), then waits at the barrier. table rows are ROW_WORDS (9) words: fn, dst,
# src0..src5, the address of the node's symbol values (the kernel's `ctx` argument).
# ctx words: the table address (TABLE_WORD), the externals, the arena; the table starts with
# the node count, the scratch and barrier addresses and the profile buffer's address (used
# by PROFILED_ENTRY_IR only).
ENTRY_IR = r"""
define void @ENTRY_NAME(ptr %ctx, i32 %ith, i32 %nth) {
entry:
  %tab_pp = getelementptr i64, ptr %ctx, i64 TABLE_WORD
  %tab_i = load i64, ptr %tab_pp, align 8
  %tab = inttoptr i64 %tab_i to ptr
  %n = load i64, ptr %tab, align 8
  %nodes = getelementptr i64, ptr %tab, i64 TABLE_HEADER
  %sc_pp = getelementptr i64, ptr %tab, i64 1
  %sc_i = load i64, ptr %sc_pp, align 8
  %scratch = inttoptr i64 %sc_i to ptr
  %ba_pp = getelementptr i64, ptr %tab, i64 2
  %ba_i = load i64, ptr %ba_pp, align 8
  %barrier = inttoptr i64 %ba_i to ptr
  br label %head
head:
  %i = phi i64 [0, %entry], [%i1, %body]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %body, label %done
body:
  %row = mul i64 %i, ROW_WORDS
  %rp = getelementptr i64, ptr %nodes, i64 %row
  %fn = load ptr, ptr %rp, align 8
  %p0 = getelementptr i64, ptr %rp, i64 1
  %d = load ptr, ptr %p0, align 8
  %p1 = getelementptr i64, ptr %rp, i64 2
  %s0 = load ptr, ptr %p1, align 8
  %p2 = getelementptr i64, ptr %rp, i64 3
  %s1 = load ptr, ptr %p2, align 8
  %p3 = getelementptr i64, ptr %rp, i64 4
  %s2 = load ptr, ptr %p3, align 8
  %p4 = getelementptr i64, ptr %rp, i64 5
  %s3 = load ptr, ptr %p4, align 8
  %p5 = getelementptr i64, ptr %rp, i64 6
  %s4 = load ptr, ptr %p5, align 8
  %p6 = getelementptr i64, ptr %rp, i64 7
  %s5 = load ptr, ptr %p6, align 8
  %p7 = getelementptr i64, ptr %rp, i64 8
  %syms = load ptr, ptr %p7, align 8
  call void %fn(ptr %d, ptr %s0, ptr %s1, ptr %s2, ptr %s3, ptr %s4, ptr %s5,
                ptr %syms, ptr %scratch, ptr %barrier, i32 %ith, i32 %nth)
  call void @ggmlpy_barrier(ptr %barrier, i32 %nth)
  %i1 = add i64 %i, 1
  br label %head
done:
  ret void
}
"""


# The same walk, timed: per thread and node, cycles in the kernel and cycles waiting at the
# barrier after it are added to the profile buffer (int64[nth][n][2]); see CpuSplit.profile.
PROFILED_ENTRY_IR = ENTRY_IR.replace("""  br label %head
head:""", """  %pr_pp = getelementptr i64, ptr %tab, i64 3
  %pr_i = load i64, ptr %pr_pp, align 8
  %prof = inttoptr i64 %pr_i to ptr
  %ith64 = sext i32 %ith to i64
  %pbase = mul i64 %ith64, %n
  br label %head
head:""").replace("""  call void %fn(ptr %d""", """  %c0 = call i64 @llvm.readcyclecounter()
  call void %fn(ptr %d""").replace("""  call void @ggmlpy_barrier(ptr %barrier, i32 %nth)
""", """  %c1 = call i64 @llvm.readcyclecounter()
  call void @ggmlpy_barrier(ptr %barrier, i32 %nth)
  %c2 = call i64 @llvm.readcyclecounter()
  %pi = add i64 %pbase, %i
  %pw = mul i64 %pi, 2
  %pk = getelementptr i64, ptr %prof, i64 %pw
  %k0 = load i64, ptr %pk, align 8
  %dk = sub i64 %c1, %c0
  %k1 = add i64 %k0, %dk
  store i64 %k1, ptr %pk, align 8
  %pb = getelementptr i64, ptr %pk, i64 1
  %b0 = load i64, ptr %pb, align 8
  %db = sub i64 %c2, %c1
  %b1 = add i64 %b0, %db
  store i64 %b1, ptr %pb, align 8
""") + "declare i64 @llvm.readcyclecounter()\n"


@functools.lru_cache(maxsize=1)
def generator_version() -> str:
    """A hash of the code that turns graphs into IR (this package and ggmlpy.ir): any edit to
    it changes every plan key, so a plan never maps to IR an older generator wrote."""
    here = Path(__file__).resolve().parent
    return source_digest(here, here.parent / "ir", extra=importlib.metadata.version("llvmlite"))


def generator_switches() -> list[bool]:
    """The code generator's switches that tests turn off to compare against (the attention
    kernels' skipping): the source hash cannot see them, and a plan key without them would
    find the other setting's object code in the disk cache."""
    return [softmax.SKIP_HIDDEN_KEYS, extent.TILES_APART]


def ir_hash(ir_text: str) -> str:
    return hashlib.sha256(ir_text.encode()).hexdigest()

