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
READ_LOOP_BYTES = 128 << 20    # a benchmark's loop between its runs: 4x that L3, a few ms a pass
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


class ReadLoop:
    """The read loop over one buffer, touched once, on a given thread pool: a benchmark
    measures it between its own timed runs on the pool that runs its graphs, so that the
    roofline's bandwidth comes from the same seconds of a shared machine (its bandwidth
    moves by 2x within a minute) and no second pool's workers spin against these."""

    def __init__(self, pool: ThreadPool, buffer_bytes: int = BUFFER_BYTES):
        self.pool = pool
        step = 64 * UNROLL * pool.n_threads
        self.n_bytes = max(buffer_bytes // step, 1) * step
        self._raw = np.empty(self.n_bytes + 64, dtype=np.uint8)
        self._data = self._raw[(-self._raw.ctypes.data) % 64:][:self.n_bytes]
        self._data[:] = 1                                 # touch every page before timing
        self._out = np.zeros(64, dtype=np.int32)
        self._ctx = np.array([self._data.ctypes.data, self.n_bytes, self._out.ctypes.data], dtype=np.uint64)
        self._fn = _read_module().address("ggmlpy_read")

    def gb_s(self, reps: int = 1) -> float:
        """The best of `reps` passes, in GB/s (10^9)."""
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            self.pool.run(self._fn, self._ctx.ctypes.data)
            best = min(best, time.perf_counter() - t0)
        nth = self.pool.n_threads
        # lane 0 of a thread's sum: word 0 (bytes of 1) of each of its 64-byte lines, mod 2^32
        expected = np.array((self.n_bytes // nth // 64 * 0x01010101) % (1 << 32), dtype=np.uint32).view(np.int32)
        if not np.all(self._out[:nth] == expected):
            raise RuntimeError("the bandwidth loop read wrong data")
        return self.n_bytes / best / 1e9


def read_gb_s(n_threads: int, reps: int = 5, buffer_bytes: int = BUFFER_BYTES) -> float:
    """The best of `reps` passes over a buffer far larger than the caches, in GB/s (10^9),
    on a pool of its own."""
    pool = ThreadPool(n_threads)
    try:
        loop = ReadLoop(pool, buffer_bytes)
        loop.gb_s(1)                                 # warm-up: threads spinning, TLB filled
        return loop.gb_s(reps)
    finally:
        pool.close()
