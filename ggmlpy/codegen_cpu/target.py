"""The host as an LLVM target: triple, CPU name and features, one TargetMachine per process.

Kernels are compiled for exactly this CPU (AVX2, AVX-512, VNNI where present); the disk cache
keys object code by the same name and features so a file built elsewhere is never run here.

Asking LLVM for the host means loading libllvmlite.so (~40 MiB resident), which a warm start
(all object code on disk) otherwise never needs. So the description LLVM gives is itself kept
in the cache directory, under a key read without LLVM: a hash of /proc/cpuinfo's identifying
lines and llvmlite's installed version. Only the first run on a machine asks LLVM, and even
then in the compile worker process when one can be started (compile_worker.py).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ggmlpy.disk_cache import cache_dir, write_atomic

if TYPE_CHECKING:
    import llvmlite.binding as llvm

log = logging.getLogger("ggmlpy.codegen_cpu")

HOST_FORMAT = 1
CPUINFO_KEYS = ("vendor_id", "cpu family", "model", "model name", "flags")


@dataclass(frozen=True)
class HostTarget:
    triple: str
    cpu: str
    features: str  # LLVM's "+avx2,+fma,..." string
    llvm_version: str = ""  # of the LLVM inside llvmlite, e.g. "20.1.8"

    def has(self, feature: str) -> bool:
        return f"+{feature}" in self.features.split(",")

    @property
    def vnni512(self) -> bool:
        return self.has("avx512vnni") and self.has("avx512bw")

    @property
    def vector_bits(self) -> int:
        if self.has("avx512f"):
            return 512
        return 256 if self.has("avx2") else 128

    def cache_key_parts(self) -> dict[str, str]:
        return {"triple": self.triple, "cpu": self.cpu, "features": self.features,
                "llvmlite": llvmlite_version(), "llvm": self.llvm_version}


@functools.lru_cache(maxsize=1)
def llvmlite_version() -> str:
    """The installed llvmlite's version, read from its metadata (no import of its library)."""
    return importlib.metadata.version("llvmlite")


def detect_host_with_llvm() -> HostTarget:
    """Ask LLVM (loads libllvmlite.so into this process)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()  # for inline and module-level assembly
    return HostTarget(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                      llvm.get_host_cpu_features().flatten(),
                      ".".join(map(str, llvm.llvm_version_info)))


def host_key(cpuinfo: str | None = None) -> str | None:
    """What identifies this CPU and toolchain without LLVM, or None off Linux."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    lines = sorted({line.strip() for line in cpuinfo.splitlines()
                    if line.split(":")[0].strip() in CPUINFO_KEYS})
    if not lines:
        return None
    text = "\n".join([f"format {HOST_FORMAT}", f"llvmlite {llvmlite_version()}", *lines])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _host_file(key: str) -> Path:
    return cache_dir("cpu") / f"host-{key}.json"


def _read_host(path: Path) -> HostTarget | None:
    try:
        h = HostTarget(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return h if h.triple and h.cpu and h.llvm_version else None


def _write_host(path: Path, h: HostTarget) -> None:
    try:
        write_atomic(path, json.dumps(asdict(h)).encode())
    except OSError as e:  # only costs the next start a detection
        log.warning("could not write the host description %s: %s", path, e)


@functools.lru_cache(maxsize=1)
def host() -> HostTarget:
    """This machine's target, from the cache directory when it was detected before."""
    key = host_key()
    path = _host_file(key) if key else None
    if path is not None:
        cached = _read_host(path)
        if cached is not None:
            return cached
    from ggmlpy.codegen_cpu.compile_worker import detect_host

    h = detect_host()
    if path is not None:
        _write_host(path, h)
    return h


@functools.lru_cache(maxsize=1)
def target_machine() -> "llvm.TargetMachine":
    """The shared machine for optimising and emitting object code."""
    return new_target_machine()


def new_target_machine() -> "llvm.TargetMachine":
    """A fresh machine: an MCJIT engine takes ownership of the one it is given."""
    import llvmlite.binding as llvm

    t = host()
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()  # for inline and module-level assembly
    return llvm.Target.from_triple(t.triple).create_target_machine(
        cpu=t.cpu, features=t.features, opt=3, reloc="pic", codemodel="default")


def optimize(module: "llvm.ModuleRef") -> None:
    """LLVM's O3 pipeline (new pass manager; llvmlite 0.50 has no legacy one)."""
    import llvmlite.binding as llvm

    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(target_machine(), pto)
    pb.getModulePassManager().run(module, pb)
