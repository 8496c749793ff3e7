"""Shared material for the CUDA tests: backends (host emulator, GPU), the op cases the
registry generates plus CUDA-specific ones, and every kernel variant they lower to.

`all_specs()` is what CI compiles with `nvcc -ptx`, and what bench/cuda_prebuild.py compiles
to cubins ahead of a GPU session (the same module source, hence the same cache key).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from ggmlpy.codegen_cuda.fusion import LowerOptions, lower_split
from ggmlpy.codegen_cuda.kernels import KernelSpec
from ggmlpy.codegen_cuda.lower_matmul import MatMulOptions
from ggmlpy.codegen_cuda.lowering import LOWERINGS, supports
from ggmlpy.ir import GGMLType, GraphBuilder, N_KV, N_TOKENS
from ggmlpy.ir.graph import Graph
from ggmlpy.ir.ops.registry import OPS, Kind, OpCase, SrcSpec
from ggmlpy.testing.ops import build_case_graph, iter_cases
from ggmlpy.ir.tensor import Flag
from ggmlpy.ir.types import is_quantized, row_size
from ggmlpy.quants import quantize
from ggmlpy.sched.store import NUMPY_DTYPES

G = GGMLType
F32, F16, I32, I64 = G.F32, G.F16, G.I32, G.I64
REPO = Path(__file__).resolve().parents[3]

# matvec (few columns), tiled (tensor cores, f16 operands), and no fusion at all
OPTION_SETS = {
    "default": dict(),
    "tiled": dict(matvec_max_cols=0),
    "unfused": dict(fuse=False),
}


def lower_options(name: str) -> LowerOptions:
    o = OPTION_SETS[name]
    return LowerOptions(o.get("fuse", True), MatMulOptions(o.get("matvec_max_cols", 8), True))


# weight types beyond the registry's cases, each with the rows (of 256 values) of its mul_mat
# cases. Their weights are random blocks (fill "blocks", ggmlpy/testing/ops.py random_blocks:
# any bits in every field, finite scales), which reach every index of the grid I-quants' grids
# with that many rows (test_decoders.py checks that they do).
WEIGHT_ROWS = {G.Q1_0: 6, G.Q2_0: 6, G.Q2_K: 6, G.Q3_K: 6, G.Q5_K: 6, G.TQ1_0: 6, G.TQ2_0: 6, G.NVFP4: 6,
               G.IQ2_XXS: 96, G.IQ2_XS: 192, G.IQ2_S: 384, G.IQ3_XXS: 48, G.IQ3_S: 96, G.IQ1_S: 800, G.IQ1_M: 800}


def weight_type_cases() -> list[tuple[str, OpCase]]:
    """mul_mat (one and five columns), get_rows and mul_mat_id with each type of WEIGHT_ROWS."""
    out = []
    for t, m in WEIGHT_ROWS.items():
        for n in (1, 5):
            out.append(("mul_mat", OpCase((SrcSpec(t, (256, m, 1, 1), fill="blocks"), SrcSpec(F32, (256, n, 1, 1))),
                                          label=f"{t.name} n={n}")))
        out.append(("get_rows", OpCase((SrcSpec(t, (256, 10, 1, 1), fill="blocks"),
                                        SrcSpec(I32, (4,), fill="rows:10")), label=t.name)))
    for t in (G.IQ2_S, G.Q3_K):
        out.append(("mul_mat_id", OpCase((SrcSpec(t, (256, 6, 4, 1), fill="blocks"), SrcSpec(F32, (256, 2, 3, 1)),
                                          SrcSpec(I32, (2, 3), fill="unique_rows:4")), label=f"{t.name} experts")))
    return out


def extra_cases() -> list[tuple[str, OpCase]]:
    """Cases beyond the registry's: several tiles, odd sizes, broadcast batches, the weight
    types the registry's cases leave out."""
    out = []
    for t, k in ((F32, 96), (F16, 80), (GGMLType.Q4_1, 96), (GGMLType.Q8_0, 64), (GGMLType.Q4_K, 256),
                 (GGMLType.MXFP4, 96)):
        out.append(("mul_mat", OpCase((SrcSpec(t, (k, 130, 1, 1)), SrcSpec(F32, (k, 70, 1, 1))),
                                      label=f"tiles {t.name}")))
    out.append(("mul_mat", OpCase((SrcSpec(F32, (20, 9, 2, 1)), SrcSpec(F32, (20, 11, 4, 3))),
                                  label="odd K, batch broadcast")))
    out.append(("mul_mat", OpCase((SrcSpec(F16, (40, 33, 3, 1), permute=(1, 0, 2, 3)),
                                   SrcSpec(F32, (33, 12, 3, 1))), label="transposed f16 a")))
    out.append(("soft_max", OpCase((SrcSpec(F32, (300, 5, 3, 1)), SrcSpec(F32, (300, 8, 1, 1), fill="mask")),
                                   (("scale", 0.3), ("max_bias", 0.0)), label="long rows")))
    out.append(("rms_norm", OpCase((SrcSpec(F32, (1500, 3, 1, 1)),), (("eps", 1e-6),), label="long rows")))
    out.append(("get_rows", OpCase((SrcSpec(GGMLType.Q4_1, (64, 10, 1, 1)), SrcSpec(I64, (5,), fill="rows:10")),
                                   label="Q4_1 i64")))
    out.append(("set_rows", OpCase((SrcSpec(GGMLType.BF16, (16, 12, 1, 1), fill="zeros"), SrcSpec(F32, (16, 5, 1, 1)),
                                    SrcSpec(I32, (5,), fill="unique_rows:12")), label="BF16 i32")))
    return out + weight_type_cases()


def _cuda_supports(op: str, case: OpCase) -> bool:
    """Whether the CUDA backend takes every node of the case (a cpy into a quantised cache,
    which it leaves to the CPU, does not)."""
    graph, _ = build_case_graph(op, case)
    return all(supports(n) for n in graph.nodes if OPS[n.op].kind != Kind.VIEW)


def all_cases() -> Iterator[tuple[str, str, OpCase]]:
    """(test id, op name, case) for the registry's cases and the extra ones; ops without a
    CUDA lowering (test_lowering_coverage.NOT_LOWERED) are left to the next backend."""
    for name, i, case in iter_cases():
        if name not in LOWERINGS or not _cuda_supports(name, case):
            continue
        yield f"{name}-{i}-{case.label}".replace(" ", "_"), name, case
    for i, (name, case) in enumerate(extra_cases()):
        yield f"{name}-x{i}-{case.label}".replace(" ", "_"), name, case


# attention and fused graphs ---------------------------------------------------------------------
def attention_graph(n_tokens: int = 5, n_kv: int = 40, kv_size: int = 64, head: int = 16,
                    n_head: int = 4, n_head_kv: int = 2, kv_type: GGMLType = F16,
                    fuse_cont: bool = True, max_bias: float = 0.0, wo_type: GGMLType | None = None,
                    sinks: bool = False, v_type: GGMLType | None = None) -> Graph:
    """llama's attention block over a KV cache (store K and V, attend through strided views);
    with `wo_type`, followed by the output projection and the residual add, as a one-token
    (decode) graph. `v_type` (default kv_type) is V's cache type; a quantised one is read by
    rows through out_prod, as llama/kv_attention.py builds it."""
    v_type = kv_type if v_type is None else v_type
    b = GraphBuilder()
    q = b.input("q", F32, (head, n_head, N_TOKENS))
    k = b.input("k", F32, (head, n_head_kv, N_TOKENS))
    v = b.input("v", F32, (head, n_head_kv, N_TOKENS))
    idx = b.input("idx", I64, (N_TOKENS,))
    mask = b.input("mask", F32, (N_KV, N_TOKENS))
    cache_k = b.cache("cache_k", kv_type, (head * n_head_kv, kv_size))
    cache_v = b.cache("cache_v", v_type, (head * n_head_kv, kv_size))
    k_all = b.set_rows(cache_k, b.reshape(k, head * n_head_kv, N_TOKENS), idx)
    v_all = b.set_rows(cache_v, b.reshape(v, head * n_head_kv, N_TOKENS), idx)
    kv = b.view(k_all, (head, n_head_kv, N_KV), (row_size(kv_type, head), cache_k.nb[1]))
    vv = b.view(v_all, (head, n_head_kv, N_KV), (row_size(v_type, head), cache_v.nb[1]))
    kq = b.mul_mat(b.permute(kv, 0, 2, 1, 3), b.permute(q, 0, 2, 1, 3))
    kq = b.soft_max_ext(kq, mask, 0.25, max_bias, sinks=b.input("sinks", F32, (n_head,)) if sinks else None)
    if is_quantized(v_type):
        kqv = b.out_prod(b.permute(vv, 0, 2, 1, 3), b.transpose(kq))
    else:
        kqv = b.mul_mat(b.permute(vv, 1, 2, 0, 3), kq)
    out = b.cont(b.permute(kqv, 0, 2, 1, 3), head * n_head, N_TOKENS) if fuse_cont else kqv
    if wo_type is not None:
        n_embd = head * n_head + 32  # the projection may change the width
        wo = b.weight("wo", wo_type, (head * n_head, n_embd))
        out = b.add(b.mul_mat(wo, out), b.input("resid", F32, (n_embd, N_TOKENS)))
    g = b.build([out])
    if wo_type is not None:
        g.hints["tokens"] = "single"
    return g


def attention_inputs(g: Graph, n_tokens: int, n_kv: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    head = g.find("q").ne[0]
    n_head, n_head_kv = g.find("q").ne[1], g.find("k").ne[1]
    kv_size = g.find("cache_k").ne[1]

    def cache(name: str) -> np.ndarray:
        t = g.find(name)
        values = rng.standard_normal((kv_size, head * n_head_kv)).astype(np.float32)
        return quantize(values, t.type) if is_quantized(t.type) else values.astype(NUMPY_DTYPES[t.type])

    mask = np.where(rng.random((n_tokens, n_kv)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[:, 0] = 0.0
    return {
        "q": rng.standard_normal((n_tokens, n_head, head)).astype(np.float32),
        "k": rng.standard_normal((n_tokens, n_head_kv, head)).astype(np.float32),
        "v": rng.standard_normal((n_tokens, n_head_kv, head)).astype(np.float32),
        "idx": rng.choice(n_kv, size=n_tokens, replace=False).astype(np.int64),
        "mask": mask,
        "cache_k": cache("cache_k"),
        "cache_v": cache("cache_v"),
        **({"sinks": 2.0 * rng.standard_normal(n_head).astype(np.float32)}
           if any(t.name == "sinks" for t in g.tensors) else {}),
        **_projection_inputs(g, n_tokens, rng),
    }


def _projection_inputs(g: Graph, n_tokens: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The output projection's weight and the residual, when the graph has them."""
    from ggmlpy.quants import quantize

    if "wo" not in {t.name for t in g.leafs}:
        return {}
    wo = g.find("wo")
    k, m = wo.ne[0], wo.ne[1]
    w = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32)
    return {"wo": w.astype(np.float16) if wo.type == F16 else quantize(w, wo.type),
            "resid": rng.standard_normal((n_tokens, m)).astype(np.float32)}


def chain_graph(n: int = 40) -> Graph:
    """Elementwise chains: soft-capping (scale -> tanh -> scale, Gemma 2's) and a chain with
    a broadcast operand and an operand used twice (mul(x, x))."""
    b = GraphBuilder()
    x = b.input("x", F32, (n, N_TOKENS))
    w = b.input("w", F32, (n,))
    capped = b.scale(b.tanh(b.scale(x, 1.0 / 30.0)), 30.0)
    y = b.silu(b.add(b.mul(x, x), w))
    return b.build([capped, y])


def ffn_graph(n_embd: int = 64, n_ff: int = 96, wtype: GGMLType = GGMLType.Q4_1, single: bool = True) -> Graph:
    """norm * w -> (q, k, v products sharing x) and a SwiGLU feed-forward with residual: every
    fusion pattern except attention, in one graph."""
    b = GraphBuilder()
    x = b.input("x", F32, (n_embd, N_TOKENS))
    cur = b.mul(b.rms_norm(x, 1e-5), b.weight("norm_w", F32, (n_embd,)))
    qkv = [b.mul_mat(b.weight(f"w{n}", wtype, (n_embd, m)), cur) for n, m in (("q", n_embd), ("k", 32), ("v", 32))]
    gate = b.mul_mat(b.weight("gate", wtype, (n_embd, n_ff)), cur)
    up = b.mul_mat(b.weight("up", wtype, (n_embd, n_ff)), cur)
    down = b.mul_mat(b.weight("down", wtype, (n_ff, n_embd)), b.swiglu(gate, up))
    out = b.add(down, x)
    g = b.build(qkv + [out])
    if single:
        g.hints["tokens"] = "single"
    return g


def qkv_graph(norm: str = "rms", wtype: GGMLType = GGMLType.Q4_1, n_embd: int = 64, head: int = 16,
              n_head: int = 4, n_head_kv: int = 2, kv_size: int = 32, single: bool = True) -> Graph:
    """A decoder block's entry as llama builds it: norm * w, Q/K/V products, rope of Q and K,
    K and V stored into f16 caches (the fusions of decode: prenorm, row store, rope pair)."""
    b = GraphBuilder()
    x = b.input("x", F32, (n_embd, N_TOKENS))
    pos = b.input("pos", I32, (N_TOKENS,))
    idx = b.input("idx", I64, (N_TOKENS,))
    cur = b.rms_norm(x, 1e-5) if norm == "rms" else b.norm(x, 1e-5)
    cur = b.mul(cur, b.weight("norm_w", F32, (n_embd,)))
    q = b.mul_mat(b.weight("wq", wtype, (n_embd, head * n_head)), cur)
    k = b.mul_mat(b.weight("wk", wtype, (n_embd, head * n_head_kv)), cur)
    v = b.mul_mat(b.weight("wv", wtype, (n_embd, head * n_head_kv)), cur)
    rope = dict(n_dims=head, mode=0, n_ctx_orig=4096, freq_base=10000.0)
    q = b.rope_ext(b.reshape(q, head, n_head, N_TOKENS), pos, None, **rope)
    k = b.rope_ext(b.reshape(k, head, n_head_kv, N_TOKENS), pos, None, **rope)
    v = b.reshape(v, head, n_head_kv, N_TOKENS)
    cache_k = b.cache("cache_k", F16, (head * n_head_kv, kv_size))
    cache_v = b.cache("cache_v", F16, (head * n_head_kv, kv_size))
    k_all = b.set_rows(cache_k, b.reshape(k, head * n_head_kv, N_TOKENS), idx)
    v_all = b.set_rows(cache_v, b.reshape(v, head * n_head_kv, N_TOKENS), idx)
    g = b.build([q, k_all, v_all])
    if single:
        g.hints["tokens"] = "single"
    return g


def ffn_inputs(g: Graph, n_tokens: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    from ggmlpy.quants import quantize

    out: dict[str, np.ndarray] = {}
    for t in g.leafs:
        ne = [int(d) if isinstance(d, int) else n_tokens for d in t.ne]
        shape = tuple(reversed(ne))
        if t.type in (I32, I64):  # positions, or distinct cache rows
            kv_rows = next((c.ne[1] for c in g.leafs if c.flags & Flag.CACHE), 64)
            out[t.name] = rng.choice(kv_rows, size=shape, replace=False).astype(np.int32 if t.type == I32 else np.int64)
            continue
        vals = rng.standard_normal(shape) / (np.sqrt(ne[0]) if t.flags & Flag.WEIGHT else 1.0)
        if t.name == "norm_w":
            vals = 1.0 + 0.1 * vals
        vals = vals.astype(np.float32)
        if t.type == F32:
            out[t.name] = np.ascontiguousarray(vals)
        elif t.flags & Flag.CACHE:
            out[t.name] = vals.astype(np.float16)
        elif t.type == F16:
            out[t.name] = vals.astype(np.float16)
        else:
            out[t.name] = quantize(vals.reshape(-1, ne[0]), t.type)
    return out


# every kernel variant ---------------------------------------------------------------------------
def graph_specs(graph: Graph, options: LowerOptions) -> list[KernelSpec]:
    return [s for step in lower_split(graph, graph.nodes, options) for s in step.specs()]


def case_specs(options_name: str = "default") -> dict[str, KernelSpec]:
    """Kernels of every op case (registry and extra) under one option set."""
    opts = lower_options(options_name)
    specs: dict[str, KernelSpec] = {}
    for _, name, case in all_cases():
        g, _ = build_case_graph(name, case)
        specs.update({s.name: s for s in graph_specs(g, opts)})
    return specs


def fused_specs() -> dict[str, KernelSpec]:
    """Kernels of the attention and feed-forward graphs (the fused variants)."""
    opts = lower_options("default")
    specs: dict[str, KernelSpec] = {}
    graphs = [attention_graph(), attention_graph(kv_type=F32, fuse_cont=False, max_bias=8.0),
              attention_graph(head=64, kv_type=GGMLType.Q8_0), attention_graph(head=32, kv_type=GGMLType.Q4_0),
              attention_graph(head=32, kv_type=GGMLType.IQ4_NL, v_type=F16),
              attention_graph(head=64, n_head=9, n_head_kv=3), attention_graph(sinks=True),
              ffn_graph(), ffn_graph(single=False),
              ffn_graph(wtype=F16), ffn_graph(wtype=GGMLType.Q8_0), qkv_graph(), qkv_graph("norm"),
              qkv_graph(single=False), chain_graph()]
    for g in graphs:
        specs.update({s.name: s for s in graph_specs(g, opts)})
    oproj = LowerOptions(matmul=opts.matmul, fuse_oproj=True)
    for wtype in (GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.Q5_0, F16):
        for head, n_head, n_head_kv in ((64, 9, 3), (16, 4, 2)):
            g = attention_graph(n_tokens=1, head=head, n_head=n_head, n_head_kv=n_head_kv, wo_type=wtype)
            specs.update({s.name: s for s in graph_specs(g, oproj)})
    return specs


def all_specs() -> dict[str, KernelSpec]:
    specs: dict[str, KernelSpec] = {}
    for name in OPTION_SETS:
        specs.update(case_specs(name))
    specs.update(fused_specs())
    return specs
