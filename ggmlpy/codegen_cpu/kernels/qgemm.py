"""Prefill products on repacked weights: every quantised weight type, many tokens.

The direct tiles of kernels/matmul.py spend four or five vector instructions per 64
multiply-adds: the dot lanes of a (row, token) pair hold partial sums of one block, so every
block costs a conversion and two multiply-adds per pair. Here the 16 lanes of a dot are 16
*weight rows* instead. A group of 16 rows is decoded once into this thread's scratch, a
*unit* (a 32-block, or a 256-value super-block) at a time: for every 4 values of the unit one
64-byte vector (lane r: those 4 values of row r, as unsigned bytes), then per-row scales and
correction terms as 16-lane vectors. A token's 4 activation bytes are broadcast to every lane
(vpdpbusd's {1to16} memory operand), so 8 dots finish 32 values for 16 rows, the scales cost
one multiply per 32 values and token, and 16 results land in one vector store with no
horizontal sums: about 11 instructions per 512 multiply-adds instead of about 36.

Per-unit area (r = lane = row of the group), all 64-byte vectors:

    32-blocks   w[8]: values 4c..4c+3 | wd: d (f32 of an f16 or MXFP4's E8M0) | m (Q4_1, Q5_1 only)
    K-quants    w[64]: values 4c..4c+3 | sc[G]: integer scale of group g | corr[G]: the
                f32 term met by the activation sums (-dmin * m, or -32 * d * sc for Q6_K, -4 * d * sc
                for Q3_K, -offset * d * sc for qgrid.py's kinds) | wd: d (qgrid: d times its unit)

(G groups of 256 / G values, the kind's `groups`: 8 for Q4_K/Q5_K, 16 for Q2_K/Q3_K/Q6_K.) Repacking costs a few hundred
instructions per unit of a group, paid once per group and token block, so it is used only
when there are enough tokens (MIN_TOKENS).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, I8, I32, I64, KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels.qdot import Block32, KQuant, QKind
from ggmlpy.codegen_cpu.kernels.qvec import (
    CONTRACT, WEIGHT_BYTE_MAX, const, dot_sum_u8s8, load_f16, load_vec, masked_store, shuffle, sitofp, splat, vec, zeros,
)

GROUP = 16        # weight rows per group: one per dot lane
TOKENS = 6        # tokens per register tile
MIN_TOKENS = 32   # fewer tokens: the direct tiles are cheaper than repacking
MAX_THREADS = 64  # the thread pool's limit: each thread has its own repack area
V = 64            # bytes of a vector


def supports(kind: QKind) -> bool:
    return isinstance(kind, (Block32, KQuant))


def unit_bytes(kind: QKind) -> int:
    if isinstance(kind, Block32):
        return 8 * V + V + (V if kind.offset is None else 0)
    return 64 * V + 2 * kind.groups * V + V


def area_bytes(kind: QKind, k: int) -> int:
    unit = 32 if isinstance(kind, Block32) else 256
    return (k // unit) * unit_bytes(kind)


class RepackGemm:
    """Emits the repacked path for one kernel: `group(row0, end, t0, t1)` computes rows
    row0..row0+15 (those below end) for tokens [t0, t1)."""

    def __init__(self, kb: KernelBuilder, kind: QKind, k: int, w_stride: ir.Value, act_base: ir.Value,
                 act_stride: int, area: ir.Value, d_stride: ir.Value):
        self.kb, self.kind, self.k = kb, kind, k
        self.w_stride, self.act_base, self.act_stride = w_stride, act_base, act_stride
        self.area, self.d_stride = area, d_stride
        self.ub = unit_bytes(kind)
        self.blocky = isinstance(kind, Block32)
        self.n_units = k // (32 if self.blocky else 256)

    def group(self, row0: ir.Value, end: ir.Value, t0: ir.Value, t1: ir.Value) -> None:
        """A last, partial group repeats its last row in the missing lanes and stores only
        the real ones, so every row takes this path whatever the thread split (a row's
        result does not depend on the split)."""
        kb, b = self.kb, self.kb.b
        self._repack(row0, end)
        lanes = b.sub(end, row0)
        self.store_mask = b.icmp_signed("<", const(I64, list(range(GROUP))), splat(b, lanes, GROUP))
        n_full = b.add(t0, b.mul(b.sdiv(b.sub(t1, t0), i64(TOKENS)), i64(TOKENS)))
        with kb.loop(t0, n_full, "gt", step=TOKENS) as tok0:
            self._tile(row0, tok0, TOKENS)
        with kb.loop(n_full, t1, "g1") as tok0:
            self._tile(row0, tok0, 1)

    # repacking ------------------------------------------------------------------------------
    def _repack(self, row0: ir.Value, end: ir.Value) -> None:
        """Runtime loops over units and rows (unrolled, a K-quant group would be ~10^4
        instructions in one block, and LLVM's compile time grows faster than its size)."""
        kb, b, kind = self.kb, self.kb.b, self.kind
        last = b.sub(end, i64(1))
        with kb.loop(i64(0), i64(self.n_units), "rp") as u:
            out = kb.byte_ptr(self.area, b.mul(u, i64(self.ub)))
            with kb.loop(i64(0), i64(GROUP), "rr") as r:
                i = b.add(row0, r)
                i = b.select(b.icmp_signed("<", i, last), i, last)
                row = kb.byte_ptr(kb.arg("src0"), b.mul(i, self.w_stride))
                p = kb.byte_ptr(row, b.mul(u, i64(kind.block_bytes)))
                lane_out = kb.byte_ptr(out, b.mul(r, i64(4)))
                if self.blocky:
                    self._repack_block(p, lane_out)
                else:
                    self._repack_superblock(p, lane_out)

    def _lane(self, value: ir.Value, out: ir.Value, vector: int) -> None:
        """Store one 4-byte value into the unit's vector number `vector`, at the row's lane
        (`out` already points at the lane)."""
        self.kb.b.store(value, self.kb.byte_ptr(out, i64(V * vector)), align=4)

    def _repack_block(self, p: ir.Value, out: ir.Value) -> None:
        b, kind = self.kb.b, self.kind
        q = b.bitcast(shuffle(b, kind.decode(self.kb, p, None), None, range(32)), vec(I32, 8))
        for c in range(8):
            self._lane(b.extract_element(q, ir.Constant(I32, c)), out, c)
        self._lane(kind.block_scale(self.kb, p), out, 8)   # f32: an f16 d or an E8M0 e
        if kind.offset is None:
            self._lane(load_f16(b, self.kb.byte_ptr(p, i64(2))), out, 9)

    def _repack_superblock(self, p: ir.Value, out: ir.Value) -> None:
        kb, b, kind = self.kb, self.kb.b, self.kind
        n_g = kind.groups
        row = kind.row(kb, p, False)
        for j in range(kind.chunks):
            q = b.bitcast(kind.chunk_w(kb, row, j)["q"], vec(I32, 16))
            for c in range(16):
                self._lane(b.extract_element(q, ir.Constant(I32, c)), out, 16 * j + c)
        scales = row["scales"]
        for g in range(n_g):
            self._lane(b.extract_element(scales, ir.Constant(I32, g)), out, 64 + g)
            self._lane(b.extract_element(row["corr"], ir.Constant(I32, g)), out, 64 + n_g + g)
        self._lane(b.extract_element(row["wd"], ir.Constant(I32, 0)), out, 64 + 2 * n_g)

    # computing ------------------------------------------------------------------------------
    def _tile(self, row0: ir.Value, tok0: ir.Value, n_t: int) -> None:
        kb, b = self.kb, self.kb.b
        toks = [b.add(tok0, i64(t)) for t in range(n_t)]
        arows = [kb.byte_ptr(self.act_base, b.mul(tok, i64(self.act_stride))) for tok in toks]
        accs = [kb.var(vec(F32, 16), zeros(F32, 16), "gacc") for _ in toks]
        if self.blocky:
            pairs, odd = divmod(self.n_units, 2)
            with kb.loop(i64(0), i64(pairs), "gs") as s:
                for h in range(2):
                    self._block(s, h, b.add(b.mul(s, i64(2)), i64(h)), arows, accs)
            if odd:
                self._block(i64(pairs), 0, i64(2 * pairs), arows, accs)
        else:
            with kb.loop(i64(0), i64(self.n_units), "gs") as s:
                self._superblock(s, arows, accs)
        for tok, acc in zip(toks, accs):
            out = kb.byte_ptr(kb.arg("dst"), b.add(b.mul(tok, self.d_stride), b.mul(row0, i64(4))))
            masked_store(kb, b.load(acc), out, self.store_mask)

    def _dots(self, isum: ir.Value, w: list[ir.Value], qp: ir.Value) -> ir.Value:
        """isum + the dots of the vectors w with consecutive 4-byte groups at qp
        (dot_sum_u8s8)."""
        kb, b = self.kb, self.kb.b
        pairs = [(wc, b.bitcast(splat(b, b.load(kb.byte_ptr(qp, i64(4 * c)), typ=I32, align=4), 16), vec(I8, 64)))
                 for c, wc in enumerate(w)]
        return dot_sum_u8s8(kb, isum, pairs, WEIGHT_BYTE_MAX[self.kind.wtype])

    def _fma_bcast(self, acc: ir.Value, v: ir.Value, scalar_ptr: ir.Value) -> ir.Value:
        b = self.kb.b
        s = splat(b, b.load(scalar_ptr, typ=F32, align=4), 16)
        return b.fadd(b.fmul(v, s, flags=CONTRACT), acc, flags=CONTRACT)

    def _block(self, step: ir.Value, half: int, blk: ir.Value, arows: list[ir.Value], accs: list) -> None:
        """32-block `blk` (= 2 * step + half) for every token of the tile. Activation layout
        (qact.py): a step is q[64], ad[16] (d in lanes 0 and 8), aux[16] (i32 -offset * sum in
        lanes 0 and 8, or f32 d * sum in lanes 1 and 3 for Q4_1)."""
        kb, b, kind = self.kb, self.kb.b, self.kind
        pb = kb.byte_ptr(self.area, b.mul(blk, i64(self.ub)))
        w = [load_vec(b, kb.byte_ptr(pb, i64(V * c)), I8, 64) for c in range(8)]
        wd = load_vec(b, kb.byte_ptr(pb, i64(8 * V)), F32, 16)
        mins = load_vec(b, kb.byte_ptr(pb, i64(9 * V)), F32, 16) if kind.offset is None else None
        for arow, acc in zip(arows, accs):
            sp = kb.byte_ptr(arow, b.mul(step, i64(kind.fmt.step_bytes)))
            if kind.offset is None:
                isum = zeros(I32, 16)
            else:
                isum = splat(b, b.load(kb.byte_ptr(sp, i64(128 + 32 * half)), typ=I32, align=4), 16)
            isum = self._dots(isum, w, kb.byte_ptr(sp, i64(32 * half)))
            ad = splat(b, b.load(kb.byte_ptr(sp, i64(64 + 32 * half)), typ=F32, align=4), 16)
            total = b.fadd(b.fmul(sitofp(b, isum), b.fmul(wd, ad, flags=CONTRACT), flags=CONTRACT),
                           b.load(acc), flags=CONTRACT)
            if mins is not None:
                total = self._fma_bcast(total, mins, kb.byte_ptr(sp, i64(128 + 4 * (1 + 2 * half))))
            b.store(total, acc)

    def _superblock(self, sb: ir.Value, arows: list[ir.Value], accs: list) -> None:
        """Super-block `sb` for every token of the tile, a runtime loop over its groups.
        Activation layout (qact.py): q[256], ad[16] (d everywhere), aux[16] (d * the sum of
        group g in lane g)."""
        kb, b, kind = self.kb, self.kb.b, self.kind
        n_g = kind.groups
        per = 64 // n_g  # 4-byte values per group
        pb = kb.byte_ptr(self.area, b.mul(sb, i64(self.ub)))
        sps = [kb.byte_ptr(arow, b.mul(sb, i64(kind.fmt.step_bytes))) for arow in arows]
        totals = [kb.var(vec(I32, 16), zeros(I32, 16), "gtot") for _ in arows]
        with kb.loop(i64(0), i64(n_g), "gg") as g:
            wg = kb.byte_ptr(pb, b.mul(g, i64(V * per)))
            w = [load_vec(b, kb.byte_ptr(wg, i64(V * c)), I8, 64) for c in range(per)]
            pg = kb.byte_ptr(pb, b.mul(g, i64(V)))
            sc = load_vec(b, kb.byte_ptr(pg, i64(V * 64)), I32, 16)
            corr = load_vec(b, kb.byte_ptr(pg, i64(V * (64 + n_g))), F32, 16)
            for sp, acc, total in zip(sps, accs, totals):
                p = self._dots(zeros(I32, 16), w, kb.byte_ptr(sp, b.mul(g, i64(4 * per))))
                b.store(b.add(b.load(total), b.mul(p, sc)), total)
                aux = kb.byte_ptr(kb.byte_ptr(sp, b.mul(g, i64(4))), i64(320))
                b.store(self._fma_bcast(b.load(acc), corr, aux), acc)
        wd = load_vec(b, kb.byte_ptr(pb, i64(V * (64 + 2 * n_g))), F32, 16)
        for sp, acc, total in zip(sps, accs, totals):
            ad = splat(b, b.load(kb.byte_ptr(sp, i64(256)), typ=F32, align=4), 16)
            value = b.fadd(b.fmul(sitofp(b, b.load(total)), b.fmul(wd, ad, flags=CONTRACT), flags=CONTRACT),
                           b.load(acc), flags=CONTRACT)
            b.store(value, acc)
