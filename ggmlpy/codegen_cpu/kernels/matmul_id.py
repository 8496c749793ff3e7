"""mul_mat_id on quantised expert weights: each token's products with the experts it
selected (ggml_mul_mat_id; the experts `as` [K, M, n_expert] stay in the file's layout).

Phase 1 quantises the input rows (n_b per token) into scratch as the weight type's
activations, then a barrier; phase 2 splits the M weight rows over the threads and, for
every (token, slot) pair in order, streams that pair's expert rows of this thread against
its activation row. A model's experts are kept repacked (repack.experts_repacked: each
expert's matrix as a 2-D weight's, one after the other), and a pair's rows are the
one-token tiles of kernels/qrepacked.py, in 16-row groups; other experts (M not whole
groups, weights computed at run time) take matmul.Tiler's one-token tiles. A decode step
reads each selected expert once; a prompt reads an expert once per token that chose it
(grouping the tokens by expert, as ggml does, is not done yet).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu import repack
from ggmlpy.codegen_cpu.irgen import I32, KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels.matmul import QUANT, Tiler, activation_bytes
from ggmlpy.codegen_cpu.kernels.qact import aligned_scratch, quantize_rows
from ggmlpy.codegen_cpu.kernels.qdot import KINDS
from ggmlpy.codegen_cpu.kernels.qrepacked import RepackedMatmul
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType


def _supported(node: Tensor) -> bool:
    w, x, ids = node.src
    return (w.type in QUANT and w.ne[3] == 1 and isinstance(w.ne[0], int) and w.ne[0] % KINDS[w.type].fmt.block == 0
            and x.type == GGMLType.F32 and x.is_contiguous and ids.type == GGMLType.I32
            and node.type == GGMLType.F32 and node.is_contiguous)


def _scratch(node: Tensor, env: dict) -> int:
    return activation_bytes(node.src[0], node.src[1], env)


class _ExpertTiler(Tiler):
    """Tiler over (token, slot) pairs p = t * n_used + u: the result row p (dst is
    [M, n_used, n_tokens], contiguous), the weights of expert ids[u, t], the activations of
    input row t * n_b + u % n_b."""

    def __init__(self, kb: KernelBuilder, node: Tensor, base: ir.Value):
        super().__init__(kb, node, KINDS[node.src[0].type], base)
        w, x, ids = node.src
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
        expert = b.sext(b.load(kb.byte_ptr(kb.arg("src2"), at), typ=I32, align=4), ir.IntType(64))
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
        if repack.operand_repacked(self.node, 0):
            self._repacked()
            return
        start, end = kb.thread_range(kb.dim(self.node.src[0].ne[1]))
        with kb.loop(i64(0), self.n_pairs, "pair") as p:
            self._rows(start, end, self.kind.single_rows, 1, p, kb.b.add(p, i64(1)))

    def _repacked(self) -> None:
        """Each pair's expert in the repacked layout: this thread's groups of 16 rows, as
        qrepacked's one-token tiles, its results stored in the pair's row."""
        kb, b = self.kb, self.kb.b
        w = self.node.src[0]
        k, m = w.ne[0], w.ne[1]
        expert_bytes = repack.repacked_nbytes(w.type, k, m)
        g0, g1 = kb.thread_range(i64(m // repack.GROUP))
        with kb.loop(i64(0), self.n_pairs, "pair") as p:
            weights = kb.byte_ptr(kb.arg("src0"), b.mul(self.expert(p), i64(expert_bytes)))
            dst = kb.byte_ptr(kb.arg("dst"), b.mul(p, self.d_stride))
            product = RepackedMatmul(kb, w.type, self.kind.fmt, k, m, self.act_row(p), i64(1), i64(0),
                                     weights=[weights], dst=dst)
            with kb.loop(g0, g1, "g") as g:
                product.tile(g, i64(0), 1)


@lowering("mul_mat_id", supports=_supported, scratch_bytes=_scratch)
def _mul_mat_id(kb: KernelBuilder, node: Tensor) -> None:
    w, x = node.src[:2]
    base = aligned_scratch(kb)
    quantize_rows(kb, x, KINDS[w.type].fmt, w.ne[0], base)
    kb.barrier()
    _ExpertTiler(kb, node, base).emit()
