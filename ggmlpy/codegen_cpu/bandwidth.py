"""The machine's memory read bandwidth, measured the way decode reads its weights: a native
loop of wide vector loads, every thread streaming its own contiguous slice, run on the
same native thread pool and thread count as a compiled graph.

Decode reads every weight once per token, so this figure over the bytes a token reads is
the decode roofline (`ggmlpy bench` reports the fraction of it a decode reaches). The
buffer is several times the last-level cache so that the loop measures DRAM, not cache.
"""
from __future__ import annotations

import functools
import time

import numpy as np

from ggmlpy.codegen_cpu.runtime import NativeObject, JitModule, ThreadPool, compile_module

BUFFER_BYTES = 256 << 20       # far above any L3 these machines have (32 MiB)
UNROLL = 4                     # independent 64-byte loads per iteration

# read(ctx, ith, nth): ctx = [data ptr, n_bytes (a multiple of 64 * UNROLL * nth), out ptr]
_READ_IR = r"""
define void @ggmlpy_read(ptr %ctx, i32 %ith32, i32 %nth32) {
entry:
  %data = load ptr, ptr %ctx, align 8
  %nb_p = getelementptr i64, ptr %ctx, i64 1
  %nb = load i64, ptr %nb_p, align 8
  %out_p = getelementptr i64, ptr %ctx, i64 2
  %out = load ptr, ptr %out_p, align 8
  %ith = sext i32 %ith32 to i64
  %nth = sext i32 %nth32 to i64
  %per = udiv i64 %nb, %nth
  %start = mul i64 %per, %ith
  %end = add i64 %start, %per
  br label %loop
loop:
  %i = phi i64 [%start, %entry], [%i1, %loop]
  %a0 = phi <16 x i32> [zeroinitializer, %entry], [%n0, %loop]
  %a1 = phi <16 x i32> [zeroinitializer, %entry], [%n1, %loop]
  %a2 = phi <16 x i32> [zeroinitializer, %entry], [%n2, %loop]
  %a3 = phi <16 x i32> [zeroinitializer, %entry], [%n3, %loop]
  %p0 = getelementptr i8, ptr %data, i64 %i
  %p1 = getelementptr i8, ptr %p0, i64 64
  %p2 = getelementptr i8, ptr %p0, i64 128
  %p3 = getelementptr i8, ptr %p0, i64 192
  %v0 = load <16 x i32>, ptr %p0, align 64
  %v1 = load <16 x i32>, ptr %p1, align 64
  %v2 = load <16 x i32>, ptr %p2, align 64
  %v3 = load <16 x i32>, ptr %p3, align 64
  %n0 = add <16 x i32> %a0, %v0
  %n1 = add <16 x i32> %a1, %v1
  %n2 = add <16 x i32> %a2, %v2
  %n3 = add <16 x i32> %a3, %v3
  %i1 = add i64 %i, 256
  %more = icmp ult i64 %i1, %end
  br i1 %more, label %loop, label %done
done:
  %s01 = add <16 x i32> %n0, %n1
  %s23 = add <16 x i32> %n2, %n3
  %s = add <16 x i32> %s01, %s23
  %x = extractelement <16 x i32> %s, i32 0
  %slot = getelementptr i32, ptr %out, i64 %ith
  store volatile i32 %x, ptr %slot, align 4
  ret void
}
"""


@functools.lru_cache(maxsize=1)
def _read_module() -> NativeObject | JitModule:
    return compile_module(_READ_IR)


def read_gb_s(n_threads: int, reps: int = 5, buffer_bytes: int = BUFFER_BYTES) -> float:
    """The best of `reps` passes over a buffer far larger than the caches, in GB/s (10^9)."""
    step = 64 * UNROLL * n_threads
    n_bytes = max(buffer_bytes // step, 1) * step
    raw = np.empty(n_bytes + 64, dtype=np.uint8)
    data = raw[(-raw.ctypes.data) % 64:][:n_bytes]
    data[:] = 1                                    # touch every page before timing
    out = np.zeros(64, dtype=np.int32)
    ctx = np.array([data.ctypes.data, n_bytes, out.ctypes.data], dtype=np.uint64)
    fn = _read_module().address("ggmlpy_read")
    pool = ThreadPool(n_threads)
    try:
        pool.run(fn, ctx.ctypes.data)              # warm-up: threads spinning, TLB filled
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            pool.run(fn, ctx.ctypes.data)
            best = min(best, time.perf_counter() - t0)
    finally:
        pool.close()
    # lane 0 of a thread's sum: word 0 (bytes of 1) of each of its 64-byte lines, mod 2^32
    expected = np.array((n_bytes // n_threads // 64 * 0x01010101) % (1 << 32), dtype=np.uint32).view(np.int32)
    if not np.all(out[:n_threads] == expected):
        raise RuntimeError("the bandwidth loop read wrong data")
    return n_bytes / best / 1e9
