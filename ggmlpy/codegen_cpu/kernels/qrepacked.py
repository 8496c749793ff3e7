"""Matrix products on repacked weights (repack.py): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL, Q1_0,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, and as codes IQ3_S, IQ3_XXS, IQ2_XS, IQ2_S, any number of tokens.

The 16 lanes of a dot are the 16 rows of a group; a token's 4 activation bytes are
broadcast to every lane (vpdpbusd's {1to16} memory operand). Per 32-block, 16 rows and one
token: 8 dots, one conversion and one multiply-add (Q4_1, Q5_1: two), and the results of 16
rows land in one vector store: no horizontal sums. Decoding the weights (nibble masks, Q5_0's
and Q5_1's fifth bit, MXFP4's code lookup and E8M0 scales) is done once per group and step,
for every token of a tile.

Threads claim chunks of whole groups (contiguous memory each) as they finish the last
(CHUNKS per token block). Tokens go in blocks whose quantised activations fit in L2
(prefill), in tiles of TOKENS whose accumulators stay in registers;
a single token (decode) is a tile of one, with the dots of a block in two chains so the
multiply-adds of consecutive dots do not wait on each other.

Activations are qact.py's q8_32 steps: q[64] | ad[16] f32 (d of block h in lane 8h) | aux
(i32 -offset * sum(q) of block h in lane 8h; Q4_1, Q5_1: f32 d * sum(q) in lane 1 + 2h).
"""
from __future__ import annotations

from typing import Callable

import llvmlite.ir as ir

from ggmlpy.codegen_cpu import repack
from ggmlpy.codegen_cpu import repack_superblocks as superblocks
from ggmlpy.codegen_cpu.irgen import F32, I8, I16, I32, KernelBuilder, i64
from ggmlpy.codegen_cpu.kernels.qact import ActFormat
from ggmlpy.codegen_cpu.kernels.qcodes import CODE_BOOKS, e8m0_half, lookup
from ggmlpy.codegen_cpu.kernels.qvec import (
    CONTRACT, WEIGHT_BYTE_MAX, dot_sum_offset128, dot_sum_u8s8, load_vec, prefetch, shuffle, sitofp, splat, splat_const,
    store_vec, vec, zeros,
)
from ggmlpy.ir.types import GGMLType

# tokens per register tile. 4 rather than 6: a batched decode step of 4 sequences is one
# full tile, prefill loses about 3%, and each kernel's unrolled code (LLVM's compile time) is
# what tiles of 6 and 1 took: 4 + 2 + 1 tokens' worth
TOKENS = 4
REST_TILES = (2, 1)        # the tiles of a block's last tokens (their count's bits; < TOKENS)
L2_BUDGET = 512 * 1024     # bytes of quantised activations per token block
V = 64
# Software prefetch of the weights this many bytes ahead. A tile that computes long enough
# per step outruns the hardware prefetcher, and its memory time then adds to its arithmetic
# instead of hiding under it (DRAM-resident Q4_1, 2 threads, AVX-512 VNNI: 4 tokens 2.5x one
# token's time without, 2.0x with). Measured per type (bench/prefetch_ab.py, in a model with
# bench/prefetch_model_ab.py), absent: no prefetch (the K-quants: a Q4_K product on AVX2
# 8% slower with it, Gemma 3's decode 11%).
# Q5_1 (Q5_0's layout plus the minimums) takes Q5_0's distance.
PREFETCH_AHEAD: dict[GGMLType, int] = {GGMLType.Q4_1: 4096, GGMLType.Q5_0: 4096, GGMLType.Q5_1: 4096,
                                       GGMLType.Q8_0: 4096}
# The smallest tile that prefetches, by dot flavour (qvec.py). With VNNI one dot step is one
# instruction and a one-token tile streams fast enough alone (its prefetch measured +-3%);
# AVX2's dot step takes three or five (Zen 1, 2 threads, one token, DRAM-resident: Q4_1
# 12.0 -> 18.2 GB/s with it, Q5_0 9.9 -> 16.1, Q8_0 13.7 -> 18.3; SmolLM2 tg +19-26%,
# Gemma 3 +16-29%; the plain IR flavour there +7%; each an in-process A/B).
PREFETCH_MIN_TOKENS: dict[str, int] = {"vnni512": 2, "vnni256": 2, "avx2": 1, "generic": 1}
# A second, streaming prefetch (prefetchnta) further ahead, per dot flavour and type, for the
# same tiles: it starts the DRAM read early, the one above then brings the line to L1 in
# time. Measured on the Zen 1 AVX2 host only: Q8_0 one-token products 16.4 ->
# 18.2-19.7 GB/s (bench/prefetch_ab.py --type Q8_0 -k 640 -m 8192 --ahead 4096,4096+8192),
# Gemma 3's decode +2.3-4.8% and SmolLM2's +1.7-6% (bench/prefetch_model_ab.py -v
# before:far.Q8_0=0 -v after:, in-process A/B, several runs); Q4_1 and Q5_0 gained 11-15%
# alone but nothing clear in a model.
PREFETCH_FAR: dict[str, dict[GGMLType, int]] = {"avx2": {GGMLType.Q8_0: 8192}}


# The K-quants whose one-token tiles decode the sub-blocks that read the same vectors (the low
# and the high nibbles) in one stretch of code, each vector loaded once rather than once per
# sub-block: one thread, one token, DRAM (bench/prefetch_ab.py, alternated runs) Q6_K +5-15%,
# Q5_K +5%, Q4_K -9% (its other costs are lower, and the reloads hit L1). Tiles of more
# tokens keep one sub-block per stretch: they would need more registers than there are.
SHARED_REGIONS = (GGMLType.Q5_K, GGMLType.Q6_K)


# Chunks of groups per token block a product is cut into for the threads to claim: enough
# that a slowed thread's share moves to the other, few enough that each chunk streams a long
# contiguous run (the 1.5B model's FFN: 35 groups, 500 KiB a chunk). A chunk holds at most
# MAX_CHUNK_BYTES of weights: a large vocabulary's output matrix in 16 chunks of 29 MB left
# one thread waiting 0.1-0.4 ms for the other (gpt-oss-20b's shapes, a 7.9 ms product); with
# 4 MiB chunks 30 µs, and the decode step 1-3% shorter in four alternated runs of
# `bench/profile_decode.py -n 64` (1 MiB chunks streamed slower: 9.0 ms).
CHUNKS = 16
MAX_CHUNK_BYTES = 4 << 20


def chunk_groups(n_groups: int, group_bytes: int) -> int:
    """Groups per chunk: n_groups / CHUNKS rounded up, no more than MAX_CHUNK_BYTES of them
    (`group_bytes` each), at least one."""
    return max(1, min(-(-n_groups // CHUNKS), MAX_CHUNK_BYTES // group_bytes))


class RepackedMatmul:
    """Emits phase 2 of a quantised mul_mat whose weights (src0) are repacked: every group of
    this thread, for every token."""

    def __init__(self, kb: KernelBuilder, wtype: GGMLType, fmt: ActFormat, k: int, m: int,
                 act_base: ir.Value, n_tok: ir.Value, d_stride: ir.Value, residual: ir.Value | None = None,
                 weights: list[ir.Value] | None = None,
                 combine: Callable[[list[ir.Value]], ir.Value] | None = None, dst: ir.Value | None = None,
                 rows: Callable[[ir.Value], tuple[ir.Value, ir.Value]] | None = None):
        self.kb, self.t, self.fmt = kb, wtype, fmt
        # several weights of one shape and type against the same activations (a gated FFN's
        # gate and up), their results per vector joined by `combine`; default: src0 alone
        self.weights = weights or [kb.arg("src0")]
        self.combine = combine or (lambda values: values[0])
        self.n_groups = m // repack.GROUP
        self.n_steps = repack.n_steps(wtype, k)
        self.step_bytes = repack.STEP_BYTES[wtype]
        self.act_base, self.act_stride = act_base, fmt.row_bytes(k)
        self.n_tok, self.d_stride = n_tok, d_stride
        self.minimums = wtype not in repack.KQUANTS and repack.minimums(wtype)
        self.codes = _code_book(wtype)   # a code-book type's nibbles are looked up
        self.residual = residual   # added to each result as it is stored (laid out as dst)
        self.dst = dst if dst is not None else kb.arg("dst")   # where token 0's results go
        # token -> (its activation row, its result row) where tokens are not evenly spaced
        # (mul_mat_id's tokens grouped by expert); default: act_base and dst by the strides
        self.rows = rows

    def emit(self) -> None:
        """The work in chunks of (token block, run of groups), claimed by whichever thread
        is free (KernelBuilder.claimed_chunks; the caller has reset the counter before the
        barrier after phase 1). A chunk is a few hundred KiB of contiguous weights; each
        tile's arithmetic is the same whichever thread takes it."""
        kb, b = self.kb, self.kb.b
        block = max(TOKENS, L2_BUDGET // self.act_stride // TOKENS * TOKENS)
        per_chunk = chunk_groups(self.n_groups, self.n_steps * self.step_bytes)
        n_group_chunks = -(-self.n_groups // per_chunk)
        n_blocks = b.sdiv(b.add(self.n_tok, i64(block - 1)), i64(block))
        with kb.claimed_chunks(b.mul(n_blocks, i64(n_group_chunks))) as chunk:
            t0 = b.mul(b.sdiv(chunk, i64(n_group_chunks)), i64(block))
            g0 = b.mul(b.srem(chunk, i64(n_group_chunks)), i64(per_chunk))
            g1 = b.add(g0, i64(per_chunk))
            g1 = b.select(b.icmp_signed("<", g1, i64(self.n_groups)), g1, i64(self.n_groups))
            t1 = b.add(t0, i64(block))
            t1 = b.select(b.icmp_signed("<", t1, self.n_tok), t1, self.n_tok)
            with kb.loop(g0, g1, "g") as g:
                self.tokens(g, t0, t1)

    def tokens(self, g: ir.Value, t0: ir.Value, t1: ir.Value) -> None:
        """Group g for tokens t0 .. t1 - 1: tiles of TOKENS, then the rest."""
        kb, b = self.kb, self.kb.b
        t_full = b.add(t0, b.mul(b.sdiv(b.sub(t1, t0), i64(TOKENS)), i64(TOKENS)))
        with kb.loop(t0, t_full, "tt", step=TOKENS) as tok0:
            self.tile(g, tok0, TOKENS)
        self._rest(g, t_full, b.sub(t1, t_full))

    def _rest(self, g: ir.Value, tok0: ir.Value, rest: ir.Value) -> None:
        """The last rest (< TOKENS) tokens of a block as tiles of 2 and 1 (rest's bits):
        batched decode (2-3 sequences a step) reads and decodes each weight step once for
        all of its tokens. Each token's arithmetic is the same whatever its tile."""
        kb, b = self.kb, self.kb.b
        for n_t in REST_TILES:
            with kb.if_then(b.icmp_signed("!=", b.and_(rest, i64(n_t)), i64(0))):
                self.tile(g, b.add(tok0, b.and_(rest, i64(~(2 * n_t - 1)))), n_t)

    # one tile: rows of group g x tokens tok0 .. tok0 + n_t - 1 --------------------------------
    def tile(self, g: ir.Value, tok0: ir.Value, n_t: int) -> None:
        kb, b = self.kb, self.kb.b
        toks = [b.add(tok0, i64(t)) for t in range(n_t)]
        if self.rows is not None:
            arows, drows = zip(*(self.rows(tok) for tok in toks))
        else:
            arows = [kb.byte_ptr(self.act_base, b.mul(tok, i64(self.act_stride))) for tok in toks]
            drows = [kb.byte_ptr(self.dst, b.mul(tok, self.d_stride)) for tok in toks]
        results = []   # per weight, per token: the 16 rows' results
        for weight in self.weights:
            gbase = kb.byte_ptr(weight, b.mul(g, i64(self.n_steps * self.step_bytes)))
            accs = [kb.var(vec(F32, 16), zeros(F32, 16), "racc") for _ in toks]
            with kb.loop(i64(0), i64(self.n_steps), "rs") as s:
                wp = kb.byte_ptr(gbase, b.mul(s, i64(self.step_bytes)))
                if n_t >= PREFETCH_MIN_TOKENS[kb.qdot]:
                    far = PREFETCH_FAR.get(kb.qdot, {}).get(self.t, 0)
                    for distance, locality in ((far, 0), (PREFETCH_AHEAD.get(self.t, 0), 3)):
                        for line in range(0, self.step_bytes if distance else 0, 64):
                            prefetch(kb, kb.byte_ptr(wp, i64(distance + line)), locality)
                aps = [kb.byte_ptr(arow, b.mul(s, i64(self.fmt.step_bytes))) for arow in arows]
                self._step(wp, aps, accs)
            results.append([b.load(acc) for acc in accs])
        for t, tok in enumerate(toks):
            at = b.add(b.mul(tok, self.d_stride), b.mul(g, i64(4 * repack.GROUP)))
            value = self.combine([r[t] for r in results])
            if self.residual is not None:
                value = b.fadd(value, load_vec(b, kb.byte_ptr(self.residual, at), F32, 16))
            store_vec(b, value, kb.byte_ptr(drows[t], b.mul(g, i64(4 * repack.GROUP))))

    def _step(self, wp: ir.Value, aps: list[ir.Value], accs: list) -> None:
        """Both 32-blocks of a step (or a K-quant super-block), for every token of the tile."""
        if self.t in repack.KQUANTS:
            self._superblock(wp, aps, accs)
            return
        kb, b = self.kb, self.kb.b
        if repack.exponents(self.t):   # E8M0 bytes: block h's 16 at byte 16h
            de = load_vec(b, kb.byte_ptr(wp, i64(repack.d_offset(self.t))), I8, 32)
            d = [e8m0_half(b, shuffle(b, de, None, range(16 * h, 16 * h + 16))) for h in range(2)]
        else:
            dh = load_vec(b, kb.byte_ptr(wp, i64(repack.d_offset(self.t))), ir.HalfType(), 32)
            d = [b.fpext(shuffle(b, dh, None, range(16 * h, 16 * h + 16)), vec(F32, 16)) for h in range(2)]
        mins = None
        if self.minimums:
            mh = load_vec(b, kb.byte_ptr(wp, i64(repack.m_offset(self.t))), ir.HalfType(), 32)
            mins = [b.fpext(shuffle(b, mh, None, range(16 * h, 16 * h + 16)), vec(F32, 16)) for h in range(2)]
        totals = [b.load(acc) for acc in accs]
        for h in range(2):
            ws = self._weights(wp, h)   # [(vector, activation byte offset within the block)]
            for i, ap in enumerate(aps):
                isum = self._dots(ap, h, ws)
                ad = splat(b, b.load(kb.byte_ptr(ap, i64(64 + 32 * h)), typ=F32, align=4), 16)
                totals[i] = b.fadd(b.fmul(sitofp(b, isum), b.fmul(d[h], ad, flags=CONTRACT), flags=CONTRACT),
                                   totals[i], flags=CONTRACT)
                if mins is not None:
                    sa = splat(b, b.load(kb.byte_ptr(ap, i64(128 + 4 * (1 + 2 * h))), typ=F32, align=4), 16)
                    totals[i] = b.fadd(b.fmul(mins[h], sa, flags=CONTRACT), totals[i], flags=CONTRACT)
        for acc, total in zip(accs, totals):
            b.store(total, acc)

    def _dots(self, ap: ir.Value, h: int, ws: list[tuple[ir.Value, int]]) -> ir.Value:
        """Block h's integer dots for one token, starting from the activation's offset
        correction (none for Q4_1, Q5_1)."""
        kb, b = self.kb, self.kb.b
        if self.t == GGMLType.Q8_0:
            pairs = [(w, self._act4(ap, 32 * h + at)) for w, at in ws]
            signed = dot_sum_offset128(kb, pairs)   # no offset to take back (avx2)
            if signed is not None:
                return signed
        if self.minimums:
            first = zeros(I32, 16)
        else:
            first = splat(b, b.load(kb.byte_ptr(ap, i64(128 + 32 * h)), typ=I32, align=4), 16)
        return self._chain_dots(ap, [(w, 32 * h + at) for w, at in ws], first)

    def _weights(self, wp: ir.Value, h: int) -> list[tuple[ir.Value, int]]:
        """Block h of the step as 8 unsigned-byte vectors, each with the offset (within the
        block) of the 4 activation values it meets."""
        kb, b = self.kb, self.kb.b
        if self.t == GGMLType.Q8_0:
            return [(load_vec(b, kb.byte_ptr(wp, i64(V * (8 * h + c))), I8, 64), 4 * c) for c in range(8)]
        if self.t == GGMLType.Q1_0:   # word c: the sign bits of values 4c.. of the 16 rows, 2 or 0 (+-1 + 1)
            masks = [b.bitcast(b.load(kb.byte_ptr(wp, i64(V * h + 8 * c)), typ=ir.IntType(64), align=8),
                               vec(ir.IntType(1), 64)) for c in range(8)]
            return [(b.select(mask, splat_const(I8, 2, 64), zeros(I8, 64)), 4 * c) for c, mask in enumerate(masks)]
        low = splat_const(I8, 15, 64)
        qh = None
        if repack.high_bits(self.t):
            qh = b.bitcast(load_vec(b, kb.byte_ptr(wp, i64(repack.qh_offset(self.t) + V * h)), I8, 64), vec(I16, 32))
        out = []
        for c in range(4):
            v = load_vec(b, kb.byte_ptr(wp, i64(V * (4 * h + c))), I8, 64)
            lo = b.and_(v, low)
            hi = b.and_(b.bitcast(b.lshr(b.bitcast(v, vec(I16, 32)), splat_const(I16, 4, 32)), vec(I8, 64)), low)
            if qh is not None:  # bit c of byte i -> bit 4 (low half); bit 4 + c -> bit 4 (high)
                five = splat_const(I8, 16, 64)
                lo = b.or_(lo, b.and_(b.bitcast(b.shl(qh, splat_const(I16, 4 - c, 32)), vec(I8, 64)), five))
                hi = b.or_(hi, b.and_(b.bitcast(b.lshr(qh, splat_const(I16, c, 32)), vec(I8, 64)), five))
            if self.codes is not None:   # MXFP4: codes to their unsigned values
                lo, hi = lookup(kb, lo, self.codes), lookup(kb, hi, self.codes)
            out += [(lo, 4 * c), (hi, 16 + 4 * c)]
        return out

    # K-quants: a step is one super-block (activations: q8_256 steps, q[256] | ad | aux) --------
    def _superblock(self, wp: ir.Value, aps: list[ir.Value], accs: list) -> None:
        """Per token: the sub-blocks' integer dots times their integer scales, summed in i32
        (exact), converted once: acc += d * ad * total + correction, where the correction
        meets the activation's per-sub-block sums (aux = ad * sum(q)): Q2_K, Q4_K, Q5_K
        -dmin * min, Q3_K -4 * d * scale and Q6_K -32 * d * scale (the stored values are q +
        offset).

        One sub-block at a time, its weights decoded, its scale loaded and its share of the
        correction added where they are used: decoding a whole chunk, or holding every
        sub-block's scale for a correction at the end, kept 30-40 vectors live, more than
        the 32 registers (the spills halved the prefill's rate)."""
        kb, b = self.kb, self.kb.b
        n_sub = 256 // self.fmt.sum_group
        per = 64 // n_sub                                     # dots (4 values each) per sub-block
        totals = [zeros(I32, 16) for _ in aps]
        corrs: list[ir.Value | None] = [None for _ in aps]
        offset = superblocks.K_OFFSET.get(self.t)
        order = self._sub_order(n_sub)
        # a one-token tile of SHARED_REGIONS takes the sub-blocks that share their vectors
        # in one region, so each vector is loaded once
        shared = len(aps) == 1 and self.t in SHARED_REGIONS
        for n, sub in enumerate(order):
            if n and (not shared or self._shares(order[n - 1]) != self._shares(sub)):
                # a compiler-only fence (no instruction): LLVM's scheduler would otherwise
                b.fence("seq_cst", "singlethread")   # decode every sub-block up front
            ws = [self._kquant_vector(wp, per * sub + c) for c in range(per)]
            scale = self._kquant_scale(wp, sub)
            # the correction's weight term: i8 scales (Q3_K, Q6_K) or u8 minimums
            term = sitofp(b, scale if offset is not None else self._kquant_min(wp, sub))
            for i, ap in enumerate(aps):
                isum = self._chain_dots(ap, [(w, 4 * (per * sub + c)) for c, w in enumerate(ws)])
                totals[i] = b.add(totals[i], b.mul(isum, scale))
                a = splat(b, b.load(kb.byte_ptr(ap, i64(320 + 4 * sub)), typ=F32, align=4), 16)
                x = b.fmul(term, a, flags=CONTRACT)
                corrs[i] = x if corrs[i] is None else b.fadd(corrs[i], x, flags=CONTRACT)
        dd = load_vec(b, kb.byte_ptr(wp, i64(superblocks.K_D[self.t])), ir.HalfType(), 32)
        d = b.fpext(shuffle(b, dd, None, range(16)), vec(F32, 16))
        if self.t in superblocks.K_FACTOR:   # IQ2_XS, IQ2_S: d / 8; IQ3_XXS: d / 4 (exact)
            d = b.fmul(d, splat_const(F32, superblocks.K_FACTOR[self.t], 16))
        if offset is not None:   # i8 scales; the offset's share met by the activation sums
            corr_w = b.fmul(d, splat_const(F32, -float(offset), 16), flags=CONTRACT)
        else:                    # u8 scales and minimums (Q2_K: both nibbles of one byte)
            corr_w = b.fsub(zeros(F32, 16), b.fpext(shuffle(b, dd, None, range(16, 32)), vec(F32, 16)))
        for i, (ap, acc) in enumerate(zip(aps, accs)):
            ad = splat(b, b.load(kb.byte_ptr(ap, i64(256)), typ=F32, align=4), 16)
            total = b.fadd(b.fmul(sitofp(b, totals[i]), b.fmul(d, ad, flags=CONTRACT), flags=CONTRACT),
                           b.load(acc), flags=CONTRACT)
            b.store(b.fadd(b.fmul(corrs[i], corr_w, flags=CONTRACT), total, flags=CONTRACT), acc)

    def _sub_order(self, n_sub: int) -> list[int]:
        """The sub-blocks in the order they are computed: those that read the same vectors
        one after the other (Q6_K: 4j, 4j + 2, 4j + 1, 4j + 3, the low and high nibbles of
        one vector), so the step's bytes are read as one ascending stream (see
        repack_superblocks; the others keep their order)."""
        return sorted(range(n_sub), key=lambda sub: (*self._shares(sub), sub))

    def _shares(self, sub: int) -> tuple[int, int]:
        """Which vectors sub-block `sub` reads, as (chunk, its first low vector): equal for
        the sub-blocks that read the low and the high nibbles of the same vectors. Q2_K and
        Q3_K: every sub-block its own."""
        if superblocks.K_VECTORS[self.t][0] != 8:
            return sub, 0
        j, u = divmod(64 // (256 // self.fmt.sum_group) * sub, 16)
        return j, u % 8

    def _kquant_scale(self, wp: ir.Value, g: int) -> ir.Value:
        """Sub-block g's scale for the 16 rows, as i32 (Q2_K: the low nibble of its byte)."""
        b = self.kb.b
        raw = load_vec(b, self.kb.byte_ptr(wp, i64(superblocks.k_scale_offset(self.t, g))), I8, 16)
        if self.t in superblocks.K_OFFSET:
            return b.sext(raw, vec(I32, 16))
        if self.t == GGMLType.Q2_K:
            raw = b.and_(raw, splat_const(I8, 15, 16))
        return b.zext(raw, vec(I32, 16))

    def _kquant_min(self, wp: ir.Value, g: int) -> ir.Value:
        """Sub-block g's minimum for the 16 rows, as i32 (Q2_K, Q4_K, Q5_K)."""
        b = self.kb.b
        if self.t == GGMLType.Q2_K:
            raw = load_vec(b, self.kb.byte_ptr(wp, i64(superblocks.k_scale_offset(self.t, g))), I8, 16)
            return b.zext(b.lshr(raw, splat_const(I8, 4, 16)), vec(I32, 16))
        raw = load_vec(b, self.kb.byte_ptr(wp, i64(superblocks.k_min_offset(self.t, g))), I8, 16)
        return b.zext(raw, vec(I32, 16))

    def _kquant_vector(self, wp: ir.Value, v: int) -> ir.Value:
        """The unsigned-byte vector of values 4v..4v+3 of the super-block (16 rows): chunk j
        = v // 16 holds values 64j.., its vector c < 8 in the low nibbles (values 64j + 4c
        + i) and the high ones (64j + 32 + 4c + i); Q5_K adds a fifth bit (laid out as Q3_K's
        third bits), Q6_K two high bits from its qh
        vectors (bits 2e..2e+1 for the low nibbles of vector 2c' + e, bits 4 + 2e.. for the
        high ones). Q2_K and Q3_K: see _crumb_vector."""
        j, u = divmod(v, 16)
        kb, b = self.kb, self.kb.b
        if superblocks.K_VECTORS[self.t][0] == 4:
            q = self._crumb_vector(wp, j, u)
            return q if self.codes is None else lookup(kb, q, self.codes)   # IQ2_XS's, IQ2_S's codes
        high, c = divmod(u, 8)
        low = splat_const(I8, 15, 64)
        raw = load_vec(b, kb.byte_ptr(wp, i64(superblocks.k_values_offset(self.t, j, c))), I8, 64)
        if high:
            raw = b.bitcast(b.lshr(b.bitcast(raw, vec(I16, 32)), splat_const(I16, 4, 32)), vec(I8, 64))
        q = b.and_(raw, low)
        if self.t == GGMLType.Q5_K:   # bit c of fifth-bit vector `high`'s bytes -> bit 4
            hv = b.bitcast(load_vec(b, kb.byte_ptr(wp, i64(superblocks.k_high_offset(self.t, j, high))), I8, 64),
                           vec(I16, 32))
            moved = b.shl(hv, splat_const(I16, 4 - c, 32)) if c < 4 else b.lshr(hv, splat_const(I16, c - 4, 32))
            q = b.or_(q, b.and_(b.bitcast(moved, vec(I8, 64)), splat_const(I8, 16, 64)))
        if self.t == GGMLType.Q6_K:
            qh = b.bitcast(load_vec(b, kb.byte_ptr(wp, i64(superblocks.q6_high_offset(j, c // 2))), I8, 64),
                           vec(I16, 32))
            e = c % 2
            moved = (b.lshr(qh, splat_const(I16, 2 * e, 32)) if high
                     else b.shl(qh, splat_const(I16, 4 - 2 * e, 32)))
            q = b.or_(q, b.and_(b.bitcast(moved, vec(I8, 64)), splat_const(I8, 0x30, 64)))
        if self.codes is not None:   # IQ4_XS, IQ3_S, IQ3_XXS: codes to their unsigned values
            q = lookup(kb, q, self.codes)
        return q

    def _crumb_vector(self, wp: ir.Value, j: int, v: int) -> ir.Value:
        """Q2_K and Q3_K: vector v = 4e + c of chunk j is bits 2e..2e+1 of its low-bit vector
        c; Q3_K adds bit v % 8 of its third-bit vector v // 8 as bit 2 (the stored q + 4)."""
        kb, b = self.kb, self.kb.b
        e, c = divmod(v, 4)
        crumbs = b.bitcast(load_vec(b, kb.byte_ptr(wp, i64(superblocks.k_values_offset(self.t, j, c))), I8, 64),
                           vec(I16, 32))
        q = b.and_(b.bitcast(b.lshr(crumbs, splat_const(I16, 2 * e, 32)), vec(I8, 64)), splat_const(I8, 3, 64))
        if superblocks.K_VECTORS[self.t][1]:
            h, bit = divmod(v, 8)
            highs = b.bitcast(load_vec(b, kb.byte_ptr(wp, i64(superblocks.k_high_offset(self.t, j, h))), I8, 64),
                              vec(I16, 32))
            moved = (b.shl(highs, splat_const(I16, 2 - bit, 32)) if bit < 2
                     else b.lshr(highs, splat_const(I16, bit - 2, 32)))
            q = b.or_(q, b.and_(b.bitcast(moved, vec(I8, 64)), splat_const(I8, 4, 64)))
        return q

    def _chain_dots(self, ap: ir.Value, ws: list[tuple[ir.Value, int]], first: ir.Value | None = None) -> ir.Value:
        """first (default 0) + the dots of vectors w with the 4 activation bytes at ap +
        offset (dot_sum_u8s8: two chains with VNNI, i16 partial sums on AVX2)."""
        pairs = [(w, self._act4(ap, at)) for w, at in ws]
        return dot_sum_u8s8(self.kb, zeros(I32, 16) if first is None else first, pairs, WEIGHT_BYTE_MAX[self.t])

    def _act4(self, ap: ir.Value, at: int) -> ir.Value:
        """The 4 activation bytes at ap + at, broadcast to every lane (<64 x i8>)."""
        b = self.kb.b
        return b.bitcast(splat(b, b.load(self.kb.byte_ptr(ap, i64(at)), typ=I32, align=4), 16), vec(I8, 64))


def _code_book(t: GGMLType) -> tuple[int, ...] | None:
    """The unsigned byte each 4-bit code of a repacked t decodes to: the code-book types'
    own (qcodes.CODE_BOOKS), or the value a repacked code stands for plus the stored offset
    (IQ3_S, IQ3_XXS, IQ2_XS, IQ2_S: repack_superblocks.CODE_VALUES); None where the bits are the values."""
    if t in superblocks.CODE_VALUES:
        return tuple(v + superblocks.K_OFFSET[t] for v in superblocks.CODE_VALUES[t])
    return CODE_BOOKS.get(t)
