"""Oracles for the quantised KV cache: rows as a quantised cache stores and returns them (for
set_rows and cpy into one), and out_prod. Written from ggml's C code one value at a time in
float32 (numpy scalars), independently of ggmlpy.quants: Q8_0 as the x86 quantize_row_q8_0
(ggml-cpu's from_float), the others as quantize_row_*_ref, then dequantize_row_*."""
from __future__ import annotations

import math

import numpy as np

from ggmlpy.ir.types import GGMLType

F = np.float32
G = GGMLType
IQ4NL = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def _half(v) -> F:
    return F(np.float16(F(v)))


def _first_absmax(x: list) -> tuple[F, F]:
    amax, mx = F(0), F(0)
    for v in x:
        if amax < abs(v):
            amax, mx = abs(v), v
    return amax, mx


def _inv(d: F) -> F:
    return F(F(1) / d) if d != 0 else F(0)


def _block(t: GGMLType, x: list) -> list:
    """The 32 values of one block after quantising and decoding."""
    if t == G.Q8_0:
        amax = max(abs(v) for v in x)
        d = _half(F(amax / F(127)))
        inv = F(F(127) / amax) if amax != 0 else F(0)
        return [F(F(np.rint(F(v * inv))) * d) for v in x]
    if t in (G.Q4_0, G.Q5_0):
        half, top = (8, 15) if t == G.Q4_0 else (16, 31)
        _, mx = _first_absmax(x)
        d = F(mx / F(-half))
        inv = _inv(d)
        q = [min(top, int(F(F(v * inv) + F(half + 0.5)))) for v in x]
        return [F(F(k - half) * _half(d)) for k in q]
    if t in (G.Q4_1, G.Q5_1):
        levels = 15 if t == G.Q4_1 else 31
        lo, hi = min(x), max(x)
        d = F(F(hi - lo) / F(levels))
        inv = _inv(d)
        q = [int(F(F(F(v - lo) * inv) + F(0.5))) for v in x]
        q = [min(15, k) for k in q] if t == G.Q4_1 else [k & 255 for k in q]
        return [F(F(F(k) * _half(d)) + _half(lo)) for k in q]
    if t == G.IQ4_NL:
        return _iq4_nl(x)
    raise NotImplementedError(t.name)


def _best(al: F) -> int:
    """ggml's best_index_int8 over kvalues_iq4nl."""
    if al <= IQ4NL[0]:
        return 0
    if al >= IQ4NL[15]:
        return 15
    lo, hi = 0, 15
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if al < IQ4NL[mid]:
            hi = mid
        else:
            lo = mid
    return hi - 1 if F(al - F(IQ4NL[hi - 1])) < F(F(IQ4NL[hi]) - al) else hi


def _iq4_nl(x: list) -> list:
    amax, mx = _first_absmax(x)
    if amax < F(1e-15):
        return [F(0)] * 32
    inv = F(F(1) / F(mx / F(IQ4NL[0])))
    levels = [_best(F(inv * v)) for v in x]
    sumqx, sumq2 = F(0), F(0)
    for v, lv in zip(x, levels):
        q = F(IQ4NL[lv])
        wq = F(F(v * v) * q)
        sumqx = F(sumqx + F(wq * v))
        sumq2 = F(sumq2 + F(wq * q))
    d = _half(F(sumqx / sumq2) if sumq2 > 0 else F(0))
    return [F(d * F(IQ4NL[lv])) for lv in levels]


def round_row(t: GGMLType, values) -> list[float]:
    """A row of float values as a cache of quantised type t stores and reads it back."""
    x = [F(v) for v in values]
    out: list = []
    for b in range(0, len(x), 32):
        out += _block(t, x[b:b + 32])
    return [float(v) for v in out]


def out_prod(x, p, case):
    """out[i0, i1, i2, i3] = sum_k a[i0, k, i2 // r2, i3 // r3] * b[i1, k, i2, i3]."""
    a, b = x
    r2, r3 = b.shape[2] // a.shape[2], b.shape[3] // a.shape[3]
    out = np.empty((a.shape[0], b.shape[0], b.shape[2], b.shape[3]))
    for i0 in range(out.shape[0]):
        for i1 in range(out.shape[1]):
            for i2 in range(out.shape[2]):
                for i3 in range(out.shape[3]):
                    out[i0, i1, i2, i3] = math.fsum(a[i0, k, i2 // r2, i3 // r3] * b[i1, k, i2, i3]
                                                    for k in range(a.shape[1]))
    return out
