"""Native threads for compiled graphs, and loading of compiled modules.

A compiled graph is one native function `graph(ctx, ith, nth)` that every thread runs, with
barriers between nodes. Worker threads are Python threads that call a compiled worker loop
through ctypes (which releases the GIL): it spins waiting for the next launch, runs the
graph, counts itself done, and only after a while without work returns to Python to sleep on
an Event. A launch from Python therefore costs about a microsecond (CPU_FACTS.md), not the
40 µs of waking Python threads.

Modules reach memory without LLVM where possible: object code comes from the disk cache or
the compile worker (a child process) and is loaded by our ELF loader; MCJIT (JitModule) is
the fallback for an object the loader rejects.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import logging
import threading
import time
import weakref

import numpy as np

from ggmlpy.codegen_cpu.compile_worker import compile_ir, emit_object
from ggmlpy.codegen_cpu.object_cache import ObjectCache
from ggmlpy.codegen_cpu.elf_loader import ElfLoadError, NativeObject
from ggmlpy.codegen_cpu.target import host, new_target_machine

log = logging.getLogger("ggmlpy.codegen_cpu")

# pool array (int64) layout
GEN, QUIT, FN, CTX, NTH, DONE = 0, 1, 2, 3, 4, 5
SEEN, IDLE = 8, 8 + 64
POOL_WORDS = 8 + 64 + 64
SPIN_LIMIT = 20_000  # wait iterations (pause, then sched_yield) before an idle worker sleeps in Python

_RUNTIME_IR = r"""
define internal void @pause() {
  %t = icmp eq i1 1, 1
  br i1 %t, label %p, label %e
p:
  PAUSE
  br label %e
e:
  ret void
}

define i64 @ggmlpy_worker(ptr %pool, i64 %ith) {
entry:
  %seen_p = getelementptr i64, ptr %pool, i64 %ith
  %seen_q = getelementptr i64, ptr %seen_p, i64 8
  %idle_q = getelementptr i64, ptr %seen_p, i64 72
  %quit_p = getelementptr i64, ptr %pool, i64 1
  %fn_p = getelementptr i64, ptr %pool, i64 2
  %ctx_p = getelementptr i64, ptr %pool, i64 3
  %nth_p = getelementptr i64, ptr %pool, i64 4
  %done_p = getelementptr i64, ptr %pool, i64 5
  br label %wait
wait:
  %spins = phi i64 [0, %entry], [%spins1, %counted], [0, %ran], [0, %woke]
  %g = load atomic i64, ptr %pool seq_cst, align 8
  %s = load i64, ptr %seen_q, align 8
  %new = icmp ne i64 %g, %s
  br i1 %new, label %run, label %check
run:
  store i64 %g, ptr %seen_q, align 8
  %fn = load ptr, ptr %fn_p, align 8
  %ctx = load ptr, ptr %ctx_p, align 8
  %nth = load i64, ptr %nth_p, align 8
  %ith32 = trunc i64 %ith to i32
  %nth32 = trunc i64 %nth to i32
  call void %fn(ptr %ctx, i32 %ith32, i32 %nth32)
  %old = atomicrmw add ptr %done_p, i64 1 seq_cst
  br label %ran
ran:
  br label %wait
check:
  %q = load atomic i64, ptr %quit_p seq_cst, align 8
  %stop = icmp ne i64 %q, 0
  br i1 %stop, label %quit, label %more
more:
  %tired = icmp sgt i64 %spins, SPIN_LIMIT
  br i1 %tired, label %sleep, label %spin
spin:
  %busy = icmp slt i64 %spins, 2000
  br i1 %busy, label %relax, label %yield
relax:
  call void @pause()
  br label %counted
yield:
  %r = call i32 @sched_yield()
  br label %counted
counted:
  %spins1 = add i64 %spins, 1
  br label %wait
sleep:
  store atomic i64 1, ptr %idle_q seq_cst, align 8
  %g2 = load atomic i64, ptr %pool seq_cst, align 8
  %new2 = icmp ne i64 %g2, %s
  br i1 %new2, label %woke, label %idle
woke:
  store atomic i64 0, ptr %idle_q seq_cst, align 8
  br label %wait
idle:
  ret i64 0
quit:
  ret i64 1
}

define void @ggmlpy_launch(ptr %pool, ptr %fn, ptr %ctx, i64 %nth) {
  %fn_p = getelementptr i64, ptr %pool, i64 2
  %ctx_p = getelementptr i64, ptr %pool, i64 3
  %nth_p = getelementptr i64, ptr %pool, i64 4
  %done_p = getelementptr i64, ptr %pool, i64 5
  store ptr %fn, ptr %fn_p, align 8
  store ptr %ctx, ptr %ctx_p, align 8
  store i64 %nth, ptr %nth_p, align 8
  store atomic i64 0, ptr %done_p seq_cst, align 8
  %old = atomicrmw add ptr %pool, i64 1 seq_cst
  ret void
}

define void @ggmlpy_run_and_wait(ptr %pool, ptr %fn, ptr %ctx, i64 %nth) {
entry:
  %nth32 = trunc i64 %nth to i32
  call void %fn(ptr %ctx, i32 0, i32 %nth32)
  %want = sub i64 %nth, 1
  %done_p = getelementptr i64, ptr %pool, i64 5
  br label %spin
spin:
  %d = load atomic i64, ptr %done_p seq_cst, align 8
  %ok = icmp sge i64 %d, %want
  br i1 %ok, label %out, label %again
again:
  %r = call i32 @sched_yield()
  br label %spin
out:
  ret void
}
"""


class JitModule:
    """An LLVM module compiled for the host and kept alive with its MCJIT engine (this loads
    libllvmlite.so; `compile_module` avoids it)."""

    def __init__(self, ir_text: str | None = None, object_code: bytes | None = None,
                 optimize_ir: bool = True):
        import llvmlite.binding as llvm

        self.object_code = emit_object(ir_text, optimize_ir) if object_code is None else object_code
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), new_target_machine())
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(self.object_code))
        self.engine.finalize_object()

    def address(self, name: str) -> int:
        addr = self.engine.get_function_address(name)
        if not addr:
            raise KeyError(f"function {name} not found in the compiled module")
        return addr


def load_object(object_code: bytes) -> NativeObject | JitModule:
    """Object code in memory, by the ELF loader; by MCJIT if the loader rejects it."""
    try:
        return NativeObject(object_code)
    except ElfLoadError as e:
        log.warning("ELF loader rejected the object (%s); loading it with MCJIT", e)
        return JitModule(object_code=object_code)


def compile_module(ir_text: str, cache: ObjectCache | None = None) -> NativeObject | JitModule:
    """The module for `ir_text`: object code from the disk cache, else compiled (by the
    compile worker) and stored there, then loaded."""
    cache = cache if cache is not None else ObjectCache()
    data = cache.load(ir_text)
    if data is None:
        t0 = time.perf_counter()
        data = compile_ir(ir_text)
        log.info("LLVM compiled %d KiB of IR to %d KiB of object code in %.2f s",
                 len(ir_text) >> 10, len(data) >> 10, time.perf_counter() - t0)
        cache.store(ir_text, data)
    return load_object(data)


@functools.lru_cache(maxsize=1)
def _runtime() -> NativeObject | JitModule:
    pause = "call void @llvm.x86.sse2.pause()" if host().triple.startswith("x86_64") else ""
    text = _RUNTIME_IR.replace("PAUSE", pause).replace("SPIN_LIMIT", str(SPIN_LIMIT))
    text += "\ndeclare i32 @sched_yield()\n"
    if pause:
        text += "declare void @llvm.x86.sse2.pause()\n"
    return compile_module(text)


_WORKER = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
_LAUNCH = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


# Pools whose workers must be stopped before the interpreter exits: a daemon worker still
# spinning in native code while finalisation frees the compiled runtime would crash the
# process on its way out.
_LIVE_POOLS: "weakref.WeakSet[ThreadPool]" = weakref.WeakSet()


@atexit.register
def _stop_pools() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()


class ThreadPool:
    """n_threads - 1 workers plus the calling thread run each launched graph together."""

    def __init__(self, n_threads: int):
        if n_threads < 1:
            raise ValueError(f"n_threads must be >= 1, got {n_threads}")
        if n_threads > 64:
            raise ValueError("at most 64 threads are supported")
        rt = _runtime()
        self.n_threads = n_threads
        self.pool = np.zeros(POOL_WORDS, dtype=np.int64)
        self._addr = self.pool.ctypes.data
        self._worker = _WORKER(rt.address("ggmlpy_worker"))
        self._launch = _LAUNCH(rt.address("ggmlpy_launch"))
        self._run_and_wait = _LAUNCH(rt.address("ggmlpy_run_and_wait"))
        self._wake = [threading.Event() for _ in range(n_threads)]
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True,
                                          name=f"ggmlpy-cpu-{i}") for i in range(1, n_threads)]
        for t in self._threads:
            t.start()
        _LIVE_POOLS.add(self)

    def _work(self, ith: int) -> None:
        """Spin natively while work comes often; sleep here when it stops. The native loop
        publishes IDLE and then looks for work once more, and `run` bumps the generation
        before it reads IDLE, so a launch either finds the worker spinning or wakes it."""
        while True:
            if self._worker(self._addr, ith) == 1:
                return
            self._wake[ith].wait()
            self._wake[ith].clear()
            self.pool[IDLE + ith] = 0

    def run(self, fn_addr: int, ctx_addr: int, n_threads: int | None = None) -> None:
        nth = min(n_threads or self.n_threads, self.n_threads)
        if nth == 1:  # no launch: the workers must not see a generation they have no part in
            self._run_and_wait(self._addr, fn_addr, ctx_addr, 1)
            return
        self._launch(self._addr, fn_addr, ctx_addr, nth)
        for ith in range(1, nth):
            if self.pool[IDLE + ith]:
                self._wake[ith].set()
        self._run_and_wait(self._addr, fn_addr, ctx_addr, nth)

    def close(self) -> None:
        self.pool[QUIT] = 1
        for e in self._wake:
            e.set()
        for t in self._threads:
            t.join(timeout=1.0)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
