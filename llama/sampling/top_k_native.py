"""The k largest logits of a row in one native pass, for top-k sampling.

Right after a decode the caches are cold (the step has just streamed every weight through
them), and then each numpy call on a logits row costs several times its warm price: the
block-maxima route of `candidates.order_desc` (a reshape-max, a partition, a compare, a
nonzero, a partition, a sort and an argsort) took about 125 µs of a 49,152-token row after
80 MB had streamed through the caches, a third of the default chain's 345 µs there (39 µs
warm). This loop looks at the row once, 16 values at a time against the smallest value kept
so far, and keeps the k best in a small sorted buffer; only the rare chunk holding a value
above that threshold is looked at value by value.

The order is order_desc's: largest first, equal values in index order (a later value equal
to the k-th best is not taken). A row holding NaN is reported and left to numpy, whose
order for NaN the callers already have.

Compiled once into the disk cache (ggmlpy.codegen_cpu.runtime.compile_module), like the
kernels; called through ctypes, which lets go of the GIL.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

# i64 ggmlpy_top_k(float *x, i64 n, i64 k, float *kept_values, i64 *kept_ids): fills the
# first min(k, n) entries of the two buffers, largest first; returns 1 if x holds a NaN.
# Requires k >= 1.
_TOP_K_IR = r"""
define internal i64 @push(ptr %bv, ptr %bi, i64 %k, i64 %c, float %x, i64 %idx) alwaysinline {
entry:
  %km1 = sub i64 %k, 1
  %room = icmp slt i64 %c, %k
  br i1 %room, label %insert, label %full
full:
  %lastp = getelementptr float, ptr %bv, i64 %km1
  %last = load float, ptr %lastp, align 4
  %better = fcmp ogt float %x, %last
  br i1 %better, label %insert, label %keep
keep:
  ret i64 %c
insert:
  %j0 = select i1 %room, i64 %c, i64 %km1
  br label %shift_head
shift_head:
  %j = phi i64 [%j0, %insert], [%jm1, %shift]
  %at_top = icmp eq i64 %j, 0
  br i1 %at_top, label %place, label %compare
compare:
  %jm1 = sub i64 %j, 1
  %pvp = getelementptr float, ptr %bv, i64 %jm1
  %pv = load float, ptr %pvp, align 4
  %smaller = fcmp olt float %pv, %x
  br i1 %smaller, label %shift, label %place
shift:
  %dvp = getelementptr float, ptr %bv, i64 %j
  store float %pv, ptr %dvp, align 4
  %pip = getelementptr i64, ptr %bi, i64 %jm1
  %pi = load i64, ptr %pip, align 8
  %dip = getelementptr i64, ptr %bi, i64 %j
  store i64 %pi, ptr %dip, align 8
  br label %shift_head
place:
  %vp = getelementptr float, ptr %bv, i64 %j
  store float %x, ptr %vp, align 4
  %ip = getelementptr i64, ptr %bi, i64 %j
  store i64 %idx, ptr %ip, align 8
  %c1 = add i64 %c, 1
  %grown = select i1 %room, i64 %c1, i64 %c
  ret i64 %grown
}

define i64 @ggmlpy_top_k(ptr %x, i64 %n, i64 %k, ptr %bv, ptr %bi) {
entry:
  %nv = and i64 %n, -16
  %km1 = sub i64 %k, 1
  br label %chunk_head
chunk_head:
  %i = phi i64 [0, %entry], [%i16, %chunk_done]
  %c = phi i64 [0, %entry], [%c_chunk, %chunk_done]
  %nan = phi <16 x i1> [zeroinitializer, %entry], [%nan1, %chunk_done]
  %more = icmp slt i64 %i, %nv
  br i1 %more, label %chunk, label %tail_head
chunk:
  %p = getelementptr float, ptr %x, i64 %i
  %v = load <16 x float>, ptr %p, align 4
  %isnan = fcmp uno <16 x float> %v, %v
  %nan1 = or <16 x i1> %nan, %isnan
  %room = icmp slt i64 %c, %k
  br i1 %room, label %lanes_head, label %test
test:
  %lastp = getelementptr float, ptr %bv, i64 %km1
  %last = load float, ptr %lastp, align 4
  %lv0 = insertelement <16 x float> poison, float %last, i64 0
  %lv = shufflevector <16 x float> %lv0, <16 x float> poison, <16 x i32> zeroinitializer
  %above = fcmp ogt <16 x float> %v, %lv
  %bits = bitcast <16 x i1> %above to i16
  %any = icmp ne i16 %bits, 0
  br i1 %any, label %lanes_head, label %chunk_done
lanes_head:
  %l = phi i64 [0, %chunk], [0, %test], [%l1, %lane]
  %cl = phi i64 [%c, %chunk], [%c, %test], [%cl1, %lane]
  %lanes_more = icmp slt i64 %l, 16
  br i1 %lanes_more, label %lane, label %chunk_done
lane:
  %idx = add i64 %i, %l
  %xp = getelementptr float, ptr %x, i64 %idx
  %xv = load float, ptr %xp, align 4
  %cl1 = call i64 @push(ptr %bv, ptr %bi, i64 %k, i64 %cl, float %xv, i64 %idx)
  %l1 = add i64 %l, 1
  br label %lanes_head
chunk_done:
  %c_chunk = phi i64 [%c, %test], [%cl, %lanes_head]
  %i16 = add i64 %i, 16
  br label %chunk_head
tail_head:
  %t = phi i64 [%nv, %chunk_head], [%t1, %tail]
  %ct = phi i64 [%c, %chunk_head], [%ct1, %tail]
  %tnan = phi i1 [false, %chunk_head], [%tnan1, %tail]
  %tail_more = icmp slt i64 %t, %n
  br i1 %tail_more, label %tail, label %done
tail:
  %txp = getelementptr float, ptr %x, i64 %t
  %txv = load float, ptr %txp, align 4
  %tisnan = fcmp uno float %txv, %txv
  %tnan1 = or i1 %tnan, %tisnan
  %ct1 = call i64 @push(ptr %bv, ptr %bi, i64 %k, i64 %ct, float %txv, i64 %t)
  %t1 = add i64 %t, 1
  br label %tail_head
done:
  %nanbits = bitcast <16 x i1> %nan to i16
  %vnan = icmp ne i16 %nanbits, 0
  %anynan = or i1 %vnan, %tnan
  %r = zext i1 %anynan to i64
  ret i64 %r
}
"""

_TOP_K = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_void_p, ctypes.c_void_p)


@functools.lru_cache(maxsize=1)
def _top_k() -> tuple[object, ctypes._CFuncPtr]:
    from ggmlpy.codegen_cpu.runtime import compile_module

    module = compile_module(_TOP_K_IR)
    return module, _TOP_K(module.address("ggmlpy_top_k"))


def top_k_indices(logits: np.ndarray, k: int) -> np.ndarray | None:
    """Indices of the min(k, len) largest of a float32 row, largest first, ties in index
    order; None when the row holds a NaN (numpy's order then applies)."""
    if logits.dtype != np.float32 or logits.ndim != 1 or not logits.flags.c_contiguous:
        raise ValueError("top_k_indices takes a contiguous 1-D float32 row")
    n = len(logits)
    k = min(k, n)
    if k < 1:
        return np.zeros(0, dtype=np.int64)
    kept_values = np.empty(k, dtype=np.float32)
    kept_ids = np.empty(k, dtype=np.int64)
    _, run = _top_k()
    if run(logits.ctypes.data, n, k, kept_values.ctypes.data, kept_ids.ctypes.data):
        return None
    return kept_ids
