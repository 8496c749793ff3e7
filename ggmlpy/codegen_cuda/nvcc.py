"""Compiling CUDA C with nvcc (subprocess), results cached on disk.

The cache key names the source hash, the target (`sm_90` / `compute_90`), the output kind
(cubin, ptx), the flags and nvcc's own version line, so a toolkit upgrade or another GPU
never picks up a stale binary. Works without a GPU: `nvcc -ptx -arch=sm_90` only needs the
toolkit, which is how CI checks every template.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ggmlpy.disk_cache import DiskCache

log = logging.getLogger("ggmlpy.codegen_cuda.nvcc")

NVCC_FLAGS = ("-std=c++17", "-O3")
NVCC_TIMEOUT_S = 600


class CompileError(RuntimeError):
    """nvcc (or the host compiler of the emulator) rejected a module; carries its log."""


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for candidate in ("/usr/local/cuda/bin/nvcc",):
        if os.path.exists(candidate):
            return candidate
    return None


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return " | ".join(lines[-2:])


def compile_cuda(source: str, arch: str, kind: str = "cubin", cache: DiskCache | None = None,
                 nvcc: str | None = None, extra_flags: tuple[str, ...] = ()) -> bytes:
    """`source` compiled for `arch` (e.g. "sm_90") to a cubin or PTX, through the cache."""
    if kind not in ("cubin", "ptx"):
        raise ValueError(f"kind must be 'cubin' or 'ptx', not {kind!r}")
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise CompileError("nvcc not found (put the CUDA toolkit's bin folder on PATH)")
    flags = NVCC_FLAGS + tuple(extra_flags)
    parts = {"source": hashlib.sha256(source.encode()).hexdigest(), "arch": arch, "kind": kind,
             "flags": " ".join(flags), "nvcc": nvcc_version(nvcc)}
    if cache is not None:
        hit = cache.get(parts, "." + kind)
        if hit is not None:
            return hit
    with tempfile.TemporaryDirectory(prefix="ggmlpy-nvcc-") as tmp:
        src = Path(tmp) / "module.cu"
        out = Path(tmp) / f"module.{kind}"
        src.write_text(source)
        cmd = [nvcc, f"--{kind}", f"-arch={arch}", *flags, "-o", str(out), str(src)]
        log.info("compiling a CUDA module (%d bytes of source) for %s", len(source), arch)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed ({' '.join(cmd)}):\n{numbered_errors(proc.stderr, source)}")
        data = out.read_bytes()
    if cache is not None:
        cache.put(parts, data, "." + kind)
    return data


def numbered_errors(stderr: str, source: str, context: int = 2) -> str:
    """The compiler's messages, each followed by the offending source lines (the source is
    generated, so the file it names is gone by the time anyone reads the error)."""
    lines = source.splitlines()
    out = []
    for msg in stderr.splitlines()[:60]:
        out.append(msg)
        m = re.search(r"module\.cu(?:\((\d+)\)|:(\d+):)", msg)
        if m and ("error" in msg):
            n = int(m.group(1) or m.group(2))
            for i in range(max(1, n - context), min(len(lines), n + context) + 1):
                out.append(f"    {i:5d}| {lines[i - 1]}")
    return "\n".join(out)
