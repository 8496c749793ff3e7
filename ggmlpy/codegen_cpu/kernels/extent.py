"""Where along a row its live entries lie: attention skips the keys no query can see.

In a causal prefill the mask hides about half of the (query, key) pairs, and in a sliding-
window layer (Gemma 3) the keys older than the window as well; each hidden score becomes
exactly 0 after the softmax. The attention kernels ask, per tile of queries, for the live
range [lo, hi) of its rows: past hi and before lo every entry is `dead` (-inf in a mask
row, 0 in a row of probabilities); lo and hi are whole chunks (clamped to the row). They
compute scores and products only inside it; outside, the results are what they would have
been anyway (a masked score's probability is 0, and adding 0 x v to a sum changes nothing),
so the results are the same and the work of the hidden part is gone. Inside the range, a
chunk of keys that no row of the tile sees (`any_live`) is skipped as well: the window
layers of a long prompt keep their cells in a ring, so the visible keys can wrap around it.

A tile computes its rows together, loading each key once for all of them; when its rows
see mostly different chunks (a batched decode step: each token of another sequence, whose
cells the KV cache keeps in blocks of their own, llama/kv_cells.py) it would compute every
row over all of them, so `rows_share_chunks` sends such a tile through one row at a time.

The scans walk in from either end one chunk at a time and stop at the first live chunk: for
a causal mask about (n_kv - token) / CHUNK vector compares per row from the end and one
from the start, against head_dim multiply-adds per key for the scores. NaN counts as live.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import I64, KernelBuilder, i64
from ggmlpy.ir.types import GGMLType

CHUNK = 16  # entries per compare (one AVX-512 register of f32)
TILES_APART = True  # rows_share_chunks decides; off, a tile's rows always go together (tests compare)


class Visible(NamedTuple):
    """What a tile of queries sees: keys [lo, hi) at most, and of those the chunks c (keys
    [c * CHUNK, (c + 1) * CHUNK)) for which chunk_live(c) holds (None: all of them)."""
    lo: ir.Value
    hi: ir.Value
    chunk_live: Callable[[ir.Value], ir.Value] | None


def any_live(kb: KernelBuilder, rows: list[ir.Value], t: GGMLType, stride: int, n: ir.Value, c: ir.Value,
             dead: float) -> ir.Value:
    """i1: chunk c (entries [c * CHUNK, (c + 1) * CHUNK) of n) is live in one of the rows."""
    b = kb.b
    live = None
    for row in rows:
        one = _chunk_live(kb, row, t, stride, n, c, dead)
        live = one if live is None else b.or_(live, one)
    return live


def live_chunks(kb: KernelBuilder, lo: ir.Value, hi: ir.Value, live: Callable[[ir.Value], ir.Value],
                body: Callable[[ir.Value, ir.Value], None]) -> None:
    """body(k0, k1) for every chunk [k0, k1) of [lo, hi) (lo a multiple of CHUNK) for which
    live(chunk index) holds: the chunks no row of a tile sees are skipped."""
    b = kb.b
    c1 = b.sdiv(b.add(hi, i64(CHUNK - 1)), i64(CHUNK))
    with kb.loop(b.sdiv(lo, i64(CHUNK)), c1, "kc") as c:
        with kb.if_then(live(c)):
            k0 = b.mul(c, i64(CHUNK))
            k1 = b.add(k0, i64(CHUNK))
            body(k0, b.select(b.icmp_signed("<", k1, hi), k1, hi))


def rows_share_chunks(kb: KernelBuilder, rows: list[ir.Value], t: GGMLType, stride: int, n: ir.Value,
                      dead: float) -> ir.Value:
    """i1: computing the rows together costs less than one at a time. Together, each row
    computes every chunk some row sees (the union, loading each key once for all rows);
    apart, only its own. The rule: together unless the rows see on average less than 3/4
    of the union (loading a key once for four rows saves about that much)."""
    b = kb.b
    if not TILES_APART:
        return ir.Constant(ir.IntType(1), 1)
    union = kb.var(I64, i64(0), "union")
    total = kb.var(I64, i64(0), "total")
    with kb.loop(i64(0), b.sdiv(b.add(n, i64(CHUNK - 1)), i64(CHUNK)), "sc") as c:
        bits = [_chunk_live(kb, row, t, stride, n, c, dead) for row in rows]
        seen = bits[0]
        count = b.zext(bits[0], I64)
        for bit in bits[1:]:
            seen = b.or_(seen, bit)
            count = b.add(count, b.zext(bit, I64))
        b.store(b.add(b.load(union), b.zext(seen, I64)), union)
        b.store(b.add(b.load(total), count), total)
    return b.icmp_signed(">=", b.mul(b.load(total), i64(4)), b.mul(b.load(union), i64(3 * len(rows))))


def _chunk_live(kb: KernelBuilder, row: ir.Value, t: GGMLType, stride: int, n: ir.Value, c: ir.Value,
                dead: float) -> ir.Value:
    """i1: chunk c of the row (entries [c * CHUNK, min(n, (c + 1) * CHUNK))) has an entry
    that is not `dead`."""
    b = kb.b
    i0 = b.mul(c, i64(CHUNK))
    left = b.sub(n, i0)
    lanes = kb.lane_mask(b.select(b.icmp_signed("<", left, i64(CHUNK)), left, i64(CHUNK)), CHUNK)
    values = kb.load_vector(kb.byte_ptr(row, b.mul(i0, i64(stride))), t, CHUNK, lanes, fill=dead)
    live = b.fcmp_unordered("!=", values, kb.splat(ir.Constant(values.type.element, dead), CHUNK))
    return b.icmp_unsigned("!=", b.bitcast(live, ir.IntType(CHUNK)), ir.Constant(ir.IntType(CHUNK), 0))


def _scan(kb: KernelBuilder, row: ir.Value, t: GGMLType, stride: int, n: ir.Value, dead: float,
          from_end: bool) -> ir.Value:
    """The first live chunk's index met walking from the start (or the end) of the row;
    n_chunks (or -1) when every chunk is dead."""
    b = kb.b
    pre = b.block
    head = b.append_basic_block("scan.head")
    body = b.append_basic_block("scan.body")
    done = b.append_basic_block("scan.done")
    n_chunks = b.sdiv(b.add(n, i64(CHUNK - 1)), i64(CHUNK))
    begin = b.sub(n_chunks, i64(1)) if from_end else i64(0)
    b.branch(head)

    b.position_at_end(head)
    c = b.phi(I64, name="chunk")
    c.add_incoming(begin, pre)
    inside = b.icmp_signed(">=", c, i64(0)) if from_end else b.icmp_signed("<", c, n_chunks)
    b.cbranch(inside, body, done)

    b.position_at_end(body)
    live = _chunk_live(kb, row, t, stride, n, c, dead)
    c.add_incoming(b.add(c, i64(-1 if from_end else 1)), body)
    b.cbranch(live, done, head)

    b.position_at_end(done)
    found = b.phi(I64, name="found")
    found.add_incoming(c, head)   # ran off the row: -1 or n_chunks
    found.add_incoming(c, body)
    return found


def live_range(kb: KernelBuilder, row: ir.Value, t: GGMLType, stride: int, n: ir.Value,
               dead: float) -> tuple[ir.Value, ir.Value]:
    """(lo, hi), i64 with 0 <= lo <= hi <= n: every entry of the row (n entries of type t,
    `stride` bytes apart, which must be the element size) outside [lo, hi) equals `dead`;
    both multiples of CHUNK or n; (0, 0) when all are dead."""
    b = kb.b
    last = _scan(kb, row, t, stride, n, dead, from_end=True)
    hi = b.mul(b.add(last, i64(1)), i64(CHUNK))
    hi = b.select(b.icmp_signed("<", hi, n), hi, n)
    first = _scan(kb, row, t, stride, n, dead, from_end=False)
    lo = b.mul(first, i64(CHUNK))
    lo = b.select(b.icmp_signed("<", lo, hi), lo, i64(0))   # all dead: hi = 0
    return lo, hi


def tile_range(kb: KernelBuilder, rows: list[ir.Value], t: GGMLType, stride: int, n: ir.Value,
               dead: float, align: int = CHUNK) -> tuple[ir.Value, ir.Value]:
    """The smallest range holding every row's live range (a tile of queries shares its
    keys), lo rounded down to a multiple of `align`."""
    b = kb.b
    lo = hi = None
    for row in rows:
        r_lo, r_hi = live_range(kb, row, t, stride, n, dead)
        lo = r_lo if lo is None else b.select(b.icmp_signed("<", r_lo, lo), r_lo, lo)
        hi = r_hi if hi is None else b.select(b.icmp_signed(">", r_hi, hi), r_hi, hi)
    if CHUNK % align:
        lo = b.mul(b.sdiv(lo, i64(align)), i64(align))
    return lo, hi
