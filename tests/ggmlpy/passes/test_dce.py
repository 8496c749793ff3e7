"""Dead-code elimination: removes what no output needs, keeps every write (a side effect),
shares the tensors it keeps, and never touches its input."""
from __future__ import annotations

import numpy as np

from ggmlpy.ir import GGMLType, Graph, GraphBuilder
from ggmlpy.ir.graph import topological_order
from ggmlpy.ir.tensor import Flag
from ggmlpy.passes.dce import eliminate_dead_code
from tests.ggmlpy.passes.helpers import leaf_roles, llama_bindings, llama_env, run_graph, snapshot

F32 = GGMLType.F32


def graph_with_extra(outputs, extra) -> Graph:
    """A graph listing `extra` (not reachable from the outputs) besides the outputs' tensors."""
    for o in outputs:
        o.flags |= Flag.OUTPUT
    return Graph(list(outputs), topological_order(list(outputs) + list(extra)))


def test_dead_nodes_and_their_private_leaves_go():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    unused = b.input("unused", F32, (8, 4))
    live = b.silu(x)
    dead = b.tanh(b.add(x, unused))
    g = graph_with_extra([live], [dead])
    before = snapshot(g)
    r = eliminate_dead_code(g)
    assert snapshot(g) == before
    assert [t.name or t.op for t in r.tensors] == ["x", "silu"]
    assert r.tensors[1] is live and r.outputs == [live]
    assert len(g.tensors) == 5


def test_writes_are_roots_with_everything_they_need():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    idx = b.input("idx", GGMLType.I64, (4,))
    cache = b.cache("cache", GGMLType.F16, (8, 16))
    k = b.mul_mat(b.weight("wk", F32, (8, 8)), x)
    stored = b.set_rows(cache, k, idx)          # nothing reads it in the graph
    other = b.cache("other", F32, (32,))
    copied = b.cpy(b.scale(x, 2.0), other)     # nor this
    dead = b.sqr(x)
    out = b.silu(x)
    g = graph_with_extra([out], [stored, copied, dead])
    r = eliminate_dead_code(g)
    kept = {t.op for t in r.nodes}
    assert kept == {"set_rows", "mul_mat", "cpy", "scale", "silu"}
    assert {t.name for t in r.leafs} == {"x", "idx", "cache", "wk", "other"}
    assert leaf_roles(r) == {n: f for n, f in leaf_roles(g).items() if n in leaf_roles(r)}
    # run both: the write lands in the cache either way
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((4, 8)).astype(np.float32), "idx": np.array([3, 0, 7, 9]),
            "wk": rng.standard_normal((8, 8)).astype(np.float32)}
    caches = [{"cache": np.zeros((16, 8), np.float16), "other": np.zeros(32, np.float32)} for _ in range(2)]
    a = run_graph(g, {**data, **caches[0]}, {})
    c = run_graph(r, {**data, **caches[1]}, {})
    np.testing.assert_array_equal(a[0], c[0])
    np.testing.assert_array_equal(caches[0]["cache"], caches[1]["cache"])
    assert np.abs(caches[1]["cache"][[3, 0, 7, 9]]).sum() > 0
    np.testing.assert_array_equal(caches[1]["other"], 2 * data["x"].reshape(-1))


def test_a_graph_without_dead_code_is_kept_as_it_is():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    g = b.build([b.add(b.silu(x), x)])
    g.hints["tokens"] = "multi"
    r = eliminate_dead_code(g)
    assert [id(t) for t in r.tensors] == [id(t) for t in g.tensors]
    assert r.outputs == g.outputs and r.hints == g.hints and r.signature() == g.signature()


def test_llama_graph_keeps_every_kv_write_and_its_logits(tiny_llama):
    g = tiny_llama.graph(7)
    dead = [GraphBuilder().silu(g.find("inp_embd"))]  # read by nothing
    padded = Graph(g.outputs, topological_order(g.outputs + dead), dict(g.hints))
    r = eliminate_dead_code(padded)
    assert len(r.tensors) == len(g.tensors)
    n_layer = tiny_llama.model.hparams.n_layer
    assert sum(t.op == "set_rows" for t in r.nodes) == 2 * n_layer
    env = llama_env(7)
    want = run_graph(g, llama_bindings(tiny_llama.model, tiny_llama.ctx, 7), env, tiny_llama.backend)
    got = run_graph(r, llama_bindings(tiny_llama.model, tiny_llama.ctx, 7), env, tiny_llama.backend)
    np.testing.assert_array_equal(want[0], got[0])
