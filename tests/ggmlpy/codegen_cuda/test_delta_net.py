"""gated_delta_net on the CUDA backend beyond the registry's one-op cases (test_ops.py runs
those): q, k, v as strided views into one packed row per token and the token count
symbolic (one kernel and one memory plan for every ubatch size, as in a model graph), with
device memory filled with NaN bytes first, so a snapshot slot the kernel should zero but
leaves as it was shows. On the host emulator always, on the GPU when there is one."""
from __future__ import annotations

import numpy as np

from ggmlpy.codegen_cuda.backend import CudaBackend
from ggmlpy.sched.store import TensorStore
from ggmlpy.testing.ops import normalized_error

from ..codegen_cpu.test_cpu_delta_net import S, H_V, _graph, _inputs, _reference

EXACT = 1e-9   # test_ops.py's bar: float32 arithmetic in another order


def _poisoned(backend: CudaBackend) -> CudaBackend:
    """Every device allocation of `backend` starts as 0xFF bytes (NaN floats)."""
    alloc = backend.alloc

    def poisoned_alloc(n: int) -> int:
        ptr = alloc(n)
        backend.driver.memset(ptr, 0xFF, n)
        return ptr

    backend.alloc = poisoned_alloc  # type: ignore[method-assign]
    return backend


def test_every_token_count_and_slot(device):
    kind, driver = device
    for K, kda in ((1, False), (3, True)):
        graph, out = _graph(K, kda)
        backend = _poisoned(CudaBackend(driver=driver))
        backend.set_limits({"n_tokens": 8})
        split = backend.compile(graph, graph.nodes)
        rng = np.random.default_rng(K)
        for n in (5, 1, 2, 7):   # 1 and 2 tokens leave snapshot slots unwritten by ggml
            inputs = _inputs(n, kda, rng)
            store = TensorStore(inputs)
            split.run(store, {"n_tokens": n})
            got = np.asarray(store.array(out, {"n_tokens": n})).reshape(1, 1, -1, S * H_V)
            want = _reference(inputs, n, K)
            assert got.shape == want.shape and np.isfinite(got).all(), f"{kind}: K={K}, {n} tokens"
            err = normalized_error(got, want)
            assert err <= EXACT, f"{kind}: NMSE {err:.3g} for K={K}, {n} tokens"
