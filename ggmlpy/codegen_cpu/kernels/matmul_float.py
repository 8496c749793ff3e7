"""mul_mat over float operands: attention over the KV cache (f16, f32, bf16, or quantised rows of
the KV cache types) and f32/f16 weights (kernels/matmul.py dispatches here).

A dot-product form when both operands are contiguous along K (k . q, four a-rows at a time
against a tile of up to four x rows), an axpy form when `a` is contiguous along its rows (the
transposed V view: softmax weights times V), and a strided fallback. A quantised `a` (a
quantised K, read as ggml reads a quantised src0; or a V cache row through out_prod,
kernels/kv_quant.py) is decoded a block at a time (kernels/kv_quant.py: its loads, and the
8-bit rounding of the operand ggml gives it).
"""
from __future__ import annotations

from typing import Callable

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import F32, KernelBuilder, f32, i64, round_f16
from ggmlpy.codegen_cpu.kernels.common import elem_ptr, n_rows, row_ptr, unravel_row
from ggmlpy.codegen_cpu.kernels.extent import Visible, any_live, live_chunks, rows_share_chunks, tile_range
from ggmlpy.codegen_cpu.kernels.kv_quant import KV_QUANT, ChunkReader, q8_operand
from ggmlpy.codegen_cpu.kernels.qvec import CONTRACT, load_vec, reduce_add_f32, shuffle, splat, store_vec, vec, zeros
from ggmlpy.ir.tensor import Tensor
from ggmlpy.ir.types import GGMLType, type_size


FLOAT = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


def float_mul_mat(kb: KernelBuilder, node: Tensor) -> None:
    """Attention over the KV cache and float weights. Vector code for the two attention
    shapes (K rows contiguous: q . k; or a's rows contiguous across the output: softmax
    weights times V), the scalar loops otherwise."""
    form = float_form(node)
    if form == "dot":
        _float_dot(kb, node)
    elif form == "axpy":
        float_axpy(kb, node)
    else:
        _float_scalar(kb, node)


VEC = 16  # f32 lanes of a vector


def float_form(node: Tensor) -> str | None:
    """"dot", "axpy" or None (the scalar loops; never for a quantised `a`, whose rows are
    read only in whole blocks: the dot form over a quantised K, kernels/kv_quant.py)."""
    a, x = node.src
    esize = type_size(a.type)
    if a.type in KV_QUANT:
        ok = (x.type == GGMLType.F32 and node.nb[0] == 4 and x.nb[0] == 4 and a.nb[0] == esize
              and isinstance(a.ne[0], int) and a.ne[0] % 32 == 0)
        return "dot" if ok else None
    if a.type not in (GGMLType.F32, GGMLType.F16) or x.type != GGMLType.F32 or node.nb[0] != 4:
        return None
    if a.nb[0] == esize and x.nb[0] == 4 and isinstance(a.ne[0], int) and a.ne[0] % VEC == 0:
        return "dot"
    m = node.ne[0]
    if a.nb[1] == esize and x.nb[0] == 4 and isinstance(m, int) and m % VEC == 0 and m <= 16 * VEC:
        return "axpy"
    return None


def _as_operand(b: ir.IRBuilder, x: ir.Value, a_type: GGMLType) -> ir.Value:
    """The f32 operand as ggml's CPU backend sees it: against f16 (the KV cache: q.k and
    softmax weights times V) it is first rounded to f16 (ggml's vec_dot_type for F16), the
    products then run in f32. llama.cpp's results carry that rounding; matching it brings
    Gemma 3's logits measurably closer to the golden data (mean |d| 0.117 -> 0.106). Against
    a quantised K, whole rows are rounded to 8 bits instead (kv_quant.q8_operand)."""
    return round_f16(b, x) if a_type == GGMLType.F16 else x


def _broadcast_rows(kb: KernelBuilder, node: Tensor, r: ir.Value):
    """(i1, i2, i3, a2, a3) for output row r: a is broadcast over dims 2 and 3 (GQA)."""
    b = kb.b
    a, x = node.src
    i1, i2, i3 = unravel_row(kb, node, r)
    r2 = b.sdiv(kb.dim(x.ne[2]), kb.dim(a.ne[2]))
    r3 = b.sdiv(kb.dim(x.ne[3]), kb.dim(a.ne[3]))
    return i1, i2, i3, b.sdiv(i2, r2), b.sdiv(i3, r3)


def _sum4(b: ir.IRBuilder, accs: list[ir.Value]) -> ir.Value:
    """Four <16 x float> -> <4 x float> of their sums (a shuffle tree, ~14 instructions)."""
    def fold(x, y, lo, hi):
        return b.fadd(shuffle(b, x, y, lo), shuffle(b, x, y, hi), flags=CONTRACT)
    h01 = fold(accs[0], accs[1], [*range(8), *range(16, 24)], [*range(8, 16), *range(24, 32)])
    h23 = fold(accs[2], accs[3], [*range(8), *range(16, 24)], [*range(8, 16), *range(24, 32)])
    q = fold(h01, h23, [*range(4), *range(8, 12), *range(16, 20), *range(24, 28)],
             [*range(4, 8), *range(12, 16), *range(20, 24), *range(28, 32)])
    q = b.fadd(q, shuffle(b, q, None, [i ^ 2 for i in range(16)]), flags=CONTRACT)
    q = b.fadd(q, shuffle(b, q, None, [i ^ 1 for i in range(16)]), flags=CONTRACT)
    return shuffle(b, q, None, [0, 4, 8, 12])


DOT_TILE = 4  # output rows (consecutive tokens of one head) per tile of the dot form


def _float_dot(kb: KernelBuilder, node: Tensor) -> None:
    """dst[i0] = a[i0, :] . x[:]: four a-rows at a time against a tile of up to four x rows
    (consecutive tokens of one head), so each a vector is converted once for the tile."""
    start, end = kb.thread_range(n_rows(kb, node))
    float_dot_tiles(kb, node, start, end, lambda rows, live: None)


def float_dot_tiles(kb: KernelBuilder, node: Tensor, start: ir.Value, end: ir.Value,
                    after: Callable[[list[tuple[ir.Value, ir.Value]], tuple[ir.Value, ir.Value]], None],
                    visible: Callable[[list[ir.Value]], Visible] | None = None,
                    together: Callable[[list[ir.Value]], ir.Value] | None = None) -> None:
    """Rows [start, end) of the dot form in tiles of DOT_TILE (see _token_tiles; `together`
    as there). With `visible`, visible(rows) says which entries of the tile's rows to
    compute (the attention fusion: the keys its mask leaves visible; the rest are left
    unwritten). `after` gets each tile's (row, dst row pointer) pairs once they are
    written, and the range [lo, hi) computed (the attention fusion normalises them there)."""
    def tile(rows: list[ir.Value]) -> None:
        seen = visible(rows) if visible is not None else Visible(i64(0), kb.dim(node.ne[0]), None)
        after(_float_dot_rows(kb, node, rows, seen), (seen.lo, seen.hi))

    _token_tiles(kb, node, start, end, DOT_TILE, tile, together, head_tile(node, DOT_TILE))


Rows = list[ir.Value]


def _token_tiles(kb: KernelBuilder, node: Tensor, start: ir.Value, end: ir.Value, size: int,
                 body: Callable[[Rows], None], together: Callable[[Rows], ir.Value] | None = None,
                 heads: int = 1) -> None:
    """body(rows) over the rows of node, this thread's share [start, end) of them: tiles of
    `size` consecutive tokens of one head (ne[1]) when together(rows) holds (when given),
    else one row at a time. With heads > 1, tiles of `heads` query heads of one token that
    read the same K or V head (grouped-query attention: each key is loaded and converted
    once for them) where token tiles do not serve: a one-token step, and (with `together`)
    a step whose first two tokens see different keys (a batched decode step, each token of
    another sequence; decided for the whole step, so that every thread takes its share of
    the rows in the same order). A tile's rows share src0's rows. Each row's result must not
    depend on the tiling (it follows the thread split)."""
    b = kb.b
    ne1, ne2 = kb.dim(node.ne[1]), kb.dim(node.ne[2])

    def tokens_fit(r0: ir.Value) -> ir.Value:
        return b.icmp_signed("<=", b.add(b.srem(r0, ne1), i64(size)), ne1)

    def by_tokens() -> None:
        _tiles(kb, start, end, size, tokens_fit, lambda q: q, body, together)

    if heads == 1:
        by_tokens()
        return
    group = _gqa_group(node)

    def heads_fit(q: ir.Value) -> ir.Value:   # q counts heads fastest: q = i2 + ne2 * (i1 + ne1 * i3)
        return b.icmp_signed("<=", b.add(b.srem(b.srem(q, ne2), i64(group)), i64(heads)), i64(group))

    def row_of(q: ir.Value) -> ir.Value:
        i2, rest = b.srem(q, ne2), b.sdiv(q, ne2)
        return b.add(b.srem(rest, ne1), b.mul(ne1, b.add(i2, b.mul(ne2, b.sdiv(rest, ne1)))))

    by_heads = b.icmp_signed("==", ne1, i64(1))
    if together is not None:
        first_two = [i64(0), i64(1)]   # tokens 0 and 1 of head 0
        apart = kb.var(ir.IntType(1), ir.Constant(ir.IntType(1), 0), "apart")
        with kb.if_then(b.icmp_signed(">", ne1, i64(1))):
            b.store(b.not_(together(first_two)), apart)
        by_heads = b.or_(by_heads, b.load(apart))
    with b.if_else(by_heads) as (heads_first, tokens_first):
        with heads_first:
            _tiles(kb, start, end, heads, heads_fit, row_of, body, aligned=True)
        with tokens_first:
            by_tokens()


def _tiles(kb: KernelBuilder, start: ir.Value, end: ir.Value, size: int, fits: Callable[[ir.Value], ir.Value],
           row_of: Callable[[ir.Value], ir.Value], body: Callable[[Rows], None],
           together: Callable[[Rows], ir.Value] | None = None, aligned: bool = False) -> None:
    """body over indices q in [start, end), as row_of(q): tiles of `size` consecutive q
    where they are all in the range, fits(q0) holds and so does together (when given),
    else one at a time. `aligned`: tiles start at multiples of size (the indices before
    the first one go one at a time), where the groups that fit begin (heads of one group)."""
    b = kb.b
    if size == 1:
        with kb.loop(start, end, "r") as q:
            body([row_of(q)])
        return
    base = b.mul(b.sdiv(start, i64(size)), i64(size)) if aligned else start   # start >= 0
    with kb.loop(base, end, "r", step=size) as q0:
        stop = b.add(q0, i64(size))
        whole = b.and_(b.and_(b.icmp_signed(">=", q0, start), b.icmp_signed("<=", stop, end)), fits(q0))
        rows = [row_of(b.add(q0, i64(t))) for t in range(size)]
        if together is not None:  # asked only of whole tiles: it reads the tile's rows
            joint = kb.var(ir.IntType(1), ir.Constant(ir.IntType(1), 0), "joint")
            with kb.if_then(whole):
                b.store(together(rows), joint)
            whole = b.load(joint)
        with b.if_else(whole) as (tile, single):
            with tile:
                body(rows)
            with single:
                first = b.select(b.icmp_signed(">", q0, start), q0, start)
                with kb.loop(first, b.select(b.icmp_signed("<", stop, end), stop, end), "r1") as q:
                    body([row_of(q)])


def _gqa_group(node: Tensor) -> int:
    """Query heads per K (V) head of a product of src0 broadcast over heads; 1 when the
    head counts are not known when the kernel is built."""
    a, x = node.src[:2]
    if not (isinstance(a.ne[2], int) and isinstance(x.ne[2], int)) or a.ne[2] < 1 or x.ne[2] % a.ne[2]:
        return 1
    return x.ne[2] // a.ne[2]


def head_tile(node: Tensor, limit: int) -> int:
    """Rows per tile of query heads for a one-token step: the largest divisor of the GQA
    group up to `limit` that leaves each of two threads (the rows split in halves) a whole
    tile (SmolLM2: 3 of 9 heads; Gemma 3 270M: 2 of 4)."""
    group = _gqa_group(node)
    cap = min(limit, -(-node.ne[2] // 2)) if isinstance(node.ne[2], int) else 1
    return max(d for d in range(1, group + 1) if group % d == 0 and d <= cap)


def _float_dot_rows(kb: KernelBuilder, node: Tensor, rows: Rows, seen: Visible) -> list[tuple[ir.Value, ir.Value]]:
    """The visible entries of the output rows of a tile (they share a's rows)."""
    b = kb.b
    a, x = node.src
    chunks = a.ne[0] // VEC
    n_t = len(rows)
    _, _, _, a2, a3 = _broadcast_rows(kb, node, rows[0])
    where = [unravel_row(kb, node, r) for r in rows]
    xrows = [row_ptr(kb, kb.arg("src1"), x, *i) for i in where]
    drows = [row_ptr(kb, kb.arg("dst"), node, *i) for i in where]

    # the tile's x rows as operands, loaded (and rounded to f16 against f16 data) once before
    # the loops over a's rows: inside them LLVM may not hoist the loads past the stores to
    # dst (the pointers may alias), and the rounding cost more than the products (AVX2)
    xvs = [[load_vec(b, kb.elem_ptr(xrows[t], i64(VEC * c), F32), F32, VEC) for c in range(chunks)]
           for t in range(n_t)]
    xvs = [q8_operand(kb, xv) if a.type in KV_QUANT else [_as_operand(b, v, a.type) for v in xv] for xv in xvs]

    def dots(i0, n):
        arows = [row_ptr(kb, kb.arg("src0"), a, b.add(i0, i64(j)), a2, a3) for j in range(n)]
        accs = [[zeros(F32, VEC)] * n for _ in range(n_t)]
        read = ChunkReader(kb, a.type)
        for c in range(chunks):
            avs = [read(arows[j], c) for j in range(n)]
            for t in range(n_t):
                for j in range(n):
                    accs[t][j] = b.fadd(b.fmul(avs[j], xvs[t][c], flags=CONTRACT), accs[t][j], flags=CONTRACT)
        return accs

    def span(lo: ir.Value, hi: ir.Value) -> None:
        m4 = b.add(lo, b.mul(b.sdiv(b.sub(hi, lo), i64(4)), i64(4)))
        with kb.loop(lo, m4, "i0", step=4) as i0:
            for drow, accs in zip(drows, dots(i0, 4)):
                store_vec(b, _sum4(b, accs), kb.elem_ptr(drow, i0, F32))
        with kb.loop(m4, hi, "i0t") as i0:
            for drow, accs in zip(drows, dots(i0, 1)):
                b.store(reduce_add_f32(b, accs[0]), kb.elem_ptr(drow, i0, F32), align=4)

    if seen.chunk_live is None:
        span(seen.lo, seen.hi)
    else:
        live_chunks(kb, seen.lo, seen.hi, seen.chunk_live, span)
    return list(zip(rows, drows))


def is_dot_form(node: Tensor) -> bool:
    return (node.src[0].type in FLOAT or node.src[0].type in KV_QUANT) and float_form(node) == "dot"


def float_axpy(kb: KernelBuilder, node: Tensor) -> None:
    """dst[:] = sum_k x[k] * a[k, :] with dst held in registers, at most 8 vectors of it at a
    time (wider rows, such as Gemma's 256-wide heads, in column blocks); rows of the same
    head are taken a few at a time, so each row of a is converted once for them. Each
    result is the same sum over k in the same order whatever the blocking.

    With the `zero_tail` parameter (codegen_cpu/fusion.py sets it when x is a softmax: the
    attention weights times V), the sum over k skips the chunks of keys where every weight
    of the tile is 0 (kernels/extent.py): the masked keys' weights are exactly +0, and
    fma(v, +0, acc) = acc for any finite v (before the first nonzero weight acc is +0, and
    +0 + -0 = +0), so the result is the same."""
    b = kb.b
    a, x = node.src
    zero_tail = bool(node.params.get("zero_tail", False))
    nv_all = node.ne[0] // VEC
    block = min(nv_all, 8)
    tok = max(1, min(4, 16 // block))
    start, end = kb.thread_range(n_rows(kb, node))
    n_k = kb.dim(a.ne[0])
    a_step = kb.dim(a.nb[0])

    def weight_rows(rows: Rows) -> list[ir.Value]:
        return [row_ptr(kb, kb.arg("src1"), x, *unravel_row(kb, node, r)) for r in rows]

    def together(rows: Rows) -> ir.Value:  # the weights of tokens of different sequences: mostly apart
        return rows_share_chunks(kb, weight_rows(rows), x.type, 4, n_k, 0.0)

    def tile(rows: Rows) -> None:
        n = len(rows)
        _, _, _, a2, a3 = _broadcast_rows(kb, node, rows[0])
        xrows = weight_rows(rows)
        drows = [row_ptr(kb, kb.arg("dst"), node, *unravel_row(kb, node, r)) for r in rows]
        abase = row_ptr(kb, kb.arg("src0"), a, i64(0), a2, a3)
        k_lo, k_hi = tile_range(kb, xrows, x.type, 4, n_k, 0.0, align=1) if zero_tail else (i64(0), n_k)
        for v0 in range(0, nv_all, block):
            vs = range(v0, min(v0 + block, nv_all))
            accs = [{v: kb.var(vec(F32, VEC), zeros(F32, VEC), "ax") for v in vs} for _ in range(n)]
            def keys(k0: ir.Value, k1: ir.Value) -> None:
                with kb.loop(k0, k1, "k") as k:
                    arow = kb.byte_ptr(abase, b.mul(k, a_step))
                    read = ChunkReader(kb, a.type)
                    avs = {v: read(arow, v) for v in vs}
                    for t in range(n):
                        xk = splat(b, _as_operand(b, b.load(kb.elem_ptr(xrows[t], k, F32), typ=F32, align=4),
                                                  a.type), VEC)
                        for v in vs:
                            b.store(b.fadd(b.fmul(avs[v], xk, flags=CONTRACT), b.load(accs[t][v]),
                                           flags=CONTRACT), accs[t][v])

            if not zero_tail:
                keys(k_lo, k_hi)
            else:  # the chunks where every weight of the tile is 0 skipped
                live_chunks(kb, k_lo, k_hi, lambda c: any_live(kb, xrows, x.type, 4, n_k, c, 0.0), keys)
            for t in range(n):
                for v in vs:
                    store_vec(b, b.load(accs[t][v]), kb.elem_ptr(drows[t], i64(VEC * v), F32))

    _token_tiles(kb, node, start, end, tok, tile, together if zero_tail else None, head_tile(node, tok))


def _float_scalar(kb: KernelBuilder, node: Tensor) -> None:
    b = kb.b
    a, x = node.src
    esize_a = type_size(a.type)
    start, end = kb.thread_range(n_rows(kb, node))
    K = kb.dim(a.ne[0])
    M = kb.dim(node.ne[0])
    axpy = a.nb[0] != esize_a and a.nb[1] == esize_a
    with kb.loop(start, end, "r") as r:
        i1, i2, i3, a2, a3 = _broadcast_rows(kb, node, r)
        xrow = row_ptr(kb, kb.arg("src1"), x, i1, i2, i3)
        drow = row_ptr(kb, kb.arg("dst"), node, i1, i2, i3)
        if axpy:  # dst[:] = sum_k x[k] * a[k, :]; a's rows (fixed k) are contiguous
            with kb.loop(i64(0), M, "i0") as i0:
                kb.store(elem_ptr(kb, drow, node, i0), f32(0.0), node.type)
            abase = row_ptr(kb, kb.arg("src0"), a, i64(0), a2, a3)
            with kb.loop(i64(0), K, "k") as k:
                xk = _as_operand(b, kb.load(elem_ptr(kb, xrow, x, k), x.type), a.type)
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
                    xv = _as_operand(b, kb.load(elem_ptr(kb, xrow, x, k), x.type), a.type)
                    b.store(kb.fadd(b.load(acc), kb.fmul(av, xv)), acc)
                kb.store(elem_ptr(kb, drow, node, i0), b.load(acc), node.type)
