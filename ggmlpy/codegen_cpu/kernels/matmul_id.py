"""mul_mat_id on quantised expert weights: each token's products with the experts it
selected (ggml_mul_mat_id; the experts `as` [K, M, n_expert] stay in the file's layout).

Phase 1 quantises the input rows (n_b per token) into scratch as the weight type's
activations, then a barrier. A model's experts are kept repacked (repack.experts_repacked:
each expert's matrix as a 2-D weight's, one after the other); for them thread 0 also sorts
the (token, slot) pairs by expert in phase 1 (a counting sort, pairs in order within an
expert, as ggml's CPU backend groups its rows), and phase 2 walks the experts: an expert
chosen by c pairs has this thread's 16-row groups multiplied with those c activation rows
in kernels/qrepacked.py's tiles of up to 4, so a prompt reads each selected expert's
weights once, as a decode step does. Every pair's arithmetic is the same whatever its tile,
so the results do not depend on how the tokens group. Other experts (M not whole groups,
weights computed at run time) take matmul.Tiler's one-token tiles pair by pair. F32, F16
and BF16 experts (no 8-bit activations, as ggml's CPU backend computes them) take a vector
dot per (pair, weight row), the rows split over the threads.

mul_mat_id_glu (the expert_glu_product fusion group, codegen_cpu/fusion.py) is an expert
FFN's gate and up products and their GLU in one kernel: one quantisation of x, one sort, and
per expert and group both weights against the same activation tiles, the GLU's formula
applied as each pair of result vectors is stored (the same f32 values as the three nodes).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import llvmlite.ir as ir

from ggmlpy.codegen_cpu import repack
from ggmlpy.codegen_cpu.irgen import I32, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.matmul import FLOAT, QUANT, Tiler, activation_bytes
from ggmlpy.codegen_cpu.kernels.qact import ALIGN, aligned_scratch, quantize_rows
from ggmlpy.codegen_cpu.kernels.qdot import KINDS
from ggmlpy.codegen_cpu.kernels.qrepacked import RepackedMatmul
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size


# An expert's rows are claimed in this many runs: long contiguous streams. Against qrepacked's
# 16 chunks of a few groups, a decode step of the 24-layer Qwen3-30B-A3B-shaped file went
# 28.6 -> 31.5-32.2 tok/s at 57-62 GB/s and 25.3-26.4 -> 26.9-27.1 at 34-36 GB/s (2
# threads, ggmlpy bench alternated in one run); quarters measured the same as halves.
RUNS_PER_EXPERT = 2


def _supported(node: Tensor) -> bool:
    w, x, ids = node.src
    weights = w.type in FLOAT and w.nb[0] == type_size(w.type) or (
        w.type in QUANT and isinstance(w.ne[0], int) and w.ne[0] % KINDS[w.type].fmt.block == 0)
    return (weights and w.ne[3] == 1 and x.type == GGMLType.F32 and x.is_contiguous and ids.type == GGMLType.I32
            and node.type == GGMLType.F32 and node.is_contiguous)


def _scratch(node: Tensor, env: dict) -> int:
    if node.src[0].type in FLOAT:
        return 0
    """The quantised activations, then (repacked experts) the pairs sorted by expert, each
    expert's first position in that order, its count and the chosen experts (i32)."""
    w, _, ids = node.src
    n_pairs = evaluate(ids.ne[0], env) * evaluate(ids.ne[1], env)
    return activation_bytes(w, node.src[1], env) + ALIGN + 4 * (n_pairs + 3 * evaluate(w.ne[2], env) + 2)


class _ExpertTiler(Tiler):
    """Tiler over (token, slot) pairs p = t * n_used + u: the result row p (dst is
    [M, n_used, n_tokens], contiguous), the weights of expert ids[u, t], the activations of
    input row t * n_b + u % n_b. `node` is a mul_mat_id (w, x, ids); its ids are the kernel
    argument ids_arg."""

    def __init__(self, kb: KernelBuilder, node: Tensor, base: ir.Value, ids_arg: str = "src2"):
        super().__init__(kb, node, KINDS[node.src[0].type], base)
        w, x, ids = node.src
        self.ids_arg = ids_arg
        b = kb.b
        self.n_used, self.n_b = kb.dim(ids.ne[0]), kb.dim(x.ne[1])
        self.ids_nb = (kb.dim(ids.nb[0]), kb.dim(ids.nb[1]))
        self.expert_stride, self.n_expert = kb.dim(w.nb[2]), kb.dim(w.ne[2])
        self.n_pairs = b.mul(self.n_used, kb.dim(ids.ne[1]))

    def _slot(self, p: ir.Value) -> tuple[ir.Value, ir.Value]:
        b = self.kb.b
        return b.sdiv(p, self.n_used), b.srem(p, self.n_used)

    def expert(self, p: ir.Value) -> ir.Value:
        """The expert id of pair p, as i64. An id outside [0, n_expert) (never from
        argsort_top_k) reads the nearest expert rather than memory outside the weights
        (ggml asserts)."""
        kb, b = self.kb, self.kb.b
        t, u = self._slot(p)
        at = b.add(b.mul(u, self.ids_nb[0]), b.mul(t, self.ids_nb[1]))
        expert = b.sext(b.load(kb.byte_ptr(kb.arg(self.ids_arg), at), typ=I32, align=4), ir.IntType(64))
        expert = b.select(b.icmp_signed("<", expert, i64(0)), i64(0), expert)
        return b.select(b.icmp_signed(">=", expert, self.n_expert), b.sub(self.n_expert, i64(1)), expert)

    def weights(self, p: ir.Value) -> ir.Value:
        return self.kb.byte_ptr(self.kb.arg("src0"), self.kb.b.mul(self.expert(p), self.expert_stride))

    def act_row(self, p: ir.Value) -> ir.Value:
        kb, b = self.kb, self.kb.b
        t, u = self._slot(p)
        row = b.add(b.mul(t, self.n_b), b.srem(u, self.n_b))
        return kb.byte_ptr(self.base, b.mul(row, i64(self.act_stride)))

    def emit(self) -> None:
        kb = self.kb
        start, end = kb.thread_range(kb.dim(self.node.src[0].ne[1]))
        with kb.loop(i64(0), self.n_pairs, "pair") as p:
            self._rows(start, end, self.kind.single_rows, 1, p, kb.b.add(p, i64(1)))

    def sort_pairs(self, order: ir.Value, first: ir.Value) -> None:
        """Thread 0: order[] = the pairs sorted by expert (stable), first[e] = where expert
        e's pairs start in it (first[n_expert] = n_pairs); after it the counts (n_expert),
        the experts chosen at least once in id order (n_expert) and their number."""
        kb, b = self.kb, self.kb.b
        n_expert = self.n_expert
        at = (lambda base, i: kb.elem_ptr(base, i, I32))
        cursor = kb.elem_ptr(first, b.add(n_expert, i64(1)), I32)
        with kb.if_then(b.icmp_signed("==", kb.ith, i64(0))):
            with kb.loop(i64(0), n_expert, "e") as e:
                b.store(ir.Constant(I32, 0), at(cursor, e))
            with kb.loop(i64(0), self.n_pairs, "p") as p:
                c = at(cursor, self.expert(p))
                b.store(b.add(b.load(c, typ=I32), ir.Constant(I32, 1)), c)
            total = kb.var(I32, ir.Constant(I32, 0), "total")
            with kb.loop(i64(0), n_expert, "e") as e:
                b.store(b.load(total), at(first, e))
                c = at(cursor, e)
                n = b.load(c, typ=I32)
                b.store(b.load(total), c)
                b.store(b.add(b.load(total), n), total)
            b.store(b.load(total), at(first, n_expert))
            with kb.loop(i64(0), self.n_pairs, "p") as p:
                c = at(cursor, self.expert(p))
                slot = b.load(c, typ=I32)
                b.store(b.trunc(p, I32), at(order, b.sext(slot, ir.IntType(64))))
                b.store(b.add(slot, ir.Constant(I32, 1)), c)
            active, n_active = self._active(first)
            b.store(ir.Constant(I32, 0), n_active)
            with kb.loop(i64(0), n_expert, "e") as e:
                chosen = b.icmp_signed("<", b.load(at(first, e), typ=I32), b.load(at(first, b.add(e, i64(1))), typ=I32))
                with kb.if_then(chosen):
                    k = b.load(n_active, typ=I32)
                    b.store(b.trunc(e, I32), at(active, b.sext(k, ir.IntType(64))))
                    b.store(b.add(k, ir.Constant(I32, 1)), n_active)

    def _active(self, first: ir.Value) -> tuple[ir.Value, ir.Value]:
        """Where sort_pairs keeps the chosen experts' ids and their number."""
        kb, b = self.kb, self.kb.b
        active = kb.elem_ptr(first, b.add(b.mul(self.n_expert, i64(2)), i64(1)), I32)
        return active, kb.elem_ptr(active, self.n_expert, I32)

    def grouped(self, order: ir.Value, first: ir.Value, weight_args: tuple[str, ...] = ("src0",),
                combine: Callable[[list[ir.Value]], ir.Value] | None = None) -> None:
        """Expert by expert (repacked layout): runs of 16-row groups of each chosen expert
        against the activation rows of the pairs that chose it, each result in its pair's
        row; with several weights (kernel arguments of one shape), their results joined by
        `combine` as they are stored. The (expert, run) chunks are claimed by whichever
        thread is free (qrepacked's chunking: a thread slowed by the VM does less)."""
        kb, b = self.kb, self.kb.b
        w = self.node.src[0]
        k, m = w.ne[0], w.ne[1]
        expert_bytes = repack.repacked_nbytes(w.type, k, m)
        n_groups = m // repack.GROUP
        per_chunk = -(-n_groups // RUNS_PER_EXPERT)
        runs = -(-n_groups // per_chunk)
        load = (lambda base, i: b.sext(b.load(kb.elem_ptr(base, i, I32), typ=I32), ir.IntType(64)))
        active, n_active = self._active(first)
        with kb.claimed_chunks(b.mul(b.sext(b.load(n_active, typ=I32), ir.IntType(64)), i64(runs))) as chunk:
            e = load(active, b.sdiv(chunk, i64(runs)))
            g0 = b.mul(b.srem(chunk, i64(runs)), i64(per_chunk))
            g1 = b.add(g0, i64(per_chunk))
            g1 = b.select(b.icmp_signed("<", g1, i64(n_groups)), g1, i64(n_groups))
            start, end = load(first, e), load(first, b.add(e, i64(1)))
            weights = [kb.byte_ptr(kb.arg(arg), b.mul(e, i64(expert_bytes))) for arg in weight_args]

            def rows(j: ir.Value) -> tuple[ir.Value, ir.Value]:
                p = load(order, j)
                return self.act_row(p), kb.byte_ptr(kb.arg("dst"), b.mul(p, self.d_stride))

            product = RepackedMatmul(kb, w.type, self.kind.fmt, k, m, self.base, end, i64(0),
                                     weights=weights, combine=combine, rows=rows)
            with kb.loop(g0, g1, "g") as g:
                product.tokens(g, start, end)


def _float_experts(kb: KernelBuilder, node: Tensor) -> None:
    """F32/F16/BF16 experts: for every pair, this thread's rows of the pair's expert dotted
    with the pair's input row in <16 x float> chunks (the last one masked)."""
    b = kb.b
    w, x, ids = node.src
    n_used, n_b, k = kb.dim(ids.ne[0]), kb.dim(x.ne[1]), kb.dim(w.ne[0])
    start, end = kb.thread_range(kb.dim(w.ne[1]))
    width = 16
    with kb.loop(i64(0), b.mul(n_used, kb.dim(ids.ne[1])), "pair") as p:
        t, u = b.sdiv(p, n_used), b.srem(p, n_used)
        at = b.add(b.mul(u, kb.dim(ids.nb[0])), b.mul(t, kb.dim(ids.nb[1])))
        e = b.sext(b.load(kb.byte_ptr(kb.arg("src2"), at), typ=I32, align=4), ir.IntType(64))
        n_expert = kb.dim(w.ne[2])   # an id outside [0, n_expert) reads the nearest expert
        e = b.select(b.icmp_signed("<", e, i64(0)), i64(0), e)
        e = b.select(b.icmp_signed(">=", e, n_expert), b.sub(n_expert, i64(1)), e)
        xrow = kb.byte_ptr(kb.arg("src1"), b.add(b.mul(b.srem(u, n_b), kb.dim(x.nb[1])), b.mul(t, kb.dim(x.nb[2]))))
        drow = kb.byte_ptr(kb.arg("dst"), b.mul(p, kb.dim(node.nb[1])))
        with kb.loop(start, end, "m") as m:
            wrow = kb.byte_ptr(kb.arg("src0"), b.add(b.mul(e, kb.dim(w.nb[2])), b.mul(m, kb.dim(w.nb[1]))))
            zero = kb.splat(f32(0.0), width)
            acc = kb.var(zero.type, zero, "acc")

            def chunk(i0: ir.Value, lanes: ir.Value | None) -> None:
                wv = kb.load_vector(kb.byte_ptr(wrow, b.mul(i0, i64(type_size(w.type)))), w.type, width, lanes)
                xv = kb.load_vector(kb.byte_ptr(xrow, b.mul(i0, i64(4))), GGMLType.F32, width, lanes)
                b.store(kb.fadd(b.load(acc), kb.fmul(wv, xv)), acc)

            kb.vector_chunks(k, chunk, width)
            kb.store(kb.byte_ptr(drow, b.mul(m, i64(4))), kb.reduce(b.load(acc), kb.fadd), GGMLType.F32)


@lowering("mul_mat_id", supports=_supported, scratch_bytes=_scratch)
def _mul_mat_id(kb: KernelBuilder, node: Tensor) -> None:
    w, x = node.src[:2]
    if w.type in FLOAT:
        _float_experts(kb, node)
        return
    base = aligned_scratch(kb)
    quantize_rows(kb, x, KINDS[w.type].fmt, w.ne[0], base)
    tiler = _ExpertTiler(kb, node, base)
    if not repack.operand_repacked(node, 0):
        kb.barrier()
        tiler.emit()
        return
    order, first = _sorted_pairs(kb, tiler, base)
    kb.reset_chunks()   # the grouped products' threads claim chunks after the barrier
    kb.barrier()
    tiler.grouped(order, first)


def _sorted_pairs(kb: KernelBuilder, tiler: _ExpertTiler, base: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Thread 0 sorts the pairs by expert into the scratch after the activations (_scratch);
    returns (order, first)."""
    b = kb.b
    w, x = tiler.node.src[:2]
    n_rows = b.mul(b.mul(kb.dim(x.ne[1]), kb.dim(x.ne[2])), kb.dim(x.ne[3]))
    act_end = b.add(b.mul(n_rows, i64(tiler.kind.fmt.row_bytes(w.ne[0]))), i64(ALIGN - 1))
    order = kb.byte_ptr(base, b.and_(act_end, i64(-ALIGN)))
    first = kb.byte_ptr(order, b.mul(tiler.n_pairs, i64(4)))
    tiler.sort_pairs(order, first)
    return order, first


def _as_product(node: Tensor) -> Tensor:
    """The gate's mul_mat_id (w_gate, x, ids) of a mul_mat_id_glu node: the shapes the
    tiler walks."""
    w_gate, _, x, ids = node.src
    return dataclasses.replace(node, op="mul_mat_id", src=(w_gate, x, ids), params={})


def _glu_supported(node: Tensor) -> bool:
    w_gate, w_up = node.src[:2]
    product = _as_product(node)
    return (_supported(product) and repack.experts_repacked(w_gate) and repack.experts_repacked(w_up)
            and w_gate.type == w_up.type and tuple(w_gate.ne) == tuple(w_up.ne)
            and node.params.get("act") in ("swiglu", "geglu"))


@lowering("mul_mat_id_glu", supports=_glu_supported, scratch_bytes=lambda node, env: _scratch(_as_product(node), env))
def _mul_mat_id_glu(kb: KernelBuilder, node: Tensor) -> None:
    from ggmlpy.codegen_cpu.kernels.elementwise import formula as op_formula

    product = _as_product(node)
    w, x = product.src[:2]
    base = aligned_scratch(kb)
    quantize_rows(kb, x, KINDS[w.type].fmt, w.ne[0], base, x_arg="src2")
    tiler = _ExpertTiler(kb, product, base, ids_arg="src3")
    order, first = _sorted_pairs(kb, tiler, base)
    kb.reset_chunks()
    kb.barrier()
    formula = op_formula(node.params["act"])
    tiler.grouped(order, first, ("src0", "src1"), combine=lambda v: formula(kb, v, node.params))
