"""The declared pipelines: their passes, dumps after a pass, errors, and the whole CPU
pipeline on SmolLM2 and the tiny llama against the reference backend (same logits)."""
from __future__ import annotations

import numpy as np
import pytest

from ggmlpy.ir import GGMLType, GraphBuilder
from ggmlpy.passes.common import FUSION_HINT
from ggmlpy.codegen_cpu.fusion import CPU_RULES
from ggmlpy.passes.pipeline import PASSES, PIPELINES, pass_names, run_pipeline
from tests.ggmlpy.passes.helpers import leaf_roles, llama_bindings, llama_env, run_graph, snapshot


def test_declared_pipelines():
    assert PIPELINES["ref"] == ("dce", "cse")
    assert PIPELINES["cpu"] == ("dce", "cse", "views", "fusion", "buffers")
    assert set(PASSES) == {"dce", "cse", "views", "fusion"}
    assert pass_names() == ["dce", "cse", "views", "fusion", "buffers"]


def small_graph():
    b = GraphBuilder()
    x = b.input("x", GGMLType.F32, (8, 4))
    a, c = b.silu(x), b.silu(x)
    return b.build([b.tanh(b.add(b.reshape(b.reshape(a, 32), 8, 4), c))])


def test_dump_after_a_pass_shows_the_graph_at_that_point():
    g = small_graph()
    seen: list[str] = []
    result = run_pipeline(g, "cpu", dump_after="cse", dump=seen.append, env={}, rules=CPU_RULES)
    assert len(seen) == 1
    text = seen[0]
    assert text.startswith("# after cse (cpu pipeline)\n")
    assert "nodes: 5" in text and "reshape 2, add 1, silu 1, tanh 1" in text  # views not folded yet
    assert [s.name for s in result.steps] == list(PIPELINES["cpu"])
    assert [(s.nodes_before, s.nodes_after) for s in result.steps] == [(6, 6), (6, 5), (5, 3), (3, 3), (3, 3)]

    seen.clear()
    run_pipeline(g, "cpu", dump_after="fusion", dump=seen.append, env={}, rules=CPU_RULES)
    assert "fusion groups: 1" in seen[0] and "map_chain" in seen[0]
    seen.clear()
    run_pipeline(g, "cpu", dump_after="buffers", dump=seen.append, env={}, rules=CPU_RULES)
    assert "buffer plan" in seen[0] and "arena" in seen[0]
    seen.clear()
    run_pipeline(g, "cpu", dump_after="views", dump=seen.append, rules=CPU_RULES, render=lambda gr: f"{len(gr.nodes)} nodes\n")
    assert seen == ["# after views (cpu pipeline)\n3 nodes\n"]


def test_bad_names_are_clear_errors():
    g = small_graph()
    with pytest.raises(ValueError, match="dce, cse"):
        run_pipeline(g, "ref", dump_after="fusion")
    with pytest.raises(ValueError, match="unknown|no pass pipeline.*cpu"):
        run_pipeline(g, "tpu")


def test_ref_pipeline_has_no_plan_and_no_fusion():
    result = run_pipeline(small_graph(), "ref")
    assert result.plan is None and FUSION_HINT not in result.graph.hints


@pytest.mark.parametrize("n_tokens", [1, 7])
@pytest.mark.parametrize("model", ["tiny_llama", "smollm2"])
def test_pipelines_keep_the_logits(model, n_tokens, request):
    setup = request.getfixturevalue(model)
    g = setup.graph(n_tokens)
    before, roles, signature = snapshot(g), leaf_roles(g), g.signature()
    env = llama_env(n_tokens)
    want = [setup.logits(n_tokens)]
    for backend in ("ref", "cpu"):
        result = run_pipeline(g, backend, env=env, rules=CPU_RULES)
        assert snapshot(g) == before and g.signature() == signature
        out = result.graph
        assert leaf_roles(out) == {n: f for n, f in roles.items() if n in leaf_roles(out)}
        assert len(out.outputs) == 1 and out.outputs[0].name == "result_output"
        got = run_graph(out, llama_bindings(setup.model, setup.ctx, n_tokens), env, setup.backend)
        np.testing.assert_array_equal(want[0], got[0])
        assert want[0].shape[-2:] == (n_tokens, setup.model.n_vocab)
    assert len(result.graph.nodes) < len(g.nodes) and result.plan is not None
    assert result.graph.hints[FUSION_HINT]


def test_the_k_shift_graph_writes_the_same_cache_after_every_pipeline(tiny_llama):
    """A graph whose only results are writes (cpy into the K cache): nothing may be dropped
    or reordered across them."""
    from llama.kshift import build_k_shift

    g = build_k_shift(tiny_llama.model, tiny_llama.ctx.kv_layout).graph
    rng = np.random.default_rng(0)
    kv_size = tiny_llama.ctx.n_ctx
    caches = {name: rng.standard_normal(a.shape).astype(a.dtype)
              for name, a in tiny_llama.ctx.memory.bindings().items()}
    shift = {"inp_k_shift": rng.integers(-5, 5, kv_size).astype(np.int32)}
    want = {k: v.copy() for k, v in caches.items()}
    run_graph(g, {**shift, **want}, {}, tiny_llama.backend)
    for backend in ("ref", "cpu"):
        result = run_pipeline(g, backend, env={}, rules=CPU_RULES)
        assert sum(t.op == "cpy" for t in result.graph.nodes) == tiny_llama.model.hparams.n_layer
        got = {k: v.copy() for k, v in caches.items()}
        run_graph(result.graph, {**shift, **got}, {}, tiny_llama.backend)
        for name in caches:
            np.testing.assert_array_equal(want[name], got[name])
        assert any(not np.array_equal(want[n], caches[n]) for n in caches if n.startswith("cache_k"))
