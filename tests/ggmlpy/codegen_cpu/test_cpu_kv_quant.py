"""The CPU kernels of a quantised KV cache (-ctk/-ctv): rows stored into it (set_rows,
kernels/kv_store.py) byte for byte as the numpy reference (ggml-cpu's from_float), and the
attention over it (kernels/kv_quant.py: K decoded against 8-bit q in the fused
mul_mat_soft_max, V read by rows through out_prod) against the reference backend, fused and
with the keys the mask hides skipped."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.kernels.kv_store import STORABLE
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.ops.rows import QUANT_DST
from ggmlpy.ir.types import GGMLType, is_quantized, row_size
from ggmlpy.quants import quantize
from ggmlpy.quants.from_float import q8_values, quantize_rows_cpu
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.sched.store import TensorStore
from ggmlpy.testing.ops import normalized_error
from tests.ggmlpy.codegen_cpu.pipeline_runs import run_cpu_and_ref
from tests.ggmlpy.codegen_cuda.cases import attention_graph, attention_inputs

G = GGMLType


def test_the_kernels_store_every_cache_type():
    assert set(STORABLE) == set(QUANT_DST)


def _rows(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Rows with the cases a quantiser can get wrong: an all-zero block, a block whose
    largest magnitude appears with both signs (the first one wins), constant blocks, tiny and
    large values, and values that fall on rounding boundaries."""
    x = rng.standard_normal((n, k)).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = rng.standard_normal(32)
    x[1, 3], x[1, 20] = -4.0, 4.0
    x[2, :32] = 0.75
    x[3, :32] *= np.float32(1e-20)
    x[4, :32] *= np.float32(1e4)
    x[5, :32] = np.round(x[5, :32] * 4) / 4
    return x


@pytest.mark.parametrize("t", QUANT_DST, ids=lambda t: t.name)
def test_set_rows_writes_the_reference_bytes(t):
    """The CPU kernel's blocks are the numpy reference's, which are ggml-cpu's from_float
    (tests/ggmlpy/ir checks those against an independent oracle)."""
    rng = np.random.default_rng(5)
    k, rows, n = 96, 16, 9
    b = GraphBuilder()
    cache = b.cache("cache", t, (k, rows))
    src = b.input("src", G.F32, (k, n))
    idx = b.input("idx", G.I64, (n,))
    out = b.set_rows(cache, src, idx)
    g = b.build([out])
    x = _rows(rng, n, k)
    where = rng.choice(rows, size=n, replace=False).astype(np.int64)
    results = []
    for backend in (CpuBackend(n_threads=2), RefBackend()):
        assert backend.supports_op(out)
        data = {"cache": np.zeros((rows, quantize(x[:1], t).shape[1]), np.uint8), "src": x.copy(), "idx": where}
        backend.compile(g, g.nodes).run(TensorStore(data), {})
        results.append(data["cache"])
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0][where], quantize_rows_cpu(x, t))


@pytest.mark.parametrize("t", QUANT_DST, ids=lambda t: t.name)
def test_cpy_round_trip_of_a_k_shift(t):
    """The K-shift's two copies: cont decodes a quantised view, cpy quantises rows back into
    it; on the CPU both run natively and give the reference's bytes."""
    rng = np.random.default_rng(6)
    b = GraphBuilder()
    cache = b.cache("cache", t, (64, 8))
    view = b.view(cache, (32, 2, 8), (row_size(t, 32), cache.nb[1]))
    decoded = b.scale(b.cont(view), 0.5)
    out = b.cpy(decoded, view)
    g = b.build([out])
    start = quantize(rng.standard_normal((8, 64)).astype(np.float32), t)
    (cpu, _), (ref, _) = run_cpu_and_ref(g, {"cache": start})
    np.testing.assert_array_equal(cpu[0], ref[0])
    assert all(CpuBackend(n_threads=1).supports_op(n) for n in g.nodes if n.op in ("cont", "cpy"))


ATTENTION = [
    dict(n_tokens=5, n_kv=40, kv_type=G.Q8_0, head=32),
    dict(n_tokens=1, n_kv=64, kv_type=G.Q4_0, head=64),                  # decode
    dict(n_tokens=4, n_kv=50, kv_type=G.IQ4_NL, head=64, n_head=9, n_head_kv=3),
    dict(n_tokens=3, n_kv=33, kv_type=G.Q5_1, head=32, fuse_cont=False),
    dict(n_tokens=2, n_kv=24, kv_type=G.Q4_1, v_type=G.F16, head=32),
    dict(n_tokens=6, n_kv=40, kv_type=G.F16, v_type=G.Q5_0, head=32, sinks=True),
    dict(n_tokens=1, n_kv=300, kv_type=G.Q8_0, head=128, n_head=4, n_head_kv=1),
]


@pytest.mark.parametrize("cfg", ATTENTION, ids=lambda c: "-".join(f"{k}={getattr(v, 'name', v)}" for k, v in c.items()))
def test_attention_over_a_quantised_cache_matches_the_reference(cfg):
    """With q already 8-bit (the rounding the kernel applies against a quantised K is then
    exact), the CPU's fused attention gives the reference backend's results up to the order
    of f32 sums, every node native (nothing falls back)."""
    n_tokens, n_kv = cfg["n_tokens"], cfg["n_kv"]
    gargs = {k: v for k, v in cfg.items() if k not in ("n_tokens", "n_kv")}
    g = attention_graph(**gargs, n_tokens=n_tokens, n_kv=n_kv, kv_size=max(64, n_kv))
    inputs = attention_inputs(g, n_tokens, n_kv, np.random.default_rng(3))
    if is_quantized(cfg["kv_type"]):
        inputs["q"] = q8_values(inputs["q"])
    env = {"n_tokens": n_tokens, "n_kv": n_kv}
    (cpu, compiled), (ref, _) = run_cpu_and_ref(g, inputs, env)
    cpu_backend = CpuBackend(n_threads=1)
    assert all(cpu_backend.supports_op(n) for n in g.nodes)
    ops = [n.op for n in compiled.nodes]
    assert "mul_mat_soft_max" in ops
    if is_quantized(cfg.get("v_type") or cfg["kv_type"]):
        assert "out_prod" in ops
    # an f16 K or V meets q or the weights rounded to f16 (as ggml's f16 vec_dot), which the
    # reference does not do
    both_quantised = is_quantized(cfg["kv_type"]) and is_quantized(cfg.get("v_type") or cfg["kv_type"])
    assert normalized_error(cpu[0], ref[0]) <= (1e-10 if both_quantised else 1e-6)


def test_q8_rounding_of_q_is_ggmls():
    """Without pre-rounding, a quantised K meets q rounded to 8 bits: the CPU then differs
    from the (unrounded) reference by that rounding, and agrees with a reference fed the
    rounded q."""
    g = attention_graph(n_tokens=3, n_kv=40, kv_size=64, head=32, kv_type=G.Q8_0)
    inputs = attention_inputs(g, 3, 40, np.random.default_rng(8))
    env = {"n_tokens": 3, "n_kv": 40}
    (cpu, _), (ref, _) = run_cpu_and_ref(g, inputs, env)
    (_, _), (ref_rounded, _) = run_cpu_and_ref(g, {**inputs, "q": q8_values(inputs["q"])}, env)
    assert normalized_error(cpu[0], ref_rounded[0]) <= 1e-10 < normalized_error(cpu[0], ref[0])
