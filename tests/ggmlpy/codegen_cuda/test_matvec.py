"""The matrix-vector kernel at model sizes, against the reference backend: rows of SmolLM2's
widths (K = 576: lanes with 2 or 3 units; K = 1536), a row longer than the register path
takes (K = 2304 streams through a loop), every packed weight unit (Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0) and the decoded ones (F16, Q4_K, MXFP4), two rows per warp, several columns, x that is not
16-byte aligned (scalar loads), and the fused prologue/epilogues (norm with weight, GLU,
residual, K/V stores)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cuda.backend import CudaBackend
from ggmlpy.codegen_cuda.lower_matmul import MatMulStep
from ggmlpy.ir import GraphBuilder, N_TOKENS
from ggmlpy.testing.ops import normalized_error
from ggmlpy.ir.types import GGMLType
from ggmlpy.sched.ref_backend import RefBackend

from .cases import ffn_graph, ffn_inputs, qkv_graph
from .test_fused import run_graph

G = GGMLType
EXACT = 1e-9


def matvec_variants(split) -> list[dict]:
    return [dict(s.mv_spec.variant) for s in split.steps if isinstance(s, MatMulStep) and s.mv_spec is not None]


def check(driver, graph, env, inputs, **backend_opts):
    refs, _, _ = run_graph(RefBackend(), graph, inputs, env)
    ours, _, split = run_graph(CudaBackend(driver=driver, **backend_opts), graph, inputs, env)
    for o, r in zip(ours, refs):
        err = normalized_error(o, r.reshape(o.shape))
        assert err <= EXACT, f"NMSE {err:.3g}"
    return split


@pytest.mark.parametrize("wtype", [G.Q4_1, G.Q8_0, G.Q4_0, G.Q5_0, G.Q5_1, G.F16, G.Q4_K, G.MXFP4],
                         ids=lambda t: t.name)
def test_feed_forward_at_model_width(device, wtype):
    """n_embd 576 (gate/up/q/k/v: K = 576, GLU) and n_ff 2304 (down: the loop path, residual)."""
    kind, driver = device
    n_embd = 768 if wtype == G.Q4_K else 576  # K-quants: rows of 256-value blocks
    g = ffn_graph(n_embd=n_embd, n_ff=2304, wtype=wtype)
    split = check(driver, g, {"n_tokens": 1}, ffn_inputs(g, 1, np.random.default_rng(21)))
    variants = matvec_variants(split)
    assert {v["K"] for v in variants} == {n_embd, 2304}
    assert all(v["xvec"] and v["a_const"] for v in variants)
    assert any(v["mode"] == "glu" for v in variants) and any(v["epilogue"] == "add" for v in variants)


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_several_columns_and_rows_per_warp(device, rows):
    """Unfused products (a prompt graph) with 3 columns; K = 576, 2304; M = 32 and 576."""
    kind, driver = device
    g = ffn_graph(n_embd=576, n_ff=2304, wtype=G.Q4_1, single=False)
    split = check(driver, g, {"n_tokens": 3}, ffn_inputs(g, 3, np.random.default_rng(22)), matvec_rows=rows)
    assert {v["rpw"] for v in matvec_variants(split)} == {rows}


@pytest.mark.parametrize("norm,rows", [("rms", 1), ("norm", 2)])
def test_norm_prologue_and_cache_store_at_width(device, norm, rows):
    """norm(x) * w inside the Q/K/V product, V stored into the f16 cache."""
    kind, driver = device
    g = qkv_graph(norm, n_embd=576, head=32, n_head=6, n_head_kv=2)
    split = check(driver, g, {"n_tokens": 1}, ffn_inputs(g, 1, np.random.default_rng(23)), matvec_rows=rows)
    (v,) = matvec_variants(split)
    assert v["prenorm"] == norm and v["prenorm_w"] and v["wvec"] and v["store_mat"] >= 0 and v["K"] == 576


def test_unaligned_x_uses_scalar_loads(device):
    """x starting 4 bytes into its buffer cannot be read as float4."""
    kind, driver = device
    k, m = 576, 40
    b = GraphBuilder()
    buf = b.input("buf", G.F32, (k + 1, N_TOKENS))
    x = b.view(buf, (k, N_TOKENS), (buf.nb[1],), 4)
    y = b.mul_mat(b.weight("w", G.Q4_1, (k, m)), x)
    g = b.build([y])
    g.hints["tokens"] = "single"
    rng = np.random.default_rng(24)
    from ggmlpy.quants import quantize

    inputs = {"buf": rng.standard_normal((1, k + 1)).astype(np.float32),
              "w": quantize((rng.standard_normal((m, k)) / 24).astype(np.float32), G.Q4_1)}
    split = check(driver, g, {"n_tokens": 1}, inputs)
    (v,) = matvec_variants(split)
    assert not v["xvec"]


def rope_block_graph(mode: int, n_dims: int, ff: bool, yarn: bool, n_embd: int = 576, head: int = 32,
                     n_head: int = 6, n_head_kv: int = 2, kv_size: int = 16):
    """Q/K/V products with ropes over part of each head, YaRN and frequency factors; K and V
    into f16 caches."""
    from ggmlpy.ir import N_TOKENS as T

    b = GraphBuilder()
    x = b.input("x", G.F32, (n_embd, T))
    pos = b.input("pos", G.I32, (T,))
    idx = b.input("idx", G.I64, (T,))
    factors = b.weight("rope_ff", G.F32, (n_dims // 2,)) if ff else None
    cur = b.mul(b.rms_norm(x, 1e-5), b.weight("norm_w", G.F32, (n_embd,)))
    q = b.mul_mat(b.weight("wq", G.Q4_1, (n_embd, head * n_head)), cur)
    k = b.mul_mat(b.weight("wk", G.Q4_1, (n_embd, head * n_head_kv)), cur)
    v = b.mul_mat(b.weight("wv", G.Q4_1, (n_embd, head * n_head_kv)), cur)
    rope = dict(n_dims=n_dims, mode=mode, n_ctx_orig=512, freq_base=10000.0,
                **(dict(freq_scale=0.25, ext_factor=1.0, attn_factor=1.1) if yarn else {}))
    q = b.rope_ext(b.reshape(q, head, n_head, T), pos, factors, **rope)
    k = b.rope_ext(b.reshape(k, head, n_head_kv, T), pos, factors, **rope)
    cache_k = b.cache("cache_k", G.F16, (head * n_head_kv, kv_size))
    cache_v = b.cache("cache_v", G.F16, (head * n_head_kv, kv_size))
    k_all = b.set_rows(cache_k, b.reshape(k, head * n_head_kv, T), idx)
    v_all = b.set_rows(cache_v, v, idx)
    g = b.build([q, k_all, v_all])
    g.hints["tokens"] = "single"
    return g


@pytest.mark.parametrize("mode,n_dims,ff,yarn", [(0, 16, True, True), (0, 32, False, False), (2, 32, False, True)],
                         ids=["partial-ff-yarn", "full", "neox-apart"])
def test_rope_in_the_product_epilogue(device, mode, n_dims, ff, yarn):
    """Mode 0 ropes are rotated inside the Q/K/V product (two rows per warp); NeoX ropes
    (pairs half a head apart) stay a rope launch. Either way the same numbers."""
    kind, driver = device
    g = rope_block_graph(mode, n_dims, ff, yarn)
    inputs = ffn_inputs(g, 1, np.random.default_rng(25))
    if ff:
        inputs["rope_ff"] = np.linspace(1.0, 4.0, n_dims // 2).astype(np.float32)
    split = check(driver, g, {"n_tokens": 1}, inputs)
    mm = split.steps[0]
    assert isinstance(mm, MatMulStep) and len(mm.ropes) == (2 if mode == 0 else 0)
    assert len(split.steps) == (1 if mode == 0 else 2)
    if mode == 0:
        assert dict(mm.mv_spec.variant)["rpw"] == 2 and dict(mm.mv_spec.variant)["rope_ff"] == ff


def test_a_tall_matrix_gets_four_rows_per_warp(device):
    """An output projection's shape (many rows): four rows per warp, chosen automatically,
    with the norm in front as llama's graph has it."""
    kind, driver = device
    k, m = 64, 16384
    b = GraphBuilder()
    x = b.input("x", G.F32, (k, N_TOKENS))
    cur = b.mul(b.rms_norm(x, 1e-5), b.weight("norm_w", G.F32, (k,)))
    g = b.build([b.mul_mat(b.weight("out", G.Q8_0, (k, m)), cur)])
    g.hints["tokens"] = "single"
    split = check(driver, g, {"n_tokens": 1}, ffn_inputs(g, 1, np.random.default_rng(26)))
    (v,) = matvec_variants(split)
    assert v["rpw"] == 4 and v["prenorm"] == "rms"
