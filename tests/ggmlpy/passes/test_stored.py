"""The optimised graphs stored on disk (passes/stored.py): a stored graph is the graph the
passes compute (same signature, same logits), takes fresh tensor ids, is keyed by the input
signature and the pass list, and an entry that does not load is removed and recomputed.
A context made twice over one cache runs no pass the second time and decodes the same."""
from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np

import llama
from ggmlpy.codegen_cpu.fusion import CPU_RULES
from ggmlpy.ir.serial import dump_graph, load_graph
from ggmlpy.ir.symbolic import SymExpr
from ggmlpy.options import Options
from ggmlpy.passes import stored as stored_module
from ggmlpy.passes.pipeline import PIPELINES, run_pipeline
from ggmlpy.passes.stored import StoredPipeline
from tests.ggmlpy.passes.helpers import llama_bindings, llama_env, run_graph

CPU_PASSES = PIPELINES["cpu"]


def _parts(graph, names):
    return StoredPipeline.key_parts(graph.signature(), names, CPU_RULES)


def test_a_stored_graph_is_the_computed_graph(tiny_llama, tmp_path):
    graph = tiny_llama.graph(5)
    computed = run_pipeline(graph, passes=CPU_PASSES[:-1], rules=CPU_RULES).graph
    first = StoredPipeline(tmp_path).optimise(graph, graph.signature(), CPU_PASSES, CPU_RULES)
    second_store = StoredPipeline(tmp_path)
    second = second_store.optimise(graph, graph.signature(), CPU_PASSES, CPU_RULES)
    assert (second_store.disk.hits, second_store.disk.misses) == (1, 0)
    assert computed.signature() == first.signature() == second.signature()
    # fresh ids: none is shared with a tensor this process made before
    made_before = {t.id for g in (graph, computed, first) for t in g.tensors}
    assert not made_before & {t.id for t in second.tensors}
    assert len({t.id for t in second.tensors}) == len(second.tensors)
    bindings = llama_bindings(tiny_llama.model, tiny_llama.ctx, 5)
    env = llama_env(5)
    want = run_graph(computed, bindings, env, tiny_llama.backend)[0]
    got = run_graph(second, bindings, env, tiny_llama.backend)[0]
    np.testing.assert_array_equal(got, want)


def test_key_names_signature_and_passes(tiny_llama, tmp_path):
    store = StoredPipeline(tmp_path)
    one, many = tiny_llama.graph(1), tiny_llama.graph(5)
    store.optimise(one, one.signature(), CPU_PASSES, CPU_RULES)
    store.optimise(many, many.signature(), CPU_PASSES, CPU_RULES)
    store.optimise(many, many.signature(), ("dce", "cse"), CPU_RULES)
    store.optimise(many, many.signature(), ("dce", "cse", "buffers"))   # buffers are not stored
    assert (store.disk.misses, store.disk.hits) == (3, 1)
    assert len(list(tmp_path.glob("*.pickle"))) == 3


def test_an_entry_that_does_not_load_is_removed_and_recomputed(tiny_llama, tmp_path):
    graph = tiny_llama.graph(5)
    store = StoredPipeline(tmp_path)
    names = CPU_PASSES[:-1]
    store.disk.put(_parts(graph, names), pickle.dumps(5), ".pickle")   # checksummed, not a graph
    out = store.optimise(graph, graph.signature(), CPU_PASSES, CPU_RULES)
    assert (store.disk.hits, store.disk.misses, store.disk.discards) == (0, 1, 1)
    assert out.signature() == run_pipeline(graph, passes=names, rules=CPU_RULES).graph.signature()
    again = StoredPipeline(tmp_path)
    assert again.optimise(graph, graph.signature(), CPU_PASSES, CPU_RULES).signature() == out.signature()
    assert again.disk.hits == 1   # the recomputed graph was stored in its place


def test_a_graph_breaking_an_invariant_is_not_used(tiny_llama, tmp_path):
    graph = tiny_llama.graph(5)
    names = CPU_PASSES[:-1]
    optimised = run_pipeline(graph, passes=names, rules=CPU_RULES).graph
    broken, _ = load_graph(dump_graph(optimised))
    broken.tensors.reverse()   # every user now before its sources
    store = StoredPipeline(tmp_path)
    store.disk.put(_parts(graph, names), dump_graph(broken), ".pickle")
    out = store.optimise(graph, graph.signature(), CPU_PASSES, CPU_RULES)
    assert store.disk.discards == 1 and out.signature() == optimised.signature()


def test_symbolic_dims_hash_as_their_equals_after_pickling_in_another_process():
    """A string's hash changes from process to process: a SymExpr keeps none when pickled."""
    blob = pickle.dumps(SymExpr({("n_tokens",): 4, ("n_kv",): 2}))
    code = (f"import pickle; from ggmlpy.ir.symbolic import SymExpr\n"
            f"e = pickle.loads({blob!r}); f = SymExpr({{('n_kv',): 2, ('n_tokens',): 4}})\n"
            f"print(e == f, hash(e) == hash(f), {{f: 1}}.get(e))")
    # -E: no PYTHON* variables, so PYTHONHASHSEED cannot fix the child's string hashes
    out = subprocess.run([sys.executable, "-E", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "1"]


def test_a_second_context_runs_no_pass_and_decodes_the_same(smollm2_path, tmp_path, monkeypatch):
    options = Options(cache_dir=str(tmp_path))
    model = llama.Model.load(smollm2_path)
    prompt = model.tokenize("The capital of France is")

    def logits(ctx: llama.Context) -> np.ndarray:
        assert ctx.decode(llama.Batch.from_tokens(prompt)) == 0
        assert ctx.decode(llama.Batch.from_tokens([prompt[-1]], pos0=len(prompt))) == 0
        return ctx.get_logits_ith(-1).copy()

    first = llama.Context(model, n_ctx=256, n_threads=2, backend_options=options)
    assert (first.stored_pipeline.disk.misses, first.stored_pipeline.disk.hits) == (2, 0)
    want = logits(first)
    ran = []
    monkeypatch.setattr(stored_module, "run_pipeline", lambda *a, **k: ran.append(1))
    second = llama.Context(model, n_ctx=256, n_threads=2, backend_options=options)
    assert (second.stored_pipeline.disk.misses, second.stored_pipeline.disk.hits) == (0, 2)
    assert ran == []
    np.testing.assert_array_equal(logits(second), want)
