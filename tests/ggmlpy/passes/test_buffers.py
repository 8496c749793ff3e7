"""Buffer planning: block reuse, in-place, views, outputs and fusion on small graphs with
hand-computed offsets; an independent liveness check (helpers.check_plan) and a real run in
one shared arena on random graphs and on SmolLM2."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ggmlpy.ir import N_KV, GGMLType, GraphBuilder
from ggmlpy.passes.arena import Arena
from ggmlpy.passes.buffers import PlanError, plan_buffers
from ggmlpy.codegen_cpu.fusion import CPU_RULES
from ggmlpy.passes.fusion import mark_fusion_groups
from ggmlpy.passes.pipeline import run_pipeline
from tests.ggmlpy.passes.helpers import (
    ArenaStore, check_plan, llama_bindings, llama_env, random_graph, run_graph, snapshot,
)

F32 = GGMLType.F32
BLOCK = 128  # an [8, 4] F32 tensor


def start(b: GraphBuilder):
    return b.input("x", F32, (8, 4)), b.weight("w", F32, (8, 8))


def test_a_block_is_reused_once_its_last_reader_ran():
    b = GraphBuilder()
    x, w = start(b)
    a = b.mul_mat(w, x)
    c = b.mul_mat(w, a)
    d = b.mul_mat(w, c)
    out = b.mul_mat(w, d)
    g = b.build([out])
    before = snapshot(g)
    plan = plan_buffers(g, {})
    assert snapshot(g) == before
    assert [plan.offsets[t.id] for t in (a, c, d, out)] == [0, BLOCK, 0, BLOCK]
    assert (plan.arena_size, plan.peak_bytes, plan.no_reuse_bytes) == (2 * BLOCK, 2 * BLOCK, 4 * BLOCK)
    assert plan.inplace == {}
    check_plan(g, plan)


def test_in_place_when_the_op_allows_it_and_the_parent_has_one_reader():
    b = GraphBuilder()
    x, w = start(b)
    a = b.mul_mat(w, x)
    s = b.silu(a)
    t = b.tanh(s)
    out = b.mul_mat(w, t)
    g = b.build([out])
    plan = plan_buffers(g, {})
    assert plan.inplace == {s.id: a.id, t.id: s.id}
    assert plan.offsets[a.id] == plan.offsets[s.id] == plan.offsets[t.id] == 0
    assert plan.offsets[out.id] == BLOCK and plan.arena_size == 2 * BLOCK
    check_plan(g, plan)


def test_no_in_place_over_a_shared_viewed_output_or_smaller_parent():
    b = GraphBuilder()
    x, w = start(b)
    shared = b.mul_mat(w, x)
    s1 = b.silu(shared)                          # shared has a second reader below
    viewed = b.mul_mat(w, x)
    s2 = b.silu(viewed)                          # viewed is read through a view below
    kept = b.mul_mat(w, x)                       # an output
    s3 = b.silu(kept)
    half = b.cont(b.view(b.input("h", GGMLType.F16, (8, 4)), (8, 4), (16,)))  # an F16 copy
    s4 = b.silu(half)                            # F32 result: bigger than its parent
    out = b.add(b.add(b.add(s1, shared), b.add(s2, b.reshape(b.reshape(viewed, 32), 8, 4))), s4)
    g = b.build([out, kept, s3])
    plan = plan_buffers(g, {})
    assert not {s1.id, s2.id, s3.id, s4.id} & set(plan.inplace)
    check_plan(g, plan)


def test_outputs_and_what_they_view_are_never_reused():
    b = GraphBuilder()
    x, w = start(b)
    kept = b.mul_mat(w, x)
    seen = b.mul_mat(w, x)
    view_out = b.transpose(seen)                 # an output that is a view of `seen`
    later = [b.mul_mat(w, kept)]
    for _ in range(4):
        later.append(b.mul_mat(w, later[-1]))
    g = b.build([kept, view_out, b.sqr(later[-1])])  # kept and seen come first
    plan = plan_buffers(g, {})
    for t in later:
        assert plan.offsets[t.id] not in (plan.offsets[kept.id], plan.offsets[seen.id])
    check_plan(g, plan)


def test_a_view_keeps_its_owner_alive_until_the_view_is_read():
    b = GraphBuilder()
    x, w = start(b)
    a = b.mul_mat(w, x)
    v = b.transpose(a)
    mids = [b.mul_mat(w, a)]
    for _ in range(3):
        mids.append(b.mul_mat(w, mids[-1]))
    out = b.add(b.transpose(mids[-1]), b.cont(v))     # v read last
    g = b.build([out])
    assert g.nodes.index(a) < g.nodes.index(mids[-1]) < g.nodes.index(out.src[1])
    plan = plan_buffers(g, {})
    assert v.id not in plan.offsets
    assert all(plan.offsets[m.id] != plan.offsets[a.id] for m in mids)
    check_plan(g, plan)


def test_the_checks_catch_a_plan_that_overlaps_live_tensors():
    b = GraphBuilder()
    x, w = start(b)
    a = b.mul_mat(w, x)
    c = b.mul_mat(w, a)
    g = b.build([b.add(c, a)])                   # a and c are live together
    plan = plan_buffers(g, {})
    bad = dataclasses.replace(plan, offsets={**plan.offsets, c.id: plan.offsets[a.id]})
    with pytest.raises(AssertionError, match="overlap"):
        check_plan(g, bad)
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((4, 8)).astype(np.float32),
            "w": rng.standard_normal((8, 8)).astype(np.float32)}
    by_id = {t.id: t for t in g.tensors}
    good_run = run_graph(g, data, {}, store=ArenaStore(data, plan, by_id, {}))
    bad_run = run_graph(g, data, {}, store=ArenaStore(data, bad, by_id, {}))
    np.testing.assert_array_equal(good_run[0], run_graph(g, data, {})[0])
    assert not np.array_equal(bad_run[0], good_run[0])


def test_fused_interior_tensors_get_no_memory():
    b = GraphBuilder()
    x, w = start(b)
    normed = b.mul(b.rms_norm(b.mul_mat(w, x), 1e-5), b.weight("g", F32, (8,)))
    g = mark_fusion_groups(b.build([b.mul_mat(w, normed)]), CPU_RULES)
    fused = plan_buffers(g, {})
    plain = plan_buffers(g, {}, fused=False)
    norm = normed.src[0]
    assert norm.id not in fused.offsets and norm.id in plain.offsets
    assert len(fused.offsets) == len(plain.offsets) - 1
    check_plan(g, fused)
    check_plan(g, plain, fused=False)


def test_best_fit_reuse_and_merging_of_free_blocks():
    arena = Arena(64)
    offs = [arena.alloc(i, size) for i, size in enumerate([192, 64, 64, 128, 64])]
    assert offs == [0, 192, 256, 320, 448]
    arena.free(0)                       # a 192-byte hole at 0
    arena.free(3)                       # a 128-byte hole at 320
    assert arena.alloc(10, 100) == 320  # best fit: the 128-byte hole, not the first one
    arena.free(1)
    arena.free(2)                       # 0..320 merge into one free block
    assert arena.alloc(11, 300) == 0
    arena.free(4)                       # the top block is free: the next big one grows it
    assert arena.alloc(12, 256) == 448 and arena.top == 704


def test_alignment_and_symbols():
    b = GraphBuilder()
    x = b.input("x", F32, (5, N_KV))
    w = b.weight("w", F32, (5, 3))
    g = b.build([b.mul_mat(w, b.mul_mat(b.weight("v", F32, (3, 5)), b.mul_mat(w, x)))])
    plan = plan_buffers(g, {"n_kv": 7}, alignment=256)
    assert all(o % 256 == 0 for o in plan.offsets.values())
    assert sorted(plan.sizes.values()) == [3 * 7 * 4, 3 * 7 * 4, 5 * 7 * 4]
    check_plan(g, plan)
    with pytest.raises(PlanError, match="n_kv"):
        plan_buffers(g, {"n_tokens": 4})
    with pytest.raises(PlanError, match="power of two"):
        plan_buffers(g, {"n_kv": 7}, alignment=48)


@pytest.mark.parametrize("seed", range(25))
def test_random_graphs_never_overlap_and_run_in_one_arena(seed):
    g, data = random_graph(np.random.default_rng(seed), n_ops=24)
    result = run_pipeline(g, "cpu", env={}, rules=CPU_RULES)
    plan = result.plan
    check_plan(result.graph, plan)
    assert plan.peak_bytes <= plan.arena_size <= plan.no_reuse_bytes
    want = run_graph(g, data, {})
    by_id = {t.id: t for t in result.graph.tensors}
    got = run_graph(result.graph, data, {}, store=ArenaStore(data, plan, by_id, {}))
    for a, c in zip(want, got):
        np.testing.assert_array_equal(a, c)


def test_smollm2_plan_has_no_overlap_and_saves_memory(smollm2):
    g = smollm2.graph(512)
    worst = {"n_tokens": 512, "n_kv": 4096, "n_outputs": 512}
    result = run_pipeline(g, "cpu", env=worst, rules=CPU_RULES)
    for plan, fused in ((result.plan, True), (plan_buffers(result.graph, worst, fused=False), False)):
        check_plan(result.graph, plan, fused=fused)
        assert plan.peak_bytes < plan.no_reuse_bytes / 10
        assert plan.arena_size < plan.no_reuse_bytes / 10
    logits = 512 * smollm2.model.n_vocab * 4
    assert logits <= result.plan.peak_bytes < logits + 8 * 4096 * 512 * 9 * 4


def test_smollm2_runs_in_an_arena_planned_for_a_bigger_ubatch(smollm2):
    result = run_pipeline(smollm2.graph(7), "cpu", env=llama_env(16, 64), rules=CPU_RULES)
    env = llama_env(7, 32)
    want = [smollm2.logits(7)]
    data = llama_bindings(smollm2.model, smollm2.ctx, 7)
    store = ArenaStore(data, result.plan, {t.id: t for t in result.graph.tensors}, env)
    got = run_graph(result.graph, data, env, smollm2.backend, store=store)
    np.testing.assert_array_equal(want[0], got[0])
