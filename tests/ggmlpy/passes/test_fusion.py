"""Fusion marking: which patterns form groups, which must not, how groups are stored
(positions in graph.tensors, consecutive nodes) and that values never change."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.ir import N_TOKENS, GGMLType, Graph, GraphBuilder
from ggmlpy.passes.common import FUSION_HINT, PassError, check_graph
from ggmlpy.codegen_cpu.fusion import CPU_RULES
from ggmlpy.passes.fusion import ChainRule, fusion_groups, mark_fusion_groups
from ggmlpy.passes.views import fold_views
from tests.ggmlpy.passes.helpers import llama_bindings, llama_env, run_graph, snapshot

F32 = GGMLType.F32


def patterns(g: Graph) -> list[str]:
    return [grp.pattern for grp in fusion_groups(g)]


def ops_of(group) -> list[str]:
    return [t.op for t in group.nodes]


def rope(b, t, pos, n_dims=8):
    return b.rope_ext(t, pos, None, n_dims, 0, 4096, 10000.0, 1.0)


def test_rms_norm_then_weight_is_one_group_with_the_norm_interior():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    w = b.weight("w", F32, (8,))
    normed = b.mul(b.rms_norm(x, 1e-5), w)
    g = b.build([b.mul_mat(b.weight("m", F32, (8, 8)), normed)])
    before = snapshot(g)
    r = mark_fusion_groups(g, CPU_RULES)
    assert snapshot(g) == before and FUSION_HINT not in g.hints
    (grp,) = fusion_groups(r)
    assert grp.pattern == "norm_mul" and ops_of(grp) == ["rms_norm", "mul"]
    assert grp.outputs == [normed] and [t.op for t in grp.interior] == ["rms_norm"]
    assert {t.name for t in grp.inputs} == {"x", "w"}
    assert r.nodes == g.nodes          # no node moved: the group was already consecutive


def test_a_norm_read_twice_or_a_full_tensor_multiply_is_not_that_group():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    n = b.rms_norm(x, 1e-5)
    twice = b.add(b.mul(n, b.weight("w", F32, (8,))), n)       # n has a second reader
    m = b.rms_norm(x, 1e-6)
    full = b.mul(m, b.input("y", F32, (8, 4)))                # not a weight row
    r = mark_fusion_groups(b.build([twice, full]), CPU_RULES)
    assert "norm_mul" not in patterns(r)


def test_elementwise_chains_stop_at_a_second_reader_and_a_shape_change():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    a = b.tanh(b.scale(b.silu(x), 2.0))          # silu -> scale -> tanh
    branch = b.sqr(a)                             # a is read twice: the chain ends at a
    other = b.add(a, branch)
    small = b.input("s", F32, (8, 1))
    grown = b.add(b.input("big", F32, (8, 4)), b.relu(small))  # relu [8, 1] feeds [8, 4]
    r = mark_fusion_groups(b.build([other, grown]), CPU_RULES)
    chains = [ops_of(grp) for grp in fusion_groups(r) if grp.pattern == "map_chain"]
    assert ["silu", "scale", "tanh"] in chains
    assert ["sqr", "add"] in chains                # the branch and its add: a chain of its own
    assert not any("relu" in c for c in chains)


def test_swiglu_with_two_matmuls_of_one_input():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    y = b.input("y", F32, (8, 4))
    wg, wu = b.weight("wg", F32, (8, 16)), b.weight("wu", F32, (8, 16))
    shared = b.swiglu(b.mul_mat(wg, x), b.mul_mat(wu, x))
    apart = b.swiglu(b.mul_mat(wg, x), b.mul_mat(wu, y))   # different inputs: no group
    r = mark_fusion_groups(b.build([shared, apart]), CPU_RULES)
    groups = [grp for grp in fusion_groups(r) if grp.pattern == "glu_product"]
    assert len(groups) == 1 and groups[0].outputs == [shared]
    assert ops_of(groups[0]) == ["mul_mat", "mul_mat", "swiglu"]
    assert [t.name for t in groups[0].inputs] == ["wg", "x", "wu"]


def test_matmul_epilogue_in_either_operand_order_but_not_when_the_product_is_shared():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    w = b.weight("w", F32, (8, 8))
    first = b.add(b.mul_mat(w, x), x)
    second = b.add(x, b.mul_mat(w, first))              # residual first
    shared = b.mul_mat(w, second)
    third = b.add(shared, second)
    g = b.build([b.mul(third, shared)])                 # the product is read twice
    r = mark_fusion_groups(g, CPU_RULES)
    epilogues = [grp.outputs[0] for grp in fusion_groups(r) if grp.pattern == "residual_product"]
    assert epilogues == [first, second]


def test_softmax_groups_with_its_scale_or_its_matmul():
    b = GraphBuilder()
    q = b.input("q", F32, (8, 4))
    k = b.input("k", F32, (8, 6))
    mask = b.input("mask", F32, (6, 4))
    scores = b.soft_max_ext(b.mul_mat(k, q), mask, 0.125, 0.0)
    scaled = b.soft_max_ext(b.scale(b.tanh(q), 0.5), None, 1.0, 0.0)
    biased = b.soft_max_ext(b.scale_bias(q, 0.5, 1.0), None, 1.0, 0.0)   # a bias: no fold
    r = mark_fusion_groups(b.build([scores, scaled, biased]), CPU_RULES)
    got = {grp.pattern: ops_of(grp) for grp in fusion_groups(r)}
    assert got["matmul_softmax"] == ["mul_mat", "soft_max"]
    assert got["scale_softmax"] == ["scale", "soft_max"]
    assert sum(p == "scale_softmax" for p in patterns(r)) == 1


def qk_layer(b, x, pos, il, wq_heads=4, wk_heads=2):
    """Q and K projections of x with rope, K first (as llama builds them)."""
    wk = b.weight(f"wk{il}", F32, (16, 8 * wk_heads))
    wq = b.weight(f"wq{il}", F32, (16, 8 * wq_heads))
    k = rope(b, b.reshape(b.mul_mat(wk, x), 8, wk_heads, N_TOKENS), pos)
    k_used = b.scale(k, 2.0)                             # K's reader comes before Q's rope
    q = rope(b, b.reshape(b.mul_mat(wq, x), 8, wq_heads, N_TOKENS), pos)
    return q, k, k_used


def test_rope_of_q_and_k_is_one_group_made_consecutive():
    b = GraphBuilder()
    pos = b.input("pos", GGMLType.I32, (N_TOKENS,))
    x0 = b.input("x0", F32, (16, N_TOKENS))
    x1 = b.input("x1", F32, (16, N_TOKENS))
    q0, k0, k0_used = qk_layer(b, x0, pos, 0)
    q1, k1, k1_used = qk_layer(b, x1, pos, 1)
    g = b.build([k0_used, b.cont(b.permute(q0, 0, 2, 1, 3)), k1_used, q1])
    assert g.tensors.index(k0_used) < g.tensors.index(q0)
    r = mark_fusion_groups(g, CPU_RULES)
    check_graph(r)
    groups = [grp for grp in fusion_groups(r) if grp.pattern == "rope_qk"]
    assert [set(map(id, grp.nodes)) for grp in groups] == [{id(k0), id(q0)}, {id(k1), id(q1)}]
    for grp in groups:
        assert len(grp.outputs) == 2 and pos in grp.inputs
        i = r.nodes.index(grp.nodes[0])
        assert r.nodes[i + 1] is grp.nodes[1]
    rng = np.random.default_rng(0)
    n = 5
    data = {"pos": np.arange(n, dtype=np.int32) + 3}
    data.update({f"x{i}": rng.standard_normal((n, 16)).astype(np.float32) for i in range(2)})
    for il in range(2):
        data[f"wk{il}"] = rng.standard_normal((16, 16)).astype(np.float32)
        data[f"wq{il}"] = rng.standard_normal((32, 16)).astype(np.float32)
    for a, c in zip(run_graph(g, data, {"n_tokens": n}), run_graph(r, data, {"n_tokens": n})):
        np.testing.assert_array_equal(a, c)


def test_ropes_of_different_inputs_or_params_are_not_paired():
    b = GraphBuilder()
    pos = b.input("pos", GGMLType.I32, (4,))
    x, y = b.input("x", F32, (16, 4)), b.input("y", F32, (16, 4))
    w = b.weight("w", F32, (16, 16))
    a = rope(b, b.reshape(b.mul_mat(w, x), 8, 2, 4), pos)
    c = rope(b, b.reshape(b.mul_mat(w, y), 8, 2, 4), pos)           # another activation
    d = rope(b, b.reshape(b.mul_mat(w, x), 8, 2, 4), pos, n_dims=4)  # other params
    r = mark_fusion_groups(b.build([a, c, d]), CPU_RULES)
    assert "rope_qk" not in patterns(r)


def test_a_group_that_would_need_its_own_output_is_refused():
    b = GraphBuilder()
    pos = b.input("pos", GGMLType.I32, (4,))
    x = b.input("x", F32, (16, 4))
    wk, wq = b.weight("wk", F32, (16, 16)), b.weight("wq", F32, (16, 16))
    k = rope(b, b.reshape(b.mul_mat(wk, x), 8, 2, 4), pos)
    k_back = b.reshape(b.sqrt(b.sqr(k)), 16, 4)                      # outside any rope group
    q_in = b.add(b.mul_mat(wq, x), k_back)                           # q depends on rope(k)
    q = rope(b, b.reshape(q_in, 8, 2, 4), pos)
    r = mark_fusion_groups(b.build([q]), CPU_RULES)
    assert "rope_qk" not in patterns(r)
    check_graph(r)


def test_groups_survive_no_pass_that_changes_the_tensor_list():
    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    out = b.tanh(b.silu(b.reshape(b.reshape(x, 32), 8, 4)))
    r = mark_fusion_groups(b.build([out]), CPU_RULES)
    assert patterns(r) == ["map_chain"]
    assert FUSION_HINT not in fold_views(r).hints          # the view pass changed the list
    stale = Graph(r.outputs, r.tensors[::-1], dict(r.hints))
    with pytest.raises(PassError):
        fusion_groups(stale)


def test_llama_groups_signature_and_logits(tiny_llama):
    n_layer = tiny_llama.model.hparams.n_layer
    g = fold_views(tiny_llama.graph(7))
    r = mark_fusion_groups(g, CPU_RULES)
    count = {p: patterns(r).count(p) for p in set(patterns(r))}
    assert count == {"norm_mul": 2 * n_layer + 1, "rope_qk": n_layer, "matmul_softmax": n_layer,
                     "glu_product": n_layer, "residual_product": 2 * n_layer - 1}
    assert mark_fusion_groups(fold_views(tiny_llama.graph(7)), CPU_RULES).signature() == r.signature()
    assert r.signature() != g.signature()
    check_graph(r)
    env = llama_env(7)
    want = run_graph(g, llama_bindings(tiny_llama.model, tiny_llama.ctx, 7), env, tiny_llama.backend)
    got = run_graph(r, llama_bindings(tiny_llama.model, tiny_llama.ctx, 7), env, tiny_llama.backend)
    np.testing.assert_array_equal(want[0], got[0])


def test_grouping_the_nodes_of_one_split():
    """group_nodes over part of a graph (how the CUDA backend marks its splits): readers
    outside the part count as outside the group, and nodes outside the part join none."""
    from ggmlpy.passes.common import consumers
    from ggmlpy.passes.fusion import group_nodes

    b = GraphBuilder()
    x = b.input("x", F32, (8, 4))
    silu = b.silu(x)
    scaled = b.scale(silu, 2.0)
    out = b.tanh(scaled)
    normed = b.rms_norm(x, 1e-5)
    weighted = b.mul(normed, b.weight("w", F32, (8,)))
    again = b.sqr(normed)                                  # a second reader of the norm
    g = b.build([out, weighted, again])
    users = consumers(g.tensors)
    order, groups = group_nodes([silu, scaled], users, (ChainRule("c"),))
    assert [[t.op for t in members] for _, members in groups] == [["silu", "scale"]]
    assert order == [silu, scaled]
    _, groups = group_nodes([silu, out], users, (ChainRule("c"),))   # scale is elsewhere
    assert groups == []
    rule = next(r for r in CPU_RULES if r.name == "norm_mul")
    _, groups = group_nodes([normed, weighted], users, (rule,))      # sqr, elsewhere, reads the norm
    assert groups == []
    _, groups = group_nodes([normed, weighted], consumers([normed, weighted]), (rule,))
    assert [p for p, _ in groups] == ["norm_mul"]
