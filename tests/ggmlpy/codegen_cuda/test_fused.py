"""The fused kernels against the reference backend on whole graphs: attention over a KV cache
(strided, permuted f16/f32 views, GQA, ALiBi), and the feed-forward patterns (norm * weight,
Q/K/V in one launch, SwiGLU, residual epilogue). Each graph also runs unfused, and the
lowering is checked to have fused what it should."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.codegen_cuda.backend import CudaBackend
from ggmlpy.codegen_cuda.lower_attention import AttentionStep
from ggmlpy.codegen_cuda.lower_matmul import MatMulStep
from ggmlpy.codegen_cuda.lower_simple import NormStep
from ggmlpy.testing.ops import normalized_error
from ggmlpy.ir.types import GGMLType, is_quantized
from ggmlpy.quants.from_float import q8_values
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.sched.store import TensorStore

from .cases import attention_graph, attention_inputs, ffn_graph, ffn_inputs, qkv_graph

F16, F32 = GGMLType.F16, GGMLType.F32
G = GGMLType


def run_graph(backend, graph, inputs, env):
    bound = {k: np.array(v, copy=True) for k, v in inputs.items()}
    store = TensorStore(bound)
    split = backend.compile(graph, graph.nodes)
    split.run(store, env)
    return [np.array(store.array(o, env), dtype=np.float32) for o in graph.outputs], bound, split


ATTENTION = [
    dict(n_tokens=5, n_kv=40, kv_type=F16),
    dict(n_tokens=1, n_kv=64, kv_type=F16),                      # decode
    dict(n_tokens=7, n_kv=33, kv_type=F32, fuse_cont=False),     # f32 cache, no cont, odd n_kv
    dict(n_tokens=3, n_kv=24, kv_type=F16, max_bias=8.0),        # ALiBi
    dict(n_tokens=3, n_kv=24, kv_type=F16, sinks=True),          # gpt-oss's sinks
    dict(n_tokens=1, n_kv=64, kv_type=F16, sinks=True),          # and in decode
    dict(n_tokens=4, n_kv=50, kv_type=F16, head=64, n_head=9, n_head_kv=3),  # SmolLM2's heads
    dict(n_tokens=1, n_kv=1100, kv_type=F16, head=64, n_head=2, n_head_kv=1),  # more keys than threads
    # quantised KV caches (-ctk/-ctv): K decoded against 8-bit q, V read by rows (out_prod)
    dict(n_tokens=5, n_kv=40, kv_type=G.Q8_0, head=32),
    dict(n_tokens=1, n_kv=64, kv_type=G.Q4_0, head=64),
    dict(n_tokens=3, n_kv=33, kv_type=G.IQ4_NL, head=32, fuse_cont=False),
    dict(n_tokens=4, n_kv=50, kv_type=G.Q5_1, head=64, n_head=9, n_head_kv=3),
    dict(n_tokens=2, n_kv=24, kv_type=G.Q4_1, v_type=F16, head=32),
    dict(n_tokens=2, n_kv=24, kv_type=F16, v_type=G.Q5_0, head=32, sinks=True),
]


@pytest.mark.parametrize("cfg", ATTENTION, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_attention_matches_reference(device, cfg):
    kind, driver = device
    n_tokens, n_kv = cfg["n_tokens"], cfg["n_kv"]
    gargs = {k: v for k, v in cfg.items() if k not in ("n_tokens", "n_kv")}
    env = {"n_tokens": n_tokens, "n_kv": n_kv}
    g = attention_graph(**gargs, n_tokens=n_tokens, n_kv=n_kv, kv_size=max(64, n_kv))
    inputs = attention_inputs(g, n_tokens, n_kv, np.random.default_rng(3))
    if is_quantized(cfg["kv_type"]):   # q as the kernel rounds it against a quantised K (idempotent)
        inputs["q"] = q8_values(inputs["q"])
    (ref,), _, _ = run_graph(RefBackend(), g, inputs, env)
    for fuse in (True, False):
        (ours,), _, split = run_graph(CudaBackend(driver=driver, fuse=fuse), g, inputs, env)
        assert any(isinstance(s, AttentionStep) for s in split.steps) == fuse
        err = normalized_error(ours, ref)
        # unfused, the two products run on the tiled kernel (half operands) past 8 columns
        assert err <= (1e-9 if fuse or n_kv <= 8 else 5e-5), f"{kind} fuse={fuse}: NMSE {err:.3g}"


def test_attention_with_few_threads_per_block(device):
    """Blocks of 64 threads (2 warps): each thread scores several keys and each warp sums
    values past the first rows it loads ahead (Options.cuda_attn_threads, given to the
    backend: it wins over GGMLPY_CUDA_ATTN_THREADS)."""
    from ggmlpy.options import Options

    kind, driver = device
    env = {"n_tokens": 2, "n_kv": 150}
    g = attention_graph(n_tokens=2, n_kv=150, kv_size=160, head=64, n_head=3, n_head_kv=1)
    inputs = attention_inputs(g, 2, 150, np.random.default_rng(4))
    (ref,), _, _ = run_graph(RefBackend(), g, inputs, env)
    (ours,), _, split = run_graph(CudaBackend(driver=driver, options=Options(cuda_attn_threads=64)), g, inputs, env)
    plan = next(iter(split._plans.values()))
    assert [pl.block for pl in plan.launches if "attention" in pl.name] == [(64, 1, 1)]
    err = normalized_error(ours, ref)
    assert err <= 1e-9, f"{kind}: NMSE {err:.3g}"


@pytest.mark.parametrize("wtype", [GGMLType.Q4_1, GGMLType.Q8_0, F16], ids=lambda t: t.name)
@pytest.mark.parametrize("single", [True, False], ids=["decode", "prompt"])
def test_feed_forward_patterns_match_reference(device, wtype, single):
    kind, driver = device
    n_tokens = 1 if single else 11
    env = {"n_tokens": n_tokens}
    g = ffn_graph(wtype=wtype, single=single)
    inputs = ffn_inputs(g, n_tokens, np.random.default_rng(5))
    refs, _, _ = run_graph(RefBackend(), g, inputs, env)
    ours, _, split = run_graph(CudaBackend(driver=driver), g, inputs, env)
    kinds = [type(s).__name__ for s in split.steps]
    assert isinstance(split.steps[0], NormStep) and split.steps[0].weight is not None
    products = [s for s in split.steps if isinstance(s, MatMulStep)]
    if single:  # q/k/v in one launch, gate/up/swiglu in one, down + residual in one
        assert sorted(len(s.mats) for s in products) == [1, 2, 3], kinds
        assert any(s.glu is not None for s in products) and any(s.add is not None for s in products)
    else:       # many columns: products stay separate (tiled kernel), the residual still fused
        assert all(len(s.mats) == 1 and s.glu is None for s in products), kinds
        assert any(s.add is not None for s in products)
    for o, r in zip(ours, refs):
        err = normalized_error(o, r)
        assert err <= (1e-9 if single else 5e-5), f"{kind}: NMSE {err:.3g}"


@pytest.mark.parametrize("norm", ["rms", "norm"])
@pytest.mark.parametrize("single,fuse_rope", [(True, True), (True, False), (False, True)],
                         ids=["decode", "decode-rope_apart", "prompt"])
def test_decoder_block_entry_matches_reference(device, norm, single, fuse_rope):
    """norm * w -> Q/K/V -> rope -> K/V into the caches: in decode, one product launch (norm
    inside, V stored as cache rows, Q and K rotated in the epilogue, K stored as cache rows);
    with the ropes apart, the product and one rope launch (Q, and K stored as cache rows)."""
    kind, driver = device
    n_tokens = 1 if single else 6
    env = {"n_tokens": n_tokens}
    g = qkv_graph(norm, single=single)
    inputs = ffn_inputs(g, n_tokens, np.random.default_rng(11))
    refs, _, _ = run_graph(RefBackend(), g, inputs, env)
    ours, _, split = run_graph(CudaBackend(driver=driver, fuse_rope=fuse_rope), g, inputs, env)
    if single and fuse_rope:
        (mm,) = split.steps
        assert isinstance(mm, MatMulStep) and mm.prenorm is not None and mm.store is not None
        assert sorted(e.store is not None for e in mm.ropes.values()) == [False, True]
    elif single:
        assert [type(s).__name__ for s in split.steps] == ["MatMulStep", "RopeStep"]
        mm, rope = split.steps
        assert mm.prenorm is not None and mm.store is not None and len(rope.parts) == 2
    for o, r in zip(ours, refs):  # q, then the two caches (read back as graph outputs)
        err = normalized_error(o, r)
        assert err <= (1e-9 if single else 5e-5), f"{kind}: NMSE {err:.3g}"


def test_decode_graph_is_captured_once_and_replayed(device):
    kind, driver = device
    g = ffn_graph()
    be = CudaBackend(driver=driver)
    split = be.compile(g, g.nodes)
    rng = np.random.default_rng(9)
    inputs = ffn_inputs(g, 1, rng)
    results = []
    for step in range(3):
        inputs["x"] = rng.standard_normal(inputs["x"].shape).astype(np.float32)
        store = TensorStore(dict(inputs))
        split.run(store, {"n_tokens": 1})
        results.append(np.array(store.array(g.outputs[-1], {"n_tokens": 1})))
        refs, _, _ = run_graph(RefBackend(), g, inputs, {"n_tokens": 1})
        assert normalized_error(results[-1], refs[-1].reshape(results[-1].shape)) <= 1e-9
    assert be.stats.graph_captures == 1 and be.stats.graph_replays == 2
    assert not np.allclose(results[0], results[1])  # new inputs reach the replayed graph


def test_a_cache_bound_to_a_new_array_is_uploaded_again(device):
    """Runs with the same cache arrays skip the per-cache checks (a fast path); binding a
    cache to another array must still upload it: the stored rows land in the new contents."""
    kind, driver = device
    g = qkv_graph("rms")
    rng = np.random.default_rng(12)
    bindings = ffn_inputs(g, 1, rng)
    split = CudaBackend(driver=driver).compile(g, g.nodes)
    env = {"n_tokens": 1}
    seen = []
    for step in range(3):
        if step == 2:
            bindings["cache_k"] = rng.standard_normal(bindings["cache_k"].shape).astype(np.float16)
        store = TensorStore(bindings)
        split.run(store, env)
        seen.append(split._cache_seen)
        ours = np.array(store.array(g.outputs[1], env), dtype=np.float32)
        refs, _, _ = run_graph(RefBackend(), g, bindings, env)
        assert normalized_error(ours, refs[1].reshape(ours.shape)) <= 1e-9, step
    assert seen[0] is not None and seen[1] is seen[0] and seen[2] is not seen[1]


def test_one_token_graphs_upload_only_their_few_input_bytes(device, monkeypatch):
    """Memory is planned for the limits (n_ubatch tokens), but a one-token graph's inputs are
    planned for one token: each run uploads a few hundred bytes, not n_ubatch tokens' worth."""
    kind, driver = device
    g = qkv_graph("rms")  # inputs: x (64 floats per token), pos, idx
    be = CudaBackend(driver=driver)
    be.set_limits({"n_tokens": 512})
    split = be.compile(g, g.nodes)
    inputs = ffn_inputs(g, 1, np.random.default_rng(13))
    split.run(TensorStore(dict(inputs)), {"n_tokens": 1})  # uploads the weights too
    sizes = []
    real_htod = driver.htod
    monkeypatch.setattr(driver, "htod", lambda dst, src, n, stream=None: (sizes.append(n), real_htod(dst, src, n))[1])
    split.run(TensorStore(dict(inputs)), {"n_tokens": 1})
    assert len(sizes) == 1 and 64 * 4 < sizes[0] <= 1024, sizes


def test_decode_attention_reads_the_cache_length_on_the_device(device):
    """A one-token graph with limits: the attention launches read n_kv from device memory, so
    one plan (and one captured CUDA graph) serves every cache length, each matching the
    reference; shared memory is sized for the limit."""
    kind, driver = device
    kv_size = 192
    g = attention_graph(n_tokens=1, n_kv=kv_size, kv_size=kv_size, head=64, n_head=3, n_head_kv=1)
    g.hints["tokens"] = "single"
    be = CudaBackend(driver=driver)
    be.set_limits({"n_tokens": 1, "n_outputs": 1, "n_kv": kv_size})
    split = be.compile(g, g.nodes)
    assert split.counts == ("n_kv",)
    rng = np.random.default_rng(5)
    first = attention_inputs(g, 1, kv_size, rng)
    # one KV cache across the runs, as in a generation (a cache bound to a new array is a new
    # cache: uploaded again and the plan rebuilt); the reference keeps its own copy
    ref_cache = {n: first[n] for n in ("cache_k", "cache_v")}
    dev_cache = {n: np.array(a, copy=True) for n, a in ref_cache.items()}
    for n_kv in (40, 150, 64, 150):
        env = {"n_tokens": 1, "n_kv": n_kv}
        inputs = attention_inputs(g, 1, n_kv, rng)
        inputs.update(ref_cache)
        (ref,), ref_bound, _ = run_graph(RefBackend(), g, inputs, env)
        ref_cache = {n: ref_bound[n] for n in ref_cache}  # with this token's row written
        bound = {k: np.array(v, copy=True) for k, v in inputs.items()}
        bound.update(dev_cache)
        store = TensorStore(bound)
        split.run(store, env)
        ours = np.array(store.array(g.outputs[0], env), dtype=np.float32)
        assert normalized_error(ours, ref) <= 1e-9, f"{kind} n_kv={n_kv}"
    assert be.stats.plans_built == 1 and be.stats.graph_captures == 1 and be.stats.graph_replays == 3
    assert be.stats.bytes_uploaded == sum(a.nbytes for a in dev_cache.values())  # the cache, once
    (launch,) = [pl for pl in next(iter(split._plans.values())).launches if "attention" in pl.name]
    step = next(s for s in split.steps if isinstance(s, AttentionStep))
    assert launch.shmem == step.smem_bytes({"n_kv": kv_size}, launch.block[0])


def test_device_cache_length_needs_limits_that_fit(emu_driver):
    """Without limits, or with a limit whose scores would not fit in shared memory, the
    length stays a launch parameter (a plan per length)."""
    g = attention_graph(n_tokens=1, n_kv=64, kv_size=64, head=64, n_head=3, n_head_kv=1)
    g.hints["tokens"] = "single"
    assert CudaBackend(driver=emu_driver).compile(g, g.nodes).counts == ()
    be = CudaBackend(driver=emu_driver)
    be.set_limits({"n_tokens": 1, "n_kv": 1 << 20})
    assert be.compile(g, g.nodes).counts == ()
    multi = attention_graph(n_tokens=4, n_kv=64, kv_size=64)
    be.set_limits({"n_tokens": 4, "n_kv": 64})
    assert be.compile(multi, multi.nodes).counts == ()  # prompts are not captured as graphs


@pytest.mark.parametrize("wtype", [GGMLType.Q4_1, GGMLType.Q8_0, F16], ids=lambda t: t.name)
@pytest.mark.parametrize("heads", [(64, 9, 3), (16, 4, 2)], ids=["smollm2-heads", "small-heads"])
def test_decode_attention_with_its_output_projection(device, wtype, heads):
    """fuse_oproj: the decode attention kernel also multiplies by Wo and adds the residual
    (one launch instead of two); the result matches the reference, also on a second run with
    new inputs (the per-head rows and the arrival counter reused)."""
    kind, driver = device
    head, n_head, n_head_kv = heads
    env = {"n_tokens": 1, "n_kv": 70}
    g = attention_graph(n_tokens=1, n_kv=70, kv_size=96, head=head, n_head=n_head, n_head_kv=n_head_kv,
                        wo_type=wtype)
    inputs = attention_inputs(g, 1, 70, np.random.default_rng(6))
    (ref,), _, _ = run_graph(RefBackend(), g, inputs, env)
    (plain,), _, split0 = run_graph(CudaBackend(driver=driver), g, inputs, env)
    be = CudaBackend(driver=driver, fuse_oproj=True)
    (fused,), _, split = run_graph(be, g, inputs, env)
    att = [s for s in split.steps if isinstance(s, AttentionStep)]
    assert len(att) == 1 and att[0].oproj is not None
    assert len(split.steps) == len(split0.steps) - 1  # the projection's own launch is gone
    assert normalized_error(fused, ref) <= 1e-9, f"{kind} {wtype.name}"
    assert normalized_error(fused, plain) <= 1e-9
    # a second run with another residual: the counter was reset, so the last block sums again
    inputs["resid"] = inputs["resid"] + 1.0
    (ref2,), _, _ = run_graph(RefBackend(), g, inputs, env)
    store = TensorStore({k: np.array(v, copy=True) for k, v in inputs.items()})
    split.run(store, env)
    again = np.array(store.array(g.outputs[0], env), dtype=np.float32)
    assert normalized_error(again, ref2) <= 1e-9 and not np.allclose(again, fused)


def test_elementwise_chains_run_as_one_kernel(device):
    """scale -> tanh -> scale and mul(x, x) -> add(., w) -> silu each become one launch; the
    result equals the unfused kernels' bit for bit (float32 in between) and the reference."""
    from ggmlpy.codegen_cuda.lower_elementwise import ElementwiseStep

    from .cases import chain_graph

    kind, driver = device
    env = {"n_tokens": 3}
    g = chain_graph()
    rng = np.random.default_rng(8)
    inputs = {"x": (rng.standard_normal((3, 40)) * 40).astype(np.float32),
              "w": rng.standard_normal(40).astype(np.float32)}
    refs, _, _ = run_graph(RefBackend(), g, inputs, env)
    fused, _, split = run_graph(CudaBackend(driver=driver), g, inputs, env)
    plain, _, split0 = run_graph(CudaBackend(driver=driver, fuse=False), g, inputs, env)
    chains = [s for s in split.steps if isinstance(s, ElementwiseStep)]
    assert sorted(len(s.nodes) for s in chains) == [3, 3] and len(split0.steps) == 6
    for r, f, u in zip(refs, fused, plain):
        np.testing.assert_array_equal(f, u)
        assert normalized_error(f, r) <= 1e-12, kind
