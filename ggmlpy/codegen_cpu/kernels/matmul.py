"""mul_mat kernels.

Float operands (attention over the f16 KV cache, f32/f16 weights): a dot-product form when
both operands are contiguous along K, an axpy form when `a` is contiguous along its rows
(the transposed V view), and a strided fallback.

Quantised weights (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K): as ggml, the activations are
first quantised to 8-bit blocks in scratch (phase 1, kernels/qact.py, rows split over
threads, then a barrier), and the dot products work on the integer blocks directly (phase 2,
kernels/qdot.py: vpdpbusd where the CPU has AVX-512 VNNI, portable vector IR elsewhere).
Phase 2 splits the weight rows over the threads; each thread computes register tiles of a
few weight rows by a few tokens (prefill), or streams its rows once per token (decode).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.kernels.qact import aligned_scratch, quantize_rows
from ggmlpy.codegen_cpu.kernels.qdot import KINDS, QKind
from ggmlpy.codegen_cpu.kernels.qvec import CONTRACT, V16F32, reduce_add_f32, zeros
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size

FLOAT = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
QUANT = tuple(KINDS)


def _supported(node: Tensor) -> bool:
    a, b = node.src
    if b.type != GGMLType.F32 or node.type != GGMLType.F32:
        return False
    if a.type in FLOAT:
        return True
    return (a.type in QUANT and a.ne[2] == 1 and a.ne[3] == 1 and b.is_contiguous and node.is_contiguous
            and isinstance(a.ne[0], int) and a.ne[0] % KINDS[a.type].fmt.block == 0)


def _scratch(node: Tensor, env: dict) -> int:
    a, b = node.src
    if a.type in FLOAT:
        return 0
    rows = evaluate(b.ne[1], env) * evaluate(b.ne[2], env) * evaluate(b.ne[3], env)
    return KINDS[a.type].fmt.scratch_bytes(a.ne[0], rows)


@lowering("mul_mat", supports=_supported, scratch_bytes=_scratch)
def _mul_mat(kb: KernelBuilder, node: Tensor) -> None:
    a = node.src[0]
    if a.type in FLOAT:
        _float_mul_mat(kb, node)
    else:
        _quant_mul_mat(kb, node)


# float ----------------------------------------------------------------------------------------
def _float_mul_mat(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    a, x = node.src
    esize_a = type_size(a.type)
    start, end = kb.thread_range(n_rows(kb, node))
    K = kb.dim(a.ne[0])
    M = kb.dim(node.ne[0])
    r2 = kb.b.sdiv(kb.dim(x.ne[2]), kb.dim(a.ne[2]))
    r3 = kb.b.sdiv(kb.dim(x.ne[3]), kb.dim(a.ne[3]))
    axpy = a.nb[0] != esize_a and a.nb[1] == esize_a
    with kb.loop(start, end, "r") as r:
        i1, i2, i3 = unravel_row(kb, node, r)
        xrow = row_ptr(kb, kb.arg("src1"), x, i1, i2, i3)
        drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        a2, a3 = b.sdiv(i2, r2), b.sdiv(i3, r3)
        if axpy:  # dst[:] = sum_k x[k] * a[k, :]; a's rows (fixed k) are contiguous
            with kb.loop(i64(0), M, "i0") as i0:
                kb.store(elem_ptr(kb, drow, node, i0), f32(0.0), node.type)
            abase = row_ptr(kb, kb.arg("src0"), a, i64(0), a2, a3)
            with kb.loop(i64(0), K, "k") as k:
                xk = kb.load(elem_ptr(kb, xrow, x, k), x.type)
                arow = kb.byte_ptr(abase, b.mul(k, kb.dim(a.nb[0])))
                with kb.loop(i64(0), M, "i0") as i0:
                    p = elem_ptr(kb, drow, node, i0)
                    av = kb.load(kb.byte_ptr(arow, b.mul(i0, kb.dim(a.nb[1]))), a.type)
                    kb.store(p, kb.fadd(kb.load(p, node.type), kb.fmul(xk, av)), node.type)
        else:
            with kb.loop(i64(0), M, "i0") as i0:
                arow = row_ptr(kb, kb.arg("src0"), a, i0, a2, a3)
                acc = kb.var(F32, f32(0.0), "acc")
                with kb.loop(i64(0), K, "k") as k:
                    av = kb.load(elem_ptr(kb, arow, a, k), a.type)
                    xv = kb.load(elem_ptr(kb, xrow, x, k), x.type)
                    b.store(kb.fadd(b.load(acc), kb.fmul(av, xv)), acc)
                kb.store(elem_ptr(kb, drow, node, i0), b.load(acc), node.type)


# quantised ------------------------------------------------------------------------------------
def _quant_mul_mat(kb: KernelBuilder, node: Tensor) -> None:
    """Phase 1 quantises the activations into scratch (rows over threads); after a barrier,
    phase 2 computes register tiles of (weight rows x tokens) over the weight rows of this
    thread, so a few weight rows stay in L1 while every token passes by."""
    a, x = node.src
    kind = KINDS[a.type]
    base = aligned_scratch(kb)
    quantize_rows(kb, x, kind.fmt, a.ne[0], base)
    kb.barrier()
    _Tiler(kb, node, kind, base).emit()


class _Tiler:
    """Phase 2's loops. Decode (fewer tokens than a tile holds): every row of this thread
    once per token, `single_rows` rows at a time. Prefill: blocks of tokens whose quantised
    activations fit in L2; within a block, tiles of `tile` = (rows, tokens) whose
    accumulators stay in registers, so each 64-weight step of a row is decoded once for
    several tokens and each activation step loaded once for several rows."""

    L2_BUDGET = 512 * 1024  # bytes of activations a token block may hold

    def __init__(self, kb: KernelBuilder, node: Tensor, kind: QKind, base: ir.Value):
        a, x = node.src
        self.kb, self.node, self.kind, self.base = kb, node, kind, base
        self.k = a.ne[0]
        self.act_stride = kind.fmt.row_bytes(self.k)
        self.w_stride = kb.dim(a.nb[1])
        self.d_stride = kb.dim(node.nb[1])  # the result is a fresh contiguous tensor
        self.n_tok = n_rows(kb, x)

    def emit(self) -> None:
        kb, b = self.kb, self.kb.b
        rows_r, toks_t = self.kind.tile
        start, end = kb.thread_range(kb.dim(self.node.src[0].ne[1]))
        block = max(toks_t, self.L2_BUDGET // self.act_stride // toks_t * toks_t)
        few = b.icmp_signed("<", self.n_tok, i64(toks_t))
        with b.if_else(few) as (decode, prefill):
            with decode:
                self._rows(start, end, self.kind.single_rows, 1, i64(0), self.n_tok)
            with prefill:
                n_full = b.mul(b.sdiv(self.n_tok, i64(toks_t)), i64(toks_t))
                with kb.loop(i64(0), n_full, "tb", step=block) as t0:
                    t1 = b.add(t0, i64(block))
                    t1 = b.select(b.icmp_signed("<", t1, n_full), t1, n_full)
                    self._rows(start, end, rows_r, toks_t, t0, t1)
                self._rows(start, end, rows_r, 1, n_full, self.n_tok)

    def _rows(self, start, end, rows_r: int, toks_t: int, tok_begin, tok_end) -> None:
        """Tiles of rows_r x toks_t over rows [start, end) and tokens [tok_begin, tok_end) (a
        multiple of toks_t apart); leftover rows one at a time."""
        kb, b = self.kb, self.kb.b
        full_end = start
        if rows_r > 1:
            full_end = b.add(start, b.mul(b.sdiv(b.sub(end, start), i64(rows_r)), i64(rows_r)))
            with kb.loop(start, full_end, "rt", step=rows_r) as row0:
                with kb.loop(tok_begin, tok_end, "tt", step=toks_t) as tok0:
                    self._tile(row0, tok0, rows_r, toks_t)
        with kb.loop(full_end, end, "rr") as row0:
            with kb.loop(tok_begin, tok_end, "tt", step=toks_t) as tok0:
                self._tile(row0, tok0, 1, toks_t)

    def _tile(self, row0, tok0, n_r: int, n_t: int) -> None:
        """n_r x n_t results. A small tile alternates two sets of accumulators between
        steps, so that consecutive steps' fused multiply-adds do not wait on each other."""
        kb, b, kind = self.kb, self.kb.b, self.kind
        wrows = [kb.byte_ptr(kb.arg("src0"), b.mul(b.add(row0, i64(r)), self.w_stride)) for r in range(n_r)]
        toks = [b.add(tok0, i64(t)) for t in range(n_t)]
        arows = [kb.byte_ptr(self.base, b.mul(tok, i64(self.act_stride))) for tok in toks]
        n_sets = 2 if n_r * n_t <= 2 else 1
        sets = [[[[kb.var(V16F32, zeros(F32, 16), "acc") for _ in range(kind.n_acc)] for _ in range(n_t)]
                 for _ in range(n_r)] for _ in range(n_sets)]
        n_steps, half = kind.n_steps(self.k)
        with kb.loop(i64(0), i64(n_steps // n_sets), "ks") as s:
            for i, accs in enumerate(sets):
                self._step(b.add(b.mul(s, i64(n_sets)), i64(i)), wrows, arows, accs, tail=False)
        if n_steps % n_sets:
            self._step(i64(n_steps - 1), wrows, arows, sets[0], tail=False)
        if half:
            self._step(i64(n_steps), wrows, arows, sets[-1], tail=True)
        for t, tok in enumerate(toks):
            drow = kb.byte_ptr(kb.arg("dst"), b.mul(tok, self.d_stride))
            for r in range(n_r):
                total = None
                for accs in sets:
                    for var in accs[r][t]:
                        v = b.load(var)
                        total = v if total is None else b.fadd(total, v, flags=CONTRACT)
                kb.store(elem_ptr(kb, drow, self.node, b.add(row0, i64(r))), reduce_add_f32(b, total),
                         self.node.type)

    def _step(self, s, wrows, arows, accs, tail: bool) -> None:
        kb, b, kind = self.kb, self.kb.b, self.kind
        off = b.mul(s, i64(kind.step_bytes()))
        rows = [kind.row(kb, kb.byte_ptr(w, off), tail) for w in wrows]
        toks = [kind.tok(kb, arow, s) for arow in arows]
        isum = [[kind.init(kb, row, tok) for tok in toks] for row in rows]
        for j in range(kind.chunks):
            wq = [kind.chunk_w(kb, row, j) for row in rows]
            for t, tok in enumerate(toks):
                aq = kind.chunk_a(kb, tok, j)
                for r in range(len(rows)):
                    isum[r][t] = kind.chunk_dot(kb, isum[r][t], wq[r], aq)
        for r, row in enumerate(rows):
            for t, tok in enumerate(toks):
                vars_ = accs[r][t]
                new = kind.finish(kb, [b.load(v) for v in vars_], isum[r][t], row, tok)
                for var, value in zip(vars_, new):
                    b.store(value, var)
