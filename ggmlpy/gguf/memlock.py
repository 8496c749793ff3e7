"""Locking a model's bytes in RAM (llama.cpp's `llama_mlock`, `use_mlock`).

A locked model is never swapped or paged out, so the first token after an idle spell is as
fast as the others. The OS may refuse (RLIMIT_MEMLOCK, typically a few MiB for users
without CAP_IPC_LOCK): as in llama.cpp that is a warning, never a failed load, because the
model runs the same, only at the mercy of the page cache.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import sys

import numpy as np

log = logging.getLogger("ggmlpy.gguf")

MLOCK_SUGGESTION = "Try increasing RLIMIT_MEMLOCK ('ulimit -l' as root)."


def _libc() -> ctypes.CDLL | None:
    """The C library's symbols (mlock, munlock), or None where there is no POSIX mlock."""
    if sys.platform == "win32":
        return None
    return ctypes.CDLL(None, use_errno=True)


def _mlock(addr: int, size: int) -> int:
    """mlock(2): 0, or the errno it failed with."""
    libc = _libc()
    if libc is None:
        return errno.ENOSYS
    libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return 0 if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size)) == 0 else ctypes.get_errno()


def _munlock(addr: int, size: int) -> None:
    libc = _libc()
    if libc is not None:
        libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(size))


def _suggest_limit(err: int, size: int) -> bool:
    """llama.cpp's rule for adding MLOCK_SUGGESTION: out of lockable memory, and raising the
    soft limit up to the hard one would not be enough."""
    if err != errno.ENOMEM:
        return False
    import resource  # POSIX only, like mlock itself

    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if hard == resource.RLIM_INFINITY:
        return False
    return not hard > soft + size


class MemoryLock:
    """The regions this object locked, unlocked together by `unlock` (before they are
    unmapped or freed)."""

    def __init__(self) -> None:
        self.regions: list[tuple[int, int]] = []

    @property
    def locked_bytes(self) -> int:
        return sum(size for _, size in self.regions)

    def lock(self, buf: np.ndarray, what: str) -> bool:
        """Lock buf's pages (which faults them all in: the file is read now). False, with a
        warning naming what and why, when the OS refuses."""
        size = buf.nbytes
        if size == 0:
            return True
        addr = buf.ctypes.data
        err = _mlock(addr, size)
        if err:
            log.warning("warning: failed to mlock %d-byte buffer (after previously locking %d bytes) "
                        "for %s: %s%s", size, self.locked_bytes, what, os.strerror(err),
                        "\n" + MLOCK_SUGGESTION if _suggest_limit(err, size) else "")
            return False
        self.regions.append((addr, size))
        return True

    def unlock(self) -> None:
        for addr, size in self.regions:
            _munlock(addr, size)
        self.regions = []
