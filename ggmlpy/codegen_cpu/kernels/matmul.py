"""mul_mat kernels.

Float operands (attention over the KV cache, f32/f16 weights) and quantised ones that are not
weights (a quantised KV cache's K rows, read through strided views): kernels/matmul_float.py.

Quantised weights (every type of kernels/qdot.py's KINDS: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4,
IQ4_NL, the K-quants Q2_K ... Q6_K, IQ4_XS, the grid I-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S, IQ1_S, IQ1_M and the ternary TQ1_0, TQ2_0): as ggml,
the activations are first quantised to 8-bit blocks in scratch (phase 1, kernels/qact.py,
rows split over threads, then a barrier), and the dot products work on the integer blocks directly (phase 2:
vpdpbusd where the CPU has AVX-512 VNNI, portable vector IR elsewhere, kernels/qvec.py).

A model's weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K with whole groups
of 16 rows) are kept by the CPU backend in its own layout (repack.py), 16 rows interleaved so the dot lanes are
rows: phase 2 is then kernels/qrepacked.py for any number of tokens. Other quantised
operands (odd row counts, tensors computed at run time) take the direct path, which
splits the weight rows over the threads and goes by the number of tokens:
- under 4 (decode): each thread streams its rows once per token, two rows at a time
  (kernels/qdot.py decodes the blocks);
- 4 to 31: register tiles of a few rows by a few tokens, so a row's step is decoded once for
  several tokens and a token's step loaded once for several rows;
- 32 and more (prefill): groups of 16 rows repacked into scratch so that the dot lanes are
  rows and the activations are broadcast (kernels/qgemm.py), about three times fewer
  instructions per multiply-add than the tiles.
Tokens go in blocks whose quantised activations fit in L2.

A stack of quantised matrices [K, M, H] (MLA's per-head attn_k_b / attn_v_b) against x [K, N,
H'] (H' a multiple of H, x's rows contiguous, as ggml broadcasts) takes the direct path head
by head (HeadTiler): x's N rows of head h against matrix h * H / H'.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu import repack
from ggmlpy.codegen_cpu.irgen import F32, KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels import qgemm
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, n_rows
from ggmlpy.codegen_cpu.kernels.matmul_float import (  # noqa: F401  (re-exported: softmax.py, fusion)
    FLOAT, float_dot_tiles, float_form, float_mul_mat, head_tile, is_dot_form,
)
from ggmlpy.codegen_cpu.kernels.qact import aligned_scratch, quantize_rows
from ggmlpy.codegen_cpu.kernels.qdot import KINDS, QKind
from ggmlpy.codegen_cpu.kernels.qrepacked import RepackedMatmul
from ggmlpy.codegen_cpu.kernels.qvec import CONTRACT, V16F32, reduce_add_f32, zeros
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.symbolic import evaluate
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType

QUANT = tuple(KINDS)


def _quant_weights(node: Tensor) -> bool:
    """A quantised `a` the weight paths take: one contiguous matrix of rows."""
    a, b = node.src[:2]
    return (a.type in QUANT and a.ne[2] == 1 and a.ne[3] == 1 and b.is_contiguous and node.is_contiguous
            and isinstance(a.ne[0], int) and a.ne[0] % KINDS[a.type].fmt.block == 0)


def _quant_heads(node: Tensor) -> bool:
    """A contiguous stack of quantised matrices `a` [K, M, H, H3] against x's rows, broadcast
    over dims 2 and 3 (HeadTiler)."""
    a, x = node.src[:2]
    if node.op != "mul_mat" or a.type not in QUANT or (a.ne[2] == 1 and a.ne[3] == 1):
        return False
    return (a.is_contiguous and all(isinstance(n, int) for n in a.ne) and a.ne[0] % KINDS[a.type].fmt.block == 0
            and x.nb[0] == 4 and node.is_contiguous and isinstance(x.ne[2], int) and isinstance(x.ne[3], int)
            and x.ne[2] % a.ne[2] == 0 and x.ne[3] % a.ne[3] == 0)


def _float_path(node: Tensor) -> bool:
    """matmul_float.py computes it: float `a`, or a quantised one the weight paths do not take
    (a quantised KV cache's K, permuted over heads) in one of its forms."""
    if node.op != "mul_mat":   # the fused products (mul_mat_add ...) are of weights
        return False
    return node.src[0].type in FLOAT or (not _quant_weights(node) and not _quant_heads(node)
                                         and float_form(node) is not None)


def _supported(node: Tensor) -> bool:
    a, b = node.src
    if b.type != GGMLType.F32 or node.type != GGMLType.F32:
        return False
    return _float_path(node) or _quant_weights(node) or _quant_heads(node)


def _scratch(node: Tensor, env: dict) -> int:
    """Quantised activations, then (prefill of 32-block weights) each thread's repack area."""
    a, b = node.src[:2]
    if a.type in FLOAT or _float_path(node):
        return 0
    kind = KINDS[a.type]
    if repack.is_repacked(a) or _quant_heads(node):
        return activation_bytes(a, b, env)
    area = qgemm.MAX_THREADS * qgemm.area_bytes(kind, a.ne[0]) if qgemm.supports(kind) else 0
    return activation_bytes(a, b, env) + area


def activation_bytes(w: Tensor, x: Tensor, env: dict) -> int:
    """Scratch for x's rows quantised to the activation format of weight type w.type."""
    rows = evaluate(x.ne[1], env) * evaluate(x.ne[2], env) * evaluate(x.ne[3], env)
    return KINDS[w.type].fmt.scratch_bytes(w.ne[0], rows)


def _epilogue_supported(node: Tensor) -> bool:
    """mul_mat_add (the residual_product fusion group, codegen_cpu/fusion.py): W x + r with
    repacked weights, r a contiguous f32 tensor of the result's shape."""
    a, x, r = node.src
    return (repack.is_repacked(a) and x.type == GGMLType.F32 and x.is_contiguous and node.is_contiguous
            and node.type == GGMLType.F32 and r.type == GGMLType.F32 and r.is_contiguous
            and tuple(r.ne) == tuple(node.ne))


@lowering("mul_mat_add", supports=_epilogue_supported, scratch_bytes=_scratch)
def _mul_mat_add(kb: KernelBuilder, node: Tensor) -> None:
    """The product, with the residual added as each result vector is stored (the same value
    as the add node: one f32 addition)."""
    _quant_mul_mat(kb, node, residual=True)


def _glu_supported(node: Tensor) -> bool:
    """mul_mat_glu (the glu_product fusion group, codegen_cpu/fusion.py): act(W_gate x) *
    (W_up x) with both weights repacked, of one type and shape."""
    w_gate, w_up, x = node.src
    return (repack.is_repacked(w_gate) and repack.is_repacked(w_up) and w_gate.type == w_up.type
            and tuple(w_gate.ne) == tuple(w_up.ne) and x.type == GGMLType.F32 and x.is_contiguous
            and node.type == GGMLType.F32 and node.is_contiguous and node.params.get("act") in ("swiglu", "geglu"))


def _glu_scratch(node: Tensor, env: dict) -> int:
    return activation_bytes(node.src[0], node.src[2], env)


@lowering("mul_mat_glu", supports=_glu_supported, scratch_bytes=_glu_scratch)
def _mul_mat_glu(kb: KernelBuilder, node: Tensor) -> None:
    """Both products from one quantisation of x, the gate activation applied as each pair
    of result vectors is stored (the formula of the swiglu/geglu node, on the same f32
    values: the same results as the three nodes)."""
    from ggmlpy.codegen_cpu.kernels.elementwise import formula as op_formula

    w_gate, w_up, x = node.src
    kind = KINDS[w_gate.type]
    base = aligned_scratch(kb)
    quantize_rows(kb, x, kind.fmt, w_gate.ne[0], base, x_arg="src2")
    kb.reset_chunks()   # RepackedMatmul's threads claim chunks after the barrier
    kb.barrier()
    formula = op_formula(node.params["act"])
    RepackedMatmul(kb, w_gate.type, kind.fmt, w_gate.ne[0], w_gate.ne[1], base, n_rows(kb, x),
                   kb.dim(node.nb[1]), weights=[kb.arg("src0"), kb.arg("src1")],
                   combine=lambda v: formula(kb, v, node.params)).emit()


@lowering("mul_mat", supports=_supported, scratch_bytes=_scratch)
def _mul_mat(kb: KernelBuilder, node: Tensor) -> None:
    if _float_path(node):
        float_mul_mat(kb, node)
    else:
        _quant_mul_mat(kb, node)


# quantised ------------------------------------------------------------------------------------
def _quant_mul_mat(kb: KernelBuilder, node: Tensor, residual: bool = False) -> None:
    """Phase 1 quantises the activations into scratch (rows over threads); after a barrier,
    phase 2 computes register tiles of (weight rows x tokens) over the weight rows of this
    thread, so a few weight rows stay in L1 while every token passes by."""
    a, x = node.src[:2]
    kind = KINDS[a.type]
    base = aligned_scratch(kb)
    quantize_rows(kb, x, kind.fmt, a.ne[0], base)
    kb.reset_chunks()   # RepackedMatmul's threads claim chunks after the barrier
    kb.barrier()
    if repack.is_repacked(a):  # weights in the CPU backend's own layout (repack.py)
        RepackedMatmul(kb, a.type, kind.fmt, a.ne[0], a.ne[1], base, n_rows(kb, x), kb.dim(node.nb[1]),
                       residual=kb.arg("src2") if residual else None).emit()
    elif _quant_heads(node):
        HeadTiler(kb, node, kind, base).emit()
    else:
        Tiler(kb, node, kind, base).emit()


class Tiler:
    """Phase 2's loops. Decode (fewer tokens than a tile holds): every row of this thread
    once per token, `single_rows` rows at a time. Prefill: blocks of tokens whose quantised
    activations fit in L2; within a block, tiles of `tile` = (rows, tokens) whose
    accumulators stay in registers, so each 64-weight step of a row is decoded once for
    several tokens and each activation step loaded once for several rows."""

    L2_BUDGET = 512 * 1024  # bytes of activations a token block may hold

    def __init__(self, kb: KernelBuilder, node: Tensor, kind: QKind, base: ir.Value):
        a, x = node.src[:2]
        self.kb, self.node, self.kind, self.base = kb, node, kind, base
        self.k = a.ne[0]
        self.act_stride = kind.fmt.row_bytes(self.k)
        self.w_stride = kb.dim(a.nb[1])
        self.d_stride = kb.dim(node.nb[1])  # the result is a fresh contiguous tensor
        self.n_tok = n_rows(kb, x)

    def emit(self) -> None:
        kb, b = self.kb, self.kb.b
        start, end = kb.thread_range(kb.dim(self.node.src[0].ne[1]))
        few = b.icmp_signed("<", self.n_tok, i64(self.kind.tile[1]))
        with b.if_else(few) as (decode, prefill):
            with decode:
                self._rows(start, end, self.kind.single_rows, 1, i64(0), self.n_tok)
            with prefill:
                if not qgemm.supports(self.kind):
                    self._token_blocks(start, end, self._direct)
                    return
                many = b.icmp_signed(">=", self.n_tok, i64(qgemm.MIN_TOKENS))
                with b.if_else(many) as (repacked, direct):
                    with repacked:
                        self._token_blocks(start, end, self._repacked)
                    with direct:
                        self._token_blocks(start, end, self._direct)

    def _token_blocks(self, start, end, body) -> None:
        """body(start, end, t0, t1) over blocks of tokens whose activations fit in L2."""
        kb, b = self.kb, self.kb.b
        block = max(8, self.L2_BUDGET // self.act_stride // 8 * 8)
        with kb.loop(i64(0), self.n_tok, "tb", step=block) as t0:
            t1 = b.add(t0, i64(block))
            body(start, end, t0, b.select(b.icmp_signed("<", t1, self.n_tok), t1, self.n_tok))

    def _direct(self, start, end, t0, t1) -> None:
        """Register tiles of `kind.tile` over rows [start, end) x tokens [t0, t1)."""
        b = self.kb.b
        rows_r, toks_t = self.kind.tile
        t_full = b.add(t0, b.mul(b.sdiv(b.sub(t1, t0), i64(toks_t)), i64(toks_t)))
        self._rows(start, end, rows_r, toks_t, t0, t_full)
        self._rows(start, end, rows_r, 1, t_full, t1)

    def _repacked(self, start, end, t0, t1) -> None:
        """Groups of 16 rows (the last one partial) through qgemm's repacked weights."""
        kb, b = self.kb, self.kb.b
        area = kb.byte_ptr(self.base, b.add(b.mul(self.n_tok, i64(self.act_stride)),
                                            b.mul(kb.ith, i64(qgemm.area_bytes(self.kind, self.k)))))
        gemm = qgemm.RepackGemm(kb, self.kind, self.k, self.w_stride, self.base, self.act_stride, area,
                                self.d_stride)
        with kb.loop(start, end, "rg", step=qgemm.GROUP) as row0:
            gemm.group(row0, end, t0, t1)

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
        """n_r x n_t results. Every tile shape sums a (row, token) pair's steps in the same
        order, so a token's result does not depend on the tile it fell in (the batch it came
        with), nor a row's on how the rows were split between threads: two alternating sets
        of accumulators for lone tokens measured no faster in decode, and changed the results
        by a rounding that an activation's 8-bit rounding can magnify."""
        kb, b, kind = self.kb, self.kb.b, self.kind
        weights = self.weights(tok0)
        wrows = [kb.byte_ptr(weights, b.mul(b.add(row0, i64(r)), self.w_stride)) for r in range(n_r)]
        toks = [b.add(tok0, i64(t)) for t in range(n_t)]
        arows = [self.act_row(tok) for tok in toks]
        accs = [[[kb.var(V16F32, zeros(F32, 16), "acc") for _ in range(kind.n_acc)] for _ in range(n_t)]
                for _ in range(n_r)]
        n_steps, half = kind.n_steps(self.k)
        with kb.loop(i64(0), i64(n_steps), "ks") as s:
            self._step(s, wrows, arows, accs, tail=False)
        if half:
            self._step(i64(n_steps), wrows, arows, accs, tail=True)
        for t, tok in enumerate(toks):
            drow = kb.byte_ptr(kb.arg("dst"), b.mul(tok, self.d_stride))
            for r in range(n_r):
                total = None
                for var in accs[r][t]:
                    v = b.load(var)
                    total = v if total is None else b.fadd(total, v, flags=CONTRACT)
                kb.store(elem_ptr(kb, drow, self.node, b.add(row0, i64(r))), reduce_add_f32(b, total),
                         self.node.type)

    # where a tile's operands are: a subclass (matmul_id.py) points them elsewhere
    def weights(self, tok: ir.Value) -> ir.Value:
        """The weight matrix the rows of token `tok`'s tile are rows of."""
        return self.kb.arg("src0")

    def act_row(self, tok: ir.Value) -> ir.Value:
        """Token tok's quantised activations."""
        return self.kb.byte_ptr(self.base, self.kb.b.mul(tok, i64(self.act_stride)))

    def _step(self, s, wrows, arows, accs, tail: bool) -> None:
        kb, b, kind = self.kb, self.kb.b, self.kind
        rows = [kind.row_at(kb, w, s, tail) for w in wrows]
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


class HeadTiler(Tiler):
    """The direct path over a stack of matrices: x's activation rows r = i1 + N (i2 + H' i3)
    (quantised in that order) go with matrix (i2 / (H' / H), i3 / (H3' / H3)), head by head,
    so that no tile mixes two heads' tokens; the result's row r is row r of dst."""

    def __init__(self, kb: KernelBuilder, node: Tensor, kind: QKind, base: ir.Value):
        super().__init__(kb, node, kind, base)
        a, x = node.src[:2]
        self.a, self.x = a, x
        self.n_per = kb.dim(x.ne[1])

    def weights(self, tok: ir.Value) -> ir.Value:
        b, a, x = self.kb.b, self.a, self.x
        head = b.sdiv(tok, self.n_per)
        i2, i3 = b.srem(head, i64(x.ne[2])), b.sdiv(head, i64(x.ne[2]))
        at = b.add(b.mul(b.sdiv(i2, i64(x.ne[2] // a.ne[2])), i64(a.nb[2])),
                   b.mul(b.sdiv(i3, i64(x.ne[3] // a.ne[3])), i64(a.nb[3])))
        return self.kb.byte_ptr(self.kb.arg("src0"), at)

    def emit(self) -> None:
        kb, b = self.kb, self.kb.b
        start, end = kb.thread_range(kb.dim(self.a.ne[1]))
        few = b.icmp_signed("<", self.n_per, i64(self.kind.tile[1]))
        with kb.loop(i64(0), b.sdiv(self.n_tok, self.n_per), "head") as head:
            t0 = b.mul(head, self.n_per)
            t1 = b.add(t0, self.n_per)
            with b.if_else(few) as (decode, prefill):
                with decode:
                    self._rows(start, end, self.kind.single_rows, 1, t0, t1)
                with prefill:
                    self._direct(start, end, t0, t1)
