"""Common-subexpression elimination: repeated computations become one node; leaves, writes,
outputs and reads of memory a write changes are never merged."""
from __future__ import annotations

import numpy as np

from ggmlpy.ir import GGMLType, GraphBuilder
from ggmlpy.passes.cse import eliminate_common_subexpressions as cse
from tests.ggmlpy.passes.helpers import leaf_roles, llama_bindings, llama_env, run_graph, snapshot

F32 = GGMLType.F32


def xy(b: GraphBuilder):
    return b.input("x", F32, (8, 4)), b.input("y", F32, (8, 4))


def data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal((4, 8)).astype(np.float32) for n in ("x", "y")}


def test_repeats_collapse_transitively_and_values_stay():
    b = GraphBuilder()
    x, y = xy(b)
    a1, a2 = b.add(x, y), b.add(x, y)
    m1, m2 = b.mul(a1, x), b.mul(a2, x)      # the same once a1 and a2 are one
    r1, r2 = b.reshape(m1, 32), b.reshape(m2, 32)  # views repeat too
    out = b.sub(b.reshape(b.silu(r1), 8, 4), b.reshape(r2, 8, 4))
    g = b.build([out])
    before = snapshot(g)
    r = cse(g)
    assert snapshot(g) == before
    ops = [t.op for t in r.nodes]
    assert ops.count("add") == 1 and ops.count("mul") == 1
    assert len(r.nodes) == len(g.nodes) - 3
    np.testing.assert_array_equal(run_graph(r, data(), {})[0], run_graph(g, data(), {})[0])
    assert leaf_roles(r) == leaf_roles(g)


def test_what_differs_is_not_merged():
    b = GraphBuilder()
    x, y = xy(b)
    y2 = b.input("y2", F32, (8, 4))              # same shape as y, but its own data
    outs = [b.scale(x, 0.5), b.scale(x, 0.25),    # params differ
            b.sub(x, y), b.sub(y, x),             # source order differs
            b.add(x, y), b.add(x, y2),            # different leaves
            b.scale(x, 0.0), b.scale(x, -0.0)]    # 0.0 and -0.0 are different params
    g = b.build([b.concat(b.concat(b.concat(outs[0], outs[1], 1), b.concat(outs[2], outs[3], 1), 1),
                          b.concat(b.concat(outs[4], outs[5], 1), b.concat(outs[6], outs[7], 1), 1), 1)])
    r = cse(g)
    assert len(r.tensors) == len(g.tensors)
    assert [id(t) for t in r.tensors] == [id(t) for t in g.tensors]


def test_outputs_are_never_merged():
    b = GraphBuilder()
    x, y = xy(b)
    first = b.add(x, y)
    second = b.add(x, y)
    g = b.build([b.silu(first), second])
    r = cse(g)
    assert sum(t.op == "add" for t in r.nodes) == 2
    assert r.outputs[1] is second


def test_writes_and_reads_of_written_memory_are_not_merged():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    idx = b.input("idx", GGMLType.I64, (4,))
    cache = b.cache("cache", F32, (8, 4))
    before_write = b.scale(b.view(cache, (8, 4), (32,)), 2.0)  # reads the cache before the write
    w1 = b.set_rows(cache, x, idx)
    after_write = b.scale(b.view(cache, (8, 4), (32,)), 2.0)   # same op and source, after it
    w2 = b.set_rows(cache, x, idx)                          # an identical second write
    g = b.build([before_write, w1, after_write, w2])
    r = cse(g)
    assert sum(t.op == "scale" for t in r.nodes) == 2
    assert sum(t.op == "set_rows" for t in r.nodes) == 2
    assert sum(t.op == "view" for t in r.nodes) == 1   # a view is an address: one is enough
    x_data = np.arange(32, dtype=np.float32).reshape(4, 8)
    bindings = {"x": x_data, "idx": np.array([3, 2, 1, 0]), "cache": np.zeros((4, 8), np.float32)}
    out = run_graph(r, bindings, {})
    np.testing.assert_array_equal(out[0], 0)               # before: the zeroed cache
    np.testing.assert_array_equal(out[2].reshape(4, 8), 2 * x_data[::-1])  # after: the rows


def test_llama_graph_is_unchanged_in_value(tiny_llama):
    g = tiny_llama.graph(7)
    r = cse(g)
    assert len(r.outputs) == 1
    env = llama_env(7)
    want = run_graph(g, llama_bindings(tiny_llama.model, tiny_llama.ctx, 7), env, tiny_llama.backend)
    got = run_graph(r, llama_bindings(tiny_llama.model, tiny_llama.ctx, 7), env, tiny_llama.backend)
    np.testing.assert_array_equal(want[0], got[0])
