"""The ELF loader runs our compiler's objects exactly as MCJIT does, without loading LLVM.

Objects come from our own compiler: the SmolLM2 graphs, and tiny hand-written IR modules
that make LLVM emit each relocation type the loader handles. Relocation types are read here
with an independent little parser, not the loader's.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import llama
import ggmlpy.codegen_cpu.compile_worker as compile_worker
import ggmlpy.codegen_cpu.runtime as runtime
from ggmlpy.codegen_cpu.compile_worker import emit_object
from ggmlpy.codegen_cpu.elf_loader import SUPPORTED, ElfLoadError, NativeObject
from ggmlpy.codegen_cpu.target import HostTarget, detect_host_with_llvm, host, host_key, target_machine
from ggmlpy.testing.models import write_tiny_llama

LIBC = ctypes.CDLL(None)

# PIC, as the backend compiles: GOT loads of external data and functions (REX_GOTPCRELX), a
# call through the GOT (GOTPCRELX, from nonlazybind), a plain call to libc (PLT32 through a
# jump stub), a pointer in writable data (R_X86_64_64), rip-relative data (PC32), a GOTPCREL
# data word and an R_X86_64_NONE from module assembly.
PIC_IR = r"""
@environ = external global ptr
@fptr = global ptr @seven
@counter = internal global i64 5
declare i32 @sched_yield() nonlazybind
declare i32 @getpid()
define i64 @seven() { ret i64 7 }
define ptr @environ_value() { %v = load ptr, ptr @environ  ret ptr %v }
define ptr @yield_addr() { ret ptr @sched_yield }
define i32 @yield_via_got() { %r = call i32 @sched_yield()  ret i32 %r }
define i32 @call_getpid() { %r = call i32 @getpid()  ret i32 %r }
define ptr @fptr_value() { %v = load ptr, ptr @fptr  ret ptr %v }
define i64 @bump() {
  %v = load i64, ptr @counter
  %w = add i64 %v, 1
  store i64 %w, ptr @counter
  ret i64 %w
}
module asm ".text"
module asm ".reloc ., R_X86_64_NONE, seven"
module asm ".section .rodata,\22a\22,@progbits"
module asm ".globl gotpcrel_word"
module asm "gotpcrel_word: .long sched_yield@GOTPCREL"
module asm ".text"
"""

# non-PIC, small code model: absolute 32-bit addresses (R_X86_64_32 and 32S)
STATIC_IR = r"""
@table = internal global [4 x i64] [i64 10, i64 20, i64 30, i64 40]
define i64 @pick(i64 %i) {
  %p = getelementptr [4 x i64], ptr @table, i64 0, i64 %i
  %v = load i64, ptr %p
  ret i64 %v
}
define ptr @table_addr() { ret ptr @table }
"""

# a relocation MCJIT knows and this loader does not (R_X86_64_PC64)
PC64_IR = r"""
define i64 @seven() { ret i64 7 }
module asm ".section .rodata,\22a\22,@progbits"
module asm "distance: .quad seven - ."
module asm ".text"
"""


def relocation_types(obj: bytes) -> dict[int, int]:
    """{type: count} over the relocation sections of everything but .eh_frame."""
    shoff = struct.unpack_from("<Q", obj, 40)[0]
    shnum, shstrndx = struct.unpack_from("<HH", obj, 60)
    headers = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + 64 * i) for i in range(shnum)]
    strtab_off = headers[shstrndx][4]

    def name(h):
        end = obj.index(b"\0", strtab_off + h[0])
        return obj[strtab_off + h[0]:end].decode()

    counts: dict[int, int] = {}
    for h in headers:
        if h[1] == 4 and name(headers[h[7]]) != ".eh_frame":  # SHT_RELA of a loaded section
            for k in range(h[5] // 24):
                info = struct.unpack_from("<Q", obj, h[4] + 24 * k + 8)[0]
                counts[info & 0xFFFFFFFF] = counts.get(info & 0xFFFFFFFF, 0) + 1
    return counts


def static_object(ir_text: str) -> bytes:
    import llvmlite.binding as llvm

    h = host()
    target_machine()  # initialises LLVM's native target and assembly parser
    tm = llvm.Target.from_triple(h.triple).create_target_machine(
        cpu=h.cpu, features=h.features, opt=2, reloc="static", codemodel="small")
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    return tm.emit_object(mod)


def fn(obj, name: str, restype=ctypes.c_int64, *argtypes):
    return ctypes.CFUNCTYPE(restype, *argtypes)(obj.address(name))


def maps_lines(start: int, end: int) -> list[tuple[int, int, str]]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            rng, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in rng.split("-"))
            if lo < end and hi > start:
                out.append((lo, hi, perms[:3]))
    return out


@pytest.fixture(scope="module")
def pic_object() -> bytes:
    return emit_object(PIC_IR)


@pytest.fixture(scope="module")
def smollm2_runs(smollm2_path):
    """The same prompt and decodes with objects loaded by the ELF loader and by MCJIT."""
    model = llama.Model.load(smollm2_path)
    results = {}
    for how in ("elf", "mcjit"):
        loaded = []
        real = runtime.load_object

        def spy(data, how=how, real=real, loaded=loaded):
            module = runtime.JitModule(object_code=data) if how == "mcjit" else real(data)
            loaded.append((data, module))
            return module

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(runtime, "load_object", spy)
            ctx = llama.Context(model, n_ctx=256, n_batch=64, n_ubatch=64, backend="cpu")
            logits = []
            assert ctx.decode(llama.Batch.from_tokens([1, 504, 3458, 314, 260, 1115, 28, 339])) == 0
            logits.append(ctx.get_logits_ith(-1).copy())
            for tok in (2052, 30, 7):  # single-token decodes: the decode graph
                assert ctx.decode(llama.Batch.from_tokens([tok])) == 0
                logits.append(ctx.get_logits_ith(-1).copy())
        results[how] = (np.stack(logits), loaded)
    return results


def test_smollm2_native_object_is_bit_identical_to_mcjit(smollm2_runs):
    elf_logits, elf_loaded = smollm2_runs["elf"]
    jit_logits, jit_loaded = smollm2_runs["mcjit"]
    assert elf_loaded and all(isinstance(m, NativeObject) for _, m in elf_loaded)
    assert all(isinstance(m, runtime.JitModule) for _, m in jit_loaded)
    # the same graph objects (the elf run also loaded the thread pool's runtime module)
    elf_objects, jit_objects = {d for d, _ in elf_loaded}, {d for d, _ in jit_loaded}
    assert jit_objects and jit_objects <= elf_objects and len(elf_objects - jit_objects) <= 1
    assert np.isfinite(elf_logits).all() and elf_logits.std() > 0.1
    np.testing.assert_array_equal(elf_logits, jit_logits)
    assert isinstance(runtime._runtime(), NativeObject)  # the thread pool's module too


def test_every_handled_relocation_type_is_exercised(smollm2_runs, pic_object):
    seen: dict[int, int] = {}
    for obj in [d for d, _ in smollm2_runs["elf"][1]] + [pic_object, static_object(STATIC_IR)]:
        for typ, n in relocation_types(obj).items():
            seen[typ] = seen.get(typ, 0) + n
    graph_types = set()
    for d, _ in smollm2_runs["elf"][1]:
        graph_types |= set(relocation_types(d))
    assert {2, 4} <= graph_types  # PC32 (constants), PLT32 (sched_yield) in the real graphs
    assert set(seen) == SUPPORTED, f"seen {sorted(seen)}, handled {sorted(SUPPORTED)}"


def test_pic_relocations_resolve_to_the_right_addresses(pic_object):
    assert {1, 2, 4, 9, 41, 42, 0} <= set(relocation_types(pic_object))
    obj = NativeObject(pic_object)
    try:
        assert fn(obj, "seven")() == 7  # R_X86_64_NONE at its first byte changed nothing
        environ = ctypes.c_void_p.in_dll(LIBC, "environ").value
        assert fn(obj, "environ_value", ctypes.c_void_p)() == environ
        yield_addr = ctypes.cast(LIBC.sched_yield, ctypes.c_void_p).value
        assert fn(obj, "yield_addr", ctypes.c_void_p)() == yield_addr
        assert fn(obj, "yield_via_got", ctypes.c_int32)() == 0
        assert fn(obj, "call_getpid", ctypes.c_int32)() == os.getpid()
        assert fn(obj, "fptr_value", ctypes.c_void_p)() == obj.address("seven")
        bump = fn(obj, "bump")
        assert (bump(), bump()) == (6, 7)  # writable .data
        word = obj.address("gotpcrel_word")  # R_X86_64_GOTPCREL: GOT slot - place
        slot = word + ctypes.c_int32.from_address(word).value
        assert ctypes.c_void_p.from_address(slot).value == yield_addr
    finally:
        obj.close()


def test_absolute_32_bit_relocations_load_low():
    data = static_object(STATIC_IR)
    assert {10, 11} <= set(relocation_types(data))
    obj = NativeObject(data)
    try:
        assert [fn(obj, "pick", ctypes.c_int64, ctypes.c_int64)(i) for i in range(4)] == [10, 20, 30, 40]
        table = fn(obj, "table_addr", ctypes.c_void_p)()
        assert table < 1 << 31 and ctypes.c_int64.from_address(table).value == 10
    finally:
        obj.close()


def test_native_memory_is_never_writable_and_executable(pic_object):
    obj = NativeObject(pic_object)
    try:
        assert sorted(p for _, _, p in obj.regions) == ["r--", "r-x", "rw-"]
        lines = maps_lines(obj._base, obj._base + obj.size)
        assert lines
        for lo, hi, perms in lines:
            assert not ("w" in perms and "x" in perms), f"{lo:#x}-{hi:#x} is {perms}"
        for start, end, perms in obj.regions:  # the kernel shows what we asked for
            assert all(p == perms for _, _, p in maps_lines(start, end)), (start, perms)
        code = obj.address("seven")
        assert [p for _, _, p in maps_lines(code, code + 1)] == ["r-x"]
        base, size = obj._base, obj.size
    finally:
        obj.close()
    assert all("x" not in p for _, _, p in maps_lines(base, base + size))  # unmapped


def test_bad_objects_raise_elf_load_error(pic_object):
    with pytest.raises(ElfLoadError, match="truncated"):
        NativeObject(pic_object[: len(pic_object) // 2])
    with pytest.raises(ElfLoadError, match="truncated"):
        NativeObject(pic_object[:10])
    with pytest.raises(ElfLoadError, match="bad magic"):
        NativeObject(b"\x7fELG" + pic_object[4:])
    with pytest.raises(ElfLoadError, match="PC64"):
        NativeObject(emit_object(PC64_IR))
    # an unknown relocation type written over the first relocation of .rela.text
    data = bytearray(pic_object)
    shoff = struct.unpack_from("<Q", data, 40)[0]
    shnum = struct.unpack_from("<H", data, 60)[0]
    rela = next(shoff + 64 * i for i in range(shnum) if struct.unpack_from("<I", data, shoff + 64 * i + 4)[0] == 4)
    first = struct.unpack_from("<Q", data, rela + 24)[0]
    struct.pack_into("<I", data, first + 8, 200)
    with pytest.raises(ElfLoadError, match="type 200"):
        NativeObject(bytes(data))
    missing = emit_object("declare void @ggmlpy_no_such_symbol()\n"
                          "define void @f() { call void @ggmlpy_no_such_symbol() ret void }\n")
    with pytest.raises(ElfLoadError, match="ggmlpy_no_such_symbol"):
        NativeObject(missing)


def test_rejected_object_falls_back_to_mcjit(caplog):
    caplog.set_level(logging.WARNING, "ggmlpy.codegen_cpu")
    module = runtime.load_object(emit_object(PC64_IR))
    assert isinstance(module, runtime.JitModule)
    assert fn(module, "seven")() == 7
    assert any("R_X86_64_PC64" in r.getMessage() and "MCJIT" in r.getMessage() for r in caplog.records)


def test_backend_runs_through_the_fallback(tmp_path, monkeypatch, caplog):
    path = write_tiny_llama(tmp_path / "tiny.gguf", seed=5)
    model = llama.Model.load(path)
    tokens = llama.Batch.from_tokens([3, 1, 4, 1, 5])
    ctx = llama.Context(model, n_ctx=64, backend="cpu")
    assert ctx.decode(tokens) == 0
    expected = ctx.get_logits_ith(-1).copy()

    def reject(data):
        raise ElfLoadError("unsupported relocation R_X86_64_GOT32 (test)")

    monkeypatch.setattr(runtime, "NativeObject", reject)
    caplog.set_level(logging.WARNING, "ggmlpy.codegen_cpu")
    ctx2 = llama.Context(model, n_ctx=64, backend="cpu")
    assert ctx2.decode(tokens) == 0
    assert any("R_X86_64_GOT32" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(ctx2.get_logits_ith(-1), expected)


def test_worker_failure_compiles_in_process(monkeypatch, caplog):
    def broken():
        raise compile_worker.WorkerFailed("could not start the compile worker: test")

    monkeypatch.delenv(compile_worker.INPROCESS_ENV, raising=False)
    monkeypatch.setattr(compile_worker, "_idle", [])
    monkeypatch.setattr(compile_worker, "_Worker", broken)
    caplog.set_level(logging.WARNING, "ggmlpy.codegen_cpu")
    obj = NativeObject(compile_worker.compile_ir("define i64 @six() { ret i64 6 }\n"))
    assert fn(obj, "six")() == 6
    assert any("compiling in this process" in r.getMessage() for r in caplog.records)


def test_worker_reports_llvm_errors():
    with pytest.raises(RuntimeError, match="LLVM could not compile"):
        compile_worker._ask(b"C", b"define i64 @bad( { ret }")
    # the worker that answered is idle again, alive, and serves the next compile
    assert compile_worker._idle and compile_worker._idle[-1].proc.poll() is None
    assert compile_worker._ask(b"C", b"define i64 @ok() { ret i64 1 }\n")[:4] == b"\x7fELF"


def test_concurrent_compiles_each_get_a_worker():
    """Two threads compiling at once use two worker processes (a context's graphs compile
    side by side), and both workers stay for later compiles."""
    import threading

    compile_worker.shutdown()
    results, barrier = {}, threading.Barrier(2)

    def compile_one(i: int) -> None:
        barrier.wait()
        results[i] = NativeObject(compile_worker.compile_ir(f"define i64 @v() {{ ret i64 {i} }}\n"))

    threads = [threading.Thread(target=compile_one, args=(i,)) for i in (5, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert {i: fn(obj, "v")() for i, obj in results.items()} == {5: 5, 9: 9}
    assert len(compile_worker._idle) == 2
    assert len({w.proc.pid for w in compile_worker._idle}) == 2


SCRIPT = """
import json, sys
import llama
m = llama.Model.load(sys.argv[1])
ctx = llama.Context(m, n_ctx=128, backend="cpu")
assert ctx.decode(llama.Batch.from_tokens([1, 2, 3])) == 0
assert ctx.decode(llama.Batch.from_tokens([4])) == 0
be = ctx.backends[0]
maps = open("/proc/self/maps").read()
print(json.dumps({"binding": "llvmlite.binding" in sys.modules, "libllvmlite": "libllvmlite" in maps,
                  "hits": be.object_cache.hits, "misses": be.object_cache.misses,
                  "logit": float(ctx.get_logits_ith(-1)[7])}))
"""


def run_script(model, cache_dir, **env) -> dict:
    env = {"GGMLPY_CACHE": str(cache_dir), "PATH": "/usr/bin:/bin", **env}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(model)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_runs_never_load_llvm_in_the_process(tmp_path):
    model = write_tiny_llama(tmp_path / "tiny.gguf", seed=3)
    cold = run_script(model, tmp_path / "cache")  # compiled by the worker process
    assert cold["misses"] >= 1
    assert not cold["binding"] and not cold["libllvmlite"]
    # the host as the worker's LLVM saw it, kept for the next start
    (host_file,) = (tmp_path / "cache" / "cpu").glob("host-*.json")
    assert HostTarget(**json.loads(host_file.read_text())) == detect_host_with_llvm()
    warm = run_script(model, tmp_path / "cache")
    # every compile unit (entry, kernels) found by the graphs' plans: nothing compiled
    assert warm["misses"] == 0 and warm["hits"] >= cold["misses"] >= 3
    assert not warm["binding"] and not warm["libllvmlite"]
    assert warm["logit"] == cold["logit"]
    host_file.write_text("{not json")  # a broken host description is detected again
    again = run_script(model, tmp_path / "cache")
    assert again["hits"] == warm["hits"] and not again["binding"] and again["logit"] == cold["logit"]
    assert HostTarget(**json.loads(host_file.read_text())) == detect_host_with_llvm()
    inproc = run_script(model, tmp_path / "cache2", GGMLPY_COMPILE_INPROCESS="1")
    assert inproc["binding"] and inproc["libllvmlite"] and inproc["misses"] >= 1
    assert inproc["logit"] == cold["logit"]


def test_host_key_follows_the_cpu_not_the_core_order():
    core = "processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {extra}\n"
    two = core.format(n=0, extra="avx2") + core.format(n=1, extra="avx2")
    assert host_key(two) == host_key(core.format(n=0, extra="avx2"))
    assert host_key(two) != host_key(core.format(n=0, extra="avx512f"))
    assert host_key("nothing useful\n") is None
