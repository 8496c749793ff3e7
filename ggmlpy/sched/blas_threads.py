"""Numpy's BLAS on one thread while the reference backend computes.

The reference backend runs between native splits when it is a context's fallback (a few
products a layer, each a matrix-vector product at decode). OpenBLAS hands such a product to
its own worker threads, which then busy-wait (sched_yield in a loop) for about 0.1 s before
they sleep; with a reference product every few hundred microseconds they never sleep. On a
2-core machine that is a third runnable thread beside the CPU backend's caller and worker,
and every barrier of the next native split waits for a time slice (SmolLM2 with its 30
`ffn_down` products on the reference backend, 2 threads: 11 tok/s with 2 BLAS threads, 78
with one).

`one_blas_thread()` sets every loaded OpenBLAS to one thread and restores the count when the
last concurrent user leaves. The count is the process's (a per-thread one exists only in
OpenBLAS 0.3.27 and later), so this object is process-wide too. A BLAS that is not OpenBLAS (or none found, off Linux) is
left alone.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np  # noqa: F401  (loads numpy's BLAS before /proc/self/maps is read)

# (get, set) symbol pairs, as OpenBLAS builds name them: plain, 64-bit-integer (numpy < 2
# wheels), scipy-openblas (numpy >= 2 wheels)
_SYMBOLS = [(f"{p}_get_num_threads{s}", f"{p}_set_num_threads{s}")
            for p in ("openblas", "scipy_openblas") for s in ("", "64_")]


@dataclass(frozen=True)
class BlasLibrary:
    """One loaded OpenBLAS: its path and its thread-count accessors."""
    path: str
    get_threads: Callable[[], int]
    set_threads: Callable[[int], None]


def _loaded_paths() -> list[str]:
    """Shared objects mapped into this process whose file name mentions OpenBLAS."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    paths = {line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6}
    return sorted(p for p in paths if "openblas" in p.rsplit("/", 1)[-1].lower() and ".so" in p)


@functools.lru_cache(maxsize=1)
def openblas_libraries() -> tuple[BlasLibrary, ...]:
    """The OpenBLAS libraries loaded in this process (numpy's, and any other's)."""
    found = []
    for path in _loaded_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in _SYMBOLS:
            try:
                get, set_ = getattr(lib, get_name), getattr(lib, set_name)
            except AttributeError:
                continue
            get.restype, get.argtypes = ctypes.c_int, []
            set_.restype, set_.argtypes = None, [ctypes.c_int]
            found.append(BlasLibrary(path, get, set_))
            break
    return tuple(found)


class BlasThreadLimit:
    """Counts the threads inside `one()`: the first sets one BLAS thread, the last restores
    the counts it found."""

    def __init__(self, libraries: Callable[[], tuple[BlasLibrary, ...]] = openblas_libraries):
        self._libraries = libraries
        self._lock = threading.Lock()
        self._users = 0
        self._saved: list[tuple[BlasLibrary, int]] = []

    @contextlib.contextmanager
    def one(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._saved = [(lib, lib.get_threads()) for lib in self._libraries()]
                for lib, _ in self._saved:
                    lib.set_threads(1)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    for lib, n in self._saved:
                        lib.set_threads(n)
                    self._saved = []


# the process's BLAS thread count has one owner per process
_LIMIT = BlasThreadLimit()


def one_blas_thread() -> contextlib.AbstractContextManager[None]:
    """A context in which numpy's BLAS (OpenBLAS) runs on the calling thread only."""
    return _LIMIT.one()
