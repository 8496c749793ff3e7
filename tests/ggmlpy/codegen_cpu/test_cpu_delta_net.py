"""gated_delta_net on the CPU beyond the registry's one-op cases (test_cpu_ops.py runs those):
one kernel for every ubatch size (the token count symbolic, as in a model graph), every slot
of the result written (snapshots past the first token zeroed, not left over), and the same
bits for any number of threads (a (head, sequence) pair's state belongs to one thread)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.ir import N_TOKENS
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.ops import OPS
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.store import TensorStore
from ggmlpy.testing.ops import normalized_error

F32 = GGMLType.F32
S, H_K, H_V = 20, 2, 4


def _graph(K: int, kda: bool):
    """q, k and v as views into one packed row per token (the convolution's output, as the
    model reads them), over a symbolic number of tokens."""
    b = GraphBuilder()
    qkv = b.input("qkv", F32, (S * (2 * H_K + H_V), N_TOKENS))
    row = qkv.nb[1]
    q = b.view(qkv, (S, H_K, N_TOKENS), (4 * S, row))
    k = b.view(qkv, (S, H_K, N_TOKENS), (4 * S, row), 4 * S * H_K)
    v = b.view(qkv, (S, H_V, N_TOKENS), (4 * S, row), 8 * S * H_K)
    g = b.input("g", F32, (S if kda else 1, H_V, N_TOKENS, 1))
    beta = b.input("beta", F32, (1, H_V, N_TOKENS, 1))
    state = b.input("state", F32, (S, S, H_V, 1))
    out = b.gated_delta_net(q, k, v, g, beta, state, K=K)
    return b.build([out]), out


def _inputs(n: int, kda: bool, rng: np.random.Generator) -> dict[str, np.ndarray]:
    qkv = rng.standard_normal((n, 2 * H_K + H_V, S))
    qkv[:, :2 * H_K] /= np.linalg.norm(qkv[:, :2 * H_K], axis=-1, keepdims=True)   # unit q and k
    return {"qkv": qkv.reshape(n, -1).astype(np.float32),
            "g": rng.uniform(-1.0, -0.01, (1, n, H_V, S if kda else 1)).astype(np.float32),
            "beta": rng.uniform(0.01, 0.99, (1, n, H_V, 1)).astype(np.float32),
            "state": rng.standard_normal((1, H_V, S, S)).astype(np.float32)}


def _reference(inputs: dict[str, np.ndarray], n: int, K: int) -> np.ndarray:
    qkv = inputs["qkv"].reshape(1, n, 2 * H_K + H_V, S)
    srcs = [qkv[:, :, :H_K], qkv[:, :, H_K:2 * H_K], qkv[:, :, 2 * H_K:], inputs["g"], inputs["beta"],
            inputs["state"]]
    return OPS["gated_delta_net"].reference(srcs, {"K": K})


@pytest.mark.parametrize("K, kda", [(1, False), (3, True)])
def test_one_kernel_serves_every_token_count(K, kda):
    graph, out = _graph(K, kda)
    split = CpuBackend(n_threads=3).compile(graph, graph.nodes)
    rng = np.random.default_rng(K)
    for n in (5, 1, 2, 7):   # 1 and 2 tokens leave snapshot slots unwritten by ggml
        inputs = _inputs(n, kda, rng)
        split.arena[:] = 0xFF   # NaN everywhere: a slot the kernel leaves unwritten shows
        store = TensorStore(inputs)
        split.run(store, {"n_tokens": n})
        got = store.array(out, {"n_tokens": n}).reshape(1, 1, -1, S * H_V)
        want = _reference(inputs, n, K)
        assert got.shape == want.shape and np.isfinite(got).all()
        assert normalized_error(got, want) < 1e-12, n


def test_threads_give_the_same_bits():
    graph, out = _graph(2, False)
    inputs = _inputs(6, False, np.random.default_rng(0))
    results = []
    for n_threads in (1, 2, 3, 8):
        store = TensorStore({k: v.copy() for k, v in inputs.items()})
        CpuBackend(n_threads=n_threads).compile(graph, graph.nodes).run(store, {"n_tokens": 6})
        results.append(np.array(store.array(out, {"n_tokens": 6})))
    assert all(np.array_equal(results[0], r) for r in results[1:])
