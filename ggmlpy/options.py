"""The `GGMLPY_*` settings of the backends, as one frozen object read when a backend is made.

Nothing in ggmlpy reads these variables at import time or keeps them in module globals: a
backend takes an `Options` (None: `Options.from_env()` at its creation) and hands what its
code generators need to them explicitly. So a program (or a test) can set options per
backend, without touching `os.environ`, and importing ggmlpy never fails on a bad value.

Not here: `GGMLPY_MODELS` (hub.py, where downloaded models live: a download setting, not a
backend's) and `GGMLPY_COMPILE_INPROCESS` (compile_worker.py: a process-wide protocol, the
worker child sets it for itself so that it compiles with its own LLVM; read at call time).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

QDOT_FLAVOURS = ("vnni512", "vnni256", "avx2", "generic")  # the CPU dot flavours (codegen_cpu/kernels/qvec.py)


def _flag(value: str | None) -> bool:
    """The "set and not 0" convention of GGMLPY_PROFILE (and GGMLPY_COMPILE_INPROCESS)."""
    return value not in (None, "", "0")


def _seconds(value: str | None, default: float) -> float:
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"GGMLPY_RAY_TIMEOUT={value!r} is not a number of seconds") from None


@dataclass(frozen=True)
class Options:
    """One field per setting; each documents its variable, default and effect."""

    # GGMLPY_PROFILE (default off; on when set and not "0"): the CPU backend builds profiled
    # entry functions that time every node (ggmlpy viz --profile reads the times)
    profile: bool = False
    # GGMLPY_CPU_QDOT (default None: the best the host supports): force the CPU's quantised
    # dot-product flavour, one of QDOT_FLAVOURS (kernels/qvec.py); part of the plan key
    cpu_qdot: str | None = None
    # GGMLPY_CACHE (default None: ~/.cache/ggmlpy): the root of the compiled-code disk caches
    cache_dir: str | None = None
    # GGMLPY_CUDA_ATTN_THREADS (default 1024): threads per block of the fused attention kernel
    # when its grid is small (decode); for comparisons
    cuda_attn_threads: int = 1024
    # GGMLPY_CUDA_PDL (default on; off when "0"): programmatic dependent launch in CUDA graphs
    # on sm_90+ (still subject to the driver's probe); for comparisons
    cuda_pdl: bool = True
    # GGMLPY_CUDA_MATVEC_ROWS (default 0: by matrix size): rows per warp of the CUDA
    # mat-vec kernels, 0, 1, 2 or 4; for benchmark comparisons
    cuda_matvec_rows: int = 0
    # GGMLPY_CUDA_FUSE_OPROJ (default off; on when "1"): a decode attention kernel computes its
    # output projection and residual add too (off until measured on a GPU)
    cuda_fuse_oproj: bool = False
    # GGMLPY_RAY_TIMEOUT (default 300): seconds a ray: device waits for any answer of its
    # actor before it is given up (ggmlpy/distributed/remote_backend.py)
    ray_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.cpu_qdot is not None and self.cpu_qdot not in QDOT_FLAVOURS:
            raise ValueError(f"GGMLPY_CPU_QDOT={self.cpu_qdot!r} is not one of {QDOT_FLAVOURS}")
        if self.cuda_matvec_rows not in (0, 1, 2, 4):
            raise ValueError(f"matvec_rows must be 0 (automatic), 1, 2 or 4, not {self.cuda_matvec_rows}")
        if not self.ray_timeout_s > 0:
            raise ValueError(f"GGMLPY_RAY_TIMEOUT must be > 0 seconds, got {self.ray_timeout_s}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Options":
        """The options the variables in `environ` (None: os.environ) give; unset ones take
        the defaults. Called when a backend is created, never at import."""
        env = os.environ if environ is None else environ
        return cls(
            profile=_flag(env.get("GGMLPY_PROFILE")),
            cpu_qdot=env.get("GGMLPY_CPU_QDOT") or None,
            cache_dir=env.get("GGMLPY_CACHE") or None,
            cuda_attn_threads=int(env.get("GGMLPY_CUDA_ATTN_THREADS", "1024")),
            cuda_pdl=env.get("GGMLPY_CUDA_PDL", "1") != "0",
            cuda_matvec_rows=int(env.get("GGMLPY_CUDA_MATVEC_ROWS", "0")),
            cuda_fuse_oproj=env.get("GGMLPY_CUDA_FUSE_OPROJ", "0") == "1",
            ray_timeout_s=_seconds(env.get("GGMLPY_RAY_TIMEOUT"), 300.0),
        )
