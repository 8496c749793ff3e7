"""The IR itself: symbolic dims, tensor strides, the builder, views, topological order and the
graph signature, with graphs run on the reference backend where data matters."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from ggmlpy.ir import N_KV, N_OUTPUTS, N_TOKENS, Flag, GGMLType, Graph, GraphBuilder, SymExpr
from ggmlpy.ir.ops import API
from ggmlpy.ir.symbolic import evaluate, evaluate_params, simplify
from ggmlpy.ir.tensor import contiguous_strides
from ggmlpy.sched.ref_backend import RefBackend
from ggmlpy.sched.scheduler import CompiledGraph
from ggmlpy.sched.store import TensorStore

F32, F16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.I64


def run(graph: Graph, bindings: dict[str, np.ndarray], env: dict[str, int] | None = None) -> list[np.ndarray]:
    """Run a graph on the reference backend; the outputs as numpy-ordered copies."""
    env = env or {}
    store = TensorStore(bindings)
    CompiledGraph(graph, [RefBackend()]).run(store, env)
    return [np.array(store.array(o, env)) for o in graph.outputs]


# symbolic dims -------------------------------------------------------------------------------
def test_symexpr_arithmetic_and_evaluation() -> None:
    e = 4 * N_TOKENS * N_KV + N_TOKENS * 2 + 64
    assert e.eval({"n_tokens": 3, "n_kv": 5}) == 4 * 15 + 6 + 64
    assert e.symbols == {"n_tokens", "n_kv"}
    assert repr(e) == "64 + 4*n_kv*n_tokens + 2*n_tokens"  # monomials in sorted order
    assert N_TOKENS * N_KV == N_KV * N_TOKENS and hash(N_TOKENS * N_KV) == hash(N_KV * N_TOKENS)
    assert (N_TOKENS + 1) * 2 == 2 * N_TOKENS + 2
    assert N_TOKENS != N_KV and N_TOKENS != 1


def test_symbols_cancel_to_plain_ints() -> None:
    zero = N_TOKENS - N_TOKENS
    assert zero == 0 and type(zero) is int
    assert type((N_TOKENS + 7) - N_TOKENS) is int and (N_TOKENS + 7) - N_TOKENS == 7
    assert simplify(SymExpr({(): 5})) == 5 and type(simplify(SymExpr({(): 5}))) is int
    assert SymExpr({(): 5}) == 5


def test_evaluate_params_reaches_inside_tuples_and_dicts() -> None:
    params = {"ne": (64, N_TOKENS, 2), "nb": {"1": 4 * N_TOKENS}, "eps": 1e-5}
    assert evaluate_params(params, {"n_tokens": 9}) == {"ne": (64, 9, 2), "nb": {"1": 36}, "eps": 1e-5}
    assert evaluate(N_OUTPUTS * 3, {"n_outputs": 4}) == 12 and evaluate(7, {}) == 7


# tensor strides ------------------------------------------------------------------------------
@pytest.mark.parametrize("ttype, ne, nb", [
    (F32, (5, 3, 2, 1), (4, 20, 60, 120)),
    (F16, (7, 3, 1, 1), (2, 14, 42, 42)),
    (I64, (3, 1, 1, 1), (8, 24, 24, 24)),
    (GGMLType.Q4_0, (64, 3, 2, 1), (18, 36, 108, 216)),   # 2 blocks of 18 bytes per row
    (GGMLType.Q4_K, (512, 2, 1, 1), (144, 288, 576, 576)),
    (GGMLType.Q8_0, (32, 5, 1, 1), (34, 34, 170, 170)),
])
def test_contiguous_strides_follow_ggml_new_tensor(ttype, ne, nb) -> None:
    assert contiguous_strides(ttype, ne) == nb


def test_symbolic_strides_and_shape_facts() -> None:
    b = GraphBuilder()
    x = b.input("x", F32, (64, N_TOKENS))
    assert x.nb == (4, 256, 256 * N_TOKENS, 256 * N_TOKENS)
    assert x.nelements() == 64 * N_TOKENS and x.is_contiguous and x.n_dims == 2
    assert b.new_tensor(F32, (5, 1, 3)).n_dims == 3 and b.new_tensor(F32, (1,)).n_dims == 1
    assert not b.transpose(b.new_tensor(F32, (5, 3))).is_contiguous


# builder -------------------------------------------------------------------------------------
GGML_API = ["get_rows", "mul_mat", "add", "mul", "scale", "rms_norm", "norm", "rope_ext",
            "soft_max_ext", "silu", "gelu", "swiglu", "view", "reshape", "permute", "transpose",
            "cont", "cpy", "set_rows", "concat"]


def test_builder_offers_the_ggml_api_from_the_registry() -> None:
    b = GraphBuilder()
    missing = [name for name in GGML_API if name not in API]
    assert not missing, f"builder functions missing from the registry: {missing}"
    assert getattr(b, "rms_norm").func is API["rms_norm"]
    with pytest.raises(AttributeError, match="no_such_op"):
        b.no_such_op


def test_builder_leaves_ops_and_names() -> None:
    b = GraphBuilder()
    w = b.weight("w", GGMLType.Q8_0, (64, 9))
    x = b.input("x", F32, (64, N_TOKENS))
    kv = b.cache("kv", F16, (64, 32))
    assert (w.flags, x.flags, kv.flags) == (Flag.WEIGHT, Flag.INPUT, Flag.CACHE)
    y = b.mul_mat(w, x)
    assert (y.op, y.type, y.ne, y.src) == ("mul_mat", F32, (9, N_TOKENS, 1, 1), (w, x))
    assert y.nb == (4, 36, 36 * N_TOKENS, 36 * N_TOKENS)
    assert b.name(y, "attn_norm", 3).name == "attn_norm-3" and b.name(y, "out", -1).name == "out"
    s = b.scale(y, 0.5)
    assert s.params == {"s": 0.5, "b": 0.0}
    assert b.created[-1] is s


# views ---------------------------------------------------------------------------------------
def test_view_chains_have_ggml_ne_nb_and_offsets() -> None:
    b = GraphBuilder()
    x = b.input("x", F32, (6, 4, 3))                        # nb 4, 24, 96, 288
    p = b.permute(x, 0, 2, 1, 3)
    assert (p.ne, p.nb) == ((6, 3, 4, 1), (4, 96, 24, 288))
    t = b.transpose(x)
    assert (t.ne, t.nb) == ((4, 6, 3, 1), (24, 4, 96, 288))
    r = b.reshape(x, 12, 6)
    assert (r.ne, r.nb, r.view_src) == ((12, 6, 1, 1), (4, 48, 288, 288), x)
    v = b.view(x, (3, 2), (24,), 8)
    assert (v.ne, v.nb, v.view_offs) == ((3, 2, 1, 1), (4, 24, 48, 48), 8)
    vv = b.view(b.view(x, (6, 2), (24,), 24), (3,), (), 4)  # offsets add up on the root
    assert vv.view_src is x and vv.view_offs == 28
    pt = b.transpose(b.permute(b.reshape(x, 6, 2, 6), 0, 2, 1, 3))
    assert pt.view_src is x and (pt.ne, pt.nb) == ((6, 6, 2, 1), (48, 4, 24, 288))


def test_reference_backend_reads_views_like_numpy() -> None:
    b = GraphBuilder()
    x = b.input("x", F32, (6, 4, 3))
    outs = [b.cont(b.permute(x, 0, 2, 1, 3)), b.cont(b.transpose(x)),
            b.cont(b.view(x, (3, 2), (24,), 8)),
            b.cont(b.view(b.view(x, (6, 2), (24,), 24), (3,), (), 4)),
            b.cont(b.transpose(b.permute(b.reshape(x, 6, 2, 6), 0, 2, 1, 3))),
            b.cont(b.view(x, (2, 2, 2), (48, 96 + 4), 4))]
    data = np.arange(72, dtype=np.float32).reshape(3, 4, 6)   # numpy order of ne (6, 4, 3)
    got = run(b.build(outs), {"x": data})
    want = [data.transpose(1, 0, 2), data.transpose(0, 2, 1), data[0, 0:2, 2:5], data[0, 1, 1:4],
            data.reshape(6, 2, 6).transpose(1, 2, 0),
            np.array([[[data.flat[1 + 12 * r + 25 * m + c] for c in range(2)] for r in range(2)]
                      for m in range(2)])]
    for g, w in zip(got, want):
        assert g.shape == (1,) * (4 - w.ndim) + w.shape
        np.testing.assert_array_equal(g.reshape(w.shape), w)


def test_symbolic_view_is_evaluated_per_run() -> None:
    b = GraphBuilder()
    x = b.input("x", F32, (6, N_TOKENS))
    right = b.cont(b.view(x, (3, N_TOKENS), (24,), 12))     # columns 3..5 of every token
    last = b.cont(b.view(x, (6,), (), 24 * (N_TOKENS - 1)))  # the last token's row
    graph = b.build([right, last])
    for n in (1, 4):
        data = np.random.default_rng(n).standard_normal((n, 6)).astype(np.float32)
        r, l = run(graph, {"x": data}, {"n_tokens": n})
        np.testing.assert_array_equal(r, data[None, None, :, 3:])
        np.testing.assert_array_equal(l.reshape(-1), data[-1])


def test_mul_mat_reads_transposed_views() -> None:
    """The attention's V read: a permuted view whose rows are strided columns."""
    b = GraphBuilder()
    v = b.input("v", F32, (8, 5))                  # [head_dim, n_kv]
    kq = b.input("kq", F32, (5, 3))                # [n_kv, n_tokens]
    out = b.mul_mat(b.transpose(v), kq)            # [head_dim, n_tokens]
    rng = np.random.default_rng(0)
    vd, kqd = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
    (got,) = run(b.build([out]), {"v": vd, "kq": kqd})
    np.testing.assert_allclose(got.reshape(3, 8), kqd @ vd, rtol=1e-5, atol=1e-6)


def test_reshape_of_a_non_contiguous_tensor_is_refused() -> None:
    b = GraphBuilder()
    t = b.transpose(b.input("x", F32, (6, 4)))
    with pytest.raises(ValueError, match="reshape.*not contiguous"):
        b.reshape(t, 24)
    with pytest.raises(ValueError, match="reshape.*24 elements"):
        b.reshape(b.input("y", F32, (6, 4)), 5, 5)


def test_a_view_past_its_source_is_refused() -> None:
    """ggml_view_impl's assert: a static view must lie inside its source's memory (a bench
    once read past a KV cache this way and crashed); symbolic ones are sized when run."""
    b = GraphBuilder()
    cache = b.cache("cache_k", GGMLType.F16, (192, 16))               # 6144 bytes
    inside = b.view(cache, (64, 3, 16), (128, 384))                    # every cell: fits
    assert inside.ne[:3] == (64, 3, 16)
    b.view(cache, (64, 2, 16), (128, 384), 128)                        # heads 1 and 2: fits
    with pytest.raises(ValueError, match=r"^view: .* ends at byte 6528, past the 6144 bytes of cache_k"):
        b.view(cache, (64, 3, 17), (128, 384))                         # one cell too many
    with pytest.raises(ValueError, match=r"^view: .* past the 6144 bytes"):
        b.view(cache, (64, 3, 16), (128, 384), 2)                      # shifted by one element
    with pytest.raises(ValueError, match=r"^view: .* past the 6144 bytes"):
        b.view(b.view(cache, (64, 2, 16), (128, 384), 128), (64, 2, 16), (128, 384), 128)
    b.view(cache, (64, 3, N_KV), (128, 384))                           # symbolic: checked at run time


@pytest.mark.parametrize("build, op", [
    (lambda b: b.mul_mat(b.input("a", F32, (64, 9)), b.input("x", F32, (32, 2))), "mul_mat"),
    (lambda b: b.mul_mat(b.input("a", F32, (8, 2, 3)), b.input("x", F32, (8, 2, 4))), "mul_mat"),
    (lambda b: b.add(b.input("a", F32, (6, 4)), b.input("c", F32, (4, 6))), "add"),
    (lambda b: b.mul(b.input("a", F32, (6, 4)), b.input("c", F32, (6, 3))), "mul"),
    (lambda b: b.concat(b.input("a", F32, (4, 3)), b.input("c", F32, (4, 5)), 0), "concat"),
    (lambda b: b.get_rows(b.input("a", F32, (4, 3)), b.input("i", F32, (2,))), "get_rows"),
    (lambda b: b.swiglu(b.input("a", F32, (4, 3)), b.input("c", F32, (4, 2))), "swiglu"),
    (lambda b: b.permute(b.input("a", F32, (4, 3)), 0, 0, 1, 2), "permute"),
    (lambda b: b.rope_ext(b.input("a", F32, (8, 2, 3)), b.input("p", I64, (3,)), None, 8, 0), "rope"),
    (lambda b: b.set_rows(b.input("d", F32, (8, 4)), b.input("s", F32, (6, 2)), b.input("i", I64, (2,))),
     "set_rows"),
])
def test_shape_errors_name_the_op(build, op) -> None:
    with pytest.raises(ValueError, match=rf"^{op}: "):
        build(GraphBuilder())


# topological order ---------------------------------------------------------------------------
def test_topological_order_is_ggml_depth_first_post_order() -> None:
    b = GraphBuilder()
    x = b.input("x", F32, (4,))
    a, c = b.silu(x), b.relu(x)
    d = b.add(a, c)
    b.tanh(x)                                       # built but unreachable from the output
    graph = b.build([d])
    assert graph.tensors == [x, a, c, d]
    assert graph.leafs == [x] and graph.nodes == [a, c, d]
    assert [t.id for t in graph.consumers()[x.id]] == [a.id, c.id]
    assert d.flags & Flag.OUTPUT


def test_multiple_outputs_share_sources_once() -> None:
    b = GraphBuilder()
    x = b.input("x", F32, (4, 2))
    r = b.reshape(x, 8)
    y1, y2 = b.sqr(r), b.add(b.cont(b.transpose(x)), b.input("z", F32, (2, 4)))
    graph = b.build([y1, y2])
    ids = [t.id for t in graph.tensors]
    assert len(ids) == len(set(ids)) == 7
    pos = {t.id: i for i, t in enumerate(graph.tensors)}
    for t in graph.tensors:
        for s in list(t.src) + ([t.view_src] if t.view_src is not None else []):
            assert pos[s.id] < pos[t.id]
    assert graph.outputs == [y1, y2] and all(o.flags & Flag.OUTPUT for o in graph.outputs)


# a llama-like block: symbolic dims and signature ----------------------------------------------
N_EMBD, N_HEAD, KV_SIZE = 16, 2, 320


def mini_block(n_tokens, n_kv, n_outputs, n_embd=N_EMBD, w_type=F32, eps=1e-5) -> Graph:
    """Norm, Q/K/V, RoPE, a KV cache written with set_rows and read back through views,
    masked softmax attention, output row selection: the shapes llama graphs are made of."""
    b = GraphBuilder()
    head = n_embd // N_HEAD
    x = b.input("inp_embd", F32, (n_embd, n_tokens))
    pos = b.input("inp_pos", I32, (n_tokens,))
    k_idxs = b.input("inp_k_idxs", I64, (n_tokens,))
    mask = b.input("inp_kq_mask", F32, (n_kv, n_tokens))
    out_ids = b.input("inp_out_ids", I32, (n_outputs,))
    cache_k = b.cache("cache_k", F16, (n_embd, KV_SIZE))
    cache_v = b.cache("cache_v", F16, (n_embd, KV_SIZE))
    w = {n: b.weight(n, w_type, (n_embd, n_embd)) for n in ("wq", "wk", "wv", "wo")}
    cur = b.mul(b.rms_norm(x, eps), b.weight("attn_norm", F32, (n_embd,)))
    q, k, v = (b.reshape(b.mul_mat(w[n], cur), head, N_HEAD, n_tokens) for n in ("wq", "wk", "wv"))
    q = b.name(b.rope_ext(q, pos, None, head, 0), "Qcur")
    k = b.rope_ext(k, pos, None, head, 0)
    k_all = b.set_rows(cache_k, b.reshape(k, n_embd, n_tokens), k_idxs)
    v_all = b.set_rows(cache_v, b.reshape(v, n_embd, n_tokens), k_idxs)
    kv = b.view(k_all, (head, N_HEAD, n_kv), (2 * head, cache_k.nb[1]))
    vv = b.view(v_all, (head, N_HEAD, n_kv), (2 * head, cache_v.nb[1]))
    kq = b.mul_mat(b.permute(kv, 0, 2, 1, 3), b.permute(q, 0, 2, 1, 3))
    kq = b.soft_max_ext(kq, mask, 1.0 / math.sqrt(head), 0.0)
    kqv = b.mul_mat(b.permute(vv, 1, 2, 0, 3), kq)
    cur = b.mul_mat(w["wo"], b.cont(b.permute(kqv, 0, 2, 1, 3), n_embd, n_tokens))
    out = b.add(b.get_rows(cur, out_ids), b.get_rows(x, out_ids))
    return b.build([b.silu(out)])


def block_data(n: int, n_kv: int, n_out: int, seed: int = 0, w_type=F32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.where(rng.random((n, n_kv)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[:, 0] = 0.0
    data = {"inp_embd": rng.standard_normal((n, N_EMBD)).astype(np.float32),
            "inp_pos": rng.integers(0, 1000, n).astype(np.int32),
            "inp_k_idxs": rng.permutation(n_kv)[:n].astype(np.int64),
            "inp_kq_mask": mask,
            "inp_out_ids": rng.choice(n, n_out, replace=False).astype(np.int32),
            "cache_k": rng.standard_normal((KV_SIZE, N_EMBD)).astype(np.float16),
            "cache_v": rng.standard_normal((KV_SIZE, N_EMBD)).astype(np.float16),
            "attn_norm": rng.uniform(0.5, 1.5, N_EMBD).astype(np.float32)}
    w_dtype = np.float16 if w_type == F16 else np.float32
    for name in ("wq", "wk", "wv", "wo"):
        data[name] = (rng.standard_normal((N_EMBD, N_EMBD)) / 4).astype(w_dtype)
    return data


def _copy(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in data.items()}   # set_rows writes into the bound caches


@pytest.mark.parametrize("n_tokens", [1, 5, 300])
def test_symbolic_graph_equals_graph_built_with_ints(n_tokens: int) -> None:
    n_kv, n_out = n_tokens + 2, min(n_tokens, 3)
    data = block_data(n_tokens, n_kv, n_out, seed=n_tokens)
    env = {"n_tokens": n_tokens, "n_kv": n_kv, "n_outputs": n_out}
    sym_store, int_store = _copy(data), _copy(data)
    (sym,) = run(mini_block(N_TOKENS, N_KV, N_OUTPUTS), sym_store, env)
    (ref,) = run(mini_block(n_tokens, n_kv, n_out), int_store)
    assert sym.shape == (1, 1, n_out, N_EMBD)
    np.testing.assert_array_equal(sym, ref)
    np.testing.assert_array_equal(sym_store["cache_k"], int_store["cache_k"])
    written = data["inp_k_idxs"]
    assert not np.array_equal(sym_store["cache_k"][written], data["cache_k"][written])


def test_signature_ignores_symbol_values_and_data() -> None:
    g1, g2 = mini_block(N_TOKENS, N_KV, N_OUTPUTS), mini_block(N_TOKENS, N_KV, N_OUTPUTS)
    assert g1.tensors[0].id != g2.tensors[0].id and g1.signature() == g2.signature()
    before = g1.signature()
    runs = [run(g, block_data(n, n + 2, 1, seed=n), {"n_tokens": n, "n_kv": n + 2, "n_outputs": 1})[0]
            for g, n in ((g1, 5), (g2, 7))]
    assert not np.allclose(runs[0], runs[1])
    assert g1.signature() == g2.signature() == before
    assert len(before) == 24 and int(before, 16) >= 0


def test_signature_changes_with_params_types_static_shapes_and_roles() -> None:
    base = mini_block(N_TOKENS, N_KV, N_OUTPUTS).signature()
    variants = {
        "eps": mini_block(N_TOKENS, N_KV, N_OUTPUTS, eps=1e-6),
        "weight type": mini_block(N_TOKENS, N_KV, N_OUTPUTS, w_type=F16),
        "n_embd": mini_block(N_TOKENS, N_KV, N_OUTPUTS, n_embd=32),
        "static tokens": mini_block(5, N_KV, N_OUTPUTS),
        "static outputs": mini_block(N_TOKENS, N_KV, 1),
    }
    sigs = {name: g.signature() for name, g in variants.items()}
    assert base not in sigs.values() and len(set(sigs.values())) == len(sigs)
    assert mini_block(5, 7, 1).signature() != mini_block(300, 302, 1).signature()
    hinted = mini_block(N_TOKENS, N_KV, N_OUTPUTS)
    hinted.hints["tokens"] = "single"
    assert hinted.signature() != base


def test_signature_ignores_intermediate_names_but_not_bound_ones() -> None:
    def graph(inter: str, weight: str) -> Graph:
        b = GraphBuilder()
        y = b.name(b.mul_mat(b.weight(weight, F32, (8, 4)), b.input("x", F32, (8, N_TOKENS))), inter)
        return b.build([b.silu(y)])

    assert graph("a", "w").signature() == graph("b", "w").signature()
    assert graph("a", "w").signature() != graph("a", "w2").signature()


def test_signature_is_the_same_in_another_process() -> None:
    code = ("from tests.ggmlpy.ir.test_ir import mini_block; "
            "from ggmlpy.ir import N_TOKENS, N_KV, N_OUTPUTS; "
            "print(mini_block(N_TOKENS, N_KV, N_OUTPUTS).signature())")
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == mini_block(N_TOKENS, N_KV, N_OUTPUTS).signature()
