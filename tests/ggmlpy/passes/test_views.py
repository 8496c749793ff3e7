"""View folding: chains of views become one strided view (ne, nb and offset composed),
identity views vanish, needless conts become reshapes; everything else stays."""
from __future__ import annotations

import numpy as np

from ggmlpy.ir import N_TOKENS, GGMLType, GraphBuilder
from ggmlpy.ir.ops import Kind, get_op
from ggmlpy.passes.common import op_kind
from ggmlpy.passes.views import fold_views
from tests.ggmlpy.passes.helpers import llama_bindings, llama_env, run_graph, snapshot

F32 = GGMLType.F32


def x_data(shape=(4, 8), seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def same_values(g, r, data, env=None):
    for a, c in zip(run_graph(g, data, env or {}), run_graph(r, data, env or {})):
        np.testing.assert_array_equal(a, c)


def assert_view_is_consistent(t):
    """A folded view says what the view op's own rule would compute from its params."""
    inferred = get_op("view").infer(t.src, t.params)
    assert tuple(inferred.ne) == t.ne and tuple(inferred.nb) == t.nb
    assert inferred.view_src is t.view_src and inferred.view_offs == t.view_offs


def test_a_chain_becomes_one_view_of_the_first_non_view():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    s = b.silu(x)
    p = b.permute(b.reshape(b.view(s, (8, 2), (32,), 32), 4, 2, 2), 1, 0, 2, 3)  # rows 1..2
    out = b.cont(p)
    g = b.build([out])
    before = snapshot(g)
    r = fold_views(g)
    assert snapshot(g) == before
    views = [t for t in r.nodes if op_kind(t) == Kind.VIEW]
    assert len(views) == 1
    v = views[0]
    assert v.op == "view" and v.src[0] is s and v.view_src is s
    assert (v.ne, v.nb, v.view_offs) == (p.ne, p.nb, p.view_offs) and v.view_offs == 32
    assert_view_is_consistent(v)
    same_values(g, r, x_data())


def test_offsets_compose_symbolically():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 2 * N_TOKENS))
    s = b.sqr(x)
    inner = b.view(s, (8, N_TOKENS), (32,), 32 * N_TOKENS)  # the second half of the rows
    outer = b.view(inner, (4, N_TOKENS), (32,), 16)         # from element 4 of each
    g = b.build([b.cont(outer)])
    r = fold_views(g)
    (v,) = [t for t in r.nodes if t.op == "view"]
    assert v.src[0] is s and v.params["offset"] == 32 * N_TOKENS + 16
    assert v.view_offs == 32 * N_TOKENS + 16
    assert_view_is_consistent(v)
    x_values = np.arange(48, dtype=np.float32).reshape(6, 8)
    same_values(g, r, {"x": x_values}, {"n_tokens": 3})
    np.testing.assert_array_equal(run_graph(r, {"x": x_values}, {"n_tokens": 3})[0].reshape(3, 4),
                                  x_values[3:, 4:] ** 2)


def test_identity_views_disappear():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    s = b.silu(x)
    back = b.transpose(b.transpose(s))
    same = b.reshape(b.reshape(s, 32), 8, 4)
    out = b.add(back, same)
    g = b.build([out])
    r = fold_views(g)
    assert [t.op for t in r.nodes] == ["silu", "add"]
    assert r.outputs[0].src == (r.nodes[0], r.nodes[0])
    same_values(g, r, x_data())


def test_single_views_and_real_copies_stay():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    s = b.silu(x)
    t = b.transpose(s)                 # one view: nothing to fold
    c = b.cont(t)                      # a real transpose: stays a copy
    h = b.input("h", GGMLType.BF16, (8, 4))
    to_f32 = b.cont(h)                 # a type change: stays a copy
    out = b.add(b.reshape(c, 8, 4), to_f32)
    g = b.build([out])
    r = fold_views(g)
    assert [id(t) for t in r.tensors] == [id(t) for t in g.tensors]


def test_a_contiguous_cont_becomes_a_reshape_and_its_views_are_rerooted():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    s = b.silu(x)
    rows = b.view(s, (8, 2), (32,), 32)       # rows 1 and 2: contiguous, at an offset
    c = b.cont(rows, 16)                      # needless copy, as a new shape
    tail = b.view(c, (8,), (), 32)            # the second of those rows, through the copy
    g = b.build([b.sqr(tail), b.tanh(c)])
    r = fold_views(g)
    assert not any(t.op == "cont" for t in r.nodes)
    (reshaped,) = [t for t in r.nodes if t.ne == (16, 1, 1, 1) and op_kind(t) == Kind.VIEW]
    assert op_kind(reshaped) == Kind.VIEW and reshaped.view_src is s and reshaped.view_offs == 32
    (v,) = [t for t in r.nodes if t.op == "view" and t.ne[0] == 8 and t.ne[1] == 1]
    assert v.view_src is s and v.view_offs == 64      # offsets compose through the old copy
    same_values(g, r, x_data())


def test_an_output_cont_keeps_its_own_memory():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    out = b.cont(b.silu(x))
    r = fold_views(b.build([out]))
    assert r.outputs[0] is out and out.op == "cont"


def test_a_view_of_a_kv_write_still_depends_on_the_write():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 3))
    idx = b.input("idx", GGMLType.I64, (3,))
    cache = b.cache("cache", GGMLType.F16, (8, 16))
    stored = b.set_rows(cache, x, idx)
    k = b.permute(b.view(stored, (4, 2, 16), (8, 16)), 0, 2, 1, 3)
    g = b.build([b.cont(k)])
    r = fold_views(g)
    (v,) = [t for t in r.nodes if op_kind(t) == Kind.VIEW]
    assert v.src[0].op == "set_rows" and v.view_src.name == "cache"
    assert_view_is_consistent(v)
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((3, 8)).astype(np.float32), "idx": np.array([5, 1, 9])}
    want = run_graph(g, {**data, "cache": np.zeros((16, 8), np.float16)}, {})
    got = run_graph(r, {**data, "cache": np.zeros((16, 8), np.float16)}, {})
    np.testing.assert_array_equal(want[0], got[0])
    assert np.abs(got[0]).sum() > 0


def test_llama_graph_folds_its_kv_views_and_keeps_logits(tiny_llama):
    g = tiny_llama.graph(7)
    r = fold_views(g)
    assert all(op_kind(t.src[0]) != Kind.VIEW for t in r.nodes if op_kind(t) == Kind.VIEW)
    n_layer = tiny_llama.model.hparams.n_layer
    # per layer: V's reshape round trip vanishes (2), view + permute of K and of V fold (2)
    assert len(g.nodes) - len(r.nodes) == 4 * n_layer
    for t in r.nodes:
        if t.op == "set_rows" and t.name.startswith("v_stored"):
            assert t.src[1].op == "mul_mat"   # V written straight from its projection
    model, ctx = tiny_llama.model, tiny_llama.ctx
    for n_kv in (7, 32):
        env = llama_env(7, n_kv)
        want = run_graph(g, llama_bindings(model, ctx, 7, n_kv), env, tiny_llama.backend)
        got = run_graph(r, llama_bindings(model, ctx, 7, n_kv), env, tiny_llama.backend)
        np.testing.assert_array_equal(want[0], got[0])
