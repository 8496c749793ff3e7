"""Fusion groups the CPU backend runs as one kernel (codegen_cpu/fusion.py).

- SmolLM2 with and without CPU fusion: bit-identical logits, and the fused ops really
  replace the groups (fewer nodes, each norm_mul / residual_product group one kernel);
- the fused kernels against the reference backend on small graphs (odd widths, decode and
  prefill token counts);
- the buffer plan with only the CPU's groups fused passes the independent liveness check.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import llama
from ggmlpy.codegen_cpu import fusion
from ggmlpy.codegen_cpu.backend import CpuBackend
from ggmlpy.codegen_cpu.kernels import extent
from ggmlpy.codegen_cpu.kernels import softmax as softmax_kernels
from ggmlpy.codegen_cpu.program import ProgramBuilder
from ggmlpy.ir.builder import GraphBuilder
from ggmlpy.ir.ops import OpCase, SrcSpec
from ggmlpy.testing.ops import make_inputs, normalized_error
from ggmlpy.ir.tensor import Flag
from ggmlpy.ir.types import GGMLType
from ggmlpy.passes.buffers import plan_buffers
from ggmlpy.passes.fusion import fusion_groups
from ggmlpy.passes.pipeline import run_pipeline
from ggmlpy.sched.store import TensorStore

from llama.graph_inputs import GraphParams
from tests.ggmlpy.codegen_cpu.pipeline_runs import run_cpu_and_ref
from tests.ggmlpy.passes.helpers import check_plan

G = GGMLType


def _run_tokens(path, tokens):
    model = llama.Model.load(path)
    ctx = llama.Context(model, n_ctx=256, n_batch=64, n_ubatch=64)
    assert ctx.decode(llama.Batch.from_tokens(tokens, logits_all=True)) == 0
    out = [np.array(ctx.get_logits())]
    assert ctx.decode(llama.Batch.from_tokens([42])) == 0          # and a one-token step
    out.append(np.array(ctx.get_logits_ith(-1)))
    compiled = [c for e in ctx.graph_cache.entries.values() for c in e.compiled]
    ops = [n.op for c in compiled for n in c.nodes]
    return out, ops


def test_smollm2_fused_equals_unfused(smollm2_path, monkeypatch):
    tokens = [1, 504, 3458, 282, 4649, 314, 253, 7]
    fused, fused_ops = _run_tokens(smollm2_path, tokens)
    monkeypatch.setattr(fusion, "FUSED", {})
    plain, plain_ops = _run_tokens(smollm2_path, tokens)
    for a, b in zip(fused, plain):
        np.testing.assert_array_equal(a, b)
    n_layer = 30
    # both graphs (prompt and one-token): every norm with its weight; every residual add
    # after attn_out/ffn_down, but the last layer's (its rows are selected to the outputs
    # first, so the add's shape is not the product's)
    assert fused_ops.count("rms_norm_mul") == 2 * (2 * n_layer + 1)
    assert fused_ops.count("mul_mat_add") >= 2 * (2 * n_layer - 1)
    assert fused_ops.count("mul_mat_glu") == 2 * n_layer          # gate, up and swiglu
    assert not {"rms_norm_mul", "mul_mat_add", "mul_mat_glu", "mul_mat_soft_max", "rope_pair"} & set(plain_ops)
    assert fused_ops.count("mul_mat_soft_max") == 2 * n_layer     # attention scores
    assert fused_ops.count("rope_pair") == 2 * n_layer            # q and k rotated together
    pairs = sum(fused_ops.count(op) for op in ("rms_norm_mul", "mul_mat_add", "mul_mat_soft_max", "rope_pair"))
    assert len(plain_ops) - len(fused_ops) == pairs + 2 * fused_ops.count("mul_mat_glu")


def _graph_norm_mul(k, n, op):
    b = GraphBuilder()
    x = b.input("x", G.F32, (k, n, 1, 1))
    w = b.input("w", G.F32, (k, 1, 1, 1))
    w.flags = Flag.WEIGHT
    y = b.mul(b.rms_norm(x, eps=1e-6) if op == "rms_norm" else b.norm(x, eps=1e-5), w)
    return b.build([y]), y


def _graph_epilogue(t, k, m, n):
    b = GraphBuilder()
    w = b.input("w", t, (k, m, 1, 1))
    w.flags = Flag.WEIGHT
    x = b.input("x", G.F32, (k, n, 1, 1))
    r = b.input("r", G.F32, (m, n, 1, 1))
    y = b.add(b.mul_mat(w, x), r)
    return b.build([y]), y


def _compare(graph, out, inputs):
    """(first output, compiled) for the CPU backend, then the reference backend."""
    return [(outs[0], compiled) for outs, compiled in run_cpu_and_ref(graph, inputs)]


@pytest.mark.parametrize("op", ["rms_norm", "norm"])
@pytest.mark.parametrize("k,n", [(576, 1), (37, 7), (1000, 40)])
def test_norm_mul_kernel(op, k, n):
    graph, out = _graph_norm_mul(k, n, op)
    rng = np.random.default_rng(k + n)
    inputs = {"x": rng.normal(size=(n, k)).astype(np.float32), "w": rng.normal(size=(1, k)).astype(np.float32)}
    (ours, cpu), (ref, _) = _compare(graph, out, inputs)
    assert [nd.op for nd in cpu.nodes] == [f"{op}_mul"]
    assert normalized_error(ours, ref) <= 1e-10


@pytest.mark.parametrize("t", [G.Q4_1, G.Q8_0, G.Q6_K], ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 7, 40])
def test_matmul_epilogue_kernel(t, n):
    k = 256 if t == G.Q6_K else 96
    graph, out = _graph_epilogue(t, k, 48, n)
    case = OpCase((SrcSpec(t, (k, 48, 1, 1)),))
    rng = np.random.default_rng(n)
    inputs = {"w": make_inputs(case, rng)["src0"], "x": rng.normal(size=(n, k)).astype(np.float32),
              "r": rng.normal(size=(n, 48)).astype(np.float32)}
    (ours, cpu), (ref, _) = _compare(graph, out, inputs)
    assert [nd.op for nd in cpu.nodes] == ["mul_mat_add"]
    assert normalized_error(ours, ref) <= 5e-4     # 8-bit activations, as mul_mat


@pytest.mark.parametrize("act", ["swiglu", "geglu"])
@pytest.mark.parametrize("t,n", [(G.Q4_1, 1), (G.Q5_0, 7), (G.Q4_K, 40)], ids=str)
def test_gated_ffn_kernel(act, t, n):
    k, m = (256, 48) if t == G.Q4_K else (96, 48)
    b = GraphBuilder()
    w_gate = b.input("wg", t, (k, m, 1, 1))
    w_up = b.input("wu", t, (k, m, 1, 1))
    w_gate.flags = w_up.flags = Flag.WEIGHT
    x = b.input("x", G.F32, (k, n, 1, 1))
    y = getattr(b, act)(b.mul_mat(w_gate, x), b.mul_mat(w_up, x))
    graph = b.build([y])
    rng = np.random.default_rng(n)
    case = OpCase((SrcSpec(t, (k, m, 1, 1)),))
    inputs = {"wg": make_inputs(case, rng)["src0"], "wu": make_inputs(case, rng)["src0"],
              "x": rng.normal(size=(n, k)).astype(np.float32)}
    (ours, cpu), (ref, _) = _compare(graph, y, inputs)
    assert [nd.op for nd in cpu.nodes] == ["mul_mat_glu"]
    assert normalized_error(ours, ref) <= 5e-4     # 8-bit activations (and GELU through f16)


@pytest.mark.parametrize("act", ["swiglu", "geglu"])
@pytest.mark.parametrize("t,n", [(G.Q8_0, 1), (G.Q4_K, 9), (G.MXFP4, 37)], ids=str)
def test_gated_experts_kernel(act, t, n):
    """act(gate_e x) * (up_e x) over each token's experts: one mul_mat_id_glu kernel, bit for
    bit the three nodes run apart."""
    k, m, n_expert, n_used = (256, 32, 6, 2) if t == G.Q4_K else (96, 48, 6, 2)
    b = GraphBuilder()
    w_gate = b.input("wg", t, (k, m, n_expert, 1))
    w_up = b.input("wu", t, (k, m, n_expert, 1))
    w_gate.flags = w_up.flags = Flag.WEIGHT
    x = b.input("x", G.F32, (k, 1, n, 1))
    ids = b.input("ids", G.I32, (n_used, n, 1, 1))
    y = getattr(b, act)(b.mul_mat_id(w_gate, x, ids), b.mul_mat_id(w_up, x, ids))
    graph = b.build([y])
    rng = np.random.default_rng(n)
    case = OpCase((SrcSpec(t, (k, m, n_expert, 1)),))
    inputs = {"wg": make_inputs(case, rng)["src0"], "wu": make_inputs(case, rng)["src0"],
              "x": rng.normal(size=(n, 1, k)).astype(np.float32),
              "ids": np.stack([rng.permutation(n_expert)[:n_used] for _ in range(n)]).astype(np.int32)}
    (ours, cpu), (ref, _) = _compare(graph, y, inputs)
    assert [nd.op for nd in cpu.nodes] == ["mul_mat_id_glu"]
    assert normalized_error(ours, ref) <= 5e-4     # 8-bit activations (and GELU through f16)
    apart = CpuBackend(n_threads=2)
    g = run_pipeline(graph, apart.name, env={"n_tokens": 512}, rules=()).graph
    store = TensorStore({key: np.array(v, copy=True) for key, v in inputs.items()})
    compiled = apart.compile(g, g.nodes)
    compiled.run(store, {})
    assert "mul_mat_id_glu" not in [nd.op for nd in compiled.nodes]
    np.testing.assert_array_equal(ours, store.array(g.outputs[0], {}))


def _graph_attention_scores(d, hkv, h, n_kv, n_tok):
    """softmax(k . q * scale + mask), k from an f16 cache viewed permuted."""
    b = GraphBuilder()
    k = b.permute(b.input("k", G.F16, (d, hkv, n_kv, 1)), 0, 2, 1, 3)
    q = b.permute(b.input("q", G.F32, (d, h, n_tok, 1)), 0, 2, 1, 3)
    mask = b.input("mask", G.F16, (n_kv, n_tok, 1, 1))
    y = b.soft_max_ext(b.mul_mat(k, q), mask, scale=d ** -0.5)
    return b.build([y]), y


@pytest.mark.parametrize("d,hkv,h,n_kv,n_tok", [(64, 3, 9, 37, 7), (64, 3, 9, 5, 1), (256, 1, 4, 19, 3)], ids=str)
def test_attention_scores_kernel(d, hkv, h, n_kv, n_tok):
    """softmax(k . q * scale + mask) as one kernel: k from an f16 cache viewed permuted,
    grouped query heads, a causal-style mask with -inf entries."""
    graph, y = _graph_attention_scores(d, hkv, h, n_kv, n_tok)
    rng = np.random.default_rng(n_kv)
    m = np.where(rng.random((n_tok, n_kv)) < 0.3, -np.inf, 0.0)
    m[:, 0] = 0.0
    inputs = {"k": rng.normal(size=(n_kv, hkv, d)).astype(np.float16),
              "q": rng.normal(size=(n_tok, h, d)).astype(np.float16).astype(np.float32),   # f16-exact
              "mask": m.astype(np.float16)}
    (ours, cpu), (ref, _) = _compare(graph, y, inputs)
    assert [nd.op for nd in cpu.nodes] == ["mul_mat_soft_max"]
    assert normalized_error(ours, ref) <= 1e-10
    assert (ours[..., np.isinf(m)] == 0).all()


def test_attention_softmax_row_is_compiled_once():
    """The softmax row is one helper function the attention kernel calls from every row of
    every tile shape (not a copy inlined per row: that was three quarters of its IR)."""
    graph, _ = _graph_attention_scores(64, 3, 9, 37, 7)
    optimised = run_pipeline(graph, "cpu", rules=fusion.CPU_RULES).graph
    builder = ProgramBuilder(optimised, optimised.nodes, {"n_tokens": 7, "n_kv": 37, "n_outputs": 7}, set())
    builder.plan_key()
    unit = next(u for u in builder.units() if u.name.endswith("_mul_mat_soft_max"))
    text = unit.build_ir()
    helper = f"{unit.name}.softmax_row"
    assert re.findall(r'define internal void @"([^"]+)"', text).count(helper) == 1
    assert text.count(f'call void @"{helper}"') >= 4     # rows of token tiles, head tiles, single rows


def test_smollm2_attention_skipping_is_exact(smollm2_path, monkeypatch):
    """The masked keys skipped (kernels/extent.py) in the scores and in weights x V: the
    same logits as computing them all, prompt and one-token step."""
    tokens = list(range(1, 41))          # 40 tokens: several tiles of the causal mask
    skipping, ops = _run_tokens(smollm2_path, tokens)
    compiled_params = [nd.params for nd in _compiled_nodes(smollm2_path, tokens) if nd.op == "mul_mat"]
    assert sum(p.get("zero_tail", False) for p in compiled_params) == 2 * 30   # every layer's weights x V
    monkeypatch.setattr(fusion, "MARKS", [])
    monkeypatch.setattr(softmax_kernels, "SKIP_HIDDEN_KEYS", False)
    full, _ = _run_tokens(smollm2_path, tokens)
    for a, b in zip(skipping, full):
        np.testing.assert_array_equal(a, b)


def _gemma_long_prompt(path):
    """Logits of a 700-token prompt in ubatches of 256: past the 512-token sliding window,
    so the window layers' tiles start after key 0."""
    model = llama.Model.load(path)
    ctx = llama.Context(model, n_ctx=1024, n_batch=256, n_ubatch=256)
    tokens = [int(t) for t in np.random.default_rng(3).integers(5, 20000, 700)]
    out = []
    for i in range(0, len(tokens), 256):
        assert ctx.decode(llama.Batch.from_tokens(tokens[i:i + 256], logits_all=True)) == 0
        out.append(np.array(ctx.get_logits()))
    return np.concatenate(out)


def test_gemma3_window_skipping_is_exact(gemma3_path, monkeypatch):
    """Gemma 3's sliding-window layers skip the keys before the window as well as those
    past the causal edge: the same logits as computing every key."""
    skipping = _gemma_long_prompt(gemma3_path)
    monkeypatch.setattr(fusion, "MARKS", [])
    monkeypatch.setattr(softmax_kernels, "SKIP_HIDDEN_KEYS", False)
    np.testing.assert_array_equal(skipping, _gemma_long_prompt(gemma3_path))


def _compiled_nodes(path, tokens):
    model = llama.Model.load(path)
    ctx = llama.Context(model, n_ctx=256, n_batch=64, n_ubatch=64)
    assert ctx.decode(llama.Batch.from_tokens(tokens)) == 0
    assert ctx.decode(llama.Batch.from_tokens([42])) == 0
    return [n for e in ctx.graph_cache.entries.values() for c in e.compiled for n in c.nodes]


def _causal_mask(n_tok, n_kv, n_past, window=None):
    """Token t sees keys [0, n_past + t] (with a window w: (n_past + t - w, n_past + t]);
    the keys from n_past + n_tok on, none."""
    keys, toks = np.arange(n_kv)[None, :], np.arange(n_tok)[:, None]
    seen = keys <= n_past + toks
    if window is not None:
        seen &= keys > n_past + toks - window
    return np.where(seen, 0.0, -np.inf)


def _ring_mask(n_tok, n_kv, start, window):
    """Token t sees the `window` keys from (start + t) on, wrapping around the cells: a
    sliding-window cache kept as a ring."""
    keys, toks = np.arange(n_kv)[None, :], np.arange(n_tok)[:, None]
    return np.where((keys - start - toks) % n_kv < window, 0.0, -np.inf)


def _attention_graph(d, hkv, h, n_kv, n_tok):
    """mul_mat(v, softmax(k . q * scale + mask)), K and V from f16 caches viewed permuted."""
    b = GraphBuilder()
    k = b.permute(b.input("k", G.F16, (d, hkv, n_kv, 1)), 0, 2, 1, 3)
    v = b.permute(b.input("v", G.F16, (d, hkv, n_kv, 1)), 1, 2, 0, 3)
    q = b.permute(b.input("q", G.F32, (d, h, n_tok, 1)), 0, 2, 1, 3)
    mask = b.input("mask", G.F16, (n_kv, n_tok, 1, 1))
    y = b.mul_mat(v, b.soft_max_ext(b.mul_mat(k, q), mask, scale=d ** -0.5))
    return b.build([y]), y


@pytest.mark.parametrize("d,n_tok,n_kv,start,window", [(64, 8, 256, 200, 100), (256, 3, 192, 150, 64)], ids=str)
def test_attention_skips_the_hidden_chunks_inside(d, n_tok, n_kv, start, window):
    """Visible keys wrapping around the cells: the 16-key chunks in the middle that no
    query sees are skipped (NaN there in K and V changes nothing), with the scores, the
    softmax and weights x V the same as the reference's from zeros there."""
    hkv, h = 2, 4
    m = _ring_mask(n_tok, n_kv, start, window)
    seen = np.isfinite(m).any(axis=0)
    hidden = np.repeat(~seen.reshape(-1, 16).any(axis=1), 16)     # whole chunks no token sees
    assert hidden.any() and seen[0] and seen[-1]                  # a hole inside, none at the ends
    rng = np.random.default_rng(d + n_kv)
    kv = rng.normal(size=(n_kv, hkv, d)).astype(np.float16)
    kv_nan, kv_zero = kv.copy(), kv.copy()
    kv_nan[hidden], kv_zero[hidden] = np.nan, 0.0
    graph, y = _attention_graph(d, hkv, h, n_kv, n_tok)
    inputs = {"q": rng.normal(size=(n_tok, h, d)).astype(np.float16).astype(np.float32),
              "mask": m.astype(np.float16)}
    (ours, cpu), _ = _compare(graph, y, {**inputs, "k": kv_nan, "v": kv_nan})
    (ours_zero, _), (ref, _) = _compare(graph, y, {**inputs, "k": kv_zero, "v": kv_zero})
    assert [nd.op for nd in cpu.nodes] == ["mul_mat_soft_max", "mul_mat"]
    np.testing.assert_array_equal(ours, ours_zero)
    assert normalized_error(ours, ref) <= 1e-6


@pytest.mark.parametrize("d", [64, 256])
def test_attention_of_tokens_of_different_sequences_runs_row_by_row(d, monkeypatch):
    """A batched decode step: token t of sequence t sees only its sequence's cells, kept in
    blocks of 64 (llama/kv_cells.py, seq_block). The tiles of queries go one row at a time
    (kernels/extent.py rows_share_chunks), so a row never touches another sequence's
    values: NaN in sequence 1's V leaves the other tokens finite and equal to the reference
    from zeros there; with the tiles forced together it reaches them (0 x NaN), which is
    what shows the rows went apart."""
    n_tok, n_kv, hkv, h = 4, 512, 2, 4
    owner = np.repeat([0, 1, 2, 3, 0, 1, 2, 3], 64)
    filled = np.arange(n_kv) % 64 < np.repeat([64, 64, 64, 64, 20, 30, 40, 50], 64)
    m = np.where((owner[None, :] == np.arange(n_tok)[:, None]) & filled[None, :], 0.0, -np.inf)
    rng = np.random.default_rng(d)
    kv = rng.normal(size=(n_kv, hkv, d)).astype(np.float16)
    v_nan, v_zero = kv.copy(), kv.copy()
    v_nan[owner == 1], v_zero[owner == 1] = np.nan, 0.0
    graph, y = _attention_graph(d, hkv, h, n_kv, n_tok)
    inputs = {"q": rng.normal(size=(n_tok, h, d)).astype(np.float16).astype(np.float32),
              "mask": m.astype(np.float16), "k": kv}
    (ours, cpu), _ = _compare(graph, y, {**inputs, "v": v_nan})
    (ours_zero, _), (ref, _) = _compare(graph, y, {**inputs, "v": v_zero})
    assert [nd.op for nd in cpu.nodes] == ["mul_mat_soft_max", "mul_mat"]
    others = [0, 2, 3]
    assert np.isnan(ours[:, :, 1]).all() and np.isfinite(ours[:, :, others]).all()   # [1, head, token, d]
    np.testing.assert_array_equal(ours[:, :, others], ours_zero[:, :, others])
    assert normalized_error(ours_zero, ref) <= 1e-6
    monkeypatch.setattr(extent, "TILES_APART", False)
    (together, _), _ = _compare(graph, y, {**inputs, "v": v_nan})
    assert np.isnan(together[:, :, others]).any()
    (together_zero, _), _ = _compare(graph, y, {**inputs, "v": v_zero})
    np.testing.assert_array_equal(together_zero, ours_zero)   # the same sums either way


def _hidden(n_tok, n_past, window=None):
    """Keys no tile of queries reaches: [0, first) and [last, n_kv), whole chunks of 64."""
    last = -(-(n_past + n_tok) // 16) * 16
    first = 0 if window is None else max(0, (n_past - window + 1) // 64 * 64)
    return first, last


ATTENTION_CASES = [(64, 16, 96, 20, None), (256, 5, 70, 33, None), (64, 1, 256, 40, None),
                   (64, 12, 300, 230, 100), (256, 4, 200, 150, 64), (64, 1, 512, 400, 128)]


@pytest.mark.parametrize("d,n_tok,n_kv,n_past,window", ATTENTION_CASES, ids=str)
def test_attention_skips_the_hidden_keys(d, n_tok, n_kv, n_past, window):
    """The keys no query of a tile sees (past the causal edge; before a sliding window) are
    never read: NaN there changes nothing (the reference, which reads them, gets the same
    result from zeros there), and their probabilities come out exactly 0."""
    hkv, h = 2, 4
    graph, y = _graph_attention_scores(d, hkv, h, n_kv, n_tok)
    rng = np.random.default_rng(d + n_kv)
    m = _causal_mask(n_tok, n_kv, n_past, window)
    first, last = _hidden(n_tok, n_past, window)
    kv = rng.normal(size=(n_kv, hkv, d)).astype(np.float16)
    inputs = {"q": rng.normal(size=(n_tok, h, d)).astype(np.float16).astype(np.float32),
              "mask": m.astype(np.float16)}
    kv_nan, kv_zero = kv.copy(), kv.copy()
    for part in (slice(0, first), slice(last, None)):
        kv_nan[part], kv_zero[part] = np.nan, 0.0
    (ours, cpu), _ = _compare(graph, y, {**inputs, "k": kv_nan})
    _, (ref, _) = _compare(graph, y, {**inputs, "k": kv_zero})
    assert [nd.op for nd in cpu.nodes] == ["mul_mat_soft_max"]
    assert np.isfinite(ours).all()
    assert normalized_error(ours, ref) <= 1e-10
    assert (ours[..., np.isinf(m)] == 0).all()


@pytest.mark.parametrize("d,n_tok,n_kv,n_past,window", ATTENTION_CASES, ids=str)
def test_weights_times_values_skips_the_zero_weights(d, n_tok, n_kv, n_past, window):
    """mul_mat(v, softmax(...)) is marked zero_tail and sums only over each tile's range of
    nonzero weights: NaN in V outside it changes nothing. The same product of a tensor that
    is not a softmax is not marked and does read them (NaN out)."""
    hkv, h = 2, 4
    b = GraphBuilder()
    v = b.permute(b.input("v", G.F16, (d, hkv, n_kv, 1)), 1, 2, 0, 3)     # [n_kv, d, hkv]
    s = b.input("s", G.F32, (n_kv, n_tok, h, 1))
    mask = b.input("mask", G.F16, (n_kv, n_tok, 1, 1))
    y = b.mul_mat(v, b.soft_max_ext(s, mask, scale=0.5))
    graph = b.build([y])
    rng = np.random.default_rng(d + n_kv)
    m = _causal_mask(n_tok, n_kv, n_past, window)
    first, last = _hidden(n_tok, n_past, window)
    vv = rng.normal(size=(n_kv, hkv, d)).astype(np.float16)
    v_nan, v_zero = vv.copy(), vv.copy()
    for part in (slice(0, first), slice(last, None)):
        v_nan[part], v_zero[part] = np.nan, 0.0
    inputs = {"s": rng.normal(size=(h, n_tok, n_kv)).astype(np.float32), "mask": m.astype(np.float16)}
    (ours, cpu), _ = _compare(graph, y, {**inputs, "v": v_nan})
    (ours_zero, _), (ref, _) = _compare(graph, y, {**inputs, "v": v_zero})
    assert [nd.params.get("zero_tail", False) for nd in cpu.nodes if nd.op == "mul_mat"] == [True]
    np.testing.assert_array_equal(ours, ours_zero)
    assert normalized_error(ours, ref) <= 1e-6     # the weights are rounded to f16 (as ggml)

    b = GraphBuilder()
    v = b.permute(b.input("v", G.F16, (d, hkv, n_kv, 1)), 1, 2, 0, 3)
    w = b.input("w", G.F32, (n_kv, n_tok, h, 1))
    y = b.mul_mat(v, w)
    weights = np.where(np.isinf(m), 0.0, 1.0 / n_kv)[None].repeat(h, 0).astype(np.float32)
    (plain, cpu), _ = _compare(b.build([y]), y, {"v": v_nan, "w": weights})
    assert [nd.params.get("zero_tail", False) for nd in cpu.nodes] == [False]
    assert np.isnan(plain).all()


def test_plan_with_the_cpu_groups_fused_has_no_overlap(smollm2_path):
    model = llama.Model.load(smollm2_path)
    ctx = llama.Context(model, n_ctx=256, backend="ref")
    graph = ctx.build_graph(GraphParams("multi", False, ctx.n_ctx)).graph
    worst = {"n_tokens": 64, "n_kv": 256, "n_outputs": 64}
    g = run_pipeline(graph, "cpu", env=worst, rules=fusion.CPU_RULES).graph
    cpu = fusion.CpuFusion(g, g.nodes)
    assert cpu.group_keys
    plan = plan_buffers(g, worst, fused=cpu.runs_fused)
    # the independent check, on the same graph annotated with exactly those groups
    annotated = g.hints["fusion_groups"]
    try:
        g.hints["fusion_groups"] = tuple(a for a, r in zip(annotated, fusion_groups(g)) if cpu.runs_fused(r))
        check_plan(g, plan, fused=True)
    finally:
        g.hints["fusion_groups"] = annotated
