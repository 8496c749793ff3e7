"""The host as an LLVM target: triple, CPU name and features, one TargetMachine per process.

Kernels are compiled for exactly this CPU (AVX2, AVX-512, VNNI where present); the disk cache
keys object code by the same name and features so a file built elsewhere is never run here.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import llvmlite
import llvmlite.binding as llvm


@dataclass(frozen=True)
class HostTarget:
    triple: str
    cpu: str
    features: str  # LLVM's "+avx2,+fma,..." string

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
                "llvmlite": llvmlite.__version__, "llvm": ".".join(map(str, llvm.llvm_version_info))}


@functools.lru_cache(maxsize=1)
def host() -> HostTarget:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return HostTarget(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                      llvm.get_host_cpu_features().flatten())


@functools.lru_cache(maxsize=1)
def target_machine() -> "llvm.TargetMachine":
    """The shared machine for optimising and emitting object code."""
    return new_target_machine()


def new_target_machine() -> "llvm.TargetMachine":
    """A fresh machine: an MCJIT engine takes ownership of the one it is given."""
    t = host()
    return llvm.Target.from_triple(t.triple).create_target_machine(
        cpu=t.cpu, features=t.features, opt=3, reloc="pic", codemodel="default")


def optimize(module: "llvm.ModuleRef") -> None:
    """LLVM's O3 pipeline (new pass manager; llvmlite 0.50 has no legacy one)."""
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(target_machine(), pto)
    pb.getModulePassManager().run(module, pb)
