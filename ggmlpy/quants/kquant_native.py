"""ggml's K-quant scale searches (make_qkx2_quants, make_qx_quants, make_q3_quants) as native code.

The searches dominate quantising to a K-quant: each sub-block tries 16 to 37 candidate
scales over its 16 or 32 values, or sweeps them five times (make_q3_quants). kquant_search.py
states them in numpy, one vector operation per element position over all sub-blocks, which
runs at 8-15 M weights a second. Here the
same steps are emitted as LLVM IR over 16 sub-blocks at a time, one per vector lane, so each
lane performs exactly the float32 operations of the numpy version (and of ggml's C loop) in
the same order: no reassociation, no fused multiply-add, ordered comparisons, decisions as
selects. The numpy functions stay the definition; tests hold this code to them and to ggml.

Data goes in groups of LANES sub-blocks: element i of sub-block 16g + j sits at
[(g * k + i) * 16 + j], so each step of a sum loads one vector. The compiled module is kept
in the object cache like the kernels.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from ggmlpy.quants.kquant_search import GROUP_MAX_EPS
from ggmlpy.quants.rounding import F32, NEAREST_INT_MAGIC

LANES = 16

_SEARCH = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int64)


class _Emitter:
    """One search function, fn(x, w, out_a, out_b, levels, n_groups): a loop over groups
    whose body the caller emits with the numpy version's operations on <16 x float> lanes."""

    def __init__(self, module: Any, name: str, k: int):
        from llvmlite import ir
        self.ir, self.k = ir, k
        self.f32, self.i32, self.i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        self.vf, self.vi = ir.VectorType(self.f32, LANES), ir.VectorType(self.i32, LANES)
        ptr = ir.PointerType(ir.IntType(8))
        self.fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr] * 5 + [self.i64]), name)
        self.x, self.w, self.out_a, self.out_b, self.levels, n = self.fn.args
        entry = self.fn.append_basic_block("entry")
        self.b = b = ir.IRBuilder(entry)
        self._group_block = self.fn.append_basic_block("group")
        self._done = self.fn.append_basic_block("done")
        b.cbranch(b.icmp_signed(">", n, self.i64(0)), self._group_block, self._done)
        b.position_at_end(self._group_block)
        self.g = b.phi(self.i64, "g")
        self.g.add_incoming(self.i64(0), entry)
        self._n = n

    def finish(self) -> None:
        b = self.b
        nxt = b.add(self.g, self.i64(1))
        self.g.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_signed("<", nxt, self._n), self._group_block, self._done)
        b.position_at_end(self._done)
        b.ret_void()

    # memory ------------------------------------------------------------------------------
    def _at(self, base, i: int, elem, vec):
        """Pointer to element i's vector of this group in `base` (elements of type elem)."""
        b = self.b
        index = b.add(b.mul(self.g, self.i64(self.k * LANES)), self.i64(i * LANES))
        typed = b.bitcast(base, self.ir.PointerType(elem))
        return b.bitcast(b.gep(typed, [index]), self.ir.PointerType(vec))

    def load_f(self, base, i: int):
        return self.b.load(self._at(base, i, self.f32, self.vf), align=4)

    def load_level(self, i: int):
        v = self.b.load(self._at(self.levels, i, self.ir.IntType(8), self.ir.VectorType(self.ir.IntType(8), LANES)),
                        align=1)
        return self.b.zext(v, self.vi)

    def store_level(self, i: int, v) -> None:
        vec8 = self.ir.VectorType(self.ir.IntType(8), LANES)
        self.b.store(self.b.trunc(v, vec8), self._at(self.levels, i, self.ir.IntType(8), vec8), align=1)

    def store_out(self, base, v) -> None:
        b = self.b
        typed = b.bitcast(base, self.ir.PointerType(self.f32))
        ptr = b.bitcast(b.gep(typed, [b.mul(self.g, self.i64(LANES))]), self.ir.PointerType(self.vf))
        b.store(v, ptr, align=4)

    # arithmetic, lane by lane ---------------------------------------------------------------
    def f(self, value: float):
        return self.ir.Constant(self.vf, [self.f32(float(F32(value)))] * LANES)

    def i(self, value: int):
        return self.ir.Constant(self.vi, [self.i32(value)] * LANES)

    def splat(self, scalar):
        b = self.b
        one = b.insert_element(self.ir.Constant(self.vf, self.ir.Undefined), scalar, self.i32(0))
        return b.shuffle_vector(one, self.ir.Constant(self.vf, self.ir.Undefined),
                                self.ir.Constant(self.vi, [self.i32(0)] * LANES))

    def add(self, x, y):
        return self.b.fadd(x, y)

    def sub(self, x, y):
        return self.b.fsub(x, y)

    def mul(self, x, y):
        return self.b.fmul(x, y)

    def div(self, x, y):
        return self.b.fdiv(x, y)

    def neg(self, x):
        return self.b.fneg(x)

    def sel(self, cond, x, y):
        return self.b.select(cond, x, y)

    def cmp(self, op: str, x, y):
        """numpy's comparison: ordered (false with a NaN), except != (true with one)."""
        return self.b.fcmp_unordered(op, x, y) if op == "!=" else self.b.fcmp_ordered(op, x, y)

    def abs(self, x):
        """fabsf: the sign bit cleared."""
        return self.b.bitcast(self.b.and_(self.b.bitcast(x, self.vi), self.i(0x7FFFFFFF)), self.vf)

    def nearest_int(self, v):
        """ggml's nearest_int: the mantissa bits of v + 1.5*2^23, less 2^22."""
        bits = self.b.bitcast(self.add(v, self.f(NEAREST_INT_MAGIC)), self.vi)
        return self.b.sub(self.b.and_(bits, self.i(0x007FFFFF)), self.i(0x00400000))

    def clamp(self, v, lo: int, hi: int):
        b = self.b
        v = b.select(b.icmp_signed("<", v, self.i(lo)), self.i(lo), v)
        return b.select(b.icmp_signed(">", v, self.i(hi)), self.i(hi), v)

    def to_f(self, v):
        return self.b.sitofp(v, self.vf)

    def seq_sum(self, terms: list):
        """Sum in index order from 0.0f, as a C loop (and kquant_search.seq_sum) adds."""
        acc = self.f(0.0)
        for t in terms:
            acc = self.add(acc, t)
        return acc

    # a loop over candidate steps, its state in phis ----------------------------------------------
    def steps(self, count: int, state: dict, body) -> dict:
        """Run body(step_index_i32, state) -> new state, `count` times, in an IR loop."""
        b = self.b
        pre = b.block
        head = self.fn.append_basic_block("step")
        after = self.fn.append_basic_block("steps_done")
        b.branch(head)
        b.position_at_end(head)
        t = b.phi(self.i32, "t")
        t.add_incoming(self.i32(0), pre)
        phis = {}
        for key, value in state.items():
            phis[key] = b.phi(value.type, key)
            phis[key].add_incoming(value, pre)
        new = body(t, dict(phis))
        nxt = b.add(t, self.i32(1))
        t.add_incoming(nxt, b.block)
        for key, phi in phis.items():
            phi.add_incoming(new[key], b.block)
        b.cbranch(b.icmp_signed("<", nxt, self.i32(count)), head, after)
        b.position_at_end(after)
        return new   # the body is one block, which the exit follows: its values are the final state


def _emit_qkx2(e: _Emitter, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool) -> None:
    """kquant_search.make_qkx2_quants_ref for one group: out_a the scale, out_b the_min."""
    k = e.k
    xs = [e.load_f(e.x, i) for i in range(k)]
    ws = [e.load_f(e.w, i) for i in range(k)]
    mn, mx = xs[0], xs[0]
    sum_w, sum_x = ws[0], e.mul(ws[0], xs[0])
    for i in range(1, k):
        mn = e.sel(e.cmp("<", xs[i], mn), xs[i], mn)
        mx = e.sel(e.cmp(">", xs[i], mx), xs[i], mx)
        sum_w = e.add(sum_w, ws[i])
        sum_x = e.add(sum_x, e.mul(ws[i], xs[i]))
    mn = e.sel(e.cmp(">", mn, e.f(0.0)), e.f(0.0), mn)
    flat, flat_min = e.cmp("==", mx, mn), mn

    def error(scale, minimum, levels):
        diffs = [e.sub(e.add(e.mul(scale, lf), minimum), x) for lf, x in zip(levels, xs)]
        return e.seq_sum([e.mul(w, e.abs(d) if use_mad else e.mul(d, d)) for w, d in zip(ws, diffs)])

    iscale = e.div(e.f(nmax), e.sub(mx, mn))
    scale = e.div(e.f(1.0), iscale)
    first = [e.clamp(e.nearest_int(e.mul(iscale, e.sub(x, mn))), 0, nmax) for x in xs]
    for i, level in enumerate(first):
        e.store_level(i, level)
    best = error(scale, mn, [e.to_f(v) for v in first])

    def step(t, s):
        b = e.b
        factor = b.fadd(b.fadd(e.f32(float(F32(rmin))), b.fmul(e.f32(float(F32(rdelta))), b.sitofp(t, e.f32))),
                        e.f32(float(F32(nmax))))
        iscale = e.div(e.splat(factor), e.sub(mx, s["mn"]))
        cand = [e.clamp(e.nearest_int(e.mul(iscale, e.sub(x, s["mn"]))), 0, nmax) for x in xs]
        cf = [e.to_f(v) for v in cand]
        wl = [e.mul(w, c) for w, c in zip(ws, cf)]
        sum_l = e.seq_sum(wl)
        sum_l2 = e.seq_sum([e.mul(a, c) for a, c in zip(wl, cf)])
        sum_xl = e.seq_sum([e.mul(a, x) for a, x in zip(wl, xs)])
        det = e.sub(e.mul(sum_w, sum_l2), e.mul(sum_l, sum_l))
        this_scale = e.div(e.sub(e.mul(sum_w, sum_xl), e.mul(sum_x, sum_l)), det)
        this_min = e.div(e.sub(e.mul(sum_l2, sum_x), e.mul(sum_l, sum_xl)), det)
        clamped = e.cmp(">", this_min, e.f(0.0))
        this_min = e.sel(clamped, e.f(0.0), this_min)
        this_scale = e.sel(clamped, e.div(sum_xl, sum_l2), this_scale)
        err = error(this_scale, this_min, cf)
        better = b.and_(e.cmp(">", det, e.f(0.0)), e.cmp("<", err, s["best"]))
        for i, c in enumerate(cand):
            e.store_level(i, e.b.select(better, c, e.load_level(i)))
        return {"best": e.sel(better, err, s["best"]), "scale": e.sel(better, this_scale, s["scale"]),
                "mn": e.sel(better, this_min, s["mn"])}

    end = e.steps(nstep + 1, {"best": best, "scale": scale, "mn": mn}, step)
    for i in range(k):
        e.store_level(i, e.b.select(flat, e.i(0), e.load_level(i)))
    e.store_out(e.out_a, e.sel(flat, e.f(0.0), end["scale"]))
    e.store_out(e.out_b, e.neg(e.sel(flat, flat_min, end["mn"])))


def _emit_qx(e: _Emitter, nmax: int, weighted: bool) -> None:
    """kquant_search.make_qx_quants_ref for one group: out_a the scale, levels + nmax."""
    k = e.k
    xs = [e.load_f(e.x, i) for i in range(k)]
    ws = [e.load_f(e.w, i) for i in range(k)] if weighted else [e.mul(x, x) for x in xs]
    amax, mx = e.f(0.0), e.f(0.0)
    for x in xs:
        ax = e.abs(x)
        take = e.cmp(">", ax, amax)
        amax, mx = e.sel(take, ax, amax), e.sel(take, x, mx)

    def candidate(iscale):
        levels = [e.clamp(e.nearest_int(e.mul(iscale, x)), -nmax, nmax - 1) for x in xs]
        lf = [e.to_f(v) for v in levels]
        sumlx = e.seq_sum([e.mul(e.mul(w, x), c) for w, x, c in zip(ws, xs, lf)])
        suml2 = e.seq_sum([e.mul(e.mul(w, c), c) for w, c in zip(ws, lf)])
        return levels, sumlx, suml2

    levels, sumlx, suml2 = candidate(e.div(e.f(-nmax), mx))
    for i, level in enumerate(levels):
        e.store_level(i, e.b.add(level, e.i(nmax)))
    scale = e.sel(e.cmp("!=", suml2, e.f(0.0)), e.div(sumlx, suml2), e.f(0.0))
    best = e.mul(scale, sumlx)

    def step(t, s):
        b = e.b
        # t = 0..17 -> step -9..-1, 1..9
        shifted = b.sub(t, e.i32(9))
        signed = b.select(b.icmp_signed(">=", shifted, e.i32(0)), b.add(shifted, e.i32(1)), shifted)
        total = b.fadd(e.f32(float(F32(nmax))), b.fmul(e.f32(float(F32(0.1))), b.sitofp(signed, e.f32)))
        levels, sumlx, suml2 = candidate(e.div(e.neg(e.splat(total)), mx))
        better = b.and_(e.cmp(">", suml2, e.f(0.0)), e.cmp(">", e.mul(sumlx, sumlx), e.mul(s["best"], suml2)))
        for i, level in enumerate(levels):
            e.store_level(i, b.select(better, b.add(level, e.i(nmax)), e.load_level(i)))
        scale = e.sel(better, e.div(sumlx, suml2), s["scale"])
        return {"scale": scale, "best": e.sel(better, e.mul(scale, sumlx), s["best"])}

    end = e.steps(18, {"scale": scale, "best": best}, step)
    zero = e.cmp("<", amax, e.f(GROUP_MAX_EPS))
    for i in range(k):
        e.store_level(i, e.b.select(zero, e.i(0), e.load_level(i)))
    e.store_out(e.out_a, e.sel(zero, e.f(0.0), end["scale"]))


def _emit_q3(e: _Emitter, nmax: int) -> None:
    """kquant_search.make_q3_quants_ref for one group: out_a the scale, levels + nmax. The
    five sweeps are unrolled, the levels kept in registers."""
    b = e.b
    xs = [e.load_f(e.x, i) for i in range(e.k)]
    ws = [e.mul(x, x) for x in xs]
    amax, mx = e.f(0.0), e.f(0.0)
    for x in xs:
        ax = e.abs(x)
        take = e.cmp(">", ax, amax)
        amax, mx = e.sel(take, ax, amax), e.sel(take, x, mx)
    iscale = e.div(e.f(-nmax), mx)
    levels = [e.clamp(e.nearest_int(e.mul(iscale, x)), -nmax, nmax - 1) for x in xs]
    lf = [e.to_f(v) for v in levels]
    sumlx = e.seq_sum([e.mul(e.mul(w, x), c) for w, x, c in zip(ws, xs, lf)])
    suml2 = e.seq_sum([e.mul(e.mul(w, c), c) for w, c in zip(ws, lf)])
    for _sweep in range(5):
        for i, (x, w) in enumerate(zip(xs, ws)):
            li = e.to_f(levels[i])
            slx = e.sub(sumlx, e.mul(e.mul(w, x), li))
            sl2 = e.sub(suml2, e.mul(e.mul(w, li), li))
            new = e.clamp(e.nearest_int(e.div(e.mul(x, sl2), slx)), -nmax, nmax - 1)
            newf = e.to_f(new)
            slx_new = e.add(slx, e.mul(e.mul(w, x), newf))
            sl2_new = e.add(sl2, e.mul(e.mul(w, newf), newf))
            accept = b.and_(b.and_(e.cmp(">", slx, e.f(0.0)), b.icmp_signed("!=", new, levels[i])),
                            b.and_(e.cmp(">", sl2_new, e.f(0.0)),
                                   e.cmp(">", e.mul(e.mul(slx_new, slx_new), suml2),
                                         e.mul(e.mul(sumlx, sumlx), sl2_new))))
            levels[i] = b.select(accept, new, levels[i])
            sumlx, suml2 = e.sel(accept, slx_new, sumlx), e.sel(accept, sl2_new, suml2)
    zero = e.cmp("<", amax, e.f(GROUP_MAX_EPS))
    for i, level in enumerate(levels):
        e.store_level(i, b.select(zero, e.i(0), b.add(level, e.i(nmax))))
    scale = e.sel(e.cmp(">", suml2, e.f(0.0)), e.div(sumlx, suml2), e.f(0.0))
    e.store_out(e.out_a, e.sel(zero, e.f(0.0), scale))


_EMITTERS = {"qkx2": _emit_qkx2, "qx": _emit_qx, "q3": _emit_q3}


@functools.lru_cache(maxsize=None)
def _search(kind: str, k: int, *params: Any) -> Any:
    """The compiled search for these parameters (the module is kept alive with it)."""
    from llvmlite import ir

    from ggmlpy.codegen_cpu.runtime import compile_module
    from ggmlpy.codegen_cpu.target import host

    module = ir.Module(name=f"ggmlpy_{kind}")
    module.triple = host().triple
    name = f"ggmlpy_{kind}"
    e = _Emitter(module, name, k)
    _EMITTERS[kind](e, *params)
    e.finish()
    compiled = compile_module(str(module))
    return compiled, _SEARCH(compiled.address(name))


def _grouped(x: np.ndarray) -> np.ndarray:
    """(k, n) sub-blocks as columns -> (groups, k, LANES), the last group padded with zeros."""
    k, n = x.shape
    groups = -(-n // LANES)
    padded = np.zeros((k, groups * LANES), dtype=F32)
    padded[:, :n] = x
    return np.ascontiguousarray(padded.reshape(k, groups, LANES).transpose(1, 0, 2))


def _ungrouped(levels: np.ndarray, n: int) -> np.ndarray:
    groups, k, _ = levels.shape
    return np.ascontiguousarray(levels.transpose(1, 0, 2).reshape(k, groups * LANES)[:, :n])


def _run(kind: str, x: np.ndarray, w: np.ndarray | None, *params: Any
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compiled search `kind` over the sub-blocks (columns) of x, weighted by w (None: the
    search weighs by x itself): (out_a, out_b, levels), each cut back to x's sub-blocks."""
    k, n = x.shape
    xg = _grouped(x)
    wg = xg if w is None else _grouped(w)
    groups = len(xg)
    out_a, out_b = np.empty(groups * LANES, F32), np.empty(groups * LANES, F32)
    levels = np.empty((groups, k, LANES), np.uint8)
    _, fn = _search(kind, k, *params)
    fn(xg.ctypes.data, wg.ctypes.data, out_a.ctypes.data, out_b.ctypes.data, levels.ctypes.data, groups)
    return out_a[:n], out_b[:n], _ungrouped(levels, n)


def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                     nstep: int, use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """kquant_search.make_qkx2_quants_ref, natively: (scale, the_min, levels)."""
    return _run("qkx2", x, w, nmax, float(F32(rmin)), float(F32(rdelta)), nstep, bool(use_mad))


def make_qx_quants(x: np.ndarray, nmax: int, w: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """kquant_search.make_qx_quants_ref, natively: (scale, levels + nmax)."""
    scale, _, levels = _run("qx", x, w, nmax, w is not None)
    return scale, levels


def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """kquant_search.make_q3_quants_ref, natively: (scale, levels + nmax)."""
    scale, _, levels = _run("q3", x, None, nmax)
    return scale, levels
