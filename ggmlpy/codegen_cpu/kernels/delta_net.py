"""gated_delta_net (ir/ops/delta_net.py): the whole recurrence in one kernel, as ggml's CPU
loop: the (head, sequence) pairs are split over the threads (each pair's state is read and
written by one thread only, so the result does not depend on the split), and each thread
carries its pairs' states over the ubatch's tokens.

The state is worked on in place in the result's snapshot slot 0 (which holds the final state
at the end, as ggml's K == 1 path does), a row M[j] of S_v floats at a time: scaled by the
gate, dotted with k, updated with delta[j] * k and dotted with q while it is in registers, in
16-lane vectors (the row length is static: a head size), the last one masked when S_v is not
a multiple of 16. With K > 1 the state after token t is copied to slot T - 1 - t when that is
below K, and the slots past the first token are zeroed (the op's definition; ggml leaves them).
"""
from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from ggmlpy.codegen_cpu.irgen import VECTOR_WIDTH, KernelBuilder, f32, i64
from ggmlpy.codegen_cpu.kernels.common import row_ptr
from ggmlpy.codegen_cpu.lowering import lowering
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType

W = VECTOR_WIDTH
F32 = GGMLType.F32


def _supported(node: Tensor) -> bool:
    q, k, v = node.src[:3]
    static = all(isinstance(d, int) for d in (v.ne[0], v.ne[1], q.ne[1], k.ne[1]))
    return static and all(t.type == F32 for t in (node, *node.src))


def _copy(kb: KernelBuilder, dst: ir.Value, src: ir.Value | None, n: int) -> None:
    """n contiguous floats from src to dst (zeros when src is None)."""
    def body(i: ir.Value, mask: ir.Value | None) -> None:
        off = kb.b.mul(i, i64(4))
        value = kb.splat(f32(0.0), W) if src is None else kb.load_vector(kb.byte_ptr(src, off), F32, W, mask)
        kb.store_vector(kb.byte_ptr(dst, off), value, F32, mask)
    kb.vector_chunks(i64(n), body)


@lowering("gated_delta_net", supports=_supported)
def _gated_delta_net(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    q, k, v, g, beta, state = node.src
    S, H = v.ne[0], v.ne[1]
    K = int(node.params.get("K", 1))
    kda = g.ne[0] != 1   # a gate per key channel (KDA)
    dst = kb.arg("dst")
    T, NS = kb.dim(v.ne[2]), kb.dim(v.ne[3])
    chunks = [(c, kb.lane_mask(i64(S - c), W) if S - c < W else None) for c in range(0, S, W)]
    scale = f32(float(np.float32(1.0) / np.sqrt(np.float32(S))))
    state_out = kb.byte_ptr(dst, b.mul(b.mul(T, NS), i64(4 * S * H)))   # past the outputs
    snap_bytes = b.mul(NS, i64(4 * S * S * H))

    def head_of(src: Tensor, h: ir.Value) -> ir.Value:       # tiled: v head h reads h % H_k
        return h if src.ne[1] == H else i64(0) if src.ne[1] == 1 else b.srem(h, i64(src.ne[1]))

    def seq_of(src: Tensor, s: ir.Value) -> ir.Value:        # repeated: s / (n_seqs / n_seqs_k)
        return s if src.ne[3] == v.ne[3] else b.sdiv(s, b.sdiv(NS, kb.dim(src.ne[3])))

    def vectors(ptr: ir.Value) -> list[ir.Value]:
        return [kb.load_vector(kb.byte_ptr(ptr, i64(4 * c)), F32, W, mask) for c, mask in chunks]

    def dot(xs: list[ir.Value], ys: list[ir.Value]) -> ir.Value:
        acc = kb.fmul(xs[0], ys[0])
        for x, y in zip(xs[1:], ys[1:]):
            acc = kb.fadd(acc, kb.fmul(x, y))
        return kb.reduce(acc, kb.fadd)

    start, end = kb.thread_range(b.mul(i64(H), NS))
    with kb.loop(start, end, "r") as r:
        h, s = b.srem(r, i64(H)), b.sdiv(r, i64(H))
        hq, hk, sq, sk = head_of(q, h), head_of(k, h), seq_of(q, s), seq_of(k, s)
        pair = b.add(b.mul(s, i64(H)), h)
        m0 = kb.byte_ptr(state_out, b.mul(pair, i64(4 * S * S)))    # slot 0: the working state
        _copy(kb, m0, row_ptr(kb, kb.arg("src5"), state, i64(0), h, s), S * S)
        out = kb.byte_ptr(dst, b.mul(b.add(b.mul(b.mul(s, T), i64(H)), h), i64(4 * S)))
        with kb.loop(i64(0), T, "t") as t:
            qs = vectors(row_ptr(kb, kb.arg("src0"), q, hq, t, sq))
            ks = vectors(row_ptr(kb, kb.arg("src1"), k, hk, t, sk))
            vrow = row_ptr(kb, kb.arg("src2"), v, h, t, s)
            grow = row_ptr(kb, kb.arg("src3"), g, h, t, s)
            beta_t = kb.load(row_ptr(kb, kb.arg("src4"), beta, h, t, s), F32)
            decay = [kb.exp(x) for x in vectors(grow)] if kda else [kb.exp(kb.load(grow, F32))] * len(chunks)
            orow = kb.byte_ptr(out, b.mul(t, i64(4 * S * H)))
            with kb.loop(i64(0), i64(S), "j") as j:
                mrow = kb.byte_ptr(m0, b.mul(j, i64(4 * S)))
                ms = [kb.fmul(m, d) for m, d in zip(vectors(mrow), decay)]
                vj = kb.load(kb.byte_ptr(vrow, b.mul(j, i64(4))), F32)
                delta = kb.fmul(kb.fsub(vj, dot(ms, ks)), beta_t)
                ms = [kb.fadd(m, kb.fmul(x, delta)) for m, x in zip(ms, ks)]
                for (c, mask), m in zip(chunks, ms):
                    kb.store_vector(kb.byte_ptr(mrow, i64(4 * c)), m, F32, mask)
                kb.store(kb.byte_ptr(orow, b.mul(j, i64(4))), kb.fmul(dot(ms, qs), scale), F32)
            if K > 1:   # the state after token t is snapshot T - 1 - t
                back = b.sub(b.sub(T, i64(1)), t)
                in_range = b.and_(b.icmp_signed(">=", back, i64(1)), b.icmp_signed("<", back, i64(K)))
                with kb.if_then(in_range):
                    slot = kb.byte_ptr(m0, b.mul(back, snap_bytes))
                    _copy(kb, slot, m0, S * S)
        if K > 1:       # slots before the first token: zero
            first = b.select(b.icmp_signed("<", T, i64(1)), i64(1), T)
            with kb.loop(first, i64(K), "slot") as slot:
                _copy(kb, kb.byte_ptr(m0, b.mul(slot, snap_bytes)), None, S * S)
