"""Multi-section rope (ggml_rope_multi, modes 8 and 40) in the CUDA backend's fused rope
launch (fusion_rules.RopeRule): Q and K rotated in one kernel, K's rows stored straight into
an f16 cache. The single-rope kernel runs the registry's cases (test_ops.py); the product's
rope epilogue takes mode 0 only, so multi ropes never reach it."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cuda.backend import CudaBackend
from ggmlpy.codegen_cuda.lower_simple import RopeStep
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.ops.rope import ROPE_TYPE_IMROPE, ROPE_TYPE_MROPE
from ggmlpy.ir.symbolic import N_TOKENS
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.testing.ops import normalized_error

from .test_fused import run_graph

F16, F32, I32, I64 = GGMLType.F16, GGMLType.F32, GGMLType.I32, GGMLType.I64
HEAD, KV_SIZE = 16, 32


def qk_cache_graph(mode: int, sections: tuple[int, ...], n_dims: int, single: bool):
    """q and k of a decoder block, rope_multi'd, k stored into a cache (Qwen3-VL's entry)."""
    b = GraphBuilder()
    x = b.input("x", F32, (32, N_TOKENS))
    pos = b.input("pos", I32, (4 * N_TOKENS,))
    idx = b.input("idx", I64, (N_TOKENS,))
    q = b.reshape(b.mul_mat(b.weight("wq", F32, (32, HEAD * 3)), x), HEAD, 3, N_TOKENS)
    k = b.reshape(b.mul_mat(b.weight("wk", F32, (32, HEAD * 2)), x), HEAD, 2, N_TOKENS)
    rope = dict(n_ctx_orig=4096, freq_base=5e6)
    q = b.rope_multi(q, pos, None, n_dims, sections, mode, **rope)
    k = b.rope_multi(k, pos, None, n_dims, sections, mode, **rope)
    cache = b.cache("cache_k", F16, (HEAD * 2, KV_SIZE))
    g = b.build([q, b.set_rows(cache, b.reshape(k, HEAD * 2, N_TOKENS), idx)])
    if single:
        g.hints["tokens"] = "single"
    return g


@pytest.mark.parametrize("mode, sections, n_dims", [(ROPE_TYPE_MROPE, (2, 1, 1, 2), 16),
                                                    (ROPE_TYPE_IMROPE, (2, 2, 1, 1), 16),
                                                    (ROPE_TYPE_IMROPE, (2, 1, 1, 0), 10)])
@pytest.mark.parametrize("n_tokens", [1, 5])
def test_fused_multi_rope_matches_reference(device, mode, sections, n_dims, n_tokens):
    kind, driver = device
    g = qk_cache_graph(mode, sections, n_dims, single=n_tokens == 1)
    rng = np.random.default_rng(n_tokens + mode)
    inputs = {"x": rng.standard_normal((n_tokens, 32)).astype(np.float32),
              "wq": (rng.standard_normal((48, 32)) / 6).astype(np.float32),
              "wk": (rng.standard_normal((32, 32)) / 6).astype(np.float32),
              "pos": rng.integers(0, 512, size=4 * n_tokens).astype(np.int32),
              "idx": rng.choice(KV_SIZE, size=n_tokens, replace=False).astype(np.int64),
              "cache_k": rng.standard_normal((KV_SIZE, HEAD * 2)).astype(np.float16)}
    env = {"n_tokens": n_tokens}
    refs, _, _ = run_graph(RefBackend(), g, inputs, env)
    ours, _, split = run_graph(CudaBackend(driver=driver), g, inputs, env)
    (rope,) = [s for s in split.steps if isinstance(s, RopeStep)]
    assert len(rope.parts) == 2 and rope.parts[1][1] is not None   # q and k, k into the cache
    for o, r in zip(ours, refs):
        err = normalized_error(o, r)
        # the product runs on the tiled kernel (operands rounded to half) past 8 columns
        assert err <= (1e-9 if n_tokens == 1 else 5e-5), f"{kind}: NMSE {err:.3g}"
