"""How far along a row its live entries reach: attention skips the keys no query can see.

In a causal prefill the mask hides about half of the (query, key) pairs, and each hidden
score becomes exactly 0 after the softmax. The attention kernels ask, per tile of queries,
for the row's live extent: 1 + the index of its last entry that is not `dead` (-inf in a
mask row, 0 in a row of probabilities), rounded up to a whole chunk. They compute scores
and products only below it; above it the results are what they would have been anyway
(a masked score's probability is 0, and adding 0 x v to a sum changes nothing), so the
results are the same and the work of the hidden half is gone.

The scan walks back from the end one chunk at a time and stops at the first live chunk:
for a causal mask that is about (n_kv - token) / CHUNK vector compares per row, against
head_dim multiply-adds per key for the scores. NaN counts as live.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ggmlpy.codegen_cpu.irgen import I64, KernelBuilder, i64
from ggmlpy.ir.types import GGMLType

CHUNK = 16  # entries per compare (one AVX-512 register of f32)


def live_extent(kb: KernelBuilder, row: ir.Value, t: GGMLType, stride: int, n: ir.Value, dead: float) -> ir.Value:
    """i64 in [0, n]: every entry of the row (n entries of type t, `stride` bytes apart,
    which must be the element size) at or past it equals `dead`; a multiple of CHUNK or n."""
    b = kb.b
    pre = b.block
    head = b.append_basic_block("extent.head")
    body = b.append_basic_block("extent.body")
    done = b.append_basic_block("extent.done")
    n_chunks = b.sdiv(b.add(n, i64(CHUNK - 1)), i64(CHUNK))
    b.branch(head)

    b.position_at_end(head)
    c = b.phi(I64, name="chunk")          # chunks not yet looked at: [0, c)
    c.add_incoming(n_chunks, pre)
    b.cbranch(b.icmp_signed(">", c, i64(0)), body, done)

    b.position_at_end(body)
    i0 = b.mul(b.sub(c, i64(1)), i64(CHUNK))
    left = b.sub(n, i0)
    lanes = kb.lane_mask(b.select(b.icmp_signed("<", left, i64(CHUNK)), left, i64(CHUNK)), CHUNK)
    values = kb.load_vector(kb.byte_ptr(row, b.mul(i0, i64(stride))), t, CHUNK, lanes, fill=dead)
    live = b.fcmp_unordered("!=", values, kb.splat(ir.Constant(values.type.element, dead), CHUNK))
    any_live = b.icmp_unsigned("!=", b.bitcast(live, ir.IntType(CHUNK)), ir.Constant(ir.IntType(CHUNK), 0))
    reach = b.add(i0, i64(CHUNK))         # this chunk is live: the extent ends with it
    reach = b.select(b.icmp_signed("<", reach, n), reach, n)
    c.add_incoming(b.sub(c, i64(1)), body)
    b.cbranch(any_live, done, head)

    b.position_at_end(done)
    end = b.phi(I64, name="extent")
    end.add_incoming(i64(0), head)
    end.add_incoming(reach, body)
    return end


def tile_extent(kb: KernelBuilder, rows: list[ir.Value], t: GGMLType, stride: int, n: ir.Value,
                dead: float) -> ir.Value:
    """The largest live extent of several rows (a tile of queries shares its keys)."""
    b = kb.b
    best = None
    for row in rows:
        e = live_extent(kb, row, t, stride, n, dead)
        best = e if best is None else b.select(b.icmp_signed(">", e, best), e, best)
    return best
